"""The tenant-limit part of the store contract, against MemoryStore and RedisStore:
open connections and starts per principal (admit, release, refresh, lapse), and
budgets per fixed window that are never granted past their limit, from any
number of replicas at once."""

from __future__ import annotations

import asyncio

from support.store_backend import Backend

TTL_MS = 5_000


async def test_connections_are_admitted_up_to_max_open_across_replicas(backend: Backend) -> None:
    a = backend.store()
    b = backend.peer(a)
    for i, store in enumerate((a, b, a)):
        admitted = await store.admit_connection("p", f"c{i}", max_open=3, starts_per_min=0, ttl_ms=TTL_MS)
        assert admitted.ok and admitted.refused is None and admitted.open == i + 1
    refused = await b.admit_connection("p", "c3", max_open=3, starts_per_min=0, ttl_ms=TTL_MS)
    assert (refused.ok, refused.refused, refused.open) == (False, "max_sessions", 3)
    other = await b.admit_connection("q", "c3", max_open=3, starts_per_min=0, ttl_ms=TTL_MS)
    assert other.ok  # another principal counts on its own
    await a.release_connection("p", "c1")
    assert (await b.admit_connection("p", "c4", max_open=3, starts_per_min=0, ttl_ms=TTL_MS)).ok
    assert not (await a.admit_connection("p", "c5", max_open=3, starts_per_min=0, ttl_ms=TTL_MS)).ok


async def test_an_entry_its_replica_stops_refreshing_lapses(backend: Backend) -> None:
    a = backend.store()
    b = backend.peer(a)
    await a.admit_connection("p", "dead", max_open=2, starts_per_min=0, ttl_ms=300)
    await b.admit_connection("p", "alive", max_open=2, starts_per_min=0, ttl_ms=300)
    for _ in range(4):  # 0.6 s: "alive" is refreshed, "dead" is not
        await asyncio.sleep(0.15)
        assert await b.refresh_connections([("p", "alive")], 300) in ([2], [1])
    assert await b.refresh_connections([("p", "alive")], 300) == [1]
    assert (await a.admit_connection("p", "new", max_open=2, starts_per_min=0, ttl_ms=300)).ok


async def test_refresh_never_brings_back_a_released_entry(backend: Backend) -> None:
    store = backend.store()
    await store.admit_connection("p", "c", max_open=1, starts_per_min=0, ttl_ms=TTL_MS)
    await store.release_connection("p", "c")
    assert await store.refresh_connections([("p", "c"), ("q", "x")], TTL_MS) == [0, 0]
    assert (await store.admit_connection("p", "d", max_open=1, starts_per_min=0, ttl_ms=TTL_MS)).ok


async def test_starts_per_minute_are_counted_over_the_last_60_s_and_a_close_frees_none(backend: Backend) -> None:
    a = backend.store()
    b = backend.peer(a)
    for i in range(3):
        store = (a, b)[i % 2]
        admitted = await store.admit_connection("p", f"c{i}", max_open=0, starts_per_min=3, ttl_ms=TTL_MS)
        assert admitted.ok and admitted.starts == i + 1
        await store.release_connection("p", f"c{i}")
    refused = await a.admit_connection("p", "c3", max_open=0, starts_per_min=3, ttl_ms=TTL_MS)
    assert (refused.ok, refused.refused, refused.starts) == (False, "session_starts_per_min", 3)
    assert 59_000 <= refused.reset_ms <= 60_000  # the oldest start leaves the window in about a minute


async def test_a_refused_connection_counts_nothing(backend: Backend) -> None:
    store = backend.store()
    assert (await store.admit_connection("p", "c0", max_open=1, starts_per_min=2, ttl_ms=TTL_MS)).ok
    for i in range(3):  # refused by max_open: no start recorded
        assert not (await store.admit_connection("p", f"r{i}", max_open=1, starts_per_min=2, ttl_ms=TTL_MS)).ok
    await store.release_connection("p", "c0")
    second = await store.admit_connection("p", "c1", max_open=1, starts_per_min=2, ttl_ms=TTL_MS)
    assert second.ok and second.starts == 2


async def test_a_budget_is_never_granted_past_its_limit_by_replicas_at_once(backend: Backend) -> None:
    stores = [backend.store()]
    stores += [backend.peer(stores[0]) for _ in range(2)]
    takes = [stores[i % 3].take_budget("p", "audio_in", 7, limit=100, window_ms=60_000) for i in range(30)]
    budgets = await asyncio.gather(*takes)
    assert sum(b.granted for b in budgets) == 100  # 14 full grants, one of 2, the rest nothing
    assert sorted(b.granted for b in budgets)[-15:] == [2] + [7] * 14
    assert max(b.used for b in budgets) == 100
    assert all(0 < b.reset_ms <= 60_000 for b in budgets)
    assert len({b.window for b in budgets}) == 1
    other = await stores[1].take_budget("p", "events", 5, limit=10, window_ms=60_000)  # another kind: its own
    assert other.granted == 5


async def test_returned_budget_can_be_granted_again_within_its_window(backend: Backend) -> None:
    a = backend.store()
    b = backend.peer(a)
    first = await a.take_budget("p", "k", 10, limit=10, window_ms=60_000)
    assert (await b.take_budget("p", "k", 1, limit=10, window_ms=60_000)).granted == 0
    await a.return_budget("p", "k", 4, window=first.window)
    again = await b.take_budget("p", "k", 10, limit=10, window_ms=60_000)
    assert (again.granted, again.used) == (4, 10)
    await a.return_budget("p", "k", 99, window=first.window)  # never below zero
    assert (await b.take_budget("p", "k", 99, limit=10, window_ms=60_000)).granted == 10


async def test_each_window_starts_from_zero_and_a_stale_return_is_ignored(backend: Backend) -> None:
    store = backend.store()
    first = await store.take_budget("p", "k", 5, limit=5, window_ms=300)
    assert first.granted == 5 and 0 < first.reset_ms <= 300
    await asyncio.sleep(first.reset_ms / 1000 + 0.05)
    second = await store.take_budget("p", "k", 5, limit=5, window_ms=300)
    assert second.window > first.window and second.granted == 5
    await store.return_budget("p", "k", 5, window=first.window)  # that window is over: no effect
    third = await store.take_budget("p", "k", 1, limit=5, window_ms=300)
    assert third.granted == 0 or third.window != second.window  # (unless the window rolled meanwhile)
