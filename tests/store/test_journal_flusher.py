"""JournalFlusher: the journal writers of one process share their commits (one
``commit_many``, on Redis one pipelined round trip), on memory and Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from support.store_backend import Backend

from gateway.store import FencedError, JournalWriter, MemoryStore, create_store
from gateway.store.base import Commit, StoreError, StoreUnavailable
from gateway.store.writer import GRID_STEPS, JournalFlusher

LEASE_MS = 5_000


def ev(seq: int) -> bytes:
    return b'{"type":"response.output_audio.delta","seq":%d}' % seq


async def _writers(backend: Backend, n: int, **options: float) -> list[JournalWriter]:
    store = backend.store(**options)
    writers = []
    for i in range(n):
        fence = await store.acquire(f"s{i}", "A", LEASE_MS)
        writers.append(JournalWriter(store, f"s{i}", fence))
    return writers


async def test_forced_flushes_of_one_loop_turn_share_one_batch(backend: Backend) -> None:
    writers = await _writers(backend, 20, flush_interval_ms=10_000)
    for w in writers:
        w.append(1, ev(1))
    flusher = JournalFlusher.of(writers[0].store)
    before, trips = flusher.batches, writers[0].store.round_trips
    await asyncio.gather(*(w.flush() for w in writers))  # the commit gate of 20 sessions at once
    assert flusher.batches - before == 1
    if backend.kind == "redis":
        assert writers[0].store.round_trips - trips == 1  # one pipeline for all 20
    for i, w in enumerate(writers):
        assert w.committed_seq == 1
        assert (await writers[0].store.read_events(f"s{i}", 0)).last_seq == 1
        await w.close()


async def test_busy_sessions_share_batches_on_the_grid(backend: Backend) -> None:
    """40 sessions streaming 50 events/s each for 0.6 s: each session's commits stay within one per
    interval, and the process's batches within GRID_STEPS per interval, however many sessions."""
    interval_ms = 20
    writers = await _writers(backend, 40, flush_interval_ms=interval_ms)
    flusher = JournalFlusher.of(writers[0].store)
    before = flusher.batches
    loop = asyncio.get_running_loop()
    start = loop.time()
    seq = 0
    while loop.time() - start < 0.6:
        seq += 1
        for w in writers:
            w.append(seq, ev(seq))
        await asyncio.sleep(0.02)
    elapsed = loop.time() - start
    await asyncio.gather(*(w.flush() for w in writers))
    batches = flusher.batches - before
    per_session = max(w.flushes for w in writers) / elapsed
    print(f"\n[{backend.kind}] 40 sessions x 50 events/s: {batches / elapsed:.0f} batches/s for the process, "
          f"at most {per_session:.0f} commits/s per session")  # fmt: skip
    assert per_session <= 1000 / interval_ms + 5
    assert batches / elapsed <= GRID_STEPS * 1000 / interval_ms + 5
    assert batches < sum(w.flushes for w in writers) / 10  # shared: far fewer batches than commits
    for i, w in enumerate(writers):
        read = await writers[0].store.read_events(f"s{i}", 0)
        assert [s for s, _ in read.events] == list(range(1, seq + 1))
        await w.close()


async def test_a_fenced_session_in_a_batch_leaves_the_others_committed(backend: Backend) -> None:
    writers = await _writers(backend, 3)
    a = writers[0].store
    peer = backend.peer(a)
    await peer.acquire("s1", "B", LEASE_MS)  # another replica takes s1
    seen: list[FencedError] = []
    writers[1].on_fenced = seen.append
    for w in writers:
        w.append(1, ev(1))
    results = await asyncio.gather(*(w.flush() for w in writers), return_exceptions=True)
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], FencedError) and len(seen) == 1 and writers[1].fenced is not None
    assert (await a.read_events("s0", 0)).last_seq == 1
    assert (await a.read_events("s2", 0)).last_seq == 1
    assert (await a.read_events("s1", 0)).last_seq is None  # nothing of the fenced writer landed
    for w in writers:
        await w.close()


class _GatedStore(MemoryStore):
    """A memory store whose batches wait for ``gate``: a batch's time in flight, held open."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()

    async def commit_many(self, commits: Sequence[Commit]) -> list[StoreError | None]:
        self.waiting.set()
        await self.gate.wait()
        return await super().commit_many(commits)


async def test_a_flush_waits_for_the_batch_in_flight() -> None:
    """An event taken by a background batch is committed when a flush() called meanwhile returns."""
    store = _GatedStore()
    writer = JournalWriter(store, "s0", await store.acquire("s0", "A", LEASE_MS))
    writer.append(1, ev(1))
    async with asyncio.timeout(10):
        await store.waiting.wait()  # the flusher took it: its commit is under way
    flush = asyncio.ensure_future(writer.flush())  # nothing pending: still waits for that commit
    await asyncio.sleep(0)
    assert not flush.done()
    store.gate.set()
    async with asyncio.timeout(10):
        await flush
    assert writer.committed_seq == 1
    assert (await store.read_events("s0", 0)).last_seq == 1
    await writer.close()


async def test_an_abandoned_writer_is_never_flushed(backend: Backend) -> None:
    (writer,) = await _writers(backend, 1, flush_interval_ms=10_000)
    writer.append(1, ev(1))
    await writer.flush()
    writer.append(2, ev(2))  # held back by the interval
    writer.abandon()
    other = JournalWriter(writer.store, "s0", writer.fence)
    other.append(3, ev(3))
    await other.flush()
    read = await writer.store.read_events("s0", 0)
    assert [s for s, _ in read.events] == [1, 3]
    await other.close()


async def test_commit_many_reports_each_commit_on_its_own(backend: Backend) -> None:
    store = backend.store()
    f0 = await store.acquire("s0", "A", LEASE_MS)
    await store.acquire("s1", "A", LEASE_MS)
    results = await store.commit_many([
        Commit("s0", f0, [(1, b"a")], snapshot=b"snap0"),
        Commit("s1", 999, [(1, b"b")]),  # a stale fence
        Commit("s0", f0, [(2, b"c")]),  # the same session again, in order
    ])  # fmt: skip
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], FencedError)
    assert [s for s, _ in (await store.read_events("s0", 0)).events] == [1, 2]
    assert await store.load_snapshot("s0") == b"snap0"
    assert (await store.read_events("s1", 0)).last_seq is None


async def test_commit_many_loads_the_script_again_after_a_redis_restart(backend: Backend) -> None:
    if backend.kind != "redis":
        pytest.skip("Redis only: a restarted Redis forgets its scripts")
    store = backend.store()
    fences = [await store.acquire(f"s{i}", "A", LEASE_MS) for i in range(2)]
    await store._redis.script_flush()  # type: ignore[attr-defined]  # as a restarted Redis has
    results = await store.commit_many([Commit(f"s{i}", fences[i], [(1, b"x")]) for i in range(2)])
    assert results == [None, None]
    assert (await store.read_events("s1", 0)).last_seq == 1


async def test_commit_many_on_an_unreachable_redis_fails_each_commit() -> None:
    store = create_store("redis://127.0.0.1:1/0", connect_timeout_s=0.2)  # nothing listens on port 1
    try:
        results = await store.commit_many([Commit("s0", 1, [(1, b"x")]), Commit("s1", 1, [(1, b"y")])])
        assert all(isinstance(r, StoreUnavailable) for r in results) and len(results) == 2
    finally:
        await store.close()


class _OneSlowSession(MemoryStore):
    """A memory store whose commits of session ``slow`` wait for ``gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()

    async def commit(self, session_id: str, **kwargs: Any) -> None:
        if session_id == "slow":
            self.waiting.set()
            await self.gate.wait()
        await super().commit(session_id, **kwargs)


async def test_a_slow_commit_holds_up_only_its_own_session() -> None:
    store = _OneSlowSession()
    slow = JournalWriter(store, "slow", await store.acquire("slow", "A", LEASE_MS))
    fast = JournalWriter(store, "fast", await store.acquire("fast", "A", LEASE_MS))
    slow.append(1, ev(1))
    async with asyncio.timeout(10):
        await store.waiting.wait()  # its batch is in flight, held
    fast.append(1, ev(1))
    async with asyncio.timeout(10):
        await fast.flush()  # another batch, beside it: the write-ahead gate of another session
    assert (await store.read_events("fast", 0)).last_seq == 1 and slow.committed_seq == 0
    store.gate.set()
    async with asyncio.timeout(10):
        await slow.flush()
    assert slow.committed_seq == 1
    await slow.close()
    await fast.close()
