"""Two tenants with different limits share three replicas (deploy/local_cluster.py:
Redis, three gateways, nginx) and each gets exactly its limits: open sessions,
session starts per minute, client events per second and input audio per minute,
counted in Redis whichever replica a socket lands on.

Sockets are opened on the replicas directly (r0, r1, r2 in turn), so that every
limit is proven with its sockets spread over all three; the last part goes
through nginx, as a user would."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import orjson
import pytest
import websockets
from conftest import redis_clients
from support.gateway import Client, connect

from deploy.local_cluster import Cluster

pytestmark = pytest.mark.timeout(240)

A_KEY, B_KEY = "sk-cluster-tenant-a", "sk-cluster-tenant-b"
A = {"max_sessions": 3, "session_starts_per_min": 8, "events_per_s": 10, "audio_in_s_per_min": 2}
B = {"max_sessions": 1, "session_starts_per_min": 4, "events_per_s": 4, "audio_in_s_per_min": 0.5}
PCM_MS = 24  # samples per ms, audio/pcm at 24 kHz


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


KEYS_FILE = orjson.dumps({"tenants": [
    {"name": "tenant-a", "key_sha256": sha(A_KEY), "limits": A},
    {"name": "tenant-b", "key_sha256": sha(B_KEY), "limits": B},
]}).decode()  # fmt: skip


@pytest.fixture(scope="module")
def cluster(cluster_binaries: None, redis_topology: str) -> Iterator[Cluster]:
    env = {"OMNI_GATEWAY_VIDEO_ENGINE": "none", "OMNI_GATEWAY_KEYS_FILE": KEYS_FILE,
           "OMNI_GATEWAY_DRAIN_WINDOW_S": "0.5", "OMNI_GATEWAY_DETACH_GRACE_S": "0.5"}  # fmt: skip
    with Cluster(replicas=3, engine="passthrough", env=env, redis=redis_topology) as c:
        yield c


@pytest.fixture
async def redis(cluster: Cluster) -> AsyncIterator[Any]:
    clients = redis_clients(cluster.redis_url)  # a cluster's TIME: any node's (one machine's clock here)
    try:
        yield clients.redis
    finally:
        await clients.close()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def redis_ms(redis: Any) -> int:
    seconds, micros = await redis.time()  # the clock every replica's limits count on
    return int(seconds) * 1000 + int(micros) // 1000


async def room_in_window(redis: Any, window_ms: int, room_ms: int) -> None:
    """Wait, if need be, until at least ``room_ms`` of the current window lie ahead."""
    left = window_ms - await redis_ms(redis) % window_ms
    if left < room_ms:
        await asyncio.sleep(left / 1000 + 0.02)


async def next_window(redis: Any, window_ms: int) -> None:
    """Wait until a fresh window has begun (nothing sent so far counts in it)."""
    await asyncio.sleep((window_ms - await redis_ms(redis) % window_ms) / 1000 + 0.02)


async def opened(stack: contextlib.AsyncExitStack, url: str, key: str) -> Client:
    c = await stack.enter_async_context(connect(url, headers=bearer(key)))
    await c.wait_for("session.created")
    return c


async def refused(url: str, key: str, says: str) -> None:
    async with connect(url, headers=bearer(key)) as c:
        first = await c.recv()
        assert first["type"] == "error" and first["error"]["code"] == "rate_limit_exceeded", first
        assert says in first["error"]["message"]
        with pytest.raises(websockets.ConnectionClosed) as info:
            await asyncio.wait_for(c.ws.recv(), 5)
        assert info.value.rcvd is not None and info.value.rcvd.code == 4029


async def manual_turns(c: Client) -> None:
    session = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
    await c.send({"type": "session.update", "session": session})
    await c.wait_for("session.updated")


async def answers(c: Client, n: int, kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    return [await c.wait_for(lambda e: e["type"] in kinds, timeout=10) for _ in range(n)]


@pytest.mark.parametrize("redis_topology", ["single", "cluster"], indirect=True)
async def test_two_tenants_each_get_exactly_their_limits_across_three_replicas(cluster: Cluster, redis: Any) -> None:
    r = [replica.url for replica in cluster.replicas]
    await room_in_window(redis, 60_000, 25_000)  # the starts and the audio below (~10 s) fit in one minute

    async with contextlib.AsyncExitStack() as stack:
        # --- open sessions: A has 3, one on each replica; B has 1 -----------------------------
        a = [await opened(stack, r[i], A_KEY) for i in range(3)]  # A's starts: 3
        b = await opened(stack, r[1], B_KEY)  # B's starts: 1
        await refused(r[0], A_KEY, "3 sessions open")  # (a refusal starts nothing)
        await refused(r[2], B_KEY, "1 sessions open")
        for c in (*a, b):
            await manual_turns(c)

        # --- client events per second: A 10 over three replicas at once, B 4 ------------------
        await next_window(redis, 1_000)
        for i in range(6):
            for c in (*a, b):
                await c.send({"type": "input_audio_buffer.clear", "event_id": f"ev{i}"})
        got = [await answers(c, 6, ("input_audio_buffer.cleared", "error")) for c in (*a, b)]
        a_taken = sum(e["type"] == "input_audio_buffer.cleared" for replies in got[:3] for e in replies)
        b_taken = sum(e["type"] == "input_audio_buffer.cleared" for e in got[3])
        assert (a_taken, b_taken) == (10, 4), got
        refusals = [e["error"]["code"] for replies in got for e in replies if e["type"] == "error"]
        assert refusals == ["rate_limit_exceeded"] * (18 - 10 + 6 - 4)
        await next_window(redis, 1_000)  # past that second (the audio below sends 10 of A's events)

        # --- input audio per minute: A 2 s as 500 ms appends on all three, B 0.5 s ------------
        def append(ms: int, event_id: str) -> dict[str, Any]:
            return {"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(ms * PCM_MS * 2)).decode(),
                    "event_id": event_id}  # fmt: skip

        for i, c in enumerate((a[0], a[1], a[2], a[0], a[1])):  # 2.5 s asked; one at a time, in turn
            await c.send(append(500, f"a{i}"))
            await c.send({"type": "input_audio_buffer.clear", "event_id": f"sync{i}"})
            await c.wait_for("input_audio_buffer.cleared")
        asked = {f"a{i}" for i in range(5)}
        a_audio_refused = [e["error"]["event_id"] for c in a for e in c.events
                           if e["type"] == "error" and e["error"]["event_id"] in asked]  # fmt: skip
        assert a_audio_refused == ["a4"]  # 4 x 500 ms = 2 s taken, the fifth refused
        for i, ms in enumerate((300, 300, 200)):  # B: 300 taken, 300 refused, 200 taken = 0.5 s (4 events)
            await b.send(append(ms, f"b{i}"))
        await b.send({"type": "input_audio_buffer.commit", "event_id": "b-commit"})
        await b.wait_for("input_audio_buffer.committed")
        b_refused = [e["error"]["event_id"] for e in b.events if e["type"] == "error"
                     and str(e["error"]["event_id"]).startswith("b")]  # fmt: skip
        assert b_refused == ["b1"]

        # --- one of A's closes on r1: A may open on r2 again (its 4th start) -------------------
        await a[1].ws.close()
        await asyncio.sleep(0.3)
        await opened(stack, r[2], A_KEY)
        await refused(r[0], A_KEY, "3 sessions open")

    # --- session starts per minute, through nginx: A 8 (4 used), B 4 (1 used) ---------------------
    await asyncio.sleep(0.3)  # every socket above is closed
    for _ in range(4):
        async with connect(cluster.url, headers=bearer(A_KEY)) as c:
            await c.wait_for("session.created")
    await refused(cluster.url, A_KEY, "opened 8 sessions in the last minute")
    for _ in range(3):
        async with connect(cluster.url, headers=bearer(B_KEY)) as c:
            await c.wait_for("session.created")
        await asyncio.sleep(0.2)  # B may hold one at a time: this one closes first
    await refused(cluster.url, B_KEY, "opened 4 sessions in the last minute")
