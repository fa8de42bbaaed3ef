"""No key reaches a log at any level: every record of every logger is redacted
where it is made (gateway/logs.py), children of the filtered loggers included."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import httpx
import pytest
from support.gateway import connect, run_gateway
from support.serve import text_turn

from gateway import logs
from gateway.settings import Settings

FRONT_KEY = "sk-front-7d1c9e2a44"
UPSTREAM_KEY = "sk-upstream-b3f08a61c5"


@pytest.fixture
def debug_log() -> Iterator[io.StringIO]:
    """Everything logged, at DEBUG, by every logger, as a handler would write it."""
    logs.install()
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def test_a_child_logger_a_traceback_and_a_registered_secret_are_redacted(debug_log: io.StringIO) -> None:
    logs.register_secret("plain-secret-value")
    logging.getLogger("websockets.client").debug("> Authorization: Bearer %s", "sk-abc123")
    logging.getLogger("some.library").info("config has plain-secret-value inside")
    try:
        raise ValueError("bad header openai-insecure-api-key.sk-zzz999 and ek_abcdefghij12")
    except ValueError:
        logging.getLogger("omni.x").exception("failed")
    logging.getLogger("omni.y").warning("token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1c2VyIn0.c2lnbmF0dXJl")
    text = debug_log.getvalue()
    for secret in ("sk-abc123", "plain-secret-value", "sk-zzz999", "ek_abcdefghij12", "eyJhbGciOiJIUzI1NiJ9"):
        assert secret not in text
    assert text.count(logs.REDACTED) >= 5
    assert "ValueError" in text  # the traceback itself is kept


async def test_debug_logs_of_a_remote_engine_session_hold_no_key(debug_log: io.StringIO) -> None:
    """The front gateway (keys, remote engine) sends its upstream key on every
    upstream socket; both gateways log at DEBUG; a client secret is minted and used."""
    upstream_settings = Settings(engine="passthrough", api_keys=(UPSTREAM_KEY,), video_engine="none")
    async with run_gateway(upstream_settings, vad_factory=None) as up:
        front = Settings(engine="remote", upstreams=(up.http,), upstream_api_key=UPSTREAM_KEY,
                         api_keys=(FRONT_KEY,), video_engine="none", log_level="debug")  # fmt: skip
        async with run_gateway(front, vad_factory=None) as gw:
            response = await text_turn(gw.url, headers={"Authorization": f"Bearer {FRONT_KEY}"})
            assert response["status"] == "completed", response
            async with httpx.AsyncClient(base_url=gw.http) as http:
                minted = await http.post(
                    "/v1/realtime/client_secrets", headers={"Authorization": f"Bearer {FRONT_KEY}"}, json={}
                )
            secret = minted.json()["value"]
            async with connect(gw.url, subprotocols=["realtime", f"openai-insecure-api-key.{secret}"]) as c:
                created = await c.wait_for("session.created")
            token = created["session"].get("resume_token") or created.get("resume_token")
    text = debug_log.getvalue()
    assert "websockets" in text and "DEBUG" in text  # the libraries' debug logging was on
    assert "Authorization: Bearer " + logs.REDACTED in text  # ... and did log the upstream header
    for value in (FRONT_KEY, UPSTREAM_KEY, secret, token):
        assert value and value not in text
