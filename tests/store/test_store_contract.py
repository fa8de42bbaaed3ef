"""The store contract: every test runs against MemoryStore and RedisStore."""

from __future__ import annotations

import asyncio

import pytest
from support.store_backend import Backend

from gateway.store import (
    FencedError,
    SessionStore,
    replica_channel,
    session_channel,
)

LEASE_MS = 5_000


def ev(seq: int, size: int = 0) -> tuple[int, bytes]:
    data = f"event-{seq}".encode()
    return seq, data.ljust(size, b".") if size else data


async def owned(store: SessionStore, sid: str = "s1", owner: str = "A") -> int:
    return await store.acquire(sid, owner, LEASE_MS)


# --- snapshot -----------------------------------------------------------------


async def test_snapshot_round_trip(backend: Backend) -> None:
    store = backend.store()
    fence = await owned(store)
    assert await store.load_snapshot("s1") is None
    await store.save_snapshot("s1", b'{"v":1}', fence=fence)
    await store.save_snapshot("s1", b'{"v":2}', fence=fence)
    assert await store.load_snapshot("s1") == b'{"v":2}'
    await store.delete_session("s1")
    assert await store.load_snapshot("s1") is None
    assert await store.owner_of("s1") is None


async def test_snapshot_expires_after_idle_ttl_and_writes_refresh_it(backend: Backend) -> None:
    store = backend.store(idle_ttl_s=0.3)
    fence = await owned(store)
    await store.save_snapshot("s1", b"snap", fence=fence)
    for _ in range(3):  # 0.45 s in all, but never 0.3 s idle
        await asyncio.sleep(0.15)
        await store.append_events("s1", [ev(_ + 1)], fence=fence)
    assert await store.load_snapshot("s1") == b"snap"
    await asyncio.sleep(0.45)
    assert await store.load_snapshot("s1") is None
    read = await store.read_events("s1", 0)
    assert read.events == [] and read.last_seq is None


# --- journal ------------------------------------------------------------------


async def test_journal_keeps_order_and_reads_after_a_seq(backend: Backend) -> None:
    store = backend.store()
    fence = await owned(store)
    await store.append_events("s1", [ev(1), ev(2), ev(3)], fence=fence)
    await store.append_events("s1", [ev(4), ev(5)], fence=fence)
    read = await store.read_events("s1", 0)
    assert read.events == [ev(i) for i in range(1, 6)]
    assert (read.gap, read.first_seq, read.last_seq) == (False, 1, 5)
    read = await store.read_events("s1", 3)
    assert read.events == [ev(4), ev(5)] and not read.gap
    assert (await store.read_events("s1", 1, limit=2)).events == [ev(2), ev(3)]
    assert (await store.read_events("s1", 5)).events == []


async def test_append_is_idempotent_by_seq(backend: Backend) -> None:
    store = backend.store()
    fence = await owned(store)
    await store.append_events("s1", [ev(1), ev(2), ev(3)], fence=fence)
    await store.append_events("s1", [ev(2), ev(3), ev(4)], fence=fence)  # a retried batch
    assert [s for s, _ in (await store.read_events("s1", 0)).events] == [1, 2, 3, 4]


async def test_gap_after_count_cap(backend: Backend) -> None:
    store = backend.store(max_events=5)
    fence = await owned(store)
    await store.append_events("s1", [ev(i) for i in range(1, 9)], fence=fence)
    read = await store.read_events("s1", 0)
    assert read.gap and read.first_seq == 4 and read.last_seq == 8
    assert [s for s, _ in read.events] == [4, 5, 6, 7, 8]
    assert (await store.read_events("s1", 2)).gap
    assert not (await store.read_events("s1", 3)).gap


async def test_gap_after_byte_cap(backend: Backend) -> None:
    store = backend.store(max_bytes=100)
    fence = await owned(store)
    await store.append_events("s1", [ev(i, size=30) for i in range(1, 7)], fence=fence)
    read = await store.read_events("s1", 0)
    assert [s for s, _ in read.events] == [4, 5, 6]  # 90 bytes fit, 120 do not
    assert read.gap and read.first_seq == 4
    assert not (await store.read_events("s1", 3)).gap
    await store.append_events("s1", [ev(7, size=500)], fence=fence)  # alone over the cap
    read = await store.read_events("s1", 3)
    assert read.gap and read.events == [] and read.last_seq == 7


async def test_gap_after_ack_trim_and_acked_seqs_are_not_appended(backend: Backend) -> None:
    store = backend.store()
    fence = await owned(store)
    await store.append_events("s1", [ev(i) for i in range(1, 6)], fence=fence)
    await store.trim_events("s1", 3)
    read = await store.read_events("s1", 3)
    assert [s for s, _ in read.events] == [4, 5] and not read.gap and read.first_seq == 4
    assert (await store.read_events("s1", 2)).gap
    await store.trim_events("s1", 7)  # acked ahead of the journal (buffered events)
    await store.append_events("s1", [ev(6), ev(7), ev(8)], fence=fence)
    read = await store.read_events("s1", 7)
    assert [s for s, _ in read.events] == [8] and not read.gap and read.last_seq == 8


async def test_lost_journal_is_a_gap_for_a_client_that_saw_events(backend: Backend) -> None:
    store = backend.store()
    assert (await store.read_events("never", 0)).gap is False
    read = await store.read_events("never", 3)
    assert read.gap and read.last_seq is None and read.first_seq is None


async def test_writer_overflow_is_reported_as_lost(backend: Backend) -> None:
    store = backend.store()
    fence = await owned(store)
    await store.commit("s1", fence=fence, events=[ev(5), ev(6)], lost_through=4)
    assert (await store.read_events("s1", 2)).gap
    assert not (await store.read_events("s1", 4)).gap


async def test_bad_read_and_trim_arguments_are_refused(backend: Backend) -> None:
    store = backend.store()
    with pytest.raises(ValueError):
        await store.read_events("s1", -1)
    with pytest.raises(ValueError):
        await store.read_events("s1", 0, limit=0)
    with pytest.raises(ValueError):
        await store.trim_events("s1", -1)


# --- lease + fencing ------------------------------------------------------------


async def test_takeover_fences_the_old_owner(backend: Backend) -> None:
    a = backend.store()
    b = backend.peer(a)
    fa = await a.acquire("s1", "A", LEASE_MS)
    await a.commit("s1", fence=fa, events=[ev(1)], snapshot=b"from-A")
    fb = await b.acquire("s1", "B", LEASE_MS)
    assert fb > fa
    assert await b.owner_of("s1") == ("B", fb)
    with pytest.raises(FencedError) as info:
        await a.append_events("s1", [ev(2)], fence=fa)
    assert info.value.current == fb and info.value.code == "session_fenced"
    with pytest.raises(FencedError):
        await a.save_snapshot("s1", b"zombie", fence=fa)
    await b.commit("s1", fence=fb, events=[ev(2)], snapshot=b"from-B")
    assert await a.load_snapshot("s1") == b"from-B"
    assert (await a.read_events("s1", 0)).events == [ev(1), ev(2)]


async def test_writes_need_an_acquired_fence(backend: Backend) -> None:
    store = backend.store()
    with pytest.raises(FencedError) as info:
        await store.save_snapshot("s1", b"x", fence=1)
    assert info.value.current is None


async def test_lease_renew_lapse_and_release(backend: Backend) -> None:
    a = backend.store()
    b = backend.peer(a)
    fa = await a.acquire("s1", "A", 200)
    assert await a.owner_of("s1") == ("A", fa)
    assert await a.renew("s1", "A", fa, 200)
    await asyncio.sleep(0.3)
    assert await a.owner_of("s1") is None  # lapsed
    assert await a.renew("s1", "A", fa, LEASE_MS)  # nobody took over: re-established
    assert await a.owner_of("s1") == ("A", fa)
    await a.save_snapshot("s1", b"ok", fence=fa)
    fb = await b.acquire("s1", "B", LEASE_MS)
    assert not await a.renew("s1", "A", fa, LEASE_MS)
    assert not await a.release("s1", "A", fa)
    assert await b.owner_of("s1") == ("B", fb)
    assert await b.release("s1", "B", fb)
    assert await b.owner_of("s1") is None
    assert await a.acquire("s1", "A", LEASE_MS) > fb  # the counter survives release


async def test_renew_many_renews_each_lease_and_reports_the_ones_taken_over(backend: Backend) -> None:
    a = backend.store()
    b = backend.peer(a)
    fences = {sid: await a.acquire(sid, "A", 200) for sid in ("s1", "s2", "s3")}
    assert await a.renew_many("A", 200, []) == []
    await b.acquire("s2", "B", LEASE_MS)  # another replica takes s2
    await asyncio.sleep(0.12)
    leases = [(sid, fence) for sid, fence in fences.items()]
    assert await a.renew_many("A", 200, leases) == [True, False, True]
    await asyncio.sleep(0.12)  # past the first TTL: only a renewal keeps s1 and s3 ours
    assert await a.owner_of("s1") == ("A", fences["s1"])
    assert await a.owner_of("s3") == ("A", fences["s3"])
    assert (await a.owner_of("s2") or ("", 0))[0] == "B"
    if backend.kind == "redis":  # every renewal in one pipelined round trip
        rounds = a.round_trips  # type: ignore[attr-defined]
        assert await a.renew_many("A", LEASE_MS, leases) == [True, False, True]
        assert a.round_trips == rounds + 1  # type: ignore[attr-defined]


# --- bus ------------------------------------------------------------------------


async def test_bus_reaches_the_owning_replica_and_no_other(backend: Backend) -> None:
    a = backend.store()
    b = backend.peer(a)
    sub_a = await a.subscribe(replica_channel("A"))
    sub_b = await b.subscribe(replica_channel("B"))
    watcher = await a.subscribe(session_channel("s1"))
    await b.acquire("s1", "B", LEASE_MS)
    assert await a.send_to_owner("s1", b'{"type":"cancel"}')
    async with asyncio.timeout(2):
        got = await sub_b.get()
    assert got is not None and got.data == b'{"type":"cancel"}'
    assert got.channel == replica_channel("B")
    assert await a.publish(session_channel("s1"), b"hello") == 1
    async with asyncio.timeout(2):
        seen = await watcher.get()
    assert seen is not None and seen.data == b"hello"
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await sub_a.get()
    assert not await a.send_to_owner("nobody", b"x")
    for sub in (sub_a, sub_b, watcher):
        await sub.close()
    assert await sub_a.get() is None


# --- tokens -----------------------------------------------------------------------


async def test_token_is_single_use_and_expires(backend: Backend) -> None:
    a = backend.store()
    b = backend.peer(a)
    await a.put_token("h1", b"payload", ttl_s=5)
    assert await b.take_token("h1") == b"payload"
    assert await a.take_token("h1") is None
    await a.put_token("h2", b"p", ttl_s=0.1)
    await asyncio.sleep(0.2)
    assert await a.take_token("h2") is None
