"""GPT-Live's stored sessions (``store: true``) on two replicas that share one Redis: a
closed session's recording downloads from either replica, and a fork carries its
conversation on, on the other replica, as a new session. A session not stored, or
another credential's, is ``session_not_found``."""

from __future__ import annotations

import base64
import struct
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
import websockets
from support.gateway import Client, RunningGateway, connect, run_gateway
from support.redis_server import REDIS_BINARY, RedisServer

from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(90)

KEY = {"Authorization": "Bearer k"}
OTHER = {"Authorization": "Bearer k2"}


@pytest.fixture
async def replicas() -> AsyncIterator[tuple[RunningGateway, RunningGateway]]:
    if not REDIS_BINARY:
        pytest.skip("redis-server is not installed")
    with RedisServer() as server:
        base = Settings(engine="passthrough", redis_url=server.url, api_keys=("k", "k2"), video_engine="none")
        engine = PassthroughEngine(audio_chunks=10, paced=False)
        async with (
            run_gateway(replace(base, replica_id="ra"), engine=engine, vad_factory=None) as a,
            run_gateway(replace(base, replica_id="rb"), engine=engine, vad_factory=None) as b,
        ):
            yield a, b


def live(gw: RunningGateway, path: str = "") -> str:
    return f"ws://127.0.0.1:{gw.port}/v1/live/sessions{path}"


async def said(c: Client, content: str, words: int = 10) -> None:
    """Append commentary and wait until its answer (``words`` words) has been said."""
    mark = len(c.events)
    await c.send({"type": "session.commentary.append", "content": content, "delegation_id": None})

    def spoken() -> int:
        return len("".join(e["delta"] for e in c.events[mark:] if e["type"] == "session.output_transcript.delta")
                   .split())  # fmt: skip

    while spoken() < words:
        await c.recv()


async def closed(c: Client) -> dict[str, Any]:
    await c.send({"type": "session.close"})
    return await c.wait_for("session.closed")


async def test_a_stored_session_s_recording_downloads_from_any_replica(
    replicas: tuple[RunningGateway, RunningGateway],
) -> None:
    a, b = replicas
    async with connect(live(a), headers=KEY) as c:
        await c.send({"type": "session.start", "session": {"model": "gpt-live-1", "store": True}})
        sid = (await c.wait_for("session.started"))["session"]["id"]
        await c.send({"type": "session.input_audio.append", "audio": base64.b64encode(bytes(48000)).decode()})
        await said(c, "one two three")
        audio = b"".join(base64.b64decode(e["delta"]) for e in c.events if e["type"] == "session.output_audio.delta")
        first = next(e for e in c.events if e["type"] == "session.output_transcript.delta")
        await closed(c)
    async with httpx.AsyncClient() as http:
        got = await http.get(f"{b.http}/v1/live/sessions/{sid}/content", headers=KEY)
        assert got.status_code == 200 and got.headers["content-type"] == "audio/wav"
        wav = got.content
        assert wav[:4] == b"RIFF" and wav[8:16] == b"WAVEfmt "
        channels, rate, bits = struct.unpack("<H", wav[22:24])[0], struct.unpack("<I", wav[24:28])[0], wav[34]
        assert (channels, rate, bits) == (1, 24000, 16)
        data = wav[44:]
        silence_ms = first["start_ms"]  # the model spoke after a second of the caller's (silent) audio
        assert silence_ms == 1000
        assert data == bytes(silence_ms * 48) + audio  # its speech, where it said it on the timeline
        for headers in (OTHER, KEY):  # another credential's, and one that does not exist
            sid_ = sid if headers is OTHER else "live_nope"
            refused = await http.get(f"{a.http}/v1/live/sessions/{sid_}/content", headers=headers)
            assert refused.status_code == 404 and refused.json()["error"]["code"] == "session_not_found"
        assert (await http.get(f"{a.http}/v1/live/sessions/{sid}/content")).status_code == 401


async def test_a_session_not_stored_is_forgotten_when_it_closes(
    replicas: tuple[RunningGateway, RunningGateway],
) -> None:
    a, b = replicas
    async with connect(live(a), headers=KEY) as c:
        await c.send({"type": "session.start", "session": {"model": "gpt-live-1"}})
        sid = (await c.wait_for("session.started"))["session"]["id"]
        await closed(c)
    async with httpx.AsyncClient() as http:
        refused = await http.get(f"{b.http}/v1/live/sessions/{sid}/content", headers=KEY)
    assert refused.status_code == 404
    async with connect(live(b, f"/{sid}/fork"), headers=KEY) as f:
        await f.send({"type": "session.start", "event_id": "fk", "session": {}})
        error = await f.wait_for("error")
        assert error["error"]["code"] == "session_not_found" and error["client_event_id"] == "fk"
        with pytest.raises(websockets.ConnectionClosed):
            await f.recv()


async def test_a_fork_carries_the_stored_conversation_on_another_replica(
    replicas: tuple[RunningGateway, RunningGateway],
) -> None:
    a, b = replicas
    history = [{"role": "developer", "content": [{"type": "input_text", "text": "You are terse."}]}]
    async with connect(live(a), headers=KEY) as c:
        await c.send({"type": "session.start", "session": {"model": "gpt-live-1", "store": True, "input": history,
                                                           "instructions": "Be kind."}})  # fmt: skip
        source = (await c.wait_for("session.started"))["session"]
        await c.send({"type": "session.thinking.append", "content": "the user is called Ada", "delegation_id": None})
        await c.wait_for("session.thinking.appended")
        await said(c, "hello Ada")
        kept = [(it.role, it.content[0].text or it.content[0].transcript) for it in
                a.runtime.hosts[source["id"]].session.conversation]  # fmt: skip
        # (the source goes on: a fork reads what the store holds now)
    async with connect(live(b, f"/{source['id']}/fork"), headers=KEY) as f:
        await f.send({"type": "session.start", "session": {"audio": {"format": {"type": "audio/pcmu"}}}})
        started = (await f.wait_for("session.started"))["session"]
        assert started["id"].startswith("live_") and started["id"] != source["id"]
        assert started["model"] == "gpt-live-1" and started["instructions"] == "Be kind."
        assert started["input"] == source["input"] and started["store"] is True
        assert started["audio"]["format"] == {"type": "audio/pcmu", "rate": 8000}
        fork = b.runtime.hosts[started["id"]].session
        assert [(it.role, it.content[0].text or it.content[0].transcript) for it in fork.conversation] == kept
        await said(f, "one two three")  # it goes on, with its own timeline
        await closed(f)
    async with connect(live(b, f"/{source['id']}/fork"), headers=KEY) as f:
        await f.send({"type": "session.start", "session": {"model": "gpt-live-2"}})  # a fork takes no new model
        error = (await f.wait_for("error"))["error"]
        assert (error["code"], error["param"]) == ("unknown_parameter", "session.model")
    async with connect(live(b, f"/{source['id']}/fork"), headers=OTHER) as f:  # not this credential's
        await f.send({"type": "session.start", "session": {}})
        assert (await f.wait_for("error"))["error"]["code"] == "session_not_found"


async def test_a_client_secret_forks_only_a_session_opened_with_a_secret_minted_the_same(
    replicas: tuple[RunningGateway, RunningGateway],
) -> None:
    """Issue 33, finding 5, for the fork: a client secret opens only the session it was
    minted for; the key's stored session is not one (answered as one that does not exist)."""
    a, b = replicas

    async def secret(**session: Any) -> list[str]:
        async with httpx.AsyncClient() as http:
            r = await http.post(f"{a.http}/v1/realtime/client_secrets", headers=KEY,
                                json={"session": {"type": "realtime", "model": "gpt-live-1", **session}})  # fmt: skip
        assert r.status_code == 200, r.text
        return [f"openai-insecure-api-key.{r.json()['value']}"]

    async def stored(**credential: Any) -> str:
        async with connect(live(a), **credential) as c:
            await c.send({"type": "session.start", "session": {"model": "gpt-live-1", "store": True}})
            sid: str = (await c.wait_for("session.started"))["session"]["id"]
            await closed(c)
        return sid

    keyed = await stored(headers=KEY)
    async with connect(live(b, f"/{keyed}/fork"), subprotocols=await secret()) as f:
        await f.send({"type": "session.start", "session": {}})
        assert (await f.wait_for("error"))["error"]["code"] == "session_not_found"
    by_secret = await stored(subprotocols=await secret())
    async with connect(live(b, f"/{by_secret}/fork"), subprotocols=await secret(instructions="Other.")) as f:
        await f.send({"type": "session.start", "session": {}})
        assert (await f.wait_for("error"))["error"]["code"] == "session_not_found"
    async with connect(live(b, f"/{by_secret}/fork"), subprotocols=await secret()) as f:  # minted the same
        await f.send({"type": "session.start", "session": {}})
        assert (await f.wait_for("session.started"))["session"]["id"] != by_secret
