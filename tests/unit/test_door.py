"""The hosting door (gateway/hosting/door.py) driven without a socket: two runtimes
("replicas") on one in-process store, each with its lease loop and bus listener, the
passthrough engine, and peers that record what a client would read.

What every transport gets from the door: a session opened, its events in order, a
resume on any replica that replays the gap exactly once and replaces the old
connection, the duplex dialect's opening, heartbeat and close, and coded refusals that
never cost the session.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from gateway.hosting.delivery import Delivery
from gateway.hosting.door import Door, Pending
from gateway.protocol.dialects import DUPLEX, GA, Dialect
from gateway.protocol.errors import CloseCode, Code
from gateway.runtime import Runtime
from gateway.settings import Settings
from gateway.store.memory import MemoryStore
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(60)

TEXT = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}


@dataclass
class Client:
    """A ``Peer`` that records what its client reads, and its close."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    closed: tuple[int, str] | None = None
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def send(self, data: bytes, event: dict[str, Any] | None = None) -> None:
        self.messages.append(orjson.loads(data))  # what goes on the wire: the bytes
        self.arrived.set()

    def close(self, code: int, reason: str) -> None:
        if self.closed is None:
            self.closed = (code, reason)
        self.arrived.set()

    def types(self) -> list[str]:
        return [m["type"] for m in self.messages]

    def seqs(self) -> list[int]:
        return [m["server_event_seq"] for m in self.messages if m.get("server_event_seq")]

    def first(self, kind: str) -> dict[str, Any]:
        return next(m for m in self.messages if m["type"] == kind)

    async def until(self, check: Any, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while not check():
                self.arrived.clear()
                await self.arrived.wait()

    async def wait_for(self, kind: str, after: int = 0) -> dict[str, Any]:
        await self.until(lambda: kind in self.types()[after:])
        return next(m for m in self.messages[after:] if m["type"] == kind)


@pytest.fixture
async def replicas() -> AsyncIterator[tuple[Runtime, Runtime]]:
    store = MemoryStore()
    runtimes = []
    for name in ("a", "b"):
        settings = Settings(engine="passthrough", video_engine="none", replica_id=name, detach_grace_s=5.0)
        rt = Runtime(settings, PassthroughEngine(audio_chunks=40, paced=True), vad_factory=None, video_engine=None,
                     store=store)  # fmt: skip
        await rt.start()
        runtimes.append(rt)
    yield runtimes[0], runtimes[1]
    for rt in runtimes:
        await rt.close()


def door(rt: Runtime, client: Client, dialect: Dialect = GA, **kwargs: Any) -> Door:
    return Door(rt.hosting, rt, client, dialect=dialect, principal="key:me", model=rt.settings.model,
                max_message_bytes=rt.settings.max_message_bytes, **kwargs)  # fmt: skip


async def hand(d: Door, event: dict[str, Any] | str) -> None:
    pending: Pending = d.receive(event if isinstance(event, str) else orjson.dumps(event).decode())
    if pending is not None:
        await pending


async def eventually(check: Any, timeout: float = 10.0) -> None:
    """Until ``check()`` holds (polled: the state changes in a task of the runtime's)."""
    async with asyncio.timeout(timeout):
        while True:
            if check():
                return
            await asyncio.sleep(0.01)


async def journaled(rt: Runtime, session_id: str, seq: int) -> None:
    """Until the store's journal holds ``seq`` (the writer commits deltas every few ms)."""
    async with asyncio.timeout(10):
        while True:
            if ((await rt.store.read_events(session_id, after_seq=seq - 1)).last_seq or 0) >= seq:
                return
            await asyncio.sleep(0.01)


async def test_a_session_opened_through_a_door_answers_in_order(replicas: tuple[Runtime, Runtime]) -> None:
    a, _ = replicas
    client = Client()
    d = door(a, client)
    assert await d.open()
    created = await client.wait_for("session.created")  # once the store holds it (write-ahead)
    assert created["resume_token"] and d.host is not None and d.host.id == created["session"]["id"]
    await hand(d, {"type": "conversation.item.create", "item": TEXT})
    await hand(d, {"type": "response.create"})
    done = await client.wait_for("response.done")
    assert done["response"]["status"] == "completed"
    seqs = client.seqs()
    assert seqs == list(range(1, len(seqs) + 1))  # every session event, once, in order
    d.detach()


async def test_a_resume_on_another_replica_replays_the_gap_once_and_replaces_the_old_connection(
    replicas: tuple[Runtime, Runtime],
) -> None:
    a, b = replicas
    first = Client()
    on_a = door(a, first)
    assert await on_a.open()
    created = await first.wait_for("session.created")
    sid, token = created["session"]["id"], created["resume_token"]
    await hand(on_a, {"type": "conversation.item.create", "item": TEXT})
    await hand(on_a, {"type": "response.create"})
    await first.until(lambda: first.types().count("response.output_audio.delta") >= 5)
    last = first.seqs()[-1]
    first.messages.clear()  # what the client lost with its socket (it read up to ``last``)

    second = Client()
    on_b = door(b, second)
    resume = {"type": "session.resume", "session_id": sid, "resume_token": token,
              "last_received_server_event_seq": last}  # fmt: skip
    await journaled(a, sid, last)  # deltas are journaled in batches: a replay can only carry what was
    await hand(on_b, resume)
    resumed = second.first("session.resumed")
    assert resumed["replay_from"] == last + 1 and resumed["resume_token"] != token
    # A hears of the takeover on the bus: its host stops, its connection is replaced (4009).
    await first.until(lambda: first.closed is not None)
    assert first.closed == (CloseCode.SESSION_REPLACED, "session replaced")
    assert sid not in a.hosts and sid in b.hosts
    # B ends what died with A explicitly and answers again: never a gap, never a repeat.
    done = await second.wait_for("response.done")
    assert done["response"]["status"] == "incomplete"
    assert done["response"]["status_details"]["gateway_reason"] == "replica_lost"
    again = await second.wait_for("response.done", after=second.messages.index(done) + 1)
    assert again["response"]["status"] == "completed"
    seqs = second.seqs()
    assert seqs == list(range(last + 1, last + 1 + len(seqs)))
    on_a.detach()
    on_b.detach()


async def test_a_resume_while_the_old_connection_still_holds_the_session(replicas: tuple[Runtime, Runtime]) -> None:
    a, _ = replicas
    first, second = Client(), Client()
    old = door(a, first)
    assert await old.open()
    created = await first.wait_for("session.created")
    await hand(old, {"type": "conversation.item.create", "item": TEXT})
    await first.wait_for("conversation.item.done")
    new = door(a, second)
    resume = {"type": "session.resume", "session_id": created["session"]["id"], "resume_token":
              created["resume_token"], "last_received_server_event_seq": 1}  # fmt: skip
    await hand(new, resume)
    assert first.closed == (CloseCode.SESSION_REPLACED, "session replaced")
    assert "session.replaced" not in first.types()  # an OpenAI client that never opted in has no such event
    replayed = [m for m in second.messages if m.get("server_event_seq")]
    assert [m["server_event_seq"] for m in replayed] == list(range(2, first.seqs()[-1] + 1))
    assert [m["type"] for m in replayed][:3] == ["conversation.created", "conversation.item.added",
                                                 "conversation.item.done"]  # fmt: skip
    old.detach()  # the old socket closes: the session stays with the new one
    assert new.host is not None and not new.host.ended
    new.detach()


async def test_refusals_are_coded_and_the_session_goes_on(replicas: tuple[Runtime, Runtime]) -> None:
    a, _ = replicas
    client = Client()
    d = door(a, client)
    assert await d.open()
    await hand(d, "{not json")
    await hand(d, "x" * (a.settings.max_message_bytes + 1))
    await hand(d, {"type": "conversation.item.create", "item": TEXT})
    await hand(d, {"type": "session.resume", "event_id": "late", "session_id": "sess_x", "resume_token": "rt",
                   "last_received_server_event_seq": 0})  # fmt: skip
    await hand(d, {"type": "session.event_ack", "last_received_server_event_seq": "many"})
    await client.until(lambda: client.types().count("error") == 4)
    errors = {m["error"]["code"]: m for m in client.messages if m["type"] == "error"}
    assert set(errors) == {Code.INVALID_JSON, Code.MESSAGE_TOO_LARGE, Code.RESUME_NOT_FIRST, Code.INVALID_TYPE}
    assert errors[Code.RESUME_NOT_FIRST]["error"]["event_id"] == "late"
    # The session's own errors are in its stream (journaled, in order); a malformed ack's is
    # the connection's: never in the journal (it would be acked again), so it passes the hold.
    in_stream = [m["error"]["code"] for m in client.messages if m["type"] == "error" and m["server_event_seq"]]
    assert in_stream == [Code.INVALID_JSON, Code.MESSAGE_TOO_LARGE, Code.RESUME_NOT_FIRST]
    assert errors[Code.INVALID_TYPE]["server_event_seq"] == 0
    assert client.closed is None and d.host is not None and not d.host.ended
    d.detach()


async def test_a_resume_of_an_unknown_session_is_refused_on_the_connections_own_session(
    replicas: tuple[Runtime, Runtime],
) -> None:
    _, b = replicas
    client = Client()
    d = door(b, client)
    assert await d.open()
    await client.wait_for("session.created")
    own = d.host
    await hand(d, {"type": "session.resume", "event_id": "r1", "session_id": "sess_nope", "resume_token": "rt_x",
                   "last_received_server_event_seq": 0})  # fmt: skip
    error = client.first("error")["error"]
    assert (error["code"], error["event_id"]) == (Code.SESSION_NOT_FOUND, "r1")
    assert d.host is own and client.closed is None
    d.detach()


async def test_the_duplex_dialect_opens_on_its_first_update_and_closes_for_good(
    replicas: tuple[Runtime, Runtime],
) -> None:
    a, _ = replicas
    client = Client()
    d = door(a, client, DUPLEX)
    await hand(d, {"type": "session.heartbeat"})
    # No session yet: a connection event (no seq), and the close of one says no epoch but 0.
    assert client.types() == ["session.heartbeat_ack"] and "server_event_seq" not in client.messages[0]
    assert d.host is None
    await hand(d, {"type": "session.update", "session": {"instructions": "brief"}})
    await client.wait_for("session.updated")  # commit-gated: once the store holds them
    assert client.types()[1:3] == ["session.created", "session.updated"]
    sid = client.first("session.created")["session"]["id"]
    mark = len(client.messages)
    await hand(d, {"type": "session.heartbeat"})
    ack = await client.wait_for("session.heartbeat_ack", after=mark)  # the session's: its seq, journaled
    assert ack["session_id"] == sid and ack["server_event_seq"] == client.messages[mark - 1]["server_event_seq"] + 1
    await journaled(a, sid, ack["server_event_seq"])
    await hand(d, {"type": "session.close"})
    await client.until(lambda: client.closed is not None)
    closed = client.messages[-1]
    assert closed["type"] == "session.closed" and client.closed == (CloseCode.NORMAL, "session closed")
    assert (closed["session_id"], closed["reason"], closed["server_event_seq"]) == (
        sid,
        "client_close",
        ack["server_event_seq"] + 1,
    )
    await eventually(lambda: sid not in a.hosts)
    assert await a.store.load_snapshot(sid) is None  # closed for good: nothing to resume
    await hand(d, {"type": "response.create"})  # what comes before the socket closes is ignored
    assert client.messages[-1]["type"] == "session.closed"
    d.detach()


async def test_session_closed_is_the_last_event_even_behind_a_running_answer(
    replicas: tuple[Runtime, Runtime],
) -> None:
    """The answer stops with the session; nothing it made passes session.closed, and
    nothing comes after it (the socket closes once the gate let it out)."""
    a, _ = replicas
    client = Client()
    d = door(a, client, DUPLEX)
    await hand(d, {"type": "session.update", "session": {"instructions": "brief"}})
    await hand(d, {"type": "conversation.item.create", "item": TEXT})
    await hand(d, {"type": "response.create"})
    await client.wait_for("response.output_audio.delta")
    await hand(d, {"type": "turn.signal", "event": "timeout"})
    await client.until(lambda: client.closed is not None)
    await asyncio.sleep(0.1)  # (anything late would arrive now)
    closed = client.messages[-1]
    assert (closed["type"], closed["reason"]) == ("session.closed", "timeout")
    seqs = client.seqs()
    assert seqs == sorted(seqs) and seqs[-1] == closed["server_event_seq"]
    d.detach()


async def test_a_resume_only_duplex_connection_refuses_other_first_events(replicas: tuple[Runtime, Runtime]) -> None:
    a, _ = replicas
    client = Client()
    d = door(a, client, DUPLEX, resume_only=True)
    await hand(d, {"type": "response.create", "event_id": "too-soon"})
    error = client.first("error")["error"]
    assert (error["code"], error["event_id"]) == ("session_not_open", "too-soon") and d.host is None
    d.detach()


# --- Delivery: hold, replay de-duplication, the commit gate --------------------------


def event(seq: int) -> tuple[dict[str, Any], bytes]:
    e = {"type": "x", "server_event_seq": seq}
    return e, orjson.dumps(e)


async def test_holds_nest_and_a_release_drops_what_the_replay_carried() -> None:
    client = Client()
    delivery = Delivery(client, gated=False)
    delivery.hold()
    delivery.hold()
    for seq in (3, 4, 5):
        delivery.send(*event(seq))
    delivery.replay(event(3)[1])
    delivery.release(4)  # the replay went up to 4
    assert client.seqs() == [3]  # still held: holds nest
    delivery.send_now(b'{"type":"error","server_event_seq":0}')
    delivery.release(0)
    assert client.seqs() == [3, 5] and client.types()[1] == "error"


async def test_a_gated_connection_sends_only_what_the_store_holds_and_closes_after_it() -> None:
    client = Client()
    delivery = Delivery(client, gated=True)
    for seq in (1, 2, 3):
        delivery.send(*event(seq))
    assert client.seqs() == []
    delivery.committed(2)
    assert client.seqs() == [1, 2]
    delivery.close(1000, "bye")
    assert client.closed is None  # seq 3 waits for its commit
    delivery.committed(3)
    assert client.seqs() == [1, 2, 3] and client.closed == (1000, "bye")


async def test_a_gated_close_waits_for_what_a_hold_keeps_back() -> None:
    client = Client()
    delivery = Delivery(client, gated=True)
    delivery.committed(5)
    delivery.hold()  # write-ahead: the flush's events wait for their snapshot
    delivery.send(*event(1))
    delivery.send(*event(2))
    delivery.close(1000, "bye")
    assert client.closed is None
    delivery.release(0)
    assert client.seqs() == [1, 2] and client.closed == (1000, "bye")
    await asyncio.wait_for(delivery.closed(), 1)


async def test_a_gated_close_without_a_commit_sends_what_waits_after_a_bound() -> None:
    client = Client()
    delivery = Delivery(client, gated=True)
    delivery.send(*event(1))
    delivery.close(1012, "drain")
    await client.until(lambda: client.closed is not None, timeout=5)
    assert client.seqs() == [1] and client.closed == (1012, "drain")
