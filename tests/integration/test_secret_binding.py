"""A client secret opens the session it was minted for, and nothing else, over real
sockets: its model (a different ``?model`` is refused, whoever minted it), its settings
in every dialect (GA, beta, duplex), its endpoint (a realtime secret never opens a video
socket, a video secret never a realtime one); and minting is bounded per tenant: the
size of what is stored, the secrets outstanding, the mints per minute."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
import websockets
from support.gateway import Client, RunningGateway, connect, run_gateway
from support.two_tones import KEY_PROTO, ROUTES, sha

from gateway.protocol.errors import Code
from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(90)

OPERATOR, ACME, BETA = "sk-bind-operator-7a1", "sk-bind-acme-2b9", "sk-bind-beta-5c4"
KEYS = orjson.dumps({"tenants": [
    {"name": "acme", "key_sha256": sha(ACME), "limits": {"max_secrets": 2}},
    {"name": "beta", "key_sha256": sha(BETA), "limits": {"secret_mints_per_min": 3, "max_secret_bytes": 2048}},
]}).decode()  # fmt: skip


def settings(**kwargs: Any) -> Settings:
    kwargs.setdefault("video_engine", "none")
    return Settings(engine="passthrough", model="tone-a", models=ROUTES, api_keys=(OPERATOR,), keys_file=KEYS,
                    detach_grace_s=0.2, drain_window_s=0.2, **kwargs)  # fmt: skip


@pytest.fixture
async def gw() -> AsyncIterator[RunningGateway]:
    async with run_gateway(settings(), engine=PassthroughEngine(audio_chunks=2, paced=False), vad_factory=None) as gw:
        yield gw


async def mint(gw: RunningGateway, session: dict[str, Any] | None = None, *, key: str = ACME) -> httpx.Response:
    body = {"session": session} if session is not None else {}
    async with httpx.AsyncClient(base_url=gw.http) as http:
        return await http.post("/v1/realtime/client_secrets", headers={"Authorization": f"Bearer {key}"}, json=body)


async def secret(gw: RunningGateway, session: dict[str, Any] | None = None, *, key: str = ACME) -> str:
    r = await mint(gw, session, key=key)
    assert r.status_code == 200, r.text
    value: str = r.json()["value"]
    return value


async def refused_after_accept(c: Client, code: str, close: int) -> dict[str, Any]:
    """An ``error`` with ``code``, then the close ``close``, and never a session; the error's
    body (nested in OpenAI's dialects, flat in the video protocol's)."""
    first = await c.recv()
    assert first["type"] == "error", first
    err: dict[str, Any] = first.get("error", first)
    assert err["code"] == code, first
    with pytest.raises(websockets.ConnectionClosed) as info:
        while True:
            await asyncio.wait_for(c.ws.recv(), 5)
    assert info.value.rcvd is not None and info.value.rcvd.code == close
    assert "session.created" not in c.types()
    return err


BOUND = {"type": "realtime", "model": "tone-b", "instructions": "Only tone-b.", "output_modalities": ["text"]}


async def test_a_secret_opens_its_minted_model_and_settings_and_refuses_another_model(gw: RunningGateway) -> None:
    s = await secret(gw, BOUND)
    async with connect(gw.url + "?model=tone-a", subprotocols=["realtime", KEY_PROTO + s]) as c:
        err = await refused_after_accept(c, Code.MODEL_NOT_ALLOWED, 4003)
        assert "tone-b" in err["message"]  # it says which model the secret opens
    for url in (gw.url, gw.url + "?model=tone-b"):  # no model named, or the same one: the minted session
        s = await secret(gw, BOUND)
        async with connect(url, subprotocols=["realtime", KEY_PROTO + s]) as c:
            created = await c.wait_for("session.created")
            assert created["session"]["model"] == "tone-b"
            assert created["session"]["instructions"] == "Only tone-b."
            assert created["session"]["output_modalities"] == ["text"]


async def test_an_operator_secret_is_bound_to_its_model_too(gw: RunningGateway) -> None:
    s = await secret(gw, key=OPERATOR)  # no session: the default model, as the mint's answer says
    async with connect(gw.url + "?model=tone-b", subprotocols=["realtime", KEY_PROTO + s]) as c:
        await refused_after_accept(c, Code.MODEL_NOT_ALLOWED, 4003)


async def test_the_beta_dialect_opens_the_minted_session(gw: RunningGateway) -> None:
    s = await secret(gw, BOUND)
    async with connect(gw.url + "?model=tone-a", subprotocols=["openai-beta.realtime-v1", KEY_PROTO + s]) as c:
        await refused_after_accept(c, Code.MODEL_NOT_ALLOWED, 4003)
    s = await secret(gw, BOUND)
    async with connect(gw.url, subprotocols=["openai-beta.realtime-v1", KEY_PROTO + s]) as c:
        created = await c.wait_for("session.created")
        assert created["session"]["model"] == "tone-b"
        assert created["session"]["instructions"] == "Only tone-b."


async def test_the_duplex_dialect_opens_the_minted_session(gw: RunningGateway) -> None:
    s = await secret(gw, BOUND)
    async with connect(gw.url + "?duplex=1&model=tone-a", subprotocols=[KEY_PROTO + s]) as c:
        await refused_after_accept(c, Code.MODEL_NOT_ALLOWED, 4003)
    s = await secret(gw, BOUND)  # opened at connect
    async with connect(gw.url + "?duplex=1&model=tone-b", subprotocols=[KEY_PROTO + s]) as c:
        created = await c.wait_for("session.created")
        assert created["session"]["model"] == "tone-b"
        assert created["session"]["instructions"] == "Only tone-b."
        assert created["session"]["modalities"] == ["text"]
    s = await secret(gw, BOUND)  # opened by the first session.update: the minted settings under it
    async with connect(gw.url + "?duplex=1", subprotocols=[KEY_PROTO + s]) as c:
        await c.send({"type": "session.update", "session": {"voice": "alloy"}})
        created = await c.wait_for("session.created")
        assert created["session"]["model"] == "tone-b"
        assert created["session"]["instructions"] == "Only tone-b."
    s = await secret(gw, BOUND)  # ... which may not name another model
    async with connect(gw.url + "?duplex=1", subprotocols=[KEY_PROTO + s]) as c:
        await c.send({"type": "session.update", "session": {"model": "tone-a"}})
        await refused_after_accept(c, Code.MODEL_NOT_ALLOWED, 4003)


async def test_a_realtime_secret_never_opens_video_nor_a_video_secret_realtime() -> None:
    async with run_gateway(settings(video_engine="cpu"), engine=PassthroughEngine(paced=False),
                           vad_factory=None) as gw:  # fmt: skip
        video_url = gw.url + "/video"
        s = await secret(gw, BOUND)
        async with connect(video_url, subprotocols=[KEY_PROTO + s]) as c:
            err = await refused_after_accept(c, Code.CLIENT_SECRET_WRONG_TYPE, 4003)
            assert "video" in err["message"]
        minted = await mint(gw, {"type": "video"})
        assert minted.status_code == 200, minted.text
        assert minted.json()["session"] == {"type": "video", "model": "cpu-video"}
        async with connect(gw.url, subprotocols=["realtime", KEY_PROTO + minted.json()["value"]]) as c:
            await refused_after_accept(c, Code.CLIENT_SECRET_WRONG_TYPE, 4003)
        s = await secret(gw, {"type": "video"})
        async with connect(video_url, subprotocols=[KEY_PROTO + s]) as c:
            await c.send({"type": "session.start", "prompt": "a fox", "width": 64, "height": 48, "num_frames": 2})
            started = await c.wait_for("video.start")
            assert started["type"] == "video.start"
        r = await mint(gw, {"type": "video", "model": "another"})
        assert r.status_code == 400 and r.json()["error"]["code"] == Code.MODEL_NOT_FOUND


# --- minting is bounded per tenant ----------------------------------------------------------


async def test_secrets_outstanding_are_bounded_per_tenant(gw: RunningGateway) -> None:
    first, _ = await secret(gw), await secret(gw)  # acme: max_secrets 2
    r = await mint(gw)
    assert r.status_code == 429
    err = r.json()["error"]
    assert (err["type"], err["code"]) == ("invalid_request_error", Code.RATE_LIMIT_EXCEEDED)
    assert "2" in err["message"]
    assert (await mint(gw, key=BETA)).status_code == 200  # another tenant's count
    async with connect(gw.url, subprotocols=["realtime", KEY_PROTO + first]) as c:  # one used: one more
        await c.wait_for("session.created")
    assert (await mint(gw)).status_code == 200


async def test_mints_per_minute_are_bounded_per_tenant(gw: RunningGateway) -> None:
    for _ in range(3):  # beta: secret_mints_per_min 3, however many were used
        s = await secret(gw, key=BETA)
        async with connect(gw.url, subprotocols=["realtime", KEY_PROTO + s]) as c:
            await c.wait_for("session.created")
    r = await mint(gw, key=BETA)
    assert r.status_code == 429
    assert r.json()["error"]["code"] == Code.RATE_LIMIT_EXCEEDED
    assert int(r.headers["retry-after"]) >= 1


async def test_what_a_secret_stores_is_bounded(gw: RunningGateway) -> None:
    r = await mint(gw, {"type": "realtime", "instructions": "x" * 3000}, key=BETA)  # beta: 2048 bytes
    assert r.status_code == 400
    err = r.json()["error"]
    assert (err["code"], err["param"]) == (Code.CLIENT_SECRET_TOO_LARGE, "session")
    assert "2048" in err["message"]
    assert (await mint(gw, {"type": "realtime", "instructions": "x" * 1000}, key=BETA)).status_code == 200
    # the default bound (64 KiB) holds for everyone else, the operator too
    r = await mint(gw, {"type": "realtime", "instructions": "x" * 100_000}, key=OPERATOR)
    assert r.status_code == 400 and r.json()["error"]["code"] == Code.CLIENT_SECRET_TOO_LARGE
