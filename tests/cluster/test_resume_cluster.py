"""Resume across replicas, with real parts: nginx (round-robin, no sticky
sessions), redis-server and three gateway replicas (``--engine passthrough``),
driven through nginx by the Python SDK (``client.RealtimeClient``).

What is proved (docs/sessions.md):

- a replica SIGKILLed in the middle of a streamed answer: the SDK resumes on
  another replica; every event after the client's last seq arrives exactly once
  (no seq gap, no duplicate delivered to the application), or, when the client
  held deltas the dead replica never committed, it gets
  ``session.resync_required`` (reason ``client_ahead``) and the stream goes on
  from there; the interrupted answer ends ``response.done`` ``incomplete``
  (``gateway_reason`` ``replica_lost``) and is re-issued, and the new answer completes; or,
  when the kill came after the answer was complete in the journal, it simply
  completed (and resumes: the client is never ahead then). Repeated 20 times.
  Every moment of a crash, one event at a time: tests/cluster/test_kill_at_every_event.py.
- a drained replica (SIGTERM): ``/readyz`` answers 503 at once, the socket
  closes 1012, the SDK resumes elsewhere, the answer finished within the drain
  window or is re-issued; nothing lost or duplicated.
- a dropped client socket (the replica stays up): the SDK resumes on any
  replica at the first attempt, nothing lost or duplicated.
- Redis restarted while sessions stream: no replica crashes, the sessions keep
  streaming on their sockets, resume works again afterwards, and a session
  whose state was lost with Redis gets ``session.resync_required`` or a coded
  refusal on resume, never a crash or a hang; events lost with Redis are never
  replayed across silently.
- the races next to those: the journal's last 25 ms dying with a replica after
  the client saw the answer complete (made deterministic with Redis
  ``CLIENT PAUSE WRITE``), a resume on the replica that holds the session while
  a journal commit is in flight (in one gateway process, where the store's
  commit can be held: the only test here without the cluster), a rotated resume
  token surviving the crash of the replica that issued it, and the replica a
  session was taken from no longer answering for it.

Every passthrough answer is 50 paced chunks (20 ms): a transcript word
``"w<i> "`` then 960 bytes of PCM16 each, so "nothing lost" is checked on the
content too: a completed answer carries exactly ``w0 .. w49`` and 48000 bytes
of audio; an interrupted one a prefix of the words.

Run with ``-s`` to see the counts. No timing is asserted; timeouts are generous.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
import pytest
import websockets
from support.gateway import run_gateway

from gateway.settings import Settings
from omni_gateway_client import ConnectionLost, RealtimeClient, ReconnectPolicy
from orchestrator.engines.passthrough import PassthroughEngine

if TYPE_CHECKING:
    from conftest import Harness  # the fixture's type; never imported at run time

pytestmark = pytest.mark.timeout(240)

WORDS = 50  # PassthroughEngine.audio_chunks (the replicas' default)
CHUNK_BYTES = 960  # 20 ms of 24 kHz PCM16 mono: one audio delta
FULL_WORDS = [f"w{i} " for i in range(WORDS)]
FULL_AUDIO = WORDS * CHUNK_BYTES
KILL_ITERATIONS = int(os.environ.get("OMNI_CLUSTER_KILLS", "20"))
EVENT_TIMEOUT_S = 15.0  # the longest wait for any one event (a resume included)
# Reconnect fast (the gateways are local) but give up well inside the test timeout.
FAST = ReconnectPolicy(initial_delay=0.05, max_delay=0.5, max_attempts=15, max_elapsed=6.0)
SLOW = ReconnectPolicy(initial_delay=0.4, max_delay=0.5, jitter=0.0, max_attempts=15, max_elapsed=6.0)
RESUME_REFUSALS = {"session_not_found", "resume_token_invalid", "resume_forbidden", "resume_seq_invalid",
                   "resume_not_first", "store_unavailable"}  # fmt: skip
TRANSCRIPT_DELTA = "response.output_audio_transcript.delta"
AUDIO_DELTA = "response.output_audio.delta"

# --- reading a session ----------------------------------------------------------------------------


@dataclass
class Tape:
    """Every event the application received from one session, in order."""

    events: list[dict[str, Any]] = field(default_factory=list)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("type") == kind]

    def words(self, response_id: str) -> list[str]:
        return [e["delta"] for e in self.of(TRANSCRIPT_DELTA) if e.get("response_id") == response_id]

    def audio_bytes(self, response_id: str) -> int:
        items = {e["item"]["id"] for e in self.of("response.output_item.added") if e.get("response_id") == response_id}
        return sum(len(e["delta"]) for e in self.of(AUDIO_DELTA) if e.get("item_id") in items)

    def summary(self, last: int = 40) -> str:
        lines = [f"{e.get('server_event_seq')} {e.get('type')} {_short(e)}" for e in self.events[-last:]]
        return f"{len(self.events)} events, the last {min(last, len(self.events))}:\n" + "\n".join(lines)


def _short(event: dict[str, Any]) -> str:
    if event.get("type") == "response.done":
        r = event["response"]
        return f"{r['id']} {r['status']} {r.get('status_details')}"
    if event.get("type") == TRANSCRIPT_DELTA:
        return repr(event.get("delta"))
    if event.get("type") in ("error", "client.session_lost"):
        return str(event.get("error") or event.get("code"))
    if event.get("type") == "session.resumed":
        return f"replay {event.get('replay_from')}..{event.get('replay_to')}"
    return ""


Hook = Callable[[dict[str, Any]], Awaitable[None]]


class AtWord:
    """A hook that runs ``action`` once, when the session's ``word``-th transcript delta arrives."""

    def __init__(self, word: int, action: Callable[[], Awaitable[None]]) -> None:
        self.word = word
        self.action = action
        self.words = 0
        self.fired = False

    async def __call__(self, event: dict[str, Any]) -> None:
        if event["type"] != TRANSCRIPT_DELTA or self.fired:
            return
        self.words += 1
        if self.words == self.word:
            self.fired = True
            await self.action()


async def next_event(rt: RealtimeClient, tape: Tape, timeout_s: float = EVENT_TIMEOUT_S) -> dict[str, Any]:
    try:
        event = await rt.recv(timeout_s)
    except TimeoutError:
        raise AssertionError(f"no event within {timeout_s}s (stats {rt.stats}); {tape.summary()}") from None
    tape.events.append(event)
    return event


async def open_session(
    h: Harness, tape: Tape, *, binary: bool = False, reconnect: ReconnectPolicy | bool = FAST
) -> RealtimeClient:
    """A connected SDK session (through nginx) with manual turns and one user message."""
    rt = RealtimeClient(h.cluster.url, api_key=h.api_key, reconnect=reconnect, binary=binary, resume_timeout=10.0)
    await rt.connect()
    try:
        assert (await next_event(rt, tape))["type"] == "session.created"
        await rt.session_update({"type": "realtime", "audio": {"input": {"turn_detection": None}}})
        await rt.send_text("hello")
    except BaseException:
        await rt.close()
        raise
    return rt


async def answer(rt: RealtimeClient, tape: Tape, hook: Hook | None = None) -> None:
    """``response.create``, then read until an answer ends other than ``incomplete`` with
    ``gateway_reason`` ``replica_lost`` or ``drained`` (which announces a re-issue); ``hook``
    sees every event as it arrives."""
    await rt.create_response()
    while True:
        event = await next_event(rt, tape)
        if hook is not None:
            await hook(event)
        if event["type"] == "response.done":
            r = event["response"]
            if not (
                r["status"] == "incomplete"
                and (r.get("status_details") or {}).get("gateway_reason") in ("replica_lost", "drained")
            ):
                return


async def read_until(rt: RealtimeClient, tape: Tape, kind: str) -> dict[str, Any]:
    return await read_until_any(rt, tape, (kind,))


async def read_until_any(rt: RealtimeClient, tape: Tape, kinds: tuple[str, ...]) -> dict[str, Any]:
    while True:
        event = await next_event(rt, tape)
        if event["type"] in kinds:
            return event


# --- the guarantees -------------------------------------------------------------------------------


def assert_exactly_once(tape: Tape, rt: RealtimeClient, *, resync_allowed: bool = False) -> None:
    """Session events (seq > 0) reached the application once each, in order, with no gap; the one
    allowed jump is right after a ``session.resync_required`` (to its ``last_server_event_seq``),
    when ``resync_allowed``."""
    last = 0
    for event in tape.events:
        seq = event.get("server_event_seq") or 0
        if event.get("type") == "session.resync_required":
            assert resync_allowed, f"resync instead of replay; {tape.summary()}"
            assert event["last_server_event_seq"] >= last, event
            last = event["last_server_event_seq"]
        elif seq > 0:
            assert last == 0 or seq == last + 1, f"seq {last} then {seq}: gap or repeat; {tape.summary()}"
            last = seq
    ids = [e["event_id"] for e in tape.events if (e.get("server_event_seq") or 0) > 0 and "event_id" in e]
    assert len(ids) == len(set(ids)), f"an event_id was delivered twice; {tape.summary()}"
    assert rt.stats.gaps == 0, rt.stats
    errors = tape.of("error")
    assert not errors, f"error events: {errors}"


def assert_answered(tape: Tape, responses_before: int = 0, cut_by: str = "replica_lost") -> str:
    """The answers after the first ``responses_before`` ones: one answer that completed whole
    ("completed"), or an interrupted one (``incomplete``, ``gateway_reason`` ``cut_by``: a lost
    replica, or a drain's window running out; a prefix of the words) and its re-issue that
    completed whole ("reissued")."""
    done = [e["response"] for e in tape.of("response.done")][responses_before:]
    created = [e["response"]["id"] for e in tape.of("response.created")][responses_before:]
    assert done, f"no response.done; {tape.summary()}"
    first = done[0]
    if first["status"] == "completed":
        outcome = "completed"
        final = first
        assert len(done) == 1 and created == [first["id"]], f"{created} {done}"
    else:
        outcome = "reissued"
        assert first["status"] == "incomplete", first
        assert (first.get("status_details") or {}).get("gateway_reason") == cut_by, first
        got = tape.words(first["id"])
        assert got == FULL_WORDS[: len(got)], f"the interrupted answer's words are not a prefix: {got}"
        assert len(done) == 2, f"expected the interrupted answer then its re-issue: {done}"
        final = done[1]
        assert final["id"] != first["id"] and created == [first["id"], final["id"]], f"{created} {done}"
    assert final["status"] == "completed", final
    assert tape.words(final["id"]) == FULL_WORDS, f"words lost or repeated: {tape.words(final['id'])}"
    assert tape.audio_bytes(final["id"]) == FULL_AUDIO, f"audio lost or repeated: {tape.audio_bytes(final['id'])}"
    return outcome


@dataclass
class Counts:
    iterations: int = 0
    completed: int = 0
    reissued: int = 0
    resumes: int = 0
    resyncs: int = 0
    replayed_events: int = 0
    duplicates_dropped: int = 0
    failed_attempts: int = 0
    landed_elsewhere: int = 0

    def add(self, outcome: str, rt: RealtimeClient, elsewhere: bool) -> None:
        self.iterations += 1
        setattr(self, outcome, getattr(self, outcome) + 1)
        self.resumes += rt.stats.resumes
        self.resyncs += rt.stats.resyncs
        self.replayed_events += rt.stats.replayed_events
        self.duplicates_dropped += rt.stats.duplicates_dropped
        self.failed_attempts += rt.stats.failed_attempts
        self.landed_elsewhere += int(elsewhere)


async def pause_redis_writes(h: Harness, ms: int) -> None:
    """Redis holds every write (Lua scripts included) for ``ms``; reads go on (CLIENT PAUSE WRITE)."""
    await h.redis.execute_command("CLIENT", "PAUSE", str(ms), "WRITE")


async def poll_readyz(h: Harness, index: int, limit_s: float = 2.0) -> list[int | None]:
    """/readyz of one replica, polled until it answers 503 or stops answering."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    codes: list[int | None] = []
    while loop.time() < deadline:
        code = await h.status(index, "/readyz")
        codes.append(code)
        if code != 200:
            break
    return codes


# --- 1. SIGKILL -----------------------------------------------------------------------------------


@dataclass
class Run:
    """One session's answer, interrupted once."""

    outcome: str  # "completed" | "reissued"
    owner: int  # the replica serving the session before
    new_owner: int | None  # the replica serving it after
    rt: RealtimeClient

    def line(self) -> str:
        s = self.rt.stats
        how = "resynced" if s.resyncs else "resumed"
        return (f"r{self.owner} -> r{self.new_owner}: {how}, {self.outcome}; replayed {s.replayed_events}, "
                f"duplicates dropped {s.duplicates_dropped}, failed attempts {s.failed_attempts}")  # fmt: skip


async def quiet(rt: RealtimeClient, tape: Tape, quiet_s: float = 0.6) -> None:
    """Read until no event arrives for ``quiet_s`` (whatever a resume still had to say)."""
    while True:
        try:
            event = await rt.recv(quiet_s)
        except TimeoutError:
            return
        tape.events.append(event)


async def kill_once(h: Harness, mode: str, kill_at: int, *, binary: bool, delay_s: float = 0.0) -> Run:
    """SIGKILL the session's replica during an answer; ``mode``:

    - "mid": at word ``kill_at``, while the client is connected;
    - "detached": the client's socket drops at word ``kill_at`` and the replica goes on generating
      (journaling) for ``delay_s`` before it is killed; the SDK, slower to reconnect here, resumes
      after the kill, so the replay carries what the dead replica journaled;
    - "late": once the answer is complete in the journal (``response.done`` received and its seq
      committed): it simply completed, and the resume has nothing to end or re-issue.
    """
    cluster = h.cluster
    tape = Tape()
    rt = await open_session(h, tape, binary=binary, reconnect=SLOW if mode == "detached" else FAST)
    try:
        sid = rt.session_id
        assert sid is not None
        owner = await h.wait_owner(sid)
        killed = asyncio.Event()

        def kill() -> None:
            cluster.kill_replica(owner, signal.SIGKILL)
            killed.set()

        async def act() -> None:
            if mode == "detached":
                drop_socket(rt)
            if delay_s:
                asyncio.get_running_loop().call_later(delay_s, kill)
            else:
                kill()

        async def when_journaled(event: dict[str, Any]) -> None:
            if event["type"] == "response.done" and not killed.is_set():
                await h.wait_journaled(sid, event["server_event_seq"])
                kill()

        trigger = AtWord(kill_at, act)
        await answer(rt, tape, when_journaled if mode == "late" else trigger)
        assert mode == "late" or trigger.fired, f"the answer ended before word {kill_at}"
        await killed.wait()
        if rt.stats.resumes + rt.stats.resyncs == 0:  # killed after the answer ended: still to come
            await read_until_any(rt, tape, ("session.resumed", "session.resync_required"))
        await quiet(rt, tape, 0.3)
        new_owner = await h.owner(sid)
        # A resync only when the client held deltas the dead replica had not committed;
        # every state change it saw was committed first (write-ahead), so never after the end.
        assert_exactly_once(tape, rt, resync_allowed=mode != "late")
        for resync in tape.of("session.resync_required"):
            assert resync["reason"] == "client_ahead", resync
        outcome = assert_answered(tape)
        assert rt.stats.resumes + rt.stats.resyncs == 1, f"{rt.stats}"
        assert new_owner is not None and new_owner != owner, (owner, new_owner)
        return Run(outcome, owner, new_owner, rt)
    finally:
        await rt.close()


async def test_replica_killed_mid_answer_resumes_elsewhere_exactly_once(harness: Harness) -> None:
    cluster = harness.cluster
    seed = int(os.environ.get("OMNI_CLUSTER_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    counts = Counts()
    modes: dict[str, int] = {}
    restarting: asyncio.Task[None] | None = None

    async def restart(index: int) -> None:
        await cluster.await_exit(index, 30)
        await cluster.astart_replica(index)

    try:
        for i in range(KILL_ITERATIONS):
            if restarting is not None:
                await restarting  # all replicas up again before the next kill
                restarting = None
            if i % 5 == 4:
                mode, kill_at, delay_s = "late", WORDS, 0.0
            elif i % 5 == 2:
                mode, kill_at, delay_s = "detached", rng.randint(10, 30), 0.15
            else:
                mode, kill_at, delay_s = "mid", rng.randint(10, 30), 0.0
            binary = i % 2 == 1
            async with asyncio.timeout(60):
                run = await kill_once(harness, mode, kill_at, binary=binary, delay_s=delay_s)
            restarting = asyncio.create_task(restart(run.owner))
            counts.add(run.outcome, run.rt, elsewhere=True)
            modes[mode] = modes.get(mode, 0) + 1
            print(f"kill {i + 1:>2} {mode:>8} at word {kill_at:>2} +{delay_s * 1000:3.0f} ms "
                  f"({'binary' if binary else 'json'}): {run.line()}")  # fmt: skip
    finally:
        if restarting is not None:
            with contextlib.suppress(Exception):
                await restarting
    print(f"modes: {modes}")
    print(f"SIGKILL x{counts.iterations} (seed {seed}): {counts}")
    assert counts.iterations == KILL_ITERATIONS
    assert counts.completed + counts.reissued == KILL_ITERATIONS


async def test_an_answer_the_client_saw_complete_is_not_ended_again_after_a_crash(harness: Harness) -> None:
    """The journal tail dies with the replica (docs/sessions.md: "a replica that dies loses at most the events
    of its last 25 ms"), but never an answer's end: Redis pauses writes (CLIENT PAUSE WRITE) from word
    45, so the last words reach the client and not the journal, while ``response.done`` waits for its
    commit; the replica is killed as soon as the client has ``response.done``. The answer completed for
    the client: the replica that resumes the session must not end it again nor answer it twice."""
    cluster = harness.cluster
    tape = Tape()
    rt = await open_session(harness, tape)
    try:
        sid = rt.session_id
        assert sid is not None
        owner = await harness.wait_owner(sid)

        async def pause_writes() -> None:
            await pause_redis_writes(harness, 1500)

        pause = AtWord(45, pause_writes)

        async def hook(event: dict[str, Any]) -> None:
            await pause(event)
            if event["type"] == "response.done":
                cluster.kill_replica(owner, signal.SIGKILL)

        async with asyncio.timeout(60):
            await answer(rt, tape, hook)
            assert pause.fired
            done_seq = tape.of("response.done")[0]["server_event_seq"]
            # docs/sessions.md: response.done is sent only once its journal batch is committed.
            assert await harness.journal_last(sid) >= done_seq, "response.done reached the client before the journal"
            await harness.redis.execute_command("CLIENT", "UNPAUSE")
            await read_until(rt, tape, "session.resumed")
            await quiet(rt, tape, 1.5)
        print(f"journal tail lost after the answer completed: {[_short(d) for d in tape.of('response.done')]}")
        assert_exactly_once(tape, rt)
        assert assert_answered(tape) == "completed"
    finally:
        with contextlib.suppress(Exception):
            await harness.redis.execute_command("CLIENT", "UNPAUSE")
        await rt.close()


# --- 2. drain -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "drain_at",
    [
        pytest.param(5, id="cut-by-the-window"),
        pytest.param(44, id="finishes-in-the-window"),
    ],
)  # fmt: skip
async def test_drained_replica_closes_1012_and_the_session_resumes_elsewhere(harness: Harness, drain_at: int) -> None:
    """SIGTERM at word ``drain_at``: with 50 words of 20 ms and a 0.5 s drain window, the answer is
    cut (word 5: ~0.9 s left) or finishes inside the window (word 44: ~0.1 s left); either is allowed."""
    cluster = harness.cluster
    tape = Tape()
    rt = await open_session(harness, tape)
    try:
        sid = rt.session_id
        assert sid is not None
        owner = await harness.wait_owner(sid)
        drained_socket = rt._ws  # the SDK's socket to the replica that will drain
        assert drained_socket is not None
        readyz: list[int | None] = []

        async def drain() -> None:
            cluster.kill_replica(owner, signal.SIGTERM)
            readyz.extend(await poll_readyz(harness, owner))

        trigger = AtWord(drain_at, drain)
        async with asyncio.timeout(60):
            await answer(rt, tape, trigger)
            assert trigger.fired, "the answer ended before the drain began"
            if not tape.of("session.resumed"):
                await read_until(rt, tape, "session.resumed")  # the close comes after the answer
            outcome = assert_answered(tape, cut_by="drained")
            assert drained_socket.close_code == 1012, (drained_socket.close_code, drained_socket.close_reason)
            assert 503 in readyz, f"/readyz of the draining replica: {readyz}"
            assert await cluster.await_exit(owner, 30) == 0
            new_owner = await harness.owner(sid)
            assert new_owner is not None and new_owner != owner, (owner, new_owner)
            # The session goes on on its new replica.
            await answer(rt, tape)
            assert assert_answered(tape, responses_before=len(tape.of("response.done")) - 1) == "completed"
        assert_exactly_once(tape, rt)
        run = Run(outcome, owner, new_owner, rt)
        print(f"drain at word {drain_at}: /readyz {readyz}, close 1012, {run.line()}")
    finally:
        await rt.close()


# --- 3. dropped socket ----------------------------------------------------------------------------


def drop_socket(rt: RealtimeClient) -> None:
    """Abort the SDK's TCP connection, as a network failure would: no close frame."""
    ws = rt._ws
    assert ws is not None, "no socket to drop"
    ws.transport.abort()


async def drop_once(h: Harness, drop_at: int, *, binary: bool = False) -> Run:
    """Drop the socket at word ``drop_at``; the SDK resumes, through nginx, on whichever replica."""
    tape = Tape()
    rt = await open_session(h, tape, binary=binary)
    try:
        sid = rt.session_id
        assert sid is not None
        owner = await h.wait_owner(sid)

        async def drop() -> None:
            drop_socket(rt)

        trigger = AtWord(drop_at, drop)
        await answer(rt, tape, trigger)
        assert trigger.fired, f"the answer ended before word {drop_at}"
        new_owner = await h.owner(sid)
        assert_exactly_once(tape, rt)
        outcome = assert_answered(tape)
        assert rt.stats.reconnects == 1 and rt.stats.resumes == 1, rt.stats
        assert rt.stats.failed_attempts == 0, f"a resume attempt failed on a live replica: {rt.stats}"
        assert all(r.alive for r in h.cluster.replicas)
        return Run(outcome, owner, new_owner, rt)
    finally:
        await rt.close()


@pytest.mark.parametrize("redis_topology", ["single", "cluster"], indirect=True)
async def test_dropped_socket_resumes_on_any_replica_at_the_first_attempt(harness: Harness) -> None:
    rng = random.Random()
    counts = Counts()
    for i in range(6):
        drop_at = rng.randint(5, 40)
        async with asyncio.timeout(60):
            run = await drop_once(harness, drop_at, binary=i % 2 == 1)
        counts.add(run.outcome, run.rt, elsewhere=run.new_owner != run.owner)
        print(f"drop {i + 1} at word {drop_at:>2}: {run.line()}")
    print(f"dropped sockets: {counts}")
    assert counts.landed_elsewhere >= 1, "no resume landed on another replica: cross-replica resume not exercised"


class RawSession:
    """A session on a plain WebSocket (JSON only, no SDK) to one replica, checking seqs itself."""

    def __init__(self, api_key: str, url: str) -> None:
        self.api_key = api_key
        self.url = url
        self.ws: Any = None
        self.session_id = ""
        self.token = ""
        self.last = 0
        self.gaps: list[tuple[int, int]] = []

    async def connect(self) -> dict[str, Any]:
        self.ws = await websockets.connect(self.url, additional_headers={"Authorization": f"Bearer {self.api_key}"},
                                           open_timeout=10, compression=None, max_size=None)  # fmt: skip
        while (event := await self.recv())["type"] != "session.created":
            pass
        return event

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(orjson.dumps(event).decode())

    async def recv(self) -> dict[str, Any]:
        return dict(orjson.loads(await self.ws.recv()))

    def observe(self, event: dict[str, Any]) -> None:
        seq = event.get("server_event_seq") or 0
        if seq:
            if seq != self.last + 1:
                self.gaps.append((self.last, seq))
            self.last = seq

    async def start(self) -> None:
        created = await self.connect()
        self.session_id, self.token = created["session"]["id"], created["resume_token"]
        self.observe(created)
        await self.send({"type": "session.update",
                         "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}})  # fmt: skip
        await self.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                         "content": [{"type": "input_text", "text": "hello"}]}})  # fmt: skip
        await self.send({"type": "response.create"})

    async def until_done(self) -> None:
        """Read until the running answer's ``response.done`` (and the events just after it)."""
        while (event := await self.recv())["type"] != "response.done":
            self.observe(event)
        self.observe(event)
        await self.stream_quietly(0.2)

    async def stream_quietly(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                while True:
                    self.observe(await self.recv())

    async def drop_and_resume(self, url: str | None = None) -> dict[str, Any]:
        """Abort the socket, reconnect (to ``url``, default the same replica) and resume; returns
        ``session.resumed`` or the refusal."""
        self.ws.transport.abort()
        if url is not None:
            self.url = url
        await self.connect()
        await self.send({"type": "session.resume", "session_id": self.session_id, "resume_token": self.token,
                         "last_received_server_event_seq": self.last})  # fmt: skip
        try:
            async with asyncio.timeout(5):
                while (event := await self.recv())["type"] not in ("session.resumed", "session.resync_required"):
                    if event["type"] == "error":
                        return event
        except TimeoutError:
            raise AssertionError(f"{self.url}: no answer to session.resume within 5 s") from None
        self.token = event["resume_token"]
        return event


class CommitGates:
    """Holds a store's journal commits (``SessionStore.commit``, which the process's journal
    flusher calls for each session of a batch) of one session at will, by order: the first
    commit of the session after ``session_id`` is set waits for ``flusher`` (the batch in flight
    when the socket dropped); later ones wait for ``others`` (a resume's flush). Other sessions'
    commits go through."""

    def __init__(self, store: Any) -> None:
        self._session_id = ""
        self._calls = 0
        self.flusher = asyncio.Event()
        self.others = asyncio.Event()
        self.flusher.set()
        self.others.set()
        self.holding = asyncio.Event()  # a later commit is being held
        commit = store.commit

        async def gated(session_id: str, **kwargs: Any) -> None:
            if session_id == self._session_id:
                self._calls += 1
                if self._calls == 1:
                    await self.flusher.wait()
                elif not self.others.is_set():
                    self.holding.set()
                    await self.others.wait()
            await commit(session_id, **kwargs)

        store.commit = gated  # this instance only: the store's commit_many calls self.commit(...)

    @property
    def session_id(self) -> str:
        return self._session_id

    @session_id.setter
    def session_id(self, value: str) -> None:
        self._session_id, self._calls = value, 0


async def test_a_resume_on_the_replica_holding_the_session_misses_nothing_while_it_flushes() -> None:
    """The race behind a seq gap seen in bench/resume.py (2 of 39 resumes under load, 1 in ~4000 on
    an idle machine), made deterministic in one gateway process (the replica holding the session):
    the socket drops mid-answer; the client resumes on the same replica while the journal commit
    that resume waits for is slow (the store's commit is held for 200 ms). Every event the answer
    produces meanwhile must reach the client, replayed or live."""
    settings = Settings(engine="passthrough", api_keys=("k",), video_engine="none")
    async with run_gateway(settings, engine=PassthroughEngine(), vad_factory=None) as gw:
        gates = CommitGates(gw.runtime.store)
        s = RawSession("k", gw.url)
        try:
            async with asyncio.timeout(30):
                await s.start()
                while s.last < 30:  # about 10 words into the answer
                    s.observe(await s.recv())
                s.ws.transport.abort()
                gates.session_id = s.session_id
                gates.flusher.clear()  # the session's next batch blocks in flight ...
                gates.others.clear()
                await asyncio.sleep(0.06)  # ... with the answer's next events waiting behind it
                await s.connect()
                resume = {"type": "session.resume", "session_id": s.session_id, "resume_token": s.token,
                          "last_received_server_event_seq": s.last}  # fmt: skip
                await s.send(resume)
                await asyncio.sleep(0.05)  # the resume now waits for that batch
                gates.flusher.set()  # the batch goes through; the resume's own flush (the next one) is held
                await gates.holding.wait()
                await asyncio.sleep(0.2)  # the answer goes on meanwhile: 10 words
                gates.others.set()
                while (event := await s.recv())["type"] != "session.resumed":
                    assert event["type"] != "error", event
                while event["type"] != "response.done":
                    event = await s.recv()
                    s.observe(event)
        finally:
            await s.ws.close()
    print(f"resume while its flush was slow: seq jumps {s.gaps}")
    assert not s.gaps, f"events never delivered: seq (last, next) jumps {s.gaps}"


async def test_a_rotated_resume_token_is_in_the_store_and_survives_the_replica(harness: Harness) -> None:
    """An idle session (its answer done) resumes on its replica after a dropped socket: the rotated
    token's hash must be in the store's snapshot (what every other replica checks) before the client
    can need it; then that replica crashes, and the rotated token resumes the session elsewhere."""
    cluster = harness.cluster
    owner, other = 0, 1
    s = RawSession(harness.api_key, cluster.replicas[owner].url)
    try:
        async with asyncio.timeout(60):
            await s.start()
            await s.until_done()
            resumed = await s.drop_and_resume()
            assert resumed["type"] == "session.resumed", resumed
            await asyncio.sleep(0.5)  # whatever the resume wrote is committed by now
            raw = await harness.redis.get(f"omni:s:{{{s.session_id}}}:snap")
            assert raw is not None
            stored = orjson.loads(raw)["token_hash"]
            assert stored == hashlib.sha256(s.token.encode()).hexdigest(), (
                "the store still holds the previous token's hash: no other replica accepts the rotated token"
            )
            cluster.kill_replica(owner, signal.SIGKILL)
            await cluster.await_exit(owner, 30)
            resumed = await s.drop_and_resume(cluster.replicas[other].url)
            assert resumed["type"] == "session.resumed", resumed
    finally:
        if s.ws is not None:
            await s.ws.close()
        await harness.ensure_all_up()


async def test_the_replica_a_session_was_taken_from_does_not_answer_for_it(harness: Harness) -> None:
    """A session idle on replica A resumes on B (A is alive: a dropped socket). Soon after, the client
    drops again and lands on A (round-robin does that): A must not answer from the state it held
    before (a token B has rotated since, a journal B writes to), but resume the session as any other
    replica would."""
    cluster = harness.cluster
    a, b = 0, 1
    s = RawSession(harness.api_key, cluster.replicas[a].url)
    try:
        async with asyncio.timeout(60):
            await s.start()
            await s.until_done()
            resumed = await s.drop_and_resume(cluster.replicas[b].url)
            assert resumed["type"] == "session.resumed", f"on B: {resumed}"
            assert await harness.owner(s.session_id) == b
            await s.stream_quietly(0.02)  # soon: A's lease renewal (every 5 s) would notice at last
            resumed = await s.drop_and_resume(cluster.replicas[a].url)
            assert resumed["type"] == "session.resumed", f"back on A: {resumed}"
            assert await harness.owner(s.session_id) == a
            await s.send({"type": "response.create"})
            await s.until_done()  # and it answers there
        assert not s.gaps, s.gaps
    finally:
        if s.ws is not None:
            await s.ws.close()


# --- 4. Redis restart -----------------------------------------------------------------------------


async def test_redis_restarts_while_sessions_stream_keep_them_streaming(harness: Harness) -> None:
    """Nine sessions stream three answers each while Redis is restarted (empty) four times: every
    socket stays up and gets every event; every replica stays alive and ready."""
    cluster = harness.cluster
    sessions, answers, restarts = 9, 3, 4
    streaming = asyncio.Event()

    async def started() -> None:
        streaming.set()

    async def stream(tape: Tape) -> RealtimeClient:
        rt = await open_session(harness, tape)
        try:
            await answer(rt, tape, AtWord(10, started))
            for _ in range(answers - 1):
                await answer(rt, tape)
        except BaseException:
            await rt.close()
            raise
        return rt

    tapes = [Tape() for _ in range(sessions)]
    async with asyncio.timeout(120):
        tasks = [asyncio.create_task(stream(t)) for t in tapes]
        await streaming.wait()
        for _ in range(restarts):
            await cluster.arestart_redis()
            await asyncio.sleep(0.4)
        results = await asyncio.gather(*tasks, return_exceptions=True)
    try:
        for tape, result in zip(tapes, results, strict=True):
            assert isinstance(result, RealtimeClient), f"{result!r}; {tape.summary()}"
            rt = result
            assert_exactly_once(tape, rt)
            done = tape.of("response.done")
            assert [d["response"]["status"] for d in done] == ["completed"] * answers, tape.summary()
            for d in done:
                assert tape.words(d["response"]["id"]) == FULL_WORDS, tape.summary()
                assert tape.audio_bytes(d["response"]["id"]) == FULL_AUDIO
            assert rt.stats.reconnects == 0, f"the socket did not survive the Redis restarts: {rt.stats}"
        for r in cluster.replicas:
            assert r.alive, f"replica {r.name} died: {harness.log_tail(r.index)}"
            assert await harness.status(r.index, "/healthz") == 200
        await harness.wait_ready(30)  # each ready again once its own probe finds Redis back (1 s, busy: more)
    finally:
        for result in results:
            if isinstance(result, RealtimeClient):
                await result.close()
    print(f"{restarts} redis restarts: {sessions} sessions x {answers} answers streamed on, every replica alive")


async def test_redis_restart_crashes_no_replica(harness: Harness) -> None:
    """Whatever happens to the sessions, a Redis restart under load never takes a replica down."""
    cluster = harness.cluster
    tapes = [Tape() for _ in range(6)]
    clients = [await open_session(harness, t) for t in tapes]
    try:
        for rt in clients:
            await rt.create_response()
        await asyncio.sleep(0.3)
        await cluster.arestart_redis()
        await asyncio.sleep(1.0)
        for r in cluster.replicas:
            assert r.alive, f"replica {r.name} died: {harness.log_tail(r.index)}"
            assert await harness.status(r.index, "/healthz") == 200
            assert await harness.status(r.index, "/readyz") == 200
        # New sessions work and answer.
        tape = Tape()
        rt = await open_session(harness, tape)
        try:
            async with asyncio.timeout(30):
                await answer(rt, tape)
            assert assert_answered(tape) == "completed"
        finally:
            await rt.close()
    finally:
        for rt in clients:
            await rt.close()


async def test_resume_works_after_a_redis_restart(harness: Harness) -> None:
    """Sessions opened after the restart whose socket drops mid-answer resume at the first attempt,
    nothing lost or duplicated."""
    await harness.cluster.arestart_redis()
    await harness.wait_ready()  # the replicas have seen Redis back: sessions open again
    for drop_at in (10, 20, 30):
        async with asyncio.timeout(60):
            run = await drop_once(harness, drop_at)
        print(f"resume after a redis restart, dropped at word {drop_at}: {run.line()}")


async def test_events_lost_with_redis_are_never_replayed_as_a_silent_gap(harness: Harness) -> None:
    """The socket drops at word 15 and Redis restarts at once: the events the replica produced
    meanwhile (still generating, detached) are lost with Redis. When the replica has taken the
    session's lease again, a resume on that replica must say so (session.resync_required) or
    replay from the client's last seq + 1 with no hole: never skip the lost events silently."""
    cluster = harness.cluster
    tape = Tape()
    rt = await open_session(harness, tape, reconnect=False)
    try:
        sid, token = rt.session_id, rt.resume_token
        assert sid is not None and token is not None
        owner = await harness.wait_owner(sid)

        async def drop() -> None:
            drop_socket(rt)
            await cluster.arestart_redis()

        trigger = AtWord(15, drop)
        with contextlib.suppress(ConnectionLost):
            async with asyncio.timeout(30):
                await answer(rt, tape, trigger)
        assert trigger.fired
        last = rt.last_seq
    finally:
        await rt.close()
    assert await harness.wait_owner(sid, 20) == owner  # its replica took the lease again
    await asyncio.sleep(0.2)  # and journaled some more of the answer
    event, ws = await raw_resume(harness, cluster.replicas[owner].url, sid, token, last)
    replayed: list[int] = []
    try:
        if event["type"] == "session.resumed":
            async with asyncio.timeout(10):
                while len(replayed) < event["replay_to"] - event["replay_from"] + 1:
                    replayed.append(await next_seq(ws))
    finally:
        if ws is not None:
            await ws.close()
    print(f"resume after events were lost with redis (last seq {last}): {event['type']} {_short(event)}")
    assert event["type"] in ("session.resync_required", "session.resumed"), event
    if event["type"] == "session.resumed":
        assert event["replay_from"] == last + 1, event
        assert replayed == list(range(last + 1, last + 1 + len(replayed))), f"last seq {last}, replayed {replayed}"


async def next_seq(ws: Any) -> int:
    """The seq of the next session event on a plain socket (binary audio frames are not offered)."""
    while True:
        event = orjson.loads(await ws.recv())
        if event.get("server_event_seq"):
            return int(event["server_event_seq"])


async def raw_resume(h: Harness, url: str, session_id: str, token: str, last_seq: int) -> tuple[dict[str, Any], Any]:
    """One resume attempt on a plain WebSocket (JSON only); returns the answer (``session.resumed``,
    ``session.resync_required`` or the refusal) and the still-open socket, or (``{"type": "closed"}``
    or ``{"type": "no answer ..."}``, None) if the server closed or stayed silent."""
    ws = await websockets.connect(url, additional_headers={"Authorization": f"Bearer {h.api_key}"},
                                  open_timeout=10, compression=None, max_size=None)  # fmt: skip
    try:
        async with asyncio.timeout(10):
            while (first := orjson.loads(await ws.recv()))["type"] != "session.created":
                if first["type"] == "error":  # refused at connect (store_unavailable: a coded refusal too)
                    return first, ws
            resume = {"type": "session.resume", "session_id": session_id, "resume_token": token,
                      "last_received_server_event_seq": last_seq}  # fmt: skip
            await ws.send(orjson.dumps(resume).decode())
            while True:
                msg = await ws.recv()
                if isinstance(msg, bytes):
                    continue
                event = orjson.loads(msg)
                if event["type"] in ("session.resumed", "session.resync_required"):
                    return event, ws
                if event["type"] == "error" and event["error"]["code"] in RESUME_REFUSALS:
                    return event, ws
    except websockets.ConnectionClosed:
        await ws.close()
        return {"type": "closed", "code": ws.close_code, "reason": ws.close_reason}, None
    except TimeoutError:
        await ws.close()
        return {"type": "no answer within 10 s"}, None
    except BaseException:
        await ws.close()
        raise


async def finished_session(h: Harness) -> tuple[str, str, int, int]:
    """A session that answered once and whose client then went away (the host keeps it, detached):
    (session id, resume token, last seq, owner)."""
    tape = Tape()
    rt = await open_session(h, tape)
    try:
        await answer(rt, tape)
        await asyncio.sleep(0.2)  # the trailing rate_limits.updated: last_seq counts what the SDK received
        sid, token = rt.session_id, rt.resume_token
        assert sid is not None and token is not None
        return sid, token, rt.last_seq, await h.wait_owner(sid)
    finally:
        await rt.close()


async def test_resume_of_a_session_lost_with_redis_is_refused_with_a_code(harness: Harness) -> None:
    """Its replica died and Redis restarted empty: nothing holds it any more. For lease_ttl_s
    after Redis came back a resume is told to retry (store_unavailable: a live replica might
    still be writing the session back, docs/sessions.md "When Redis fails"); then it is the
    final session_not_found."""
    cluster = harness.cluster
    sid, token, last, owner = await finished_session(harness)
    cluster.kill_replica(owner, signal.SIGKILL)
    await cluster.await_exit(owner, 30)
    await cluster.arestart_redis()
    codes: list[str] = []
    async with asyncio.timeout(60):  # (the window is lease_ttl_s, 15 s by default)
        while True:
            answer_event, ws = await raw_resume(harness, cluster.url, sid, token, last)
            assert answer_event["type"] == "error", answer_event
            codes.append(answer_event["error"]["code"])
            if codes[-1] != "store_unavailable":
                break
            if ws is not None:
                await ws.close()
            await asyncio.sleep(1.0)
    print(f"answers while Redis was coming back: {codes}")
    try:
        assert answer_event["type"] == "error", answer_event
        assert answer_event["error"]["code"] == "session_not_found", answer_event
        # The connection's own new session goes on.
        await ws.send(orjson.dumps({"type": "session.update", "session": {"type": "realtime",
                                                                          "instructions": "x"}}).decode())  # fmt: skip
        async with asyncio.timeout(10):
            while orjson.loads(await ws.recv())["type"] != "session.updated":
                pass
    finally:
        if ws is not None:
            await ws.close()
    await cluster.astart_replica(owner)
    for r in cluster.replicas:
        assert await harness.status(r.index, "/healthz") == 200
    print(f"session lost with redis: {answer_event['error']['code']}")


async def test_resume_of_a_session_whose_journal_was_lost_gets_resync_or_a_code(harness: Harness) -> None:
    """Its replica is alive and takes the session's lease again after Redis restarted (renewal,
    every lease_ttl_s/3 = 5 s), but the journal is gone. A resume on another replica must answer
    with session.resync_required (or session.resumed, or a coded refusal): never close, never hang."""
    cluster = harness.cluster
    sid, token, last, owner = await finished_session(harness)
    await cluster.arestart_redis()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while await harness.owner(sid) is None:  # re-acquired by its replica (the snapshot with it)
        assert loop.time() < deadline, "the owner never took the lease again after the Redis restart"
        await asyncio.sleep(0.1)
    other = (owner + 1) % harness.replicas
    # Until its own probe sees Redis back (redis_probe_interval_s), the other replica refuses
    # with store_unavailable, to be retried; then it must answer the resume itself.
    deadline = loop.time() + 30
    while True:
        answer_event, ws = await raw_resume(harness, cluster.replicas[other].url, sid, token, last)
        if ws is not None:
            await ws.close()
        if answer_event.get("error", {}).get("code") != "store_unavailable" or loop.time() > deadline:
            break
        await asyncio.sleep(0.5)
    assert answer_event["type"] in ("session.resync_required", "session.resumed", "error"), (
        f"r{other} did not answer the resume: {answer_event}"
    )
    if answer_event["type"] == "error":
        assert answer_event["error"]["code"] in RESUME_REFUSALS
    for r in cluster.replicas:
        assert r.alive and await harness.status(r.index, "/healthz") == 200
    print(f"session whose journal was lost, resumed on r{other}: {answer_event['type']}")
