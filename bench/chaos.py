"""Chaos: many sessions over a cluster whose replicas are SIGKILLed at random.

A local cluster (``deploy/local_cluster.py``: redis-server, ``--replicas``
gateways, nginx round-robin with no sticky sessions); ``--sessions`` Python SDK
sessions (``client.RealtimeClient``, reconnecting through nginx) hold text turns
back to back (``conversation.item.create`` + ``response.create``, a passthrough
answer of 50 paced words and audio chunks, 1 s), with a random pause between
turns. Meanwhile, every ``--kill-every`` seconds (randomised), a random live
replica is SIGKILLed and restarted ``--down`` seconds later. After
``--duration`` seconds, the sessions finish their turn and the counts are
printed.

Each turn ends in exactly one of (docs/sessions.md):

- ``completed``: the answer completed (``completed_after_resume`` when the
  session resumed meanwhile: the kill came while it was idle or after the
  answer was stored);
- ``reissued``: the answer was ended ``incomplete`` (``replica_lost``) and its
  re-issue completed;
- ``resync``: ``session.resync_required`` (the client held deltas the dead
  replica never committed), then the answer completed;

or a failure, counted by kind: ``silence`` (no answer within ``--answer-timeout``),
``gap`` (a seq skipped or repeated, but for a resync's announced jump),
``resume_failed`` (the SDK gave up or the resume was refused), ``bad_answer``
(a completed answer missing or repeating a word or audio), ``error`` (an error
event), ``close_hung`` (the SDK's ``close()`` took over 30 s at the end). As a
client would after an outage, a session sends again what its turn
asked for and did not see done once the replay is in (the store holds every
state change the client saw, so "not seen" is "not stored").

    python bench/chaos.py                                   # 5 min, 100 sessions, 3 replicas
    python bench/chaos.py --duration 30 --sessions 20       # a quick look

Exit status 1 if any turn failed. Only 127.0.0.1 is used; the cluster is
stopped at the end (also on error or Ctrl-C).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from deploy.local_cluster import Cluster  # noqa: E402
from omni_gateway_client import RealtimeClient, RealtimeError, ReconnectPolicy  # noqa: E402

API_KEY = "sk-bench-chaos"
WORDS = 50  # PassthroughEngine.audio_chunks (the replicas' default)
CHUNK_BYTES = 960  # 20 ms of 24 kHz PCM16: one passthrough audio delta
# Patient: nginx may answer 502 ("no live upstreams") for several seconds after kills, while the
# replicas it marked failed (max_fails=1) get one probe connection per fail_timeout; a WebSocket
# probe releases its peer only when it closes. The SDK gives up after a minute without a resume.
CLOSE_TIMEOUT_S = 30.0  # a session whose close() takes longer is a failure (the run stays bounded)
POLICY = ReconnectPolicy(initial_delay=0.05, max_delay=1.0, max_attempts=None, max_elapsed=60.0)


class Turn:
    """One turn of one session: what it asked, what it saw."""

    def __init__(self, n: int, session: int) -> None:
        self.item_id = f"item_s{session}t{n}"
        self.item_seen = False
        self.response_seen = False  # a response.created after the item
        # The connection each request went out on (0: the first; None: not sent): only a
        # request sent on a connection that was lost since may need sending again.
        self.item_conn: int | None = None
        self.response_conn: int | None = None
        self.resumed = False
        self.resync = False
        self.reissued = False
        self.words: dict[str, list[str]] = {}
        self.audio: dict[str, int] = {}


class Session:
    def __init__(self, index: int, url: str, counts: Counter[str], failures: list[str], args: Any) -> None:
        self.index = index
        self.rt = RealtimeClient(url, api_key=API_KEY, reconnect=POLICY, resume_timeout=10.0)
        self.counts = counts
        self.failures = failures
        self.args = args
        self.last = 0
        self.rng = random.Random(index)
        self.connections = 0  # session.resumed / resync_required read so far

    def fail(self, kind: str, detail: str) -> None:
        self.counts[kind] += 1
        if len(self.failures) < 20:
            self.failures.append(f"session {self.index} ({self.rt.session_id}): {kind}: {detail}")

    async def run(self, stop_at: float) -> None:
        await asyncio.sleep(self.rng.uniform(0, 2))  # not all at once
        try:
            await self.rt.connect()
            await self.rt.session_update({"type": "realtime", "audio": {"input": {"turn_detection": None}}})
            n = 0
            while time.monotonic() < stop_at:
                n += 1
                outcome = await self.turn(Turn(n, self.index))
                self.counts[outcome] += 1
                if outcome not in ("completed", "completed_after_resume", "reissued", "resync"):
                    return  # a failed session says no more
                await asyncio.sleep(self.rng.uniform(*self.args.think))
        except RealtimeError as exc:
            self.fail("resume_failed", repr(exc))
        finally:
            try:
                await asyncio.wait_for(self.rt.close(), CLOSE_TIMEOUT_S)
            except TimeoutError:
                self.fail("close_hung", f"close() did not return within {CLOSE_TIMEOUT_S:.0f} s")

    def _lost(self, conn: int | None) -> bool:
        """Whether a request sent on connection ``conn`` may be lost: never sent, or sent on a
        connection before the one just resumed (a send queued by the SDK during an outage goes
        out on the next connection, after the resume)."""
        return conn is None or conn < self.connections

    async def _send(self, send: Any) -> int:
        s = self.rt.stats
        established, queued = s.resumes + s.resyncs, s.sends_queued
        await send()
        return established + (1 if s.sends_queued > queued else 0)

    async def ask(self, turn: Turn) -> None:
        """Send what the turn needs, has not seen happen, and may have been lost."""
        if not turn.item_seen and self._lost(turn.item_conn):
            item = {"id": turn.item_id, "type": "message", "role": "user",
                    "content": [{"type": "input_text", "text": "hello"}]}  # fmt: skip
            turn.item_conn = await self._send(lambda: self.rt.item_create(item))
        if not turn.response_seen and self._lost(turn.response_conn):
            turn.response_conn = await self._send(self.rt.create_response)

    async def turn(self, turn: Turn) -> str:
        await self.ask(turn)
        replay_to: int | None = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.args.answer_timeout
        while True:
            try:
                event = await self.rt.recv(max(0.01, deadline - loop.time()))
            except TimeoutError:
                self.fail("silence", f"no completed answer within {self.args.answer_timeout} s")
                return "silence"
            kind = event.get("type")
            seq = event.get("server_event_seq") or 0
            if kind in ("session.resync_required", "session.resumed"):
                self.connections += 1
            if kind == "session.resync_required":
                turn.resync = True
                self.last = event["last_server_event_seq"]
                turn.item_seen = any(it.get("id") == turn.item_id for it in event["conversation"])
                await self.ask(turn)  # the stored state says what is missing
                continue
            if kind == "session.resumed":
                turn.resumed = True
                replay_to = event["replay_to"] if event["replay_to"] >= event["replay_from"] else None
                if replay_to is None:
                    await self.ask(turn)
                continue
            if seq:
                if seq != self.last + 1 and self.last:
                    self.fail("gap", f"seq {self.last} then {seq} ({kind})")
                    return "gap"
                self.last = seq
            if kind == "error":
                self.fail("error", str(event.get("error")))
                return "error"
            if kind == "conversation.item.added" and event["item"]["id"] == turn.item_id:
                turn.item_seen = True
            elif kind == "response.created" and turn.item_seen:
                turn.response_seen = True
            elif kind == "response.output_audio_transcript.delta":
                turn.words.setdefault(event["response_id"], []).append(event["delta"])
            elif kind == "response.output_audio.delta":
                turn.audio[event["response_id"]] = turn.audio.get(event["response_id"], 0) + len(event["delta"])
            elif kind == "response.done":
                r = event["response"]
                if (
                    r["status"] == "incomplete"
                    and (r.get("status_details") or {}).get("gateway_reason") == "replica_lost"
                ):
                    turn.reissued = True
                elif r["status"] == "completed":
                    if turn.words.get(r["id"]) != [f"w{i} " for i in range(WORDS)] or (
                        turn.audio.get(r["id"]) != WORDS * CHUNK_BYTES
                    ):
                        self.fail("bad_answer", f"{r['id']}: {len(turn.words.get(r['id'], []))} words")
                        return "bad_answer"
                    if turn.resync:
                        return "resync"
                    if turn.reissued:
                        return "reissued"
                    return "completed_after_resume" if turn.resumed else "completed"
                else:
                    self.fail("bad_answer", f"{r['id']} ended {r['status']} {r.get('status_details')}")
                    return "bad_answer"
            if replay_to is not None and self.last >= replay_to:
                replay_to = None
                await self.ask(turn)  # the replay is in: what is still missing is not stored


async def chaos(cluster: Cluster, stop_at: float, counts: Counter[str], args: Any, rng: random.Random) -> None:
    restarts: set[asyncio.Task[None]] = set()

    async def restart(index: int) -> None:
        await cluster.await_exit(index, 30)
        await asyncio.sleep(args.down)
        await cluster.astart_replica(index)

    try:
        while time.monotonic() < stop_at:
            await asyncio.sleep(rng.uniform(*args.kill_every))
            down = {t.get_name() for t in restarts}
            alive = [r.index for r in cluster.replicas if r.alive and str(r.index) not in down]
            if len(alive) < 2:
                continue  # keep one replica to land on
            victim = rng.choice(alive)
            cluster.kill_replica(victim, signal.SIGKILL)
            counts["kills"] += 1
            print(f"  {time.strftime('%H:%M:%S')} SIGKILL r{victim} ({len(alive) - 1} left up)")
            task = asyncio.create_task(restart(victim), name=str(victim))
            restarts.add(task)
            task.add_done_callback(restarts.discard)
    finally:
        for task in list(restarts):
            with contextlib.suppress(Exception):
                await task


async def main(args: argparse.Namespace) -> int:
    env = {"OMNI_GATEWAY_VIDEO_ENGINE": "none", "OMNI_GATEWAY_DETACH_GRACE_S": "5"}
    cluster = Cluster(replicas=args.replicas, engine="passthrough", api_keys=(API_KEY,), env=env,
                      keep_run_dir=args.keep)  # fmt: skip
    await cluster.astart()
    print(f"cluster up: {args.replicas} replicas behind {cluster.url} (run dir {cluster.run_dir})")
    counts: Counter[str] = Counter()
    failures: list[str] = []
    rng = random.Random(args.seed)
    started = time.monotonic()
    stop_at = started + args.duration
    try:
        sessions = [Session(i, cluster.url, counts, failures, args) for i in range(args.sessions)]
        await asyncio.gather(chaos(cluster, stop_at, counts, args, rng), *(s.run(stop_at) for s in sessions))
        stats = Counter[str]()
        for s in sessions:
            for name in ("resumes", "resyncs", "replayed_events", "duplicates_dropped", "failed_attempts", "gaps"):
                stats[name] += getattr(s.rt.stats, name)
    finally:
        await cluster.astop()
    elapsed = time.monotonic() - started
    ok = ("completed", "completed_after_resume", "reissued", "resync")
    bad = ("silence", "gap", "resume_failed", "bad_answer", "error", "close_hung")
    turns = sum(counts[k] for k in ok)
    print(f"{args.sessions} sessions, {args.replicas} replicas, {elapsed:.0f} s, seed {args.seed}: "
          f"{counts['kills']} SIGKILLs, {turns} answers")  # fmt: skip
    print("  outcomes: " + ", ".join(f"{k} {counts[k]}" for k in ok))
    print("  failures: " + ", ".join(f"{k} {counts[k]}" for k in bad))
    print("  SDK: " + ", ".join(f"{k} {v}" for k, v in stats.items()))
    for line in failures:
        print("  " + line)
    return 1 if any(counts[k] for k in bad) else 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=300.0, help="seconds of chaos (default 300)")
    p.add_argument("--sessions", type=int, default=100)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--kill-every", type=float, nargs=2, default=(3.0, 8.0), metavar=("MIN", "MAX"),
                   help="seconds between kills, drawn uniformly (default 3 8)")  # fmt: skip
    p.add_argument("--down", type=float, default=1.0, help="seconds a killed replica stays down")
    p.add_argument("--think", type=float, nargs=2, default=(0.5, 3.0), metavar=("MIN", "MAX"),
                   help="pause between a session's turns (default 0.5 3)")  # fmt: skip
    p.add_argument("--answer-timeout", type=float, default=90.0, help="longer without the answer: silence")
    p.add_argument("--seed", type=int, default=random.randrange(1 << 30))
    p.add_argument("--keep", action="store_true", help="keep the run directory (replica, nginx, redis logs)")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
