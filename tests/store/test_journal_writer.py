"""JournalWriter batching, on memory and Redis; prints the round-trip figures."""

from __future__ import annotations

import asyncio

import pytest
from support.store_backend import Backend

from gateway.store import FencedError, JournalWriter

LEASE_MS = 5_000


def ev(seq: int) -> bytes:
    return b'{"type":"response.output_audio.delta","delta":"' + b"A" * 200 + b'"}'


async def test_appends_within_one_interval_cost_one_round_trip(backend: Backend) -> None:
    store = backend.store(flush_interval_ms=20)
    fence = await store.acquire("s1", "A", LEASE_MS)
    writer = JournalWriter(store, "s1", fence)
    before = store.round_trips
    for seq in range(1, 501):
        writer.append(seq, ev(seq))  # no await: the session's hot path
    writer.set_snapshot(b"snap@500")
    await asyncio.sleep(0.1)
    trips = store.round_trips - before
    print(f"\n[{backend.kind}] 500 appends + snapshot in one interval: {trips} round trip(s)")
    assert trips == 1
    read = await store.read_events("s1", 0)
    assert [s for s, _ in read.events] == list(range(1, 501))
    assert await store.load_snapshot("s1") == b"snap@500"
    await writer.close()


@pytest.mark.parametrize(("rate", "burst"), [(50, 1), (50, 5)])
async def test_round_trips_stay_within_one_per_interval(backend: Backend, rate: int, burst: int) -> None:
    """``rate`` events/s, arriving ``burst`` at a time, for 0.6 s."""
    store = backend.store(flush_interval_ms=20)
    fence = await store.acquire("s1", "A", LEASE_MS)
    writer = JournalWriter(store, "s1", fence)
    before = store.round_trips
    loop = asyncio.get_running_loop()
    start = loop.time()
    seq = 0
    for _ in range(int(0.6 * rate / burst)):
        for _ in range(burst):
            seq += 1
            writer.append(seq, ev(seq))
        await asyncio.sleep(burst / rate)
    await writer.flush()
    elapsed = loop.time() - start
    trips = store.round_trips - before
    latency_ms = 1000 * writer.flush_seconds / max(1, writer.flushes)
    print(
        f"\n[{backend.kind}] {rate} events/s in bursts of {burst}: "
        f"{trips / elapsed:.1f} round trips/s, {seq / max(1, trips):.1f} events per "
        f"round trip, mean flush latency {latency_ms:.2f} ms"
    )
    assert trips / elapsed <= 1000 / 20 + 5
    assert [s for s, _ in (await store.read_events("s1", 0)).events] == list(range(1, seq + 1))
    await writer.close()


async def test_flush_forces_what_the_interval_holds_back(backend: Backend) -> None:
    store = backend.store(flush_interval_ms=10_000)
    fence = await store.acquire("s1", "A", LEASE_MS)
    writer = JournalWriter(store, "s1", fence)
    writer.append(1, ev(1))  # first after a quiet period: goes out at once
    await asyncio.sleep(0.05)
    assert (await store.read_events("s1", 0)).last_seq == 1
    writer.append(2, ev(2))  # within the interval: held back
    await asyncio.sleep(0.05)
    assert (await store.read_events("s1", 0)).last_seq == 1
    await writer.flush()
    assert (await store.read_events("s1", 0)).last_seq == 2
    writer.append(3, ev(3))
    await writer.close()  # close flushes
    assert (await store.read_events("s1", 0)).last_seq == 3


async def test_writer_stops_for_good_once_fenced(backend: Backend) -> None:
    a = backend.store()
    b = backend.peer(a)
    fa = await a.acquire("s1", "A", LEASE_MS)
    seen: list[FencedError] = []
    writer = JournalWriter(a, "s1", fa, on_fenced=seen.append)
    writer.append(1, ev(1))
    await writer.flush()
    await b.acquire("s1", "B", LEASE_MS)
    writer.append(2, ev(2))
    await asyncio.sleep(0.1)  # the background flush meets the fence
    assert writer.fenced is not None and len(seen) == 1
    with pytest.raises(FencedError):
        writer.append(3, ev(3))
    with pytest.raises(FencedError):
        await writer.flush()
    assert [s for s, _ in (await b.read_events("s1", 0)).events] == [1]
    await writer.close()


async def test_pending_overflow_drops_oldest_and_reports_a_gap(backend: Backend) -> None:
    store = backend.store()
    fence = await store.acquire("s1", "A", LEASE_MS)
    writer = JournalWriter(store, "s1", fence, max_pending_events=3)
    for seq in range(1, 6):  # no await: nothing flushed yet, the buffer overflows
        writer.append(seq, ev(seq))
    await writer.flush()
    read = await store.read_events("s1", 0)
    assert [s for s, _ in read.events] == [3, 4, 5] and read.gap
    assert not (await store.read_events("s1", 2)).gap
    await writer.close()


@pytest.mark.parametrize("in_flight", [False, True])
async def test_a_flush_waiting_when_the_writer_is_closed_unflushed_is_answered(
    backend: Backend, in_flight: bool
) -> None:
    """Issue 34's silence after a resume: a session that ends unflushed (``close(flush=False)``,
    a resume's provisional session) while a ``flush()`` waits, its batch not yet taken (or
    waiting behind one in flight), must answer that flush: the commit gate waits on it, and a
    gate never released holds every later event of the connection back."""
    store = backend.store(flush_interval_ms=20)
    fence = await store.acquire("s1", "A", LEASE_MS)
    writer = JournalWriter(store, "s1", fence)
    writer.append(1, ev(1))
    first = asyncio.ensure_future(writer.flush())
    if in_flight:
        while not writer._in_flight:  # noqa: ASYNC110 (the batch taken, its commit under way)
            await asyncio.sleep(0)
    writer.append(2, ev(2))
    second = asyncio.ensure_future(writer.flush())
    await asyncio.sleep(0)  # the flush asked (its waiter queued), its batch not yet taken
    await writer.close(flush=False)
    await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), 5)
