"""An accept waits for the call's transport to settle it (gateway/hosting/incoming.py): it
answers once the call's session opened or was refused, across replicas over the bus, and
after ``ACCEPT_OPEN_WAIT_S`` when nothing settles it (the call's replica died). The memory
store and two replicas' contexts with their bus listeners: no sockets, no transport."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import orjson
import pytest

from gateway.auth import Grant
from gateway.hosting import incoming
from gateway.hosting.bus import listen_bus
from gateway.hosting.context import HostContext
from gateway.hosting.incoming import Accepted, IncomingCall, Rejected, answer_call, new_call_id
from gateway.store.memory import MemoryStore
from orchestrator.metrics import Metrics


@contextlib.asynccontextmanager
async def replica(store: MemoryStore, name: str) -> AsyncIterator[HostContext]:
    ctx = HostContext(store=store, metrics=Metrics(), replica_id=name, lease_ttl_ms=3000, detach_grace_s=1.0)
    listener = asyncio.get_running_loop().create_task(listen_bus(ctx))
    await turns()  # (it subscribes to the replica's channel)
    try:
        yield ctx
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener


async def waiting_call(ctx: HostContext) -> IncomingCall:
    """A call waiting on ``ctx``'s replica, as ``announce`` records it (without the webhook)."""
    call = IncomingCall(ctx, new_call_id())
    ctx.incoming[call.call_id] = call
    await ctx.store.put_token("incoming:" + call.call_id, orjson.dumps({"replica": ctx.replica_id}), 30)
    return call


async def turns(n: int = 20) -> None:
    for _ in range(n):  # (the loop's turns: what is ready runs)
        await asyncio.sleep(0)


@pytest.mark.parametrize("opened", [True, False])
async def test_an_accept_on_another_replica_answers_once_the_call_settles(opened: bool) -> None:
    store = MemoryStore()
    async with replica(store, "a") as a, replica(store, "b") as b:
        call = await waiting_call(a)
        accepting = asyncio.get_running_loop().create_task(answer_call(b, call.call_id, Accepted(Grant("key:k"), {})))
        answer = await call.wait(5)
        assert isinstance(answer, Accepted) and answer.grant.principal == "key:k"
        await turns()
        assert not accepting.done()  # delivered, and waiting for the session
        await call.settle(opened)
        assert await asyncio.wait_for(accepting, 5) is True
        await call.settle(opened)  # (again: nothing)
        assert not b.asks


async def test_an_accept_nobody_settles_answers_after_its_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(incoming, "ACCEPT_OPEN_WAIT_S", 0.2)
    store = MemoryStore()
    async with replica(store, "a") as a:
        call = await waiting_call(a)
        assert await answer_call(a, call.call_id, Accepted(Grant("key:k"), {})) is True  # (the call never settled)
        assert isinstance(await call.wait(1), Accepted) and not a.asks


async def test_a_reject_waits_for_nothing_and_a_second_answer_finds_no_call() -> None:
    store = MemoryStore()
    async with replica(store, "a") as a, replica(store, "b") as b:
        call = await waiting_call(a)
        assert await answer_call(b, call.call_id, Rejected("rejected", 486)) is True
        assert await call.wait(5) == Rejected("rejected", 486)
        assert await answer_call(b, call.call_id, Accepted(Grant("key:k"), {})) is False
