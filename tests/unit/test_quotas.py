"""The replica side of tenant limits (gateway/quotas.py) on a real MemoryStore:
budgets leased a chunk at a time (never a store round trip per message), never
past the limit from several replicas, given back when a principal's last socket
closes, and a bounded allowance while the store is down."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from gateway.auth import Grant
from gateway.protocol.errors import Code, ProtocolError
from gateway.quotas import NeedBudget, Quotas, Seat
from gateway.store import MemoryStore, StoreUnavailable
from gateway.tenants import Tenant, TenantLimits


def grant(**limits: float) -> Grant:
    return Grant("tenant:acme", tenant=Tenant("acme", TenantLimits(**limits)))  # type: ignore[arg-type]


def replica(store: MemoryStore) -> Quotas:
    return Quotas(store, CollectorRegistry(), ttl_ms=5_000)


async def seat(quotas: Quotas, **limits: float) -> Seat:
    admitted = await quotas.admit(grant(**limits))
    assert isinstance(admitted, Seat)
    return admitted


async def send(s: Seat) -> bool:
    """One client message as the transport sends it: True taken, False refused."""
    while True:
        try:
            s.message()
            return True
        except NeedBudget as need:
            await need.wait()
        except ProtocolError as err:
            assert err.code == Code.RATE_LIMIT_EXCEEDED
            return False


async def test_messages_cost_a_store_round_trip_per_chunk_not_per_message() -> None:
    store = MemoryStore()
    s = await seat(replica(store), events_per_s=800)
    before = store.round_trips
    taken = [await send(s) for _ in range(500)]
    assert all(taken)
    assert store.round_trips - before <= 500 // 100 + 1  # chunks of 800 / 8 = 100


async def test_three_replicas_never_take_more_than_the_limit_together() -> None:
    store = MemoryStore(clock=lambda: 1000.0)  # one window for all 60 (a slow machine would span two)
    seats = [await seat(replica(store), events_per_s=20) for _ in range(3)]
    taken = sum([await send(seats[i % 3]) for i in range(60)])
    assert taken <= 20
    # Held unspent by the others is the only shortfall: at most a chunk (20 / 8 -> 3) each.
    assert taken >= 20 - 2 * 3


async def test_budget_held_unspent_is_given_back_when_the_last_socket_closes() -> None:
    store = MemoryStore()
    a, b = replica(store), replica(store)
    first = await seat(a, events_per_s=16)
    assert await send(first)  # leases a chunk of 2, spends 1
    await first.close()  # gives the other back
    other = await seat(b, events_per_s=16)
    assert sum([await send(other) for _ in range(20)]) == 15


class FailingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.down = False

    async def take_budget(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
        if self.down:
            raise StoreUnavailable("down")
        return await super().take_budget(*args, **kwargs)  # type: ignore[arg-type]


async def test_while_the_store_is_down_one_chunk_per_window_is_granted_here() -> None:
    store = FailingStore()
    store.down = True
    s = await seat(replica(store), events_per_s=80)  # chunks of 10
    assert sum([await send(s) for _ in range(30)]) == 10


async def test_output_is_charged_after_it_is_made_and_stops_at_the_limit() -> None:
    store = MemoryStore()
    s = await seat(replica(store), audio_out_s_per_min=0.1)  # 100 ms; chunks of 13
    assert s.output_allowed()
    results = []
    for _ in range(12):
        results.append(s.audio_out(20))
        for _ in range(3):
            await asyncio.sleep(0)  # let the background lease land (the memory store answers at once)
    assert results[:5] == [True] * 5  # 100 ms
    assert not results[-1]
    assert not s.output_allowed()


@pytest.mark.parametrize("limits", [{}, {"max_sessions": 0}])
async def test_a_principal_without_limits_costs_no_store_round_trip(limits: dict[str, float]) -> None:
    store = MemoryStore()
    quotas = replica(store)
    before = store.round_trips
    s = await seat(quotas, **limits)
    for _ in range(10):
        s.message()
        s.audio_in(20, None)
        assert s.audio_out(20)
    await s.close()
    assert store.round_trips == before
    assert s.rate_limits() == {"rate_limits": [], "tenant_limits": []}
