"""``omni-gateway serve``'s flags: every engine docs/engines.md names, the default model
named after a checkpoint, and settings that cannot serve refused before start."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import pytest

from gateway import cli
from gateway.cli import main, problems, settings_from_args
from gateway.settings import DEFAULT_MODEL, ENGINES


@pytest.mark.parametrize("engine", ENGINES)
def test_every_documented_engine_is_accepted(engine: str) -> None:
    assert settings_from_args(["serve", "--engine", engine], environ={}).engine == engine


@pytest.mark.parametrize("engine", ["vllm", "omni"])
def test_a_checkpoint_names_the_default_model_as_vllm_serve_does(engine: str) -> None:
    s = settings_from_args(["serve", "--engine", engine, "--engine-model", "/models/tiny"], environ={})
    assert s.model == "/models/tiny"


def test_a_model_given_by_flag_or_environment_keeps_its_name() -> None:
    argv = ["serve", "--engine", "vllm", "--engine-model", "/models/tiny"]
    assert settings_from_args([*argv, "--model", "tiny"], environ={}).model == "tiny"
    assert settings_from_args(argv, environ={"OMNI_GATEWAY_MODEL": "tiny"}).model == "tiny"
    env = {"OMNI_GATEWAY_ENGINE": "vllm", "OMNI_GATEWAY_ENGINE_MODEL": "/m"}
    assert settings_from_args(["serve"], environ=env).model == "/m"


def test_the_cascade_keeps_its_model_name() -> None:
    assert settings_from_args(["serve", "--engine-model", "/m"], environ={}).model == DEFAULT_MODEL


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--engine", "remote"], "--engine remote needs at least one --upstream"),
        (["--video-engine", "remote"], "--video-engine remote needs at least one --upstream"),
        (["--host", "0.0.0.0"], "refusing to bind 0.0.0.0 without credentials"),
        (["--keys-file", '{"tenants": [{"name": "a b"}]}'], "the keys file cannot be used: tenants[0].name"),
        (["--keys-file", "/nonexistent/keys.json"], "cannot read keys_file"),
        (["--engine", "vllm"], "--engine vllm loads a model: pass --engine-model PATH"),
        (["--engine", "omni"], "--engine omni loads a model: pass --engine-model PATH"),
        (["--thinker", "vllm"], "--thinker vllm loads a model: pass --engine-model PATH"),
        (["--engine", "omni", "--engine-model", "/m"], "--engine omni needs vLLM-Omni, which is not installed"),
    ],
)
def test_settings_that_cannot_serve_are_refused_before_anything_starts(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = settings_from_args(["serve", *argv], environ={})
    assert any(says in line for line in problems(settings))
    assert main(["serve", *argv]) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    ("environ", "argv", "says"),
    [
        ({"OMNI_GATEWAY_AUTH_REQUIRED": "false"}, ["--api-key", "sk-x"], "while credentials are configured"),
        ({"OMNI_GATEWAY_AUTH_REQUIRED": "false", "OMNI_GATEWAY_JWT_SECRET": "s"}, [], "credentials are configured"),
        ({"OMNI_GATEWAY_AUTH_REQUIRED": "0"}, ["--host", "0.0.0.0", "--api-key", "sk-x"], "AUTH_REQUIRED=false"),
        ({"OMNI_GATEWAY_AUTH_REQUIRED": "false"}, ["--host", "0.0.0.0"], "on 0.0.0.0"),
    ],
)
def test_auth_turned_off_beside_credentials_or_beyond_loopback_refuses_to_start(
    environ: dict[str, str], argv: list[str], says: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Issue 33, finding 10: it used to start, and every anonymous caller was the operator."""
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert any(says in line for line in problems(settings_from_args(["serve", *argv], environ=environ)))
    assert main(["serve", *argv]) == 2
    assert says in capsys.readouterr().err


def test_auth_off_on_loopback_without_credentials_still_starts() -> None:
    settings = settings_from_args(["serve"], environ={"OMNI_GATEWAY_AUTH_REQUIRED": "false"})
    assert not settings.requires_auth and problems(settings) == []


def test_an_unknown_engine_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        settings_from_args(["serve", "--engine", "gpt"], environ={})
    assert exc.value.code == 2
    assert "invalid choice: 'gpt'" in capsys.readouterr().err


def test_settings_the_app_cannot_start_with_exit_3(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.json")
    argv = ["serve", "--engine", "passthrough", "--video-engine", "none", "--models", missing, "--port", "0"]
    assert main(argv) == 3


@pytest.mark.parametrize("argv", [["--help"], ["serve", "--help"]])
def test_help_is_plain_text(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """No reStructuredText markup (the module docstring's double backticks) in what a person reads."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "usage: omni-gateway" in out and "``" not in out


@pytest.mark.parametrize(
    ("argv", "hidden", "says"),
    [
        (["--engine", "vllm", "--engine-model", "/m"], "vllm", "--engine vllm needs vLLM, which is not installed"),
        (["--thinker", "vllm", "--engine-model", "/m"], "vllm", "--thinker vllm needs vLLM, which is not installed"),
        ([], "pocketsphinx", "--engine cascade needs the embedded CPU voice cascade"),
        (["--models", '[{"name": "a", "engine": "vllm", "model": "/m"}]'], "vllm", "the vllm engine needs vLLM"),
    ],
)
def test_an_engine_whose_package_is_missing_is_one_line_saying_what_to_install(
    argv: list[str], hidden: str, says: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As on a machine without the package (tests/docs/test_user_install.py runs the real case:
    ``--engine vllm`` in a fresh venv that has no vLLM)."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(cli.importlib.util, "find_spec", lambda name: None if name == hidden else find_spec(name))
    assert main(["serve", *argv, "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and "pip install 'omni-realtime-gateway[" in err[0], err


def test_a_port_in_use_is_one_line_before_anything_loads(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2  # the cascade: it would take seconds to load
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"omni-gateway: port {port} on 127.0.0.1 is in use (another gateway?): stop what holds it, "
                   "or pick another port with --port (env OMNI_GATEWAY_PORT)"]  # fmt: skip
