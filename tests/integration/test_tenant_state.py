"""A tenant cannot fill the shared Redis (issue 21, item 3): two replicas on one Redis,
real sockets, a tenant whose sessions may hold 2 MiB of state. The attack (open a
session, give it the longest instructions, close it, again, alternating replicas) is
stopped at the limit with ``rate_limit_exceeded`` and close 4029, while what Redis
holds for the tenant stays within the bound; sessions kept after their close are
forgotten, oldest first, beyond the tenant's ``max_kept_sessions``."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis
import websockets
from support.gateway import RunningGateway, connect, run_gateway
from support.redis_server import REDIS_BINARY, RedisServer

from gateway.protocol.bounds import MAX_INSTRUCTIONS_BYTES
from gateway.protocol.errors import Code
from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(90)

KEY = "sk-state-tenant"
PRINCIPAL = "tenant:acme"
LIMIT = 2 << 20  # max_state_mib 2
LONGEST = "x" * MAX_INSTRUCTIONS_BYTES


def keys_file(**limits: Any) -> str:
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    return orjson.dumps({"tenants": [{"name": "acme", "key_sha256": digest, "limits": limits}]}).decode()


@pytest.fixture
async def redis_server() -> AsyncIterator[RedisServer]:
    if not REDIS_BINARY:
        pytest.skip("redis-server is not installed")
    with RedisServer() as server:
        yield server


@contextlib.asynccontextmanager
async def two_replicas(server: RedisServer, **settings: Any) -> AsyncIterator[tuple[RunningGateway, RunningGateway]]:
    base = Settings(engine="passthrough", redis_url=server.url, video_engine="none", **settings)
    engine = PassthroughEngine(audio_chunks=5, paced=False)
    async with (
        run_gateway(replace(base, replica_id="ra"), engine=engine, vad_factory=None) as a,
        run_gateway(replace(base, replica_id="rb"), engine=engine, vad_factory=None) as b,
    ):
        yield a, b


async def redis_bytes(server: RedisServer) -> int:
    """What Redis itself holds in session keys (MEMORY USAGE: values and its overhead)."""
    client = aioredis.Redis.from_url(server.url)
    try:
        total = 0
        async for key in client.scan_iter(match="omni:s:*", count=1000):
            total += await client.memory_usage(key) or 0
        return total
    finally:
        await client.aclose()


async def open_with_instructions(gw: RunningGateway) -> dict[str, Any]:
    """A session with the longest instructions, then its socket closed: the first event
    the gateway sent (``session.created``, or the refusal)."""
    async with connect(gw.url, headers={"Authorization": f"Bearer {KEY}"}) as c:
        first = await c.recv()
        if first["type"] != "session.created":
            with pytest.raises(websockets.ConnectionClosed) as info:
                await asyncio.wait_for(c.ws.recv(), 5)
            assert info.value.rcvd is not None
            return {**first, "close": info.value.rcvd.code}
        await c.send({"type": "session.update", "session": {"type": "realtime", "instructions": LONGEST}})
        await c.wait_for("session.updated")
        return first


async def test_open_and_close_with_long_instructions_is_stopped_at_the_tenant_state_limit(
    redis_server: RedisServer,
) -> None:
    async with two_replicas(redis_server, api_keys=("op",), keys_file=keys_file(max_state_mib=2,
                            max_sessions=5)) as (a, b):  # fmt: skip
        opened = 0
        refusal: dict[str, Any] | None = None
        for i in range(40):  # each session holds its instructions twice: ~256 KiB; 2 MiB is ~8
            first = await open_with_instructions((a, b)[i % 2])
            if first["type"] == "session.created":
                opened += 1
                continue
            refusal = first
            break
        assert refusal is not None, f"{opened} sessions opened, none refused"
        assert refusal["type"] == "error" and refusal["error"]["code"] == Code.RATE_LIMIT_EXCEEDED
        assert "2 MiB" in refusal["error"]["message"] and refusal["close"] == 4029
        assert 4 <= opened <= 9, opened
        held = await a.runtime.store.state_held(PRINCIPAL)
        one_session = 2 * MAX_INSTRUCTIONS_BYTES + (32 << 10)  # the last one admitted grew after its admission
        assert held.bytes <= LIMIT + one_session
        # What Redis holds, its overhead included (its allocator rounds a 128 KiB value up to 160 KiB)
        assert await redis_bytes(redis_server) <= 1.3 * (LIMIT + one_session)
        # Refused on the other replica too, and for as long as the sessions are served.
        again = await open_with_instructions(b)
        assert again["type"] == "error" and again["close"] == 4029


async def kept_settles(gw: RunningGateway, n: int) -> None:
    """Wait until the tenant's sessions are ``n``, all kept (their grace over)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while (held := await gw.runtime.store.state_held(PRINCIPAL)) != (held.bytes, n, n) and (
        held.sessions,
        held.kept,
    ) != (n, n):
        assert loop.time() < deadline, held
        await asyncio.sleep(0.05)


async def test_sessions_kept_after_their_close_are_forgotten_oldest_first(redis_server: RedisServer) -> None:
    async with two_replicas(redis_server, api_keys=("op",), detach_grace_s=0.1,
                            keys_file=keys_file(max_state_mib=1, max_kept_sessions=2)) as (a, b):  # fmt: skip
        created = []
        for i in range(6):  # 6 x ~256 KiB: past 1 MiB, but each closes and is kept, never refused
            first = await open_with_instructions((a, b)[i % 2])
            assert first["type"] == "session.created", first
            created.append(first)
            await kept_settles(a, min(i + 1, 2))
        held = await b.runtime.store.state_held(PRINCIPAL)
        assert (held.sessions, held.kept) == (2, 2) and held.bytes <= 1 << 20
        assert await redis_bytes(redis_server) <= 1.3 * (1 << 20)
        # The oldest is gone (its resume: session_not_found); the newest resumes.
        for first, found in ((created[0], False), (created[-1], True)):
            async with connect(b.url, headers={"Authorization": f"Bearer {KEY}"}) as c:
                await c.wait_for("session.created")
                await c.send({"type": "session.resume", "session_id": first["session"]["id"],
                              "resume_token": first["resume_token"], "last_received_server_event_seq": 1})  # fmt: skip
                answer = await c.wait_for(lambda e: e["type"] in ("session.resumed", "error"))
                assert (answer["type"] == "session.resumed") == found, answer
                if not found:
                    assert answer["error"]["code"] == Code.SESSION_NOT_FOUND
