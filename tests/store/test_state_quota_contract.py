"""The state-quota part of the store contract, against MemoryStore and RedisStore: a
principal's ledger counts the bytes of its sessions' state (snapshot, item records,
journal) from any replica; a new session past ``max_bytes`` is refused once no kept
session is left to forget; kept sessions (no live lease) beyond ``max_kept`` are
forgotten, least recently served first; a session a replica serves never is."""

from __future__ import annotations

import asyncio

import pytest
from support.store_backend import Backend

from gateway.store.base import StateLimitExceeded, StateQuota

LEASE_MS = 5_000
KB = b"x" * 1000


async def open_session(store: object, sid: str, quota: StateQuota, *, size: int = 0) -> int:
    fence: int = await store.acquire(sid, "r", LEASE_MS, quota=quota, new=True)  # type: ignore[attr-defined]
    await store.commit(sid, fence=fence, snapshot=KB * size, quota=quota)  # type: ignore[attr-defined]
    return fence


async def test_the_ledger_counts_snapshot_items_and_journal_from_every_replica(backend: Backend) -> None:
    a = backend.store()
    b = backend.peer(a)
    q = StateQuota("p")
    fa = await a.acquire("s1", "ra", LEASE_MS, quota=q, new=True)
    await a.commit("s1", fence=fa, snapshot=KB, items={"i1": KB * 2}, events=[(1, KB * 3)], quota=q)
    fb = await b.acquire("s2", "rb", LEASE_MS, quota=q, new=True)
    await b.commit("s2", fence=fb, snapshot=KB * 4, quota=q)
    assert await a.state_held("p") == await b.state_held("p")
    held = await b.state_held("p")
    assert (held.bytes, held.sessions, held.kept) == (10_000, 2, 0)
    await a.commit("s1", fence=fa, drop_items=["i1"], quota=q)
    await a.trim_events("s1", 1, quota=q)
    assert (await b.state_held("p")).bytes == 5_000  # what was dropped and acked no longer counts
    assert (await b.state_held("q")).sessions == 0  # another principal has its own ledger
    await b.release("s2", "rb", fb, quota=q)
    assert (await a.state_held("p")).kept == 1
    await a.delete_session("s2", quota=q)
    held = await a.state_held("p")
    assert (held.bytes, held.sessions, held.kept) == (1_000, 1, 0)


async def test_a_new_session_past_max_bytes_forgets_kept_ones_then_is_refused(backend: Backend) -> None:
    a = backend.store()
    b = backend.peer(a)
    q = StateQuota("p", max_bytes=10_000)
    fences = {}
    for i, store in enumerate((a, b, a)):
        fences[f"s{i}"] = await open_session(store, f"s{i}", q, size=3)
    await b.release("s0", "r", fences["s0"], quota=q)  # s0 is kept; s1, s2 are served
    fences["s3"] = await open_session(b, "s3", q, size=3)  # 12,000 held: over, but a served write never fails
    # A new session: s0 (kept) is forgotten to make room; then only served sessions hold 9,000.
    fences["s4"] = await open_session(a, "s4", q, size=1)
    assert await a.load_snapshot("s0") is None and (await b.read_events("s0", 0)).last_seq is None
    held = await a.state_held("p")
    assert (held.bytes, held.sessions, held.kept) == (10_000, 4, 0)
    with pytest.raises(StateLimitExceeded) as refused:
        await b.acquire("s5", "r", LEASE_MS, quota=q, new=True)
    assert refused.value.code == "rate_limit_exceeded" and refused.value.limit == 10_000
    assert await b.owner_of("s5") is None  # nothing was written for it
    for sid in ("s1", "s2", "s3", "s4"):
        assert await a.load_snapshot(sid) is not None  # no served session was forgotten
    # A resume (not new) of a served session is never refused.
    assert await b.acquire("s1", "r2", LEASE_MS, quota=q) > fences["s1"]


async def test_kept_sessions_beyond_max_kept_are_forgotten_oldest_first(backend: Backend) -> None:
    a = backend.store()
    b = backend.peer(a)
    q = StateQuota("p", max_kept=2)
    for i in range(4):
        store = (a, b)[i % 2]
        fence = await open_session(store, f"s{i}", q, size=1)
        await store.release(f"s{i}", "r", fence, quota=q)
    held = await a.state_held("p")
    assert (held.sessions, held.kept) == (2, 2)
    assert [await a.load_snapshot(f"s{i}") is not None for i in range(4)] == [False, False, True, True]


async def test_the_quota_ttl_is_the_state_idle_ttl(backend: Backend) -> None:
    store = backend.store()
    q = StateQuota("p", ttl_s=0.3)
    fence = await open_session(store, "s", q, size=1)
    await store.release("s", "r", fence, quota=q)
    assert await store.load_snapshot("s") is not None
    deadline = asyncio.get_running_loop().time() + 3.0  # the store's own idle TTL is an hour
    while await store.load_snapshot("s") is not None:
        assert asyncio.get_running_loop().time() < deadline, "the state outlived its quota's TTL"
        await asyncio.sleep(0.05)
    assert (await store.state_held("p")).sessions == 0


async def test_a_late_size_report_never_overwrites_a_newer_one(backend: Backend) -> None:
    """Redis keeps the ledger in a second script after the session's write (their keys are in
    different cluster slots): two replicas' reports may arrive out of order, and the newest
    write's size must win. (White-box: the report is sent as a replica would send it late.)"""
    if backend.kind != "redis":
        pytest.skip("Redis only: memory keeps the ledger in the same step as the write")
    from gateway.store.redis import RedisStore, Sized

    store = backend.store()
    assert isinstance(store, RedisStore)
    q = StateQuota("p")
    fence = await open_session(store, "s1", q, size=3)
    assert (await store.state_held("p")).bytes == 3_000
    assert await store._report_sizes([Sized(0, q, "s1", 1_000, fence, 0)]) == []  # an older write's: ignored
    assert (await store.state_held("p")).bytes == 3_000
    await store._report_sizes([Sized(0, q, "s1", 2_000, fence + 1, 0)])  # a newer owner's: taken
    assert (await store.state_held("p")).bytes == 2_000
