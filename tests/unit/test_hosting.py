"""A session host (gateway/hosting/host.py) driven without a socket: a real session,
a real orchestrator running the passthrough engine, the in-process store, and a
peer that records what reaches the client and what the store held at that moment.

Write-ahead (docs/sessions.md): an event that changes session
state reaches the client only once the store holds the state it announces; the
deltas of an answer stay batched.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import orjson
import pytest

from gateway.hosting.context import HostContext
from gateway.hosting.door import Door
from gateway.hosting.host import SessionHost
from gateway.protocol import client_events as ce
from gateway.protocol.dialects import GA
from gateway.protocol.session_config import SessionConfig
from gateway.session import snapshot
from gateway.session.events import STATE_EVENTS
from gateway.session.session import RealtimeSession
from gateway.session.snapshot import assemble
from gateway.store.base import StateQuota
from gateway.store.memory import MemoryStore
from orchestrator.engines.passthrough import PassthroughEngine
from orchestrator.metrics import Metrics
from orchestrator.orchestrator import AdmissionLimits, Orchestrator

CHUNKS = 20  # words (and audio deltas) in one passthrough answer
NO_SESSIONS: Any = None  # these tests host their session themselves: the door never opens one


class RecordingStore(MemoryStore):
    """The memory store, remembering what its commits made durable; ``gate`` holds commits."""

    def __init__(self) -> None:
        super().__init__()
        self.committed: set[int] = set()  # seqs of journaled events
        self.snapshot: dict[str, Any] | None = None  # the last committed snapshot, parsed
        self.commits = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def commit(
        self,
        session_id: str,
        *,
        fence: int,
        events: Sequence[tuple[int, bytes]] = (),
        snapshot: bytes | None = None,
        lost_through: int = 0,
        items: Mapping[str, bytes] | None = None,
        drop_items: Sequence[str] = (),
        quota: StateQuota | None = None,
    ) -> None:
        await self.gate.wait()
        await super().commit(session_id, fence=fence, events=events, snapshot=snapshot, lost_through=lost_through,
                             items=items, drop_items=drop_items, quota=quota)  # fmt: skip
        self.commits += 1
        self.committed.update(seq for seq, _ in events)
        if snapshot is not None:
            stored = await self.load_session(session_id)
            assert stored is not None
            self.snapshot = assemble(*stored)  # what a replica taking over would read


class RecordingPeer:
    """A connection (the ``Peer`` protocol: it writes what hosting gives it) that records
    each delivery with what the store held then."""

    def __init__(self, store: RecordingStore) -> None:
        self.store = store
        self.delivered: list[dict[str, Any]] = []
        self.violations: list[str] = []
        self.closed: tuple[int, str] | None = None
        self.arrived = asyncio.Event()

    def send(self, data: bytes, event: dict[str, Any] | None = None) -> None:
        self._deliver(event if event is not None else orjson.loads(data))

    def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)

    def _deliver(self, event: dict[str, Any]) -> None:
        self.delivered.append(event)
        self.arrived.set()
        if event["type"] not in STATE_EVENTS:
            return
        seq = event["server_event_seq"]
        snap = self.store.snapshot
        if seq not in self.store.committed:
            self.violations.append(f"{event['type']} (seq {seq}) reached the client before the journal held it")
        elif snap is None or snap["seq"] < seq:
            self.violations.append(f"{event['type']} (seq {seq}) reached the client before the snapshot held it")

    async def wait_for(self, kind: str, timeout: float = 5.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                for event in self.delivered:
                    if event["type"] == kind:
                        return event
                self.arrived.clear()
                await self.arrived.wait()

    def types(self) -> list[str]:
        return [e["type"] for e in self.delivered]


@pytest.fixture
async def hosted() -> AsyncIterator[tuple[SessionHost, RecordingPeer, RecordingStore]]:
    store = RecordingStore()
    engine = PassthroughEngine(audio_chunks=CHUNKS, paced=False)
    orchestrator = Orchestrator(engine, AdmissionLimits(), Metrics())
    ctx = HostContext(store=store, metrics=Metrics(), replica_id="r-test", lease_ttl_ms=15_000, detach_grace_s=1.0)
    session = RealtimeSession(
        session_id="sess_host", config=SessionConfig(model="m", turn_detection=None), engine=engine.info
    )
    host = await SessionHost.open(ctx, session, orchestrator=orchestrator, principal="key:me")
    peer = RecordingPeer(store)
    door = Door(ctx, NO_SESSIONS, peer, dialect=GA, principal="key:me", model="m", max_message_bytes=1 << 20)
    host.attach(door)
    host.start()
    try:
        yield host, peer, store
    finally:
        store.gate.set()
        await host.end(reason="test over")
        await orchestrator.close()


def handle(host: SessionHost, event: dict[str, Any]) -> None:
    host.receive(ce.decode(orjson.dumps(event)))


TEXT = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}


async def test_a_state_event_reaches_the_client_only_once_the_store_holds_it(
    hosted: tuple[SessionHost, RecordingPeer, RecordingStore],
) -> None:
    host, peer, store = hosted
    handle(host, {"type": "session.update", "session": {"type": "realtime", "instructions": "brief"}})
    handle(host, {"type": "conversation.item.create", "item": TEXT})
    handle(host, {"type": "response.create"})
    done = await peer.wait_for("response.done")
    assert done["response"]["status"] == "completed"
    assert peer.violations == []
    kinds = set(peer.types())
    assert {"session.created", "session.updated", "conversation.item.added", "response.created"} <= kinds
    assert peer.types().count("response.output_audio.delta") == CHUNKS
    # The snapshot a takeover would load knows everything the client saw.
    assert store.snapshot is not None
    restored = RealtimeSession.restore(snapshot.loads(orjson.dumps(store.snapshot)), engine=host.session.engine)
    assert [it.id for it in restored.conversation] == [it.id for it in host.session.conversation]
    assert restored.active_response_id is None


async def test_while_the_store_is_slow_a_state_event_waits_and_what_follows_waits_behind_it(
    hosted: tuple[SessionHost, RecordingPeer, RecordingStore],
) -> None:
    host, peer, store = hosted
    await asyncio.sleep(0.05)  # session.created is out
    before = len(peer.delivered)
    store.gate.clear()
    handle(host, {"type": "conversation.item.create", "item": TEXT})
    await asyncio.sleep(0.1)
    assert peer.types()[before:] == [], "conversation.item.added went out before its commit"
    store.gate.set()
    await peer.wait_for("conversation.item.done")
    assert peer.types()[before:] == ["conversation.item.added", "conversation.item.done"]
    assert peer.violations == []


async def test_an_answers_deltas_stay_batched(hosted: tuple[SessionHost, RecordingPeer, RecordingStore]) -> None:
    host, peer, store = hosted
    handle(host, {"type": "conversation.item.create", "item": TEXT})
    await peer.wait_for("conversation.item.done")
    await asyncio.sleep(0.05)
    commits = store.commits
    handle(host, {"type": "response.create"})
    await peer.wait_for("response.done")
    await asyncio.sleep(0.1)
    per_answer = store.commits - commits
    events = sum(1 for e in peer.delivered if e["type"].startswith("response.") or e["type"].startswith("rate_"))
    print(f"one answer of {events} events: {per_answer} commits")
    # response.created and response.done each wait for one commit; the 2 x CHUNKS deltas
    # between them, produced at once by the unpaced engine, share the batches around them.
    assert per_answer <= 4, per_answer
    assert peer.violations == []
