"""A client secret opens only the session it was minted for (issue 33, finding 5), over real
sockets, on one replica and across two on one Redis:

- no sideband (``?call_id=``) with a secret, and no sideband at all beside a session no
  WebRTC call carried (a plain socket's id spelled ``rtc_<suffix>``): answered as a call
  that does not exist;
- a resume with a secret takes only a session opened with a secret minted for the same
  session (endpoint, model, settings): a session a key opened, or one minted otherwise,
  is ``session_not_found`` however good the resume token; the key (or token) of the
  session's principal resumes any of its sessions, and an honest reconnect (a fresh
  secret minted as the first was) resumes its own.

The WebRTC side (a real call's sideband) is in tests/webrtc/test_calls.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
import websockets
from support.gateway import Client, RunningGateway, connect, run_gateway
from support.redis_server import REDIS_BINARY, RedisServer
from support.two_tones import KEY_PROTO

from gateway.protocol.errors import CloseCode, Code
from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(90)

KEY = "sk-secret-sessions-6d1"
BEARER = {"Authorization": f"Bearer {KEY}"}
SESSION_A = {"type": "realtime", "instructions": "You help Alice."}
SESSION_B = {"type": "realtime", "instructions": "You help Bob."}


def settings(**kwargs: Any) -> Settings:
    return Settings(engine="passthrough", video_engine="none", api_keys=(KEY,), detach_grace_s=30, **kwargs)


@pytest.fixture
async def gw() -> AsyncIterator[RunningGateway]:
    async with run_gateway(settings(), engine=PassthroughEngine(paced=False), vad_factory=None) as gw:
        yield gw


async def mint(gw: RunningGateway, session: dict[str, Any]) -> str:
    async with httpx.AsyncClient(base_url=gw.http) as http:
        r = await http.post("/v1/realtime/client_secrets", headers=BEARER, json={"session": session})
    assert r.status_code == 200, r.text
    value: str = r.json()["value"]
    return value


def with_secret(secret: str) -> dict[str, Any]:
    return {"subprotocols": ["realtime", KEY_PROTO + secret]}


async def opened(gw: RunningGateway, credential: dict[str, Any]) -> tuple[str, str, int]:
    """A session opened and left (its socket closed): (id, resume token, last seq)."""
    async with connect(gw.url, **credential) as c:
        created = await c.wait_for("session.created")
        return created["session"]["id"], created["resume_token"], created["server_event_seq"]


async def resume(gw: RunningGateway, credential: dict[str, Any], sid: str, token: str, last: int) -> dict[str, Any]:
    """session.resume on a fresh socket: session.resumed, or the error that refused it."""
    async with connect(gw.url + "?resume=1", **credential) as c:
        await c.send({"type": "session.resume", "session_id": sid, "resume_token": token,
                      "last_received_server_event_seq": last})  # fmt: skip
        answer = await c.wait_for(lambda e: e["type"] in ("session.resumed", "error"))
        return answer


async def refused(c: Client, code: str, close: int) -> None:
    err = await c.wait_for("error")
    assert err["error"]["code"] == code, err
    with pytest.raises(websockets.ConnectionClosed) as info:
        while True:
            await c.ws.recv()
    assert info.value.rcvd is not None and info.value.rcvd.code == close


async def test_a_plain_sessions_id_spelled_as_a_call_opens_no_sideband(gw: RunningGateway) -> None:
    """Was: ?call_id=rtc_<suffix of its sess_ id> joined any session, read its events."""
    async with connect(gw.url, headers=BEARER) as owner:
        created = await owner.wait_for("session.created")
        call_id = "rtc_" + created["session"]["id"].removeprefix("sess_")
        async with connect(f"{gw.url}?call_id={call_id}", headers=BEARER) as sideband:
            await refused(sideband, Code.CALL_NOT_FOUND, CloseCode.UNKNOWN_CALL)


async def test_a_client_secret_opens_no_sideband(gw: RunningGateway) -> None:
    async with connect(gw.url, headers=BEARER) as owner:
        created = await owner.wait_for("session.created")
        call_id = "rtc_" + created["session"]["id"].removeprefix("sess_")
        secret = await mint(gw, SESSION_A)
        async with connect(f"{gw.url}?call_id={call_id}", **with_secret(secret)) as sideband:
            await refused(sideband, Code.CLIENT_SECRET_WRONG_TYPE, CloseCode.FORBIDDEN)


async def test_a_secret_resumes_no_session_a_key_opened(gw: RunningGateway) -> None:
    sid, token, last = await opened(gw, {"headers": BEARER})
    answer = await resume(gw, with_secret(await mint(gw, SESSION_A)), sid, token, last)
    assert answer["type"] == "error" and answer["error"]["code"] == Code.SESSION_NOT_FOUND, answer
    answer = await resume(gw, {"headers": BEARER}, sid, token, last)  # its principal's key: yes
    assert answer["type"] == "session.resumed", answer


async def test_a_secret_resumes_only_a_session_minted_as_it_was(gw: RunningGateway) -> None:
    sid, token, last = await opened(gw, with_secret(await mint(gw, SESSION_A)))
    answer = await resume(gw, with_secret(await mint(gw, SESSION_B)), sid, token, last)
    assert answer["type"] == "error" and answer["error"]["code"] == Code.SESSION_NOT_FOUND, answer
    answer = await resume(gw, with_secret(await mint(gw, SESSION_A)), sid, token, last)  # an honest reconnect
    assert answer["type"] == "session.resumed", answer
    answer = await resume(gw, {"headers": BEARER}, sid, answer["resume_token"], last)  # and the key
    assert answer["type"] == "session.resumed", answer


async def test_the_binding_holds_on_another_replica() -> None:
    if not REDIS_BINARY:
        pytest.skip("redis-server is not installed")
    with RedisServer() as server:
        base = settings(redis_url=server.url)
        engine = PassthroughEngine(paced=False)
        async with (
            run_gateway(replace(base, replica_id="ra"), engine=engine, vad_factory=None) as a,
            run_gateway(replace(base, replica_id="rb"), engine=engine, vad_factory=None) as b,
        ):
            sid, token, last = await opened(a, with_secret(await mint(a, SESSION_A)))
            answer = await resume(b, with_secret(await mint(b, SESSION_B)), sid, token, last)
            assert answer["type"] == "error" and answer["error"]["code"] == Code.SESSION_NOT_FOUND, answer
            answer = await resume(b, with_secret(await mint(a, SESSION_A)), sid, token, last)
            assert answer["type"] == "session.resumed", answer
            keyed, keyed_token, keyed_last = await opened(b, {"headers": BEARER})
            answer = await resume(a, with_secret(await mint(a, SESSION_A)), keyed, keyed_token, keyed_last)
            assert answer["type"] == "error" and answer["error"]["code"] == Code.SESSION_NOT_FOUND, answer
