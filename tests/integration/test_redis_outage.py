"""When Redis fails: two gateway replicas in this process on a private redis-server on a
loopback port, which the tests kill, restart empty, and freeze (SIGSTOP) and thaw (SIGCONT).

What must hold (docs/sessions.md, "When Redis fails"): readiness says whether this replica
can open and resume sessions; a resume refused for the store does not cost the client its
token; a session alive on a replica is never told ``session_not_found`` because Redis came
back empty, and its replica writes it back at once; a frozen Redis is, past
``redis_timeout_s``, what a dead one is (sessions stream, metrics and readiness say so), with
its warnings rate-limited and what waits in memory bounded."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
import websockets
from support.gateway import Client, RunningGateway, connect, run_gateway
from support.redis_server import REDIS_BINARY, RedisServer

from gateway.hosting.host import SessionHost
from gateway.settings import Settings
from gateway.store.health import THROTTLE
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(120)

KEY = {"Authorization": "Bearer k"}
TEXT = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
RESUME_ANSWERS = ("session.resumed", "session.resync_required", "error")


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    if not REDIS_BINARY:
        pytest.skip("redis-server is not installed")
    server = RedisServer()
    try:
        yield server
    finally:
        if server.running:
            server.resume()  # (a frozen one: thawed, so that it dies at once)
        server.cleanup()


def settings(redis: RedisServer, replica: str, **changes: Any) -> Settings:
    # A short timeout and probe interval so the tests see the states quickly; a long lease,
    # so that the lease loop's own period (20 s) never does the write-back for the watch.
    base = Settings(engine="passthrough", redis_url=redis.url, api_keys=("k",), video_engine="none",
                    replica_id=replica, redis_timeout_s=0.5, redis_probe_interval_s=0.1, lease_ttl_s=60.0)  # fmt: skip
    return replace(base, **changes)


@contextlib.asynccontextmanager
async def two_replicas(redis: RedisServer, **changes: Any) -> AsyncIterator[tuple[RunningGateway, RunningGateway]]:
    engine = PassthroughEngine(audio_chunks=5, paced=False)
    async with (
        run_gateway(settings(redis, "ra", **changes), engine=engine, vad_factory=None) as a,
        run_gateway(settings(redis, "rb", **changes), engine=engine, vad_factory=None) as b,
    ):
        yield a, b


async def readiness(http: httpx.AsyncClient, want: int, timeout: float = 20.0) -> dict[str, Any]:
    """Poll ``/readyz`` until it answers ``want`` (the state a load balancer acts on)."""
    async with asyncio.timeout(timeout):
        while True:
            r = await http.get("/readyz")
            if r.status_code == want:
                body: dict[str, Any] = r.json()
                return body
            await asyncio.sleep(0.05)


async def open_session(gw: RunningGateway) -> tuple[Client, dict[str, Any], contextlib.AsyncExitStack]:
    stack = contextlib.AsyncExitStack()
    c = await stack.enter_async_context(connect(gw.url, headers=KEY))
    created = await c.wait_for("session.created")
    await c.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
        "turn_detection": None}}}})  # fmt: skip
    await c.wait_for("session.updated")
    return c, created, stack


async def answer(c: Client, timeout: float = 20.0) -> dict[str, Any]:
    await c.send({"type": "conversation.item.create", "item": TEXT})
    await c.send({"type": "response.create"})
    done = await c.wait_for("response.done", timeout)
    await c.wait_for("rate_limits.updated", timeout)  # (the answer's last event)
    return done


async def try_resume(gw: RunningGateway, sid: str, token: str, last: int) -> dict[str, Any]:
    """One resume on a fresh resume-only connection (nothing opens before the resume, as the
    SDKs reconnect): its answer (session.resumed, resync, or the error)."""
    async with connect(gw.url + "?resume=1", headers=KEY) as c:
        await c.send({"type": "session.resume", "session_id": sid, "resume_token": token,
                      "last_received_server_event_seq": last, "event_id": "ev_resume"})  # fmt: skip
        return await c.wait_for(lambda e: e["type"] in RESUME_ANSWERS)


async def no_session_opens(gw: RunningGateway) -> dict[str, Any]:
    """A new session is refused: its error (store_unavailable) before the close (1013)."""
    async with connect(gw.url, headers=KEY) as c:
        err = await c.wait_for("error")
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await c.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
        return err


# --- readiness ------------------------------------------------------------------------------


async def test_readyz_is_503_while_redis_is_dead_and_ready_again_without_a_restart(redis: RedisServer) -> None:
    redis.start()
    async with two_replicas(redis) as (a, _), httpx.AsyncClient(base_url=a.http) as http:
        await readiness(http, 200)
        redis.stop()
        body = await readiness(http, 503)
        assert body["status"] == "not_ready" and body["reason"] == "store_unavailable", body
        assert (await http.get("/healthz")).status_code == 200  # liveness: the process is fine
        assert (await no_session_opens(a))["error"]["code"] == "store_unavailable"
        detail = (await http.get("/readyz", headers=KEY)).json()  # an operator reads why
        assert detail["status"].startswith("store_unavailable:"), detail
        assert a.runtime.metrics.store_up._value.get() == 0
        redis.start()  # empty, same port
        body = await readiness(http, 200)
        assert body == {"status": "ready", "engines_ok": 1, "engines_total": 1}
        c, _, stack = await open_session(a)
        async with stack:
            assert (await answer(c))["response"]["status"] == "completed"


async def test_readyz_is_503_while_redis_is_frozen(redis: RedisServer) -> None:
    redis.start()
    async with two_replicas(redis) as (a, _), httpx.AsyncClient(base_url=a.http) as http:
        await readiness(http, 200)
        redis.pause()
        body = await readiness(http, 503)
        assert body["reason"] == "store_unavailable", body
        assert (await http.get("/healthz")).status_code == 200
        redis.resume()
        await readiness(http, 200)


async def test_a_replica_started_with_no_redis_is_not_ready_until_redis_comes(redis: RedisServer) -> None:
    """Started while nothing listens on the Redis port: it refuses every session, and says
    so; once Redis listens it is ready, and serves, with no restart."""
    async with two_replicas(redis) as (a, _), httpx.AsyncClient(base_url=a.http) as http:
        body = await readiness(http, 503)
        assert body["reason"] == "store_unavailable", body
        assert (await no_session_opens(a))["error"]["code"] == "store_unavailable"
        redis.start()
        await readiness(http, 200)
        c, _, stack = await open_session(a)
        async with stack:
            assert (await answer(c))["response"]["status"] == "completed"


# --- a resume refused for the store keeps the token -------------------------------------------


@pytest.mark.parametrize("outage", ["killed", "frozen"])
async def test_a_resume_refused_store_unavailable_keeps_the_token(redis: RedisServer, outage: str) -> None:
    """The client's socket drops; its resume (to the replica that still runs the session) is
    refused store_unavailable while Redis is out; once Redis is back, the token it holds
    resumes the session. (It used to be rotated by the refused resume: resume_token_invalid
    from then on.)"""
    redis.start()
    async with two_replicas(redis) as (a, b), httpx.AsyncClient(base_url=a.http) as http:
        await readiness(http, 200)
        c, created, stack = await open_session(a)
        async with stack:
            await answer(c)
            last = c.events[-1]["server_event_seq"]
        sid, token = created["session"]["id"], created["resume_token"]
        if outage == "killed":
            redis.stop()
        else:
            redis.pause()
        await readiness(http, 503)
        for gw in (a, b):  # the owner (its live session), and a replica that would take it over
            async with connect(gw.url + "?resume=1", headers=KEY) as r:
                await r.send({"type": "session.resume", "session_id": sid, "resume_token": token,
                              "last_received_server_event_seq": last})  # fmt: skip
                refused = await r.wait_for("error")
                assert refused["error"]["code"] == "store_unavailable", refused
                with pytest.raises(websockets.ConnectionClosed) as closed:  # then 1013: resume again shortly
                    await r.recv()
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
        if outage == "killed":
            redis.start()  # empty: A writes the session back (below)
        else:
            redis.resume()
        await readiness(http, 200)
        async with asyncio.timeout(20):  # (after a restart: until A has written it back)
            while True:
                got = await try_resume(a, sid, token, last)
                if got["type"] != "error" or got["error"]["code"] != "store_unavailable":
                    break
        assert got["type"] in ("session.resumed", "session.resync_required"), got


# --- Redis back empty: no final session_not_found; the owner writes back ----------------------


async def test_a_replica_writes_back_its_sessions_as_soon_as_redis_returns_empty(redis: RedisServer) -> None:
    """Redis restarts empty while A serves a session whose state lived only there: A takes it
    again and writes it whole as soon as its probe sees Redis back without its data (the
    lease loop alone would wait for its period, 20 s here), and it resumes on B."""
    redis.start()
    async with two_replicas(redis) as (a, b), httpx.AsyncClient(base_url=a.http) as http:
        await readiness(http, 200)
        c, created, stack = await open_session(a)
        async with stack:
            await answer(c)
            sid, token = created["session"]["id"], created["resume_token"]
            last = c.events[-1]["server_event_seq"]
            redis.restart()  # empty: the snapshot, journal, lease and fence are gone
            assert await a.runtime.store.load_snapshot(sid) is None
            async with asyncio.timeout(10):
                while await a.runtime.store.load_snapshot(sid) is None:  # noqa: ASYNC110 (the state the test needs)
                    await asyncio.sleep(0.05)
            assert a.runtime.metrics.store_writebacks._value.get() >= 1
            assert a.runtime.store_watch.losses == 1
        got = await try_resume(b, sid, token, last)
        assert got["type"] == "session.resumed", got  # it held every event: nothing lost to replay
        assert got["replay_to"] == last


async def test_a_resume_right_after_redis_restarts_empty_is_told_to_retry_not_session_not_found(
    redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume reaching B before A has written the session back is refused store_unavailable
    (retry), never the final session_not_found; retried, it resumes. (A's write-back is held
    back here until B has answered, so the first resume surely comes before it.)"""
    redis.start()
    async with two_replicas(redis) as (a, b), httpx.AsyncClient(base_url=a.http) as http:
        await readiness(http, 200)
        c, created, stack = await open_session(a)
        async with stack:
            await answer(c)
            sid, token = created["session"]["id"], created["resume_token"]
            last = c.events[-1]["server_event_seq"]
        (host,) = [h for h in a.runtime.hosting.hosts.values() if isinstance(h, SessionHost)]
        go_on = asyncio.Event()
        real = host._reacquire

        async def held_back() -> None:
            await go_on.wait()
            await real()

        monkeypatch.setattr(host, "_reacquire", held_back)
        redis.restart()
        first = await try_resume(b, sid, token, last)
        assert first["type"] == "error" and first["error"]["code"] == "store_unavailable", first
        assert "session_not_found" not in first["error"]["message"]
        go_on.set()
        async with asyncio.timeout(20):
            while True:
                got = await try_resume(b, sid, token, last)
                assert got["type"] != "error" or got["error"]["code"] == "store_unavailable", got
                if got["type"] != "error":
                    break
        assert got["type"] == "session.resumed", got


async def test_an_unknown_session_is_still_session_not_found(redis: RedisServer) -> None:
    """Outside the moments after Redis came back, a session the store lacks is unknown: final."""
    redis.start()
    async with two_replicas(redis) as (_, b), httpx.AsyncClient(base_url=b.http) as http:
        await readiness(http, 200)
        got = await try_resume(b, "sess_0123456789abcdef0123", "rt_nothing_of_the_kind", 0)
        assert got["type"] == "error" and got["error"]["code"] == "session_not_found", got


# --- a frozen Redis ------------------------------------------------------------------------------


async def test_sessions_stream_through_a_frozen_redis_with_few_warnings_and_bounded_memory(
    redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGSTOP: past redis_timeout_s the store counts as down (readiness 503, omni_store_up
    0), every store call then fails at once, so sessions keep answering at their own pace
    (write-ahead no longer waits on the frozen commit); warnings come at most one line per
    kind per THROTTLE.interval_s; what each session keeps for the store stays within
    journal_pending_max_bytes. After SIGCONT everything is as before."""
    redis.start()
    cap = 16 << 10
    async with (
        two_replicas(redis, journal_pending_max_bytes=cap) as (a, _),
        httpx.AsyncClient(base_url=a.http) as http,
    ):
        await readiness(http, 200)
        sessions = [await open_session(a) for _ in range(3)]
        async with contextlib.AsyncExitStack() as stack:
            for _, _, s in sessions:
                await stack.enter_async_context(s)
            hosts = [h for h in a.runtime.hosting.hosts.values() if isinstance(h, SessionHost)]
            caplog.set_level(logging.WARNING)
            caplog.clear()
            loop = asyncio.get_running_loop()
            frozen_at = loop.time()
            redis.pause()
            await readiness(http, 503)
            assert a.runtime.metrics.store_up._value.get() == 0
            store: Any = a.runtime.store
            most = waiting = 0

            async def watch_pending() -> None:  # every loop turn: what waits, on Redis and in memory
                nonlocal most, waiting
                while True:
                    most = max(most, *(h.writer._bytes for h in hosts))
                    waiting = max(waiting, store.waiting)
                    await asyncio.sleep(0)

            watcher = loop.create_task(watch_pending())
            for _ in range(4):  # answer after answer, on every session, while frozen
                done = await asyncio.gather(*(answer(c) for c, _, _ in sessions))
                assert all(d["response"]["status"] == "completed" for d in done)
            watcher.cancel()
            assert redis.running and (await http.get("/readyz")).status_code == 503  # (still frozen)
            elapsed = loop.time() - frozen_at
            # Nothing queues behind a frozen Redis: the probe and one trial call at most wait on it.
            assert waiting <= 2, waiting
            assert most <= cap, most
            assert all(h.writer.max_pending_bytes == cap for h in hosts)
            assert a.runtime.metrics.store_calls_refused._value.get() > 0
            lines = Counter(r.msg for r in caplog.records if r.levelno == logging.WARNING)
            allowed = elapsed / THROTTLE.interval_s + 1
            assert lines and all(n <= allowed for n in lines.values()), (elapsed, lines)
            redis.resume()
            await readiness(http, 200)
            done = await asyncio.gather(*(answer(c) for c, _, _ in sessions))
            assert all(d["response"]["status"] == "completed" for d in done)
