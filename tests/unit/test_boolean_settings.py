"""Every boolean setting takes only known spellings: a typo refuses to start, it never
turns a switch (auth above all) off."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import fields

import pytest

from gateway.settings import Settings, SettingsError, from_env

BOOLEANS = [f.name for f in fields(Settings) if f.type in ("bool", "bool | None")]


def test_the_booleans_are_found() -> None:
    assert {"auth_required", "metrics_public", "webrtc"} <= set(BOOLEANS)


SPELLINGS = [("1", True), ("TRUE", True), (" Yes ", True), ("on", True)]
SPELLINGS += [("0", False), ("False", False), ("NO", False), ("off", False)]


@pytest.mark.parametrize("name", BOOLEANS)
@pytest.mark.parametrize(("raw", "value"), SPELLINGS)
def test_known_spellings_are_read_case_insensitively(name: str, raw: str, value: bool) -> None:
    assert getattr(from_env({f"OMNI_GATEWAY_{name.upper()}": raw}), name) is value


@pytest.mark.parametrize("name", BOOLEANS)
@pytest.mark.parametrize("raw", ["enforce", "", "2", "tru", "enabled"])
def test_any_other_value_is_refused_naming_the_variable(name: str, raw: str) -> None:
    with pytest.raises(SettingsError, match=f"OMNI_GATEWAY_{name.upper()}: .* is not a boolean"):
        from_env({f"OMNI_GATEWAY_{name.upper()}": raw})


def test_serve_with_a_typo_in_auth_required_refuses_to_start() -> None:
    """The command a user runs: exit 2 and a line naming the variable, before anything binds
    (the keys would otherwise be ignored and the port open to anyone)."""
    env = {**os.environ, "OMNI_GATEWAY_AUTH_REQUIRED": "enforce", "OMNI_GATEWAY_API_KEYS": "sk-test-1234"}
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--engine", "passthrough", "--video-engine", "none",
         "--port", "1"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "OMNI_GATEWAY_AUTH_REQUIRED: 'enforce' is not a boolean" in done.stderr
