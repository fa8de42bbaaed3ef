"""The video host (gateway/hosting/video.py) driven without a socket: the CPU video engine,
an orchestrator, the in-process store shared by two "replicas" (two host contexts, each
with its lease loop and bus listener), and a peer that records what reaches the client
together with what the store held at that moment.

What an operator relies on (issue: an interaction POSTed to another replica after the
lease TTL got 404): the session is owned in the store before ``video.start`` can be
seen, its lease is renewed for as long as it streams, interactions reach it from any
replica, and once ``session.done`` is out no replica finds it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from gateway.hosting.bus import listen_bus
from gateway.hosting.context import HostContext
from gateway.hosting.leases import renew_leases
from gateway.hosting.video import Queued, Refused, VideoHost, VideoTimeouts, submit_interaction
from gateway.protocol.video_events import decode_interaction
from gateway.session.video_session import VideoSession
from gateway.store.memory import MemoryStore
from orchestrator.engines.passthrough import PassthroughEngine
from orchestrator.engines.video.engine import CpuVideoEngine
from orchestrator.metrics import Metrics
from orchestrator.orchestrator import AdmissionLimits, Orchestrator

pytestmark = pytest.mark.timeout(60)

LEASE_TTL_MS = 300  # short: a stream of a few seconds outlives many TTLs
START = {"type": "session.start", "prompt": "A red fox in snow", "width": 64, "height": 48, "fps": 8,
         "frames_per_chunk": 2}  # fmt: skip


@dataclass
class RecordingPeer:
    """The ``VideoPeer`` protocol, recording each delivery and whether the store still
    listed the session at that moment."""

    store: MemoryStore
    session_id: str = ""
    said: list[tuple[str, Any]] = field(default_factory=list)  # ("event", dict) | ("chunk", meta) | ...
    registered_when_done: bool | None = None
    closed: tuple[int, str] | None = None
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def send_event(self, event: dict[str, Any]) -> None:
        self.said.append(("event", event))
        if event["type"] == "session.done":
            # Reading the store is async: a task records it; the check is that the
            # registration is gone already, so it cannot come back later.
            asyncio.get_running_loop().create_task(self._note_done())
        self.arrived.set()

    async def _note_done(self) -> None:
        self.registered_when_done = await self.store.load_snapshot(self.session_id) is not None
        self.arrived.set()

    def send_chunk(self, meta: dict[str, Any], media: bytes, init_segment: bytes) -> None:
        self.said.append(("chunk", meta))
        self.arrived.set()

    def completed(self) -> None:
        self.said.append(("completed", None))

    def close(self, code: int, reason: str) -> None:
        if self.closed is None:
            self.closed = (code, reason)
        self.arrived.set()

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [x for k, x in self.said if k == "event" and x["type"] == kind]

    def chunks(self) -> list[dict[str, Any]]:
        return [x for k, x in self.said if k == "chunk"]

    def queued(self, event_id: str) -> bool:
        return any(e["event_id"] == event_id for e in self.events("session.interaction.queued"))

    def started(self, event_id: str) -> bool:
        """A chunk reports the interaction started: the engine applies it."""
        return any(event_id in c["started_event_ids"] for c in self.chunks())

    async def until(self, check: Any, timeout: float = 20.0) -> None:
        async with asyncio.timeout(timeout):
            while not check():
                self.arrived.clear()
                await self.arrived.wait()


@dataclass
class Replica:
    ctx: HostContext
    tasks: list[asyncio.Task[Any]]


@pytest.fixture
async def engine() -> AsyncIterator[CpuVideoEngine]:
    video = CpuVideoEngine(workers=1)
    await video.warm()  # (torch's import is not the first chunk's time: the tests time the stream)
    yield video
    await video.close()


@pytest.fixture
async def store() -> MemoryStore:
    return MemoryStore()


@contextlib.asynccontextmanager
async def replica(store: MemoryStore, name: str) -> AsyncIterator[Replica]:
    ctx = HostContext(store=store, metrics=Metrics(), replica_id=name, lease_ttl_ms=LEASE_TTL_MS, detach_grace_s=1.0)
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(renew_leases(ctx)), loop.create_task(listen_bus(ctx))]
    try:
        yield Replica(ctx, tasks)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def open_host(
    a: Replica, engine: CpuVideoEngine, store: MemoryStore, *, principal: str = "key:me"
) -> tuple[VideoHost, RecordingPeer, Orchestrator]:
    orchestrator = Orchestrator(PassthroughEngine(), AdmissionLimits(), Metrics(), video_engine=engine)
    session = VideoSession(session_id="vsess_test", info=engine.info)
    peer = RecordingPeer(store, session.id)
    host = await VideoHost.open(a.ctx, session, orchestrator=orchestrator, principal=principal, peer=peer,
                                timeouts=VideoTimeouts(start_s=10, stall_s=10))  # fmt: skip
    return host, peer, orchestrator


def interaction(event_id: str, prompt: str, k: int = 1) -> dict[str, Any]:
    return {"event_id": event_id, "event": {"prompt": prompt}, "transition_chunks": k}


async def test_the_session_is_owned_in_the_store_before_a_message_is_read(
    engine: CpuVideoEngine, store: MemoryStore
) -> None:
    async with replica(store, "a") as a:
        host, _, orchestrator = await open_host(a, engine, store)
        # open() has returned: nothing was read yet, and another replica can already find it.
        owner = await store.owner_of(host.id)
        assert owner is not None and owner.owner == "a"
        assert orjson.loads(await store.load_snapshot(host.id) or b"{}") == {"kind": "video", "principal": "key:me"}
        await host.end()
        assert await store.load_snapshot(host.id) is None and await store.owner_of(host.id) is None
        await orchestrator.close()


async def test_interactions_from_another_replica_are_applied_for_many_lease_ttls_and_none_after_the_end(
    engine: CpuVideoEngine, store: MemoryStore
) -> None:
    async with replica(store, "a") as a, replica(store, "b") as b:
        host, peer, orchestrator = await open_host(a, engine, store)
        host.receive(orjson.dumps({**START, "num_frames": 8 * 4}).decode())  # a 4 s stream
        await peer.until(lambda: peer.events("video.start"))
        loop = asyncio.get_running_loop()
        started = loop.time()
        for n, at in enumerate((0.1, 1.5, 3.0)):  # 5, 5 and 10 lease TTLs after the start
            await asyncio.sleep(max(0.0, started + at - loop.time()))
            payload = interaction(f"from-b-{n}", f"A lighthouse, take {n}")
            outcome = await submit_interaction(b.ctx, host.id, "key:me", decode_interaction(payload), payload)
            assert outcome == Queued(forwarded=True), (at, outcome)
            await peer.until(
                lambda n=n: any(e["event_id"] == f"from-b-{n}" for e in peer.events("session.interaction.queued"))
            )
            await peer.until(lambda n=n: any(f"from-b-{n}" in c["started_event_ids"] for c in peer.chunks()))
        await peer.until(lambda: peer.events("session.done") and peer.registered_when_done is not None)
        assert peer.events("session.done")[0]["stopped"] is False  # it ran to its end
        assert peer.registered_when_done is False  # forgotten before session.done went out
        payload = interaction("too-late", "Nothing")
        assert await submit_interaction(b.ctx, host.id, "key:me", decode_interaction(payload), payload) is None
        assert peer.closed == (1000, "done")
        await host.end()
        await orchestrator.close()


async def test_another_principal_finds_no_session_on_either_replica(engine: CpuVideoEngine, store: MemoryStore) -> None:
    async with replica(store, "a") as a, replica(store, "b") as b:
        host, peer, orchestrator = await open_host(a, engine, store)
        host.receive(orjson.dumps(START).decode())
        await peer.until(lambda: peer.chunks())
        payload = interaction("intruder", "Mine now")
        for ctx in (a.ctx, b.ctx):
            assert await submit_interaction(ctx, host.id, "key:other", decode_interaction(payload), payload) is None
        assert await submit_interaction(b.ctx, "vsess_nope", "key:me", decode_interaction(payload), payload) is None
        assert not peer.events("session.interaction.queued")
        await host.end()
        await orchestrator.close()


async def test_a_refused_interaction_is_answered_on_the_replica_that_serves_it(
    engine: CpuVideoEngine, store: MemoryStore
) -> None:
    async with replica(store, "a") as a:
        host, peer, orchestrator = await open_host(a, engine, store)
        payload = interaction("early", "Too soon")
        outcome = await submit_interaction(a.ctx, host.id, "key:me", decode_interaction(payload), payload)
        assert isinstance(outcome, Refused) and outcome.code == "no_active_request"
        assert peer.events("error")[0]["code"] == "no_active_request"  # the socket's client hears it too
        await host.end()
        await orchestrator.close()


async def test_a_store_down_at_the_start_is_caught_up_by_the_lease_loop(
    engine: CpuVideoEngine, store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.store.base import StoreUnavailable

    real_acquire = store.acquire
    down = True

    async def acquire(*args: Any, **kwargs: Any) -> int:
        if down:
            raise StoreUnavailable("redis is down")
        return await real_acquire(*args, **kwargs)

    monkeypatch.setattr(store, "acquire", acquire)
    async with replica(store, "a") as a:
        host, _, orchestrator = await open_host(a, engine, store)
        assert host.fence == 0 and await store.load_snapshot(host.id) is None  # streams unregistered
        down = False
        async with asyncio.timeout(10):  # polling the store: the lease loop runs on its own clock
            while True:
                if await store.load_snapshot(host.id) is not None:
                    break
                await asyncio.sleep(0.05)
        owner = await store.owner_of(host.id)
        assert owner is not None and owner.owner == "a" and host.fence > 0
        await host.end()
        await orchestrator.close()
