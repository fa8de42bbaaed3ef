"""Write-ahead over real sockets and a private Redis (docs/sessions.md,
"Write-ahead"): an event that changes session state reaches the client only once
Redis holds it in the journal and the snapshot holds the state it announces.

Redis holds every write for a moment (``CLIENT PAUSE WRITE``) just before each
state change, so a state event sent before its commit would reach the client
while Redis still lacks it; on each one the test reads Redis (reads go on during
the pause) and checks. The answer's deltas are not held: they keep streaming.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis
from support.gateway import Client, RunningGateway, connect, run_gateway
from support.redis_server import REDIS_BINARY, RedisServer

from gateway.session.events import LIVE_STATE_EVENTS, REALTIME_STATE_EVENTS, STATE_EVENTS
from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(60)
PAUSE_MS = 150  # each state change waits this long for Redis


@pytest.fixture
async def redis_gateway() -> AsyncIterator[tuple[RunningGateway, aioredis.Redis]]:
    if not REDIS_BINARY:
        pytest.skip("redis-server is not installed")
    with RedisServer() as server:
        settings = Settings(engine="passthrough", redis_url=server.url)
        engine = PassthroughEngine(audio_chunks=30)
        async with run_gateway(settings, engine=engine, vad_factory=None) as gw:
            client = aioredis.from_url(server.url)
            try:
                yield gw, client
            finally:
                await client.aclose()


class Checker:
    """Reads what Redis holds for the session whenever a state event arrives."""

    def __init__(self, redis: aioredis.Redis, session_id: str) -> None:
        self.redis = redis
        self.sid = session_id
        self.checked: list[str] = []
        self.problems: list[str] = []

    async def check(self, event: dict[str, Any]) -> None:
        if event["type"] not in STATE_EVENTS and event["type"] != "conversation.item.created":
            return
        seq = event["server_event_seq"]
        last = int(await self.redis.hget(f"omni:s:{{{self.sid}}}:meta", "last") or 0)
        raw = await self.redis.get(f"omni:s:{{{self.sid}}}:snap")
        snap_seq = orjson.loads(raw)["seq"] if raw else 0
        self.checked.append(event["type"])
        if last < seq or snap_seq < seq:
            self.problems.append(f"{event['type']} seq {seq}: journal at {last}, snapshot at {snap_seq}")

    async def until(self, c: Client, kind: str) -> dict[str, Any]:
        while True:
            event = await c.recv()
            await self.check(event)
            if event["type"] == kind:
                return event


async def pause_writes(redis: aioredis.Redis) -> None:
    await redis.execute_command("CLIENT", "PAUSE", str(PAUSE_MS), "WRITE")


async def test_every_state_event_reaches_the_client_after_redis_holds_it(
    redis_gateway: tuple[RunningGateway, aioredis.Redis],
) -> None:
    gw, redis = redis_gateway
    await pause_writes(redis)
    async with connect(gw.url) as c:
        created = await c.wait_for("session.created")
        check = Checker(redis, created["session"]["id"])
        await check.check(created)  # its resume token resumes the session anywhere

        async def step(event: dict[str, Any], until: str) -> dict[str, Any]:
            await pause_writes(redis)
            await c.send(event)
            return await check.until(c, until)

        update = {"type": "realtime", "instructions": "brief", "audio": {"input": {"turn_detection": None}}}
        await step({"type": "session.update", "session": update}, "session.updated")
        audio = base64.b64encode(b"\x00\x00" * 4800).decode()  # 200 ms of silence
        await c.send({"type": "input_audio_buffer.append", "audio": audio})
        await step({"type": "input_audio_buffer.commit"}, "conversation.item.done")
        text = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
        added = await step({"type": "conversation.item.create", "item": text}, "conversation.item.done")
        await step({"type": "response.create"}, "response.output_audio.delta")
        deltas = 0
        while True:  # the deltas stream; response.done waits for Redis again
            event = await c.recv()
            await check.check(event)
            deltas += event["type"] == "response.output_audio.delta"
            if deltas == 25:
                await pause_writes(redis)
            if event["type"] == "response.done":
                done = event
                break
        answer = done["response"]["output"][0]["id"]
        truncate = {"type": "conversation.item.truncate", "item_id": answer, "content_index": 0, "audio_end_ms": 20}
        await step(truncate, "conversation.item.truncated")
        await step({"type": "conversation.item.delete", "item_id": added["item"]["id"]}, "conversation.item.deleted")
    async with connect(gw.url, headers={"OpenAI-Beta": "realtime=v1"}) as beta:  # the beta's transcription update
        created = await beta.wait_for("session.created")
        check.sid = created["session"]["id"]
        await pause_writes(redis)
        update = {"input_audio_transcription": {"model": "whisper-1"}, "turn_detection": None}
        await beta.send({"type": "transcription_session.update", "session": update})
        await check.until(beta, "transcription_session.updated")
    assert check.problems == []
    never = REALTIME_STATE_EVENTS - set(check.checked)
    assert not never, f"never checked: {never}"


async def test_every_live_state_event_reaches_the_client_after_redis_holds_it(
    redis_gateway: tuple[RunningGateway, aioredis.Redis],
) -> None:
    """The same for GPT-Live (docs/live.md, "Resume"): each of its state events waits for Redis."""
    gw, redis = redis_gateway
    async with connect(f"ws://127.0.0.1:{gw.port}/v1/live/sessions") as c:
        await pause_writes(redis)
        # (stored: its state outlives session.closed, which the test then checks too)
        await c.send({"type": "session.start", "session": {"model": "gpt-live-1", "store": True}})
        started = await c.wait_for("session.started")
        check = Checker(redis, started["session"]["id"])
        await check.check(started)

        async def step(event: dict[str, Any], until: str) -> dict[str, Any]:
            await pause_writes(redis)
            await c.send(event)
            return await check.until(c, until)

        await step({"type": "session.input_audio.mute"}, "session.input_audio.muted")
        await step({"type": "session.input_audio.unmute"}, "session.input_audio.unmuted")
        await step({"type": "session.update", "session": {"triggers": []}}, "session.updated")
        for kind in ("instructions", "thinking", "commentary"):
            await step({"type": f"session.{kind}.append", "content": "x", "delegation_id": None},
                       f"session.{kind}.appended")  # fmt: skip
        fixture = base64.b64encode(b"\x00\x00" * 2400).decode()  # 100 ms
        await step({"type": "session.output_audio.fixture.play", "audio": fixture},
                   "session.output_audio.fixture.played")  # fmt: skip
        await step({"type": "session.close"}, "session.closed")
    assert check.problems == []
    never = LIVE_STATE_EVENTS - {"session.delegation.created"} - set(check.checked)  # (delegation: its own test)
    assert not never, f"never checked: {never}"


async def test_while_redis_holds_writes_the_state_event_waits(
    redis_gateway: tuple[RunningGateway, aioredis.Redis],
) -> None:
    """The converse, so the test above cannot pass by luck: during a long pause, the
    client gets nothing for its item until Redis takes the write."""
    gw, redis = redis_gateway
    async with connect(gw.url) as c:
        await c.wait_for("session.created")
        await asyncio.sleep(0.1)
        await redis.execute_command("CLIENT", "PAUSE", "600", "WRITE")
        loop = asyncio.get_running_loop()
        sent = loop.time()
        text = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
        await c.send({"type": "conversation.item.create", "item": text})
        added = await c.wait_for("conversation.item.added")
        waited = loop.time() - sent
    assert added["item"]["role"] == "user"
    assert waited >= 0.4, f"conversation.item.added arrived {waited * 1000:.0f} ms after the send, while Redis paused"
