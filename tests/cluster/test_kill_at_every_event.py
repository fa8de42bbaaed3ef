"""A crash at every moment of a spoken answer (docs/sessions.md).

Real processes: replicas of ``python -m gateway serve`` on one redis-server
(``deploy/local_cluster.py``), each serving two routes: ``omni-cascade`` (the
default engine, unpaced: eSpeak speaks the echo in 400 ms chunks) and
``passthrough`` (a paced answer of 4 words and 4 audio chunks of 20 ms). The
client talks to one replica directly, no balancer.

For each engine and each turn (a text turn: ``session.update``,
``conversation.item.create``, ``response.create``; a voice turn: the same
update, then speech and silence appended for server VAD), a reference run with
no crash fixes the events of the answer, from ``session.created`` (event 1) to
``response.done`` (event K). Then for every k in 1..K: a new session on replica
A; when the client has received event k, A is SIGKILLed and the client drops
its socket (it holds exactly events 1..k); it resumes on replica B with
``last_received_server_event_seq`` = the seq of event k, and, as any client
would after an outage, sends again what it asked for and never saw done (the
store holds every state change the client saw: write-ahead, so "not seen after
the replay" is "not in the store"). It must end in exactly one of:

- ``completed``: resumed, and the answer completed, once;
- ``reissued``: resumed, the interrupted answer ended ``incomplete`` (reason
  ``replica_lost``) and its re-issue completed;
- ``resync``: ``session.resync_required`` (reason ``client_ahead``) whose
  session and conversation are what the client saw, then the answer completed
  (re-issued when one was running). It comes exactly when the client holds
  events the store never got (the test reads Redis once the replica is dead).

In every case: never silence (an answer completes within the timeouts), never
a duplicate (no seq or event_id twice, never two completed answers), never a
gap (the seq goes up by one, but for the jump a resync announces), and the
completed answer is whole (its transcript deltas make its transcript; for the
passthrough exactly w0..w3 and 4 x 960 bytes of audio).

One cluster serves every case; a killed replica is restarted in the
background while the next cases run on the others. Run with ``-s`` for the
counts of each outcome.
"""

from __future__ import annotations

import asyncio
import base64
import json
import signal
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis
import websockets
from support.speech import chunks, silence, speak

from deploy.local_cluster import Cluster, ClusterError, ensure_binaries

pytestmark = pytest.mark.timeout(420)

API_KEY = "sk-kill-every-event"
REPLICAS = 4  # two serve a case; the others restart meanwhile
PASSTHROUGH_WORDS = 4
CHUNK_BYTES = 960  # 20 ms of 24 kHz PCM16: one passthrough audio delta
MODELS = {
    "models": [
        {"name": "omni-cascade", "engine": "cascade", "audio_chunk_ms": 400},
        {"name": "passthrough", "engine": "passthrough", "audio_chunks": PASSTHROUGH_WORDS},
    ]
}
ENV = {
    "OMNI_GATEWAY_MODELS": json.dumps(MODELS),
    "OMNI_GATEWAY_VIDEO_ENGINE": "none",
    "OMNI_GATEWAY_DETACH_GRACE_S": "2",  # sessions left behind by finished cases go soon
}
EVENT_TIMEOUT_S = 15.0  # the longest wait for any one event
APPEND_MS = 100  # the voice turn streams its audio in appends of this much ...
APPEND_EVERY_S = 0.025  # ... this often (4x real time), so some kills land mid-speech
KEY_PREFIX = "omni:"  # the replicas' store keys (gateway/store/redis.py)
AUDIO = "response.output_audio.delta"
TRANSCRIPT = "response.output_audio_transcript.delta"


@dataclass(frozen=True)
class Scenario:
    model: str
    voice: bool

    @property
    def name(self) -> str:
        return f"{'cascade' if self.model == 'omni-cascade' else 'passthrough'}-{'voice' if self.voice else 'text'}"


SCENARIOS = [Scenario(m, v) for m in ("omni-cascade", "passthrough") for v in (False, True)]


# --- the client -------------------------------------------------------------------------------------


def _update(voice: bool) -> dict[str, Any]:
    session: dict[str, Any] = {"type": "realtime", "instructions": "answer briefly"}
    if not voice:
        session["audio"] = {"input": {"turn_detection": None}}
    return {"type": "session.update", "session": session}


TEXT_ITEM = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello there"}]}


@dataclass
class View:
    """What the client knows of its session, from the events it received."""

    events: list[dict[str, Any]] = field(default_factory=list)  # session events and resume answers, in order
    last: int = 0
    config: dict[str, Any] | None = None
    items: list[str] = field(default_factory=list)  # conversation item ids, in order
    problems: list[str] = field(default_factory=list)

    def take(self, event: dict[str, Any]) -> None:
        seq = event.get("server_event_seq") or 0
        kind = event["type"]
        if kind == "session.resync_required":
            if event["last_server_event_seq"] < self.last:
                self.problems.append(f"resync to seq {event['last_server_event_seq']} below {self.last}")
            self.last = event["last_server_event_seq"]
        elif seq:
            if seq != self.last + 1:
                self.problems.append(f"seq {self.last} then {seq}")
            self.last = seq
        self.events.append(event)
        if kind in ("session.created", "session.updated"):
            self.config = event["session"]
        elif kind == "conversation.item.added":
            self.items.append(event["item"]["id"])
        elif kind == "conversation.item.deleted":
            self.items.remove(event["item_id"])

    def seen(self, kind: str, **match: Any) -> bool:
        return any(e["type"] == kind and all(e.get(k) == v for k, v in match.items()) for e in self.events)

    def user_item(self) -> bool:
        return any(e["type"] == "conversation.item.added" and e["item"]["role"] == "user" for e in self.events)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]


class Socket:
    def __init__(self, ws: Any) -> None:
        self.ws = ws

    @classmethod
    async def open(cls, url: str, model: str) -> Socket:
        ws = await websockets.connect(f"{url}?model={model}", additional_headers={"Authorization": f"Bearer {API_KEY}"},
                                      open_timeout=10, compression=None, max_size=None)  # fmt: skip
        return cls(ws)

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(orjson.dumps(event).decode())

    async def recv(self) -> dict[str, Any]:
        try:
            return dict(orjson.loads(await asyncio.wait_for(self.ws.recv(), EVENT_TIMEOUT_S)))
        except TimeoutError:
            raise AssertionError(f"silence: no event within {EVENT_TIMEOUT_S} s") from None

    async def close(self) -> None:
        await self.ws.close()

    def drop(self) -> None:
        self.ws.transport.abort()  # as a crash leaves it: no close frame, nothing more read


async def ask(sock: Socket, scenario: Scenario, view: View, speech: bytes, *, paced: bool = False) -> None:
    """Send what the turn needs and the client has not seen happen (all of it, on a new session)."""
    if not view.seen("session.updated"):
        await sock.send(_update(scenario.voice))
    if scenario.voice:
        if not view.seen("input_audio_buffer.committed"):  # uncommitted audio is lost with its replica
            for piece in chunks(speech, APPEND_MS):
                await sock.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(piece).decode()})
                if paced:
                    await asyncio.sleep(APPEND_EVERY_S)
        return
    if not view.user_item():
        await sock.send({"type": "conversation.item.create", "item": TEXT_ITEM})
    if not view.seen("response.created"):
        await sock.send({"type": "response.create"})


def completed(view: View) -> bool:
    return any(e["response"]["status"] == "completed" for e in view.of("response.done"))


async def read_on(sock: Socket, view: View, *, until_k: int | None = None) -> None:
    """Read into ``view`` until ``until_k`` session events are held, or an answer completed
    (and the rate limits after it arrived)."""
    while True:
        event = await sock.recv()
        view.take(event)
        if until_k is not None and sum(1 for e in view.events if e.get("server_event_seq")) >= until_k:
            return
        if event["type"] == "rate_limits.updated" and completed(view):
            return


@dataclass
class Case:
    scenario: Scenario
    k: int
    kind: str  # the type of event k
    outcome: str = ""
    view: View = field(default_factory=View)


async def run_case(cluster: Cluster, scenario: Scenario, k: int | None, a: int, b: int, speech: bytes) -> Case:
    """One session on replica ``a``; with ``k``, ``a`` is SIGKILLed once the client holds event k,
    and the client resumes on ``b``. Without ``k`` (the reference run) nothing is killed."""
    view = View()
    sock = await Socket.open(cluster.replicas[a].url, scenario.model)
    created = await sock.recv()
    assert created["type"] == "session.created", created
    view.take(created)
    sid, token = created["session"]["id"], created["resume_token"]
    if k is None or k > 1:
        asking = asyncio.create_task(ask(sock, scenario, view, speech, paced=True))
        await read_on(sock, view, until_k=k)
        if k is None:
            await asking
        asking.cancel()  # the client stops sending to the replica it lost
    case = Case(scenario, k or 0, view.events[-1]["type"], view=view)
    if k is None:
        await sock.close()
        return case
    cluster.kill_replica(a, signal.SIGKILL)
    sock.drop()
    await cluster.await_exit(a, 10)
    stored = await stored_seq(cluster, sid)  # all the dead replica managed to commit
    sock = await Socket.open(cluster.replicas[b].url, scenario.model)
    try:
        while (await sock.recv())["type"] != "session.created":  # the new socket's own session
            pass
        await sock.send({"type": "session.resume", "session_id": sid, "resume_token": token,
                         "last_received_server_event_seq": view.last})  # fmt: skip
        answer = await sock.recv()
        while answer["type"] not in ("session.resumed", "session.resync_required", "error"):
            answer = await sock.recv()  # the provisional session's own events
        assert answer["type"] != "error", f"the resume was refused: {answer}"
        # Resynced exactly when the client holds events the store never got.
        expected = "session.resync_required" if view.last > stored else "session.resumed"
        assert answer["type"] == expected, f"client at seq {view.last}, store at {stored}: {answer['type']}"
        seen_config, seen_items = view.config, list(view.items)
        view.take(answer)
        if answer["type"] == "session.resync_required":
            check_resync(answer, seen_config, seen_items)
            view.config = answer["session"]
            view.items = [it["id"] for it in answer["conversation"]]
        else:
            for _ in range(answer["replay_to"] - answer["replay_from"] + 1):
                view.take(await sock.recv())
        await ask(sock, scenario, view, speech)
        if not completed(view):
            await read_on(sock, view)
        await asyncio.sleep(0.05)  # anything the resume still had to say arrives now, or never
    finally:
        await sock.close()
    case.outcome = judge(case)
    return case


async def stored_seq(cluster: Cluster, session_id: str) -> int:
    """The highest seq the store holds for the session: its journal's or its snapshot's."""
    redis = aioredis.from_url(cluster.redis_url)
    try:
        last = await redis.hget(f"{KEY_PREFIX}s:{{{session_id}}}:meta", "last")
        snap = await redis.get(f"{KEY_PREFIX}s:{{{session_id}}}:snap")
    finally:
        await redis.aclose()
    return max(int(last or 0), orjson.loads(snap)["seq"] if snap else 0)


def check_resync(resync: dict[str, Any], config: dict[str, Any] | None, items: list[str]) -> None:
    """A resync carries the state the client saw: write-ahead stored every change it was told of."""
    assert resync["reason"] == "client_ahead", resync["reason"]
    assert resync["session"] == config, "the resync's session is not the one the client saw"
    assert [it["id"] for it in resync["conversation"]] == items, "the resync's conversation is not the client's"


def judge(case: Case) -> str:
    view = case.view
    assert view.problems == [], view.problems
    ids = [e["event_id"] for e in view.events if e.get("server_event_seq")]
    assert len(ids) == len(set(ids)), "an event was delivered twice"
    # The one error allowed: a transcription that was running on the dead replica is
    # reported failed (replica_lost; as an error event when the session asked for no
    # transcription events), and the answer waiting for it goes on without it.
    errors = [e["error"] for e in view.of("error")]
    assert all(e["code"] == "replica_lost" for e in errors) and len(errors) <= 1, errors
    done = [e["response"] for e in view.of("response.done")]
    finished = [r for r in done if r["status"] == "completed"]
    assert len(finished) == 1, f"completed answers: {[r['id'] for r in finished]}"
    others = [r for r in done if r["status"] != "completed"]
    for r in others:
        assert r["status"] == "incomplete" and r["status_details"]["gateway_reason"] == "replica_lost", r
    assert len(others) <= 1 and done[-1]["status"] == "completed", done
    check_whole(view, finished[0])
    if view.of("session.resync_required"):
        return "resync"
    return "reissued" if others else "completed"


def check_whole(view: View, response: dict[str, Any]) -> None:
    """The completed answer reached the client whole: no delta lost or repeated."""
    rid = response["id"]
    words = [e["delta"] for e in view.of(TRANSCRIPT) if e["response_id"] == rid]
    audio = sum(len(base64.b64decode(e["delta"])) for e in view.of(AUDIO) if e["response_id"] == rid)
    transcript = response["output"][0]["content"][0]["transcript"]
    assert "".join(words) == transcript, (words, transcript)
    assert audio > 0
    if view.events[0]["session"]["model"] == "passthrough":
        assert words == [f"w{i} " for i in range(PASSTHROUGH_WORDS)], words
        assert audio == PASSTHROUGH_WORDS * CHUNK_BYTES, audio


# --- the run ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def routes_cluster() -> Iterator[Cluster]:
    """The module's own cluster: both routes on every replica (tests/cluster/conftest.py's serves
    passthrough only)."""
    try:
        ensure_binaries()
    except ClusterError as err:
        pytest.skip(f"nginx/redis-server unavailable and could not be installed: {err}")
    c = Cluster(replicas=REPLICAS, engine="cascade", api_keys=(API_KEY,), env=ENV)
    c.start()
    try:
        yield c
    finally:
        c.stop()


class Pool:
    """Which replicas are up; a killed one is restarted in the background."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.restarts: dict[int, asyncio.Task[None]] = {}
        self.next = 0

    async def pair(self) -> tuple[int, int]:
        while True:
            for index, task in list(self.restarts.items()):
                if task.done():
                    task.result()
                    del self.restarts[index]
            up = [r.index for r in self.cluster.replicas if r.index not in self.restarts and r.alive]
            if len(up) >= 2:
                self.next += 1
                a = up[self.next % len(up)]
                return a, up[(self.next + 1) % len(up)]
            await asyncio.wait(set(self.restarts.values()), return_when=asyncio.FIRST_COMPLETED)

    def killed(self, index: int) -> None:
        async def restart() -> None:
            await self.cluster.await_exit(index, 30)
            await self.cluster.astart_replica(index)

        self.restarts[index] = asyncio.create_task(restart())

    async def settle(self) -> None:
        for task in self.restarts.values():
            await task


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
async def test_a_kill_after_any_event_ends_in_a_completed_reissued_or_resynced_answer(
    routes_cluster: Cluster, scenario: Scenario
) -> None:
    cluster = routes_cluster
    speech = await speak("hello there, how are you today") + silence(900) if scenario.voice else b""
    pool = Pool(cluster)
    a, b = await pool.pair()
    reference = await run_case(cluster, scenario, None, a, b, speech)
    kinds = [e["type"] for e in reference.view.events]
    last_k = kinds.index("response.done") + 1
    outcomes: Counter[str] = Counter()
    by_kind: dict[str, set[str]] = {}
    try:
        for k in range(1, last_k + 1):
            a, b = await pool.pair()
            try:
                case = await asyncio.wait_for(run_case(cluster, scenario, k, a, b, speech), 60)
            except BaseException as exc:
                raise AssertionError(f"{scenario.name}, killed after event {k} ({kinds[k - 1]}): {exc!r}") from exc
            finally:
                pool.killed(a)
            assert case.kind == kinds[k - 1], f"event {k} was {case.kind}, not {kinds[k - 1]} as in the reference"
            outcomes[case.outcome] += 1
            by_kind.setdefault(case.kind, set()).add(case.outcome)
            print(f"{scenario.name} k={k:>2} {case.kind:<40} r{a} -> r{b}: {case.outcome}")
    finally:
        await pool.settle()
    print(f"{scenario.name}: {last_k} kills, {dict(outcomes)}")
    assert sum(outcomes.values()) == last_k
    # The moments that decide an outcome behave as write-ahead says.
    assert by_kind["session.created"] == {"completed"}  # nothing had started: no re-issue, no resync
    assert by_kind["response.done"] == {"completed"}  # the end was stored before it was sent
    # It was stored: a running answer to re-issue; or, when the kill landed after the replica had
    # finished the answer (an unpaced cascade answer takes ~0.1 s: a loaded machine delays the
    # kill that long), the stored answer, replayed. Never a resync: nothing was sent unstored.
    assert by_kind["response.created"] <= {"reissued", "completed"}
