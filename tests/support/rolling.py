"""A rolling deploy under load, as an operator runs one: the driver of ``bench/rolling_deploy.py``
and ``tests/cluster/test_rolling_deploy.py``.

A local cluster (``deploy/local_cluster.py``: redis-server, passthrough replicas behind nginx,
round-robin) serves ``sessions`` Python SDK sessions, each asking for answer after answer
with no pause between them (a text item and ``response.create``; a passthrough answer is 50
words, each with 20 ms of audio, paced: 1 s). Meanwhile each replica in turn is signalled
(SIGTERM: a drain; SIGKILL: a crash), waited for, and started again on its port, ``rounds``
times over. Every session checks what it receives and counts, per answer:

- ``completed``: every word and every audio byte, in order, and no answer cut on the way;
- ``cut``: ended ``incomplete`` (``gateway_reason`` ``drained``: the drain window ran out,
  or ``replica_lost``: a crash), then re-issued and completed (``reissued``);

and per session: seq gaps or repeats the SDK saw (``gaps``, ``duplicates``), errors, resumes,
resyncs, and the **largest silence**: the longest time between two audio deltas of one
answer, or between asking (the previous answer's ``response.done``, or the request) and the
answer's first delta: what a listener who keeps asking hears as a pause. An answer's first
delta normally comes ~20 ms after the request; a drain's handover (close 1012, reconnect,
resume, ask again) and a crash show up here.

A request sent as the old socket closed may not have been read: after a resume the session
asks again for what it has not seen (the replay shows what the store holds), as docs/sessions.md
says a client should.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from deploy.local_cluster import Cluster
from omni_gateway_client import RealtimeClient, RealtimeError, ReconnectPolicy

API_KEY = "sk-rolling-deploy"
WORDS = 50  # PassthroughEngine.audio_chunks (the replicas' default)
CHUNK_BYTES = 960  # 20 ms of 24 kHz PCM16: one passthrough audio delta
POLICY = ReconnectPolicy(max_attempts=None, max_elapsed=60.0)  # the SDK's delays, patient
ANSWER_TIMEOUT_S = 60.0
FAILURES = ("silence", "gap", "bad_answer", "error", "resume_failed")
PAUSE_S = 0.1  # a silence at least this long is kept with its moment, to say what caused it
TICK_S = 0.01  # the clients' loop is checked this often: late by STALL_S or more, it stalled
STALL_S = 0.05


@dataclass(frozen=True)
class Pause:
    """One silence of at least PAUSE_S (loop times): did the session change socket in it?"""

    began: float
    ended: float
    handover: bool
    session: int = -1  # the listener's index


@dataclass
class Report:
    """What the sessions saw (Counter keys: completed, reissued, cut_drained, cut_replica_lost,
    silence, gap, bad_answer, error, resume_failed) and what the deploy did."""

    counts: Counter[str] = field(default_factory=Counter)
    silences: list[float] = field(default_factory=list)  # the largest per session, seconds
    silence_of: dict[int, float] = field(default_factory=dict)  # the same, by the listener's index
    sdk: Counter[str] = field(default_factory=Counter)
    restarts: list[tuple[str, float]] = field(default_factory=list)  # (replica, seconds from signal to exit)
    failures: list[str] = field(default_factory=list)
    pauses: list[Pause] = field(default_factory=list)
    starting: list[tuple[float, float]] = field(default_factory=list)  # a replica's spawn to ready (loop times)
    # The clients' own process stalled (its loop ran nothing): every session's silence then is
    # the measuring process's, not the gateway's (loop times, from when it was due to when it ran).
    stalls: list[tuple[float, float]] = field(default_factory=list)

    @property
    def answers(self) -> int:
        return self.counts["completed"] + self.counts["reissued"]

    @property
    def cut(self) -> int:
        return self.counts["cut_drained"] + self.counts["cut_replica_lost"]

    @property
    def lost(self) -> int:
        """Answers asked for and never completed (whatever the reason)."""
        return sum(self.counts[k] for k in FAILURES)

    @property
    def bad(self) -> int:
        return sum(self.counts[k] for k in FAILURES)

    def silence_ms(self, q: float) -> float:
        return _quantile_ms(self.silences, q)

    def silences_without_stalls(self) -> list[float]:
        """The largest silence per session less the time the clients' process itself stalled
        within it: the gateway's side of it. Silences of PAUSE_S or more are known by their
        moments; a session whose every such silence was mostly a stall counts its largest
        remainder (its shorter silences, under PAUSE_S, are not kept)."""
        largest = {i: s for i, s in self.silence_of.items() if s < PAUSE_S}
        for p in self.pauses:
            stalled = sum(max(0.0, min(p.ended, end) - max(p.began, start)) for start, end in self.stalls)
            largest[p.session] = max(largest.get(p.session, 0.0), p.ended - p.began - stalled)
        return list(largest.values())


def _quantile_ms(values: list[float], q: float) -> float:
    ordered = sorted(values) or [0.0]
    return 1000 * ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Listener:
    """One SDK session asking for answer after answer until ``stop`` is set. An ``error``
    fails it, unless its code is one of ``passing`` (counted as ``error_<code>``: a refusal
    the socket's close follows, such as ``store_unavailable`` on a resume while Redis fails
    over; the SDK resumes again)."""

    def __init__(self, index: int, url: str, report: Report, *, passing: tuple[str, ...] = (),
                 plain: bool = False) -> None:  # fmt: skip
        self.passing = passing
        self.index = index
        # plain: each reconnect is a plain socket (the server opens a session at connect, which the
        # resume replaces), as a client of another SDK reconnects; else a resume-only socket.
        self.rt = RealtimeClient(url, api_key=API_KEY, reconnect=POLICY, resume_timeout=10.0,
                                 resume_fallback="new_session" if plain else "raise")  # fmt: skip
        self.report = report
        self.last_seq = 0
        self.connections = 0  # session.resumed / resync_required read so far
        self.largest_silence = 0.0
        self.turn = 0
        self.cut = False  # the answer under way was cut (incomplete): its re-issue must complete

    def fail(self, kind: str, detail: str) -> None:
        self.report.counts[kind] += 1
        if self.cut:  # an answer ended incomplete whose re-issue never completed
            self.report.counts["incomplete"] += 1
        if len(self.report.failures) < 20:
            self.report.failures.append(f"session {self.index} ({self.rt.session_id}): {kind}: {detail}")

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.sleep(random.Random(self.index).uniform(0, 1))  # not all in the same millisecond
        try:
            await self.rt.connect()
            await self.rt.session_update({"type": "realtime", "audio": {"input": {"turn_detection": None}}})
            while not stop.is_set():
                if not await self.answer():
                    return  # a failed session says no more
        except RealtimeError as exc:
            self.fail("resume_failed", repr(exc))
        finally:
            self.report.silences.append(self.largest_silence)
            self.report.silence_of[self.index] = self.largest_silence
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.rt.close(), 30)

    async def answer(self) -> bool:
        """One turn: ask, hear the answer whole (a cut one re-issued); False on a failure."""
        self.turn += 1
        item_id = f"item_s{self.index}t{self.turn}"
        seen_item = seen_response = False
        sent_item_on = sent_response_on = -1  # the connection each request went out on
        words: dict[str, list[str]] = {}
        audio: dict[str, int] = {}
        cut = self.cut = False
        loop = asyncio.get_running_loop()
        heard = loop.time()  # the last sound, or the asking
        heard_on = self.connections

        async def sent(send: Any) -> int:
            """The connection a request goes out on, counted as ``self.connections`` counts
            them: the SDK's own (it may have resumed before this session read the
            ``session.resumed``), or the next (the SDK queues what is sent while it
            reconnects)."""
            stats = self.rt.stats
            established, queued = stats.resumes + stats.resyncs, stats.sends_queued
            await send()
            return established + (1 if stats.sends_queued > queued else 0)

        async def ask() -> None:
            """Send what the turn needs, has not seen, and may have lost with a connection."""
            nonlocal sent_item_on, sent_response_on
            if not seen_item and sent_item_on < self.connections:
                item = {"id": item_id, "type": "message", "role": "user",
                        "content": [{"type": "input_text", "text": "hello"}]}  # fmt: skip
                sent_item_on = await sent(lambda: self.rt.item_create(item))
            if not seen_response and sent_response_on < self.connections:
                sent_response_on = await sent(self.rt.create_response)

        await ask()
        replay_to: int | None = None
        deadline = loop.time() + ANSWER_TIMEOUT_S
        while True:
            try:
                event = await self.rt.recv(max(0.01, deadline - loop.time()))
            except TimeoutError:
                self.fail("silence", f"no answer within {ANSWER_TIMEOUT_S:.0f} s")
                return False
            kind = event.get("type")
            if kind == "client.session_lost":  # (plain sockets: a refused resume started a new session)
                self.fail("resume_failed", str(event))
                return False
            if kind in ("session.resumed", "session.resync_required"):
                self.connections += 1
                if kind == "session.resync_required":
                    self.last_seq = event["last_server_event_seq"]
                    seen_item = any(it.get("id") == item_id for it in event["conversation"])
                    await ask()
                else:
                    replay_to = event["replay_to"] if event["replay_to"] >= event["replay_from"] else None
                    if replay_to is None:
                        await ask()
                continue
            seq = event.get("server_event_seq") or 0
            if seq:
                if self.last_seq and seq != self.last_seq + 1:
                    self.fail("gap", f"seq {self.last_seq} then {seq} ({kind})")
                    return False
                self.last_seq = seq
            if kind == "error":
                code = (event.get("error") or {}).get("code")
                if code in self.passing:
                    self.report.counts[f"error_{code}"] += 1
                    continue
                self.fail("error", str(event.get("error")))
                return False
            if kind == "conversation.item.added" and event["item"]["id"] == item_id:
                seen_item = True
            elif kind == "response.created" and seen_item:
                seen_response = True
            elif kind == "response.output_audio_transcript.delta":
                words.setdefault(event["response_id"], []).append(event["delta"])
            elif kind == "response.output_audio.delta":
                now = loop.time()
                self.largest_silence = max(self.largest_silence, now - heard)
                if now - heard >= PAUSE_S:
                    self.report.pauses.append(Pause(heard, now, self.connections != heard_on, self.index))
                heard, heard_on = now, self.connections
                audio[event["response_id"]] = audio.get(event["response_id"], 0) + len(event["delta"])
            elif kind == "response.done":
                r = event["response"]
                reason = (r.get("status_details") or {}).get("gateway_reason")
                if r["status"] == "incomplete" and reason in ("drained", "replica_lost"):
                    self.report.counts[f"cut_{reason}"] += 1
                    cut = self.cut = True  # its re-issue follows
                elif r["status"] == "completed":
                    whole = words.get(r["id"]) == [f"w{i} " for i in range(WORDS)]
                    if not whole or audio.get(r["id"]) != WORDS * CHUNK_BYTES:
                        self.fail("bad_answer", f"{r['id']}: {len(words.get(r['id'], []))} words")
                        return False
                    self.report.counts["reissued" if cut else "completed"] += 1
                    return True
                else:
                    self.fail("bad_answer", f"{r['id']} ended {r['status']} {r.get('status_details')}")
                    return False
            if replay_to is not None and self.last_seq >= replay_to:
                replay_to = None
                await ask()  # the replay is in: what is still missing was never stored


async def roll(cluster: Cluster, rounds: int, sig: int, report: Report, *, settle_s: float = 1.0) -> None:
    """Each replica in turn: ``sig``, wait for it to exit, start it again on its port, let it
    settle (``settle_s``: the sessions spread again); ``rounds`` times over."""
    for _ in range(rounds):
        for replica in cluster.replicas:
            began = time.monotonic()
            cluster.kill_replica(replica.index, sig)
            await cluster.await_exit(replica.index, 60)
            report.restarts.append((replica.name, time.monotonic() - began))
            spawned = asyncio.get_running_loop().time()
            await cluster.astart_replica(replica.index)
            report.starting.append((spawned, asyncio.get_running_loop().time()))
            await asyncio.sleep(settle_s)


async def rolling_deploy(cluster: Cluster, *, sessions: int, rounds: int, sig: int = signal.SIGTERM,
                         warm_up_s: float = 2.0, settle_s: float = 1.0, plain: bool = False,
                         kill_rounds: int = 0) -> Report:  # fmt: skip
    """``sessions`` listeners through ``cluster``'s nginx while it is rolled ``rounds`` times
    with ``sig``, then ``kill_rounds`` times with SIGKILL (``plain``: they reconnect on plain
    sockets, ``Listener``)."""
    report = Report()
    stop = asyncio.Event()
    listeners = [Listener(i, cluster.url, report, plain=plain) for i in range(sessions)]
    running = [asyncio.create_task(listener.run(stop)) for listener in listeners]
    running.append(asyncio.create_task(watch_stalls(report, stop)))
    try:
        await asyncio.sleep(warm_up_s)  # every session under way
        await roll(cluster, rounds, sig, report, settle_s=settle_s)
        await roll(cluster, kill_rounds, signal.SIGKILL, report, settle_s=settle_s)
    finally:
        stop.set()
        await asyncio.gather(*running)
    for listener in listeners:
        s = listener.rt.stats
        for name in ("resumes", "resyncs", "replayed_events", "duplicates_dropped", "failed_attempts", "gaps"):
            report.sdk[name] += getattr(s, name)
    return report


async def watch_stalls(report: Report, stop: asyncio.Event) -> None:
    """Note each moment the clients' own loop ran nothing for STALL_S or more (its process was
    not scheduled, or a client blocked it): a silence then is the measuring process's."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + TICK_S
        await asyncio.sleep(TICK_S)
        if loop.time() - due >= STALL_S:
            report.stalls.append((due, loop.time()))


def summary(report: Report) -> list[str]:
    silences = report.silences or [0.0]
    exits = [t for _, t in report.restarts] or [0.0]
    return [
        f"answers {report.answers} ({report.counts['completed']} whole, {report.counts['reissued']} re-issued); "
        f"cut {report.cut} (drained {report.counts['cut_drained']}, replica_lost {report.counts['cut_replica_lost']})",
        "failures: " + ", ".join(f"{k} {report.counts[k]}" for k in FAILURES),
        f"lost {report.lost} (an answer never completed), incomplete {report.counts['incomplete']} (cut, and "
        f"its re-issue never completed); event gap p99 {report.silence_ms(0.99):.0f} ms (the largest per session)",
        "SDK: " + ", ".join(f"{k} {v}" for k, v in report.sdk.items()),
        f"largest silence per session: p50 {report.silence_ms(0.5):.0f} ms, p99 {report.silence_ms(0.99):.0f} ms, "
        f"max {1000 * max(silences):.0f} ms ({len(report.silences)} sessions); less the clients' own stalls "
        f"({len(report.stalls)}, {sum(e - b for b, e in report.stalls):.1f} s): p50 "
        f"{_quantile_ms(report.silences_without_stalls(), 0.5):.0f} ms, "
        f"p99 {_quantile_ms(report.silences_without_stalls(), 0.99):.0f} ms",
        f"signal -> exit per replica: median {statistics.median(exits):.2f} s, max {max(exits):.2f} s "
        f"({len(report.restarts)} restarts)",
        pauses(report),
        *report.failures,
    ]


def pauses(report: Report) -> str:
    """What the silences of PAUSE_S or more coincided with: the session's own handover (it
    changed socket within the silence), the clients' own process stalling (the measuring
    process ran nothing: half the silence or more), a replica starting (spawn to ready: its
    start-up takes CPU from the others on a small machine), or none of these (the load
    itself); and the most sessions silent at one moment (many at once: a stall they share)."""
    kinds: Counter[str] = Counter()
    longest: tuple[float, str] = (0.0, "")
    for p in report.pauses:
        stalled = sum(max(0.0, min(p.ended, end) - max(p.began, start)) for start, end in report.stalls)
        if p.handover:
            kind = "handover"
        elif stalled >= (p.ended - p.began) / 2:
            kind = "clients' stall"
        elif any(p.began < ready and p.ended > spawned for spawned, ready in report.starting):
            kind = "replica starting"
        else:
            kind = "neither"
        kinds[kind] += 1
        longest = max(longest, (p.ended - p.began, kind))
    edges = sorted([(p.began, 1) for p in report.pauses] + [(p.ended, -1) for p in report.pauses])
    most = depth = 0
    for _, step in edges:
        depth += step
        most = max(most, depth)
    what = ", ".join(f"{kinds[k]} in {k}" for k in ("handover", "clients' stall", "replica starting", "neither"))
    line = f"silences of {1000 * PAUSE_S:.0f} ms or more: {len(report.pauses)} ({what}); at most {most} at once"
    return line + (f"; the longest {1000 * longest[0]:.0f} ms, in {longest[1]}" if longest[1] else "")
