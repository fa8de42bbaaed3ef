"""A call's sideband held by a replica that does not serve the call (issue 33, finding 4):
two replicas in this process on one private Redis, an aiortc "browser" calling replica A,
the backend's sideband socket on replica B, relayed over the bus.

- B meters what the sideband sends (the tenant's ``events_per_s`` and input audio limit),
  as A would a sideband of its own: refused messages get their ``error`` and never reach
  the bus;
- a message past ``sideband_relay_max_bytes`` is refused on B; an event larger than that
  reaches the sideband whole (sent in pieces);
- Redis never drops a replica's bus subscription for what one sideband sends, even with a
  pub/sub output buffer limit far below Redis's default (1 MB here): what is in flight
  each way is bounded (``Window``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import orjson
import pytest
import websockets
from aiortc import RTCSessionDescription
from rtc_support import make_browser, wait_for
from support.gateway import RunningGateway, run_gateway
from support.redis_server import REDIS_BINARY, RedisServer
from support.two_tones import sha

from gateway.protocol.errors import Code
from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(180)

KEY = "sk-relay-tenant-91c"
CAP = 64 << 10  # sideband_relay_max_bytes in these tests


@contextlib.asynccontextmanager
async def replicas(limits: dict[str, Any]) -> AsyncIterator[tuple[RunningGateway, RunningGateway, RedisServer]]:
    if not REDIS_BINARY:
        pytest.skip("redis-server is not installed")
    keys = orjson.dumps({"tenants": [{"name": "t", "key_sha256": sha(KEY), "limits": limits}]}).decode()
    with RedisServer() as server:
        base = Settings(engine="passthrough", video_engine="none", redis_url=server.url, keys_file=keys,
                        sideband_relay_max_bytes=CAP, max_conversation_bytes=16 << 20)  # fmt: skip
        engine = PassthroughEngine(paced=False)
        async with (
            run_gateway(replace(base, replica_id="ra"), engine=engine, vad_factory=False) as a,
            run_gateway(replace(base, replica_id="rb"), engine=engine, vad_factory=False) as b,
        ):
            yield a, b, server


@contextlib.asynccontextmanager
async def call_on(gw: RunningGateway) -> AsyncIterator[tuple[str, list[dict[str, Any]], Any]]:
    """A browser's call answered by ``gw``: (call id, what its data channel received, the browser)."""
    browser, offer = await make_browser()
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/sdp"}
            r = await http.post(f"{gw.http}/v1/realtime/calls", content=offer, headers=headers)
        assert r.status_code == 201, r.text
        events: list[dict[str, Any]] = []
        assert browser.channel is not None
        browser.channel.on("message", lambda m: events.append(orjson.loads(m)))
        await browser.pc.setRemoteDescription(RTCSessionDescription(sdp=r.text, type="answer"))
        await wait_for(lambda: any(e["type"] == "session.created" for e in events), "session.created")
        yield r.headers["location"].rsplit("/", 1)[1], events, browser
    finally:
        await browser.close()


@contextlib.asynccontextmanager
async def sideband(gw: RunningGateway, call_id: str) -> AsyncIterator[tuple[Any, list[dict[str, Any]]]]:
    """The backend's socket on ``gw`` (relayed when ``gw`` does not serve the call), reading
    into a list."""
    async with websockets.connect(f"{gw.url}?call_id={call_id}", max_size=None,
                                  additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:  # fmt: skip
        seen: list[dict[str, Any]] = []

        async def read() -> None:
            with contextlib.suppress(websockets.ConnectionClosed):
                async for message in ws:
                    seen.append(orjson.loads(message))

        reader = asyncio.ensure_future(read())
        try:
            yield ws, seen
        finally:
            reader.cancel()


def relayed(b: RunningGateway) -> bool:
    return bool(b.runtime.hosting.links)


def codes(seen: list[dict[str, Any]]) -> list[str]:
    return [e["error"]["code"] for e in seen if e["type"] == "error"]


async def test_a_relayed_sidebands_events_are_metered_where_its_socket_is_held() -> None:
    """Was: 2000 session.update through B against events_per_s 20, all taken."""
    async with replicas({"events_per_s": 5}) as (a, b, _), call_on(a) as (call_id, events, _):
        async with sideband(b, call_id) as (ws, seen):
            await wait_for(lambda: relayed(b), "the relay to open")
            for i in range(30):
                new = {"type": "realtime", "instructions": f"v{i}"}
                update = {"type": "session.update", "event_id": f"u{i}", "session": new}
                await ws.send(orjson.dumps(update).decode())
            await wait_for(lambda: len([e for e in seen if e["type"] in ("session.updated", "error")]) >= 30,
                           "an answer to every update")  # fmt: skip
        refused = codes(seen).count(Code.RATE_LIMIT_EXCEEDED)
        assert refused >= 18, codes(seen)  # at most two clock seconds of 5 (and the socket's own start)
        applied = [e for e in events if e["type"] == "session.updated"]
        assert len(applied) == 30 - refused  # what B refused never reached the call's session


async def test_a_relayed_sidebands_audio_is_metered_in_the_sessions_format() -> None:
    async with replicas({"audio_in_s_per_min": 1}) as (a, b, _), call_on(a) as (call_id, _, _):
        async with sideband(b, call_id) as (ws, seen):
            await wait_for(lambda: relayed(b), "the relay to open")
            half_second = base64.b64encode(bytes(24_000)).decode()  # pcm16 at 24 kHz: 500 ms
            for i in range(6):
                await ws.send(orjson.dumps({"type": "input_audio_buffer.append", "event_id": f"a{i}",
                                            "audio": half_second}).decode())  # fmt: skip
            await wait_for(lambda: codes(seen).count(Code.RATE_LIMIT_EXCEEDED) >= 4, "the input limit to refuse")
        refusals = [e for e in seen if e["type"] == "error"]
        assert [e["error"]["event_id"] for e in refusals] == ["a2", "a3", "a4", "a5"]  # 1 s taken, then refused


async def test_a_message_past_the_relay_cap_is_refused_and_a_large_event_arrives_whole() -> None:
    async with replicas({}) as (a, b, _), call_on(a) as (call_id, events, browser):
        async with sideband(b, call_id) as (ws, seen):
            await wait_for(lambda: relayed(b), "the relay to open")
            big = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x" * (CAP + 1)}]}
            await ws.send(orjson.dumps({"type": "conversation.item.create", "event_id": "big", "item": big}).decode())
            await wait_for(lambda: Code.MESSAGE_TOO_LARGE in codes(seen), "the refusal")
            assert not any(e["type"] == "conversation.item.added" for e in events)
            # The call itself may add a larger item: the sideband sees its event whole.
            text = "y" * (3 * CAP)
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
            browser.channel.send(orjson.dumps({"type": "conversation.item.create", "item": item}).decode())
            await wait_for(lambda: any(e["type"] == "conversation.item.added" for e in seen), "the item, relayed")
            added = next(e for e in seen if e["type"] == "conversation.item.added")
            assert added["item"]["content"][0]["text"] == text


def disconnections(server: RedisServer) -> int:
    """Clients Redis closed for their output buffer (its log says each; Redis 7.0 has no
    counter of them)."""
    return server.log().count("for overcoming of output buffer limits")


async def test_one_sideband_never_makes_redis_drop_a_bus_subscription() -> None:
    """Was: 15 MB relayed messages made Redis drop the owner's subscription (pub/sub output
    buffer limit), and every session's bus traffic with it. Here the limit is 1 MB (hard):
    a sideband on B floods A with messages under the relay cap as fast as it can."""
    import redis

    async with replicas({}) as (a, b, server), call_on(a) as (call_id, events, _):
        client = redis.Redis(port=server.port)
        client.config_set("client-output-buffer-limit", "pubsub 1mb 256kb 5")
        client.close()
        async with sideband(b, call_id) as (ws, seen):
            await wait_for(lambda: relayed(b), "the relay to open")
            huge = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "h" * (3 << 19)}]}
            for i in range(3):  # 1.5 MB each: over the subscription's limit alone (refused on B, never relayed)
                await ws.send(orjson.dumps({"type": "conversation.item.create", "event_id": f"h{i}",
                                            "item": huge}).decode())  # fmt: skip
            text = "z" * (CAP // 2 - 1000)  # (JSON in JSON: about CAP on the bus)
            for i in range(60):
                item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
                await ws.send(orjson.dumps({"type": "conversation.item.create", "event_id": f"f{i}",
                                            "item": item}).decode())  # fmt: skip
            await wait_for(lambda: sum(e["type"] == "conversation.item.added" for e in seen) >= 60,
                           "every item, relayed both ways")  # fmt: skip
            with contextlib.suppress(websockets.ConnectionClosed):
                await ws.send(orjson.dumps({"type": "input_audio_buffer.clear"}).decode())
            await wait_for(lambda: sum(e["type"] == "conversation.item.added" for e in events) >= 60,
                           "the call to see them all")  # fmt: skip
        assert disconnections(server) == 0
