"""Resume across replicas, measured on a local cluster (redis + N gateway replicas
+ nginx round-robin, ``deploy/local_cluster.py``), driven by the Python SDK.

Three phases, each bounded in count and time:

1. **Redis round trips per streaming session.** ``--sessions`` SDK sessions
   stream passthrough answers back to back (50 paced chunks of 20 ms each: a
   transcript word and an audio delta) for ``--stream-s`` seconds, then stay
   idle. The replicas' own counter (``RedisStore.round_trips``) is not
   exported, so Redis is asked (``INFO commandstats``): round trips are the
   calls of the commands the gateway only sends at the top level, ``EVALSHA``
   above all (every journal commit, ack trim and lease call is one Lua script,
   one round trip), plus ``EXEC``/``PING``/``PUBLISH``. ``INFO stats``
   ``total_commands_processed`` and ``instantaneous_ops_per_sec`` are shown
   too, but Redis 7 counts in them every command a script runs (about 11 per
   journal commit), so they are not round trips. Streaming minus idle, divided
   by sessions and seconds: round trips per second per streaming session
   (target <= 50).
2. **Resume latency after dropped sockets.** The same sessions stream on; every
   ``--drop-every-ms`` (randomised) one connected session's TCP connection is
   aborted (no close frame), ``--drops`` times. The SDK reconnects through
   nginx (any replica) and resumes. Latency: from the new socket being open
   (the SDK's ``_open`` returned) to the first replayed event reaching the
   application (target p99 <= 50 ms); also to ``session.resumed``, and the
   whole outage (drop -> first replayed event, backoff included).
3. **SIGKILL loop.** ``--kills`` times: a new session starts an answer, the
   replica holding its lease (read from Redis) is SIGKILLed after 10-30 words,
   the SDK resumes on another replica; the killed replica is restarted once the
   session has resumed (so its start does not compete for the CPU with the
   resume being timed), and the next kill waits for it. Counted: answers completed vs ended ``incomplete``
   (``replica_lost``) and re-issued, replayed events, duplicates dropped by the
   SDK, seq gaps, failures; timed: new socket -> ``session.resumed`` (or
   ``session.resync_required``: the client held deltas the dead replica never
   committed, the usual case for a kill mid-answer) and -> the first event after it.

Every phase checks what the application received: seqs contiguous (no gap,
no duplicate), every completed answer carries all 50 words. Only 127.0.0.1 is
used; the cluster is stopped at the end (also on error or Ctrl-C).

    python bench/resume.py                          # ~4-5 min: 6 sessions, 200 drops, 100 kills
    python bench/resume.py --quick                  # ~1 min
    python bench/resume.py --kills 0 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from deploy.local_cluster import Cluster  # noqa: E402
from omni_gateway_client import RealtimeClient, RealtimeError, ReconnectPolicy  # noqa: E402

API_KEY = "sk-bench-resume"
WORDS = 50  # PassthroughEngine.audio_chunks
TRANSCRIPT_DELTA = "response.output_audio_transcript.delta"
KEY_PREFIX = "omni:"  # the replicas' store key prefix (gateway/store/base.py)
POLICY = ReconnectPolicy(initial_delay=0.05, max_delay=0.5, max_attempts=15, max_elapsed=6.0)
TARGET_RESUME_P99_MS = 50.0
TARGET_ROUND_TRIPS = 50.0


# --- the SDK, timed ---------------------------------------------------------------------------------


class TimedClient(RealtimeClient):
    """``RealtimeClient`` that notes when each of its sockets opened (``_open`` is the SDK's one
    place where a socket is made; a reconnect calls it again)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.opened_at = 0.0
        self.opens = 0

    async def _open(self, *, first: bool, resume_only: bool = False) -> Any:
        ws = await super()._open(first=first, resume_only=resume_only)
        self.opened_at = time.perf_counter()
        self.opens += 1
        return ws


@dataclass
class Resume:
    opened_at: float  # the new socket was open
    resumed_at: float  # session.resumed reached the application
    replay: int  # events announced for replay
    dropped_at: float | None = None  # when the old socket was dropped / its replica killed
    first_at: float | None = None  # the first session event after session.resumed
    first_replayed: bool = False


@dataclass
class Tally:
    answers_completed: int = 0
    answers_interrupted: int = 0  # ended incomplete / replica_lost (and re-issued)
    answers_bad: int = 0  # other endings, or a completed answer missing words
    gaps: int = 0  # seq jumps the application saw
    resyncs: int = 0
    replayed_events: int = 0
    duplicates_dropped: int = 0
    failed_attempts: int = 0
    failures: list[str] = field(default_factory=list)


class Session:
    """One SDK session answering back to back; checks and times what it receives."""

    def __init__(self, url: str, *, binary: bool = False, policy: ReconnectPolicy = POLICY) -> None:
        self.rt = TimedClient(url, api_key=API_KEY, reconnect=policy, binary=binary)
        self.last_seq = 0
        self.gaps = 0
        self.resumes: list[Resume] = []
        self.dropped_at: float | None = None
        self.words: dict[str, list[str]] = {}
        self.done: list[dict[str, Any]] = []
        self.on_event: Callable[[dict[str, Any]], Awaitable[None]] | None = None
        self.victim: int | None = None  # the replica killed under this session (phase 3)

    async def open(self) -> None:
        await self.rt.connect()
        await self.rt.session_update({"type": "realtime", "audio": {"input": {"turn_detection": None}}})
        await self.rt.send_text("hello")

    def _observe(self, event: dict[str, Any], now: float) -> None:
        kind = event.get("type")
        seq = event.get("server_event_seq") or 0
        if kind == "session.resumed":
            replay = max(0, event["replay_to"] - event["replay_from"] + 1)
            self.resumes.append(Resume(self.rt.opened_at, now, replay, self.dropped_at))
            self.dropped_at = None
        elif kind == "session.resync_required":  # the client was ahead of the store (a kill): timed alike
            self.last_seq = event.get("last_server_event_seq", self.last_seq)
            self.resumes.append(Resume(self.rt.opened_at, now, 0, self.dropped_at))
            self.dropped_at = None
        if seq > 0:
            if self.last_seq and seq != self.last_seq + 1:
                self.gaps += 1
            self.last_seq = seq
            if self.resumes and self.resumes[-1].first_at is None:
                r = self.resumes[-1]
                r.first_at = now
                r.first_replayed = r.replay > 0
        if kind == TRANSCRIPT_DELTA:
            self.words.setdefault(event["response_id"], []).append(event["delta"])
        elif kind == "response.done":
            self.done.append(event["response"])

    async def answer(self, timeout_s: float = 20.0) -> None:
        """One answer (and its re-issue, if it was interrupted)."""
        await self.rt.create_response()
        while True:
            event = await self.rt.recv(timeout_s)
            self._observe(event, time.perf_counter())
            if self.on_event is not None:
                await self.on_event(event)
            if event["type"] == "response.done":
                r = event["response"]
                if not (
                    r["status"] == "incomplete"
                    and (r.get("status_details") or {}).get("gateway_reason") == "replica_lost"
                ):
                    return

    async def settle(self, quiet_s: float = 0.3) -> None:
        """Take in what is still coming (e.g. a resume after the answer ended)."""
        while True:
            try:
                event = await self.rt.recv(quiet_s)
            except TimeoutError:
                return
            self._observe(event, time.perf_counter())

    def tally(self, into: Tally) -> None:
        full = [f"w{i} " for i in range(WORDS)]
        for r in self.done:
            details = r.get("status_details") or {}
            if r["status"] == "completed" and self.words.get(r["id"]) == full:
                into.answers_completed += 1
            elif r["status"] == "incomplete" and details.get("gateway_reason") == "replica_lost":
                into.answers_interrupted += 1
            else:
                into.answers_bad += 1
        into.gaps += self.gaps + self.rt.stats.gaps
        into.resyncs += self.rt.stats.resyncs
        into.replayed_events += self.rt.stats.replayed_events
        into.duplicates_dropped += self.rt.stats.duplicates_dropped
        into.failed_attempts += self.rt.stats.failed_attempts

    def drop(self) -> bool:
        """Abort the TCP connection (no close frame), as a network failure would."""
        ws = self.rt._ws
        if ws is None or not self.rt.connected:
            return False
        self.dropped_at = time.perf_counter()
        ws.transport.abort()
        return True


# --- figures ------------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def dist(values: list[float]) -> dict[str, Any]:
    ms = [v * 1000 for v in values]
    return {"n": len(ms), "p50_ms": pct(ms, 50), "p90_ms": pct(ms, 90), "p99_ms": pct(ms, 99),
            "max_ms": max(ms, default=float("nan")), "mean_ms": statistics.fmean(ms) if ms else float("nan"),
            "samples_ms": sorted(round(v, 1) for v in ms)}  # fmt: skip


def show(name: str, d: dict[str, Any]) -> str:
    return (f"{name:<44} n={d['n']:<4} p50 {d['p50_ms']:6.1f}  p90 {d['p90_ms']:6.1f}  p99 {d['p99_ms']:6.1f}  "
            f"max {d['max_ms']:6.1f} ms")  # fmt: skip


def resume_figures(resumes: list[Resume]) -> dict[str, Any]:
    replayed = [r for r in resumes if r.first_at is not None and r.first_replayed]
    return {
        "resumes": len(resumes),
        "with_replay": len(replayed),
        "open_to_resumed": dist([r.resumed_at - r.opened_at for r in resumes]),
        "open_to_first_replayed": dist([r.first_at - r.opened_at for r in replayed if r.first_at]),
        "open_to_first_event": dist([r.first_at - r.opened_at for r in resumes if r.first_at]),
        "outage_drop_to_first_event": dist([r.first_at - r.dropped_at for r in resumes if r.first_at and r.dropped_at]),
    }


# --- phases -------------------------------------------------------------------------------------------


# Commands the gateway sends only at the top level (never from inside its Lua scripts): each call is
# one round trip. A MULTI/EXEC pipeline (read_events) is one round trip, counted by its EXEC. GET,
# HMGET, DEL... also run inside the scripts, so they are not counted here; outside scripts the
# gateway sends them only to resume, which phase 1 does not do.
ROUND_TRIP_COMMANDS = ("evalsha", "eval", "exec", "ping", "publish", "getdel")


async def redis_counters(r: aioredis.Redis) -> dict[str, int]:
    """``total_commands_processed`` (script-internal commands included, in Redis 7) and the calls of
    every command (``INFO commandstats``)."""
    stats = await r.info("stats")
    cmds = await r.info("commandstats")
    out = {name.removeprefix("cmdstat_"): int(v.get("calls", 0)) for name, v in cmds.items()}
    out["@total"] = int(stats["total_commands_processed"])
    return out


async def phase_round_trips(
    cluster: Cluster, r: aioredis.Redis, sessions: list[Session], stream_s: float
) -> dict[str, Any]:
    async def measure(seconds: float, streaming: bool) -> dict[str, Any]:
        stop = asyncio.Event()

        async def stream(s: Session) -> None:
            while not stop.is_set():
                await s.answer()

        tasks = [asyncio.create_task(stream(s)) for s in sessions] if streaming else []
        await asyncio.sleep(1.0 if streaming else 0.2)  # into the steady state
        c0 = await redis_counters(r)
        t0 = time.perf_counter()
        ops: list[int] = []
        while time.perf_counter() - t0 < seconds:
            await asyncio.sleep(1.0)
            ops.append(int((await r.info("stats"))["instantaneous_ops_per_sec"]))
        c1 = await redis_counters(r)
        elapsed = time.perf_counter() - t0
        stop.set()
        await asyncio.gather(*tasks)
        delta = {k: v - c0.get(k, 0) for k, v in c1.items() if v != c0.get(k, 0)}
        delta["info"] = delta.get("info", 0) - 3 - len(ops)  # this function's own INFO calls
        delta["@total"] -= 3 + len(ops)
        return {
            "seconds": elapsed,
            "round_trips_per_s": sum(delta.get(c, 0) for c in ROUND_TRIP_COMMANDS) / elapsed,
            "commands_per_s": delta["@total"] / elapsed,  # script-internal commands included
            "instantaneous_ops_per_sec_mean": statistics.fmean(ops) if ops else 0.0,
            "calls_per_s": {k: round(v / elapsed, 2) for k, v in sorted(delta.items()) if v > 0},
        }

    busy = await measure(stream_s, True)
    idle = await measure(min(stream_s, 5.0), False)
    n = len(sessions)
    return {
        "sessions": n,
        "streaming": busy,
        "idle": idle,
        "round_trips_per_s_per_streaming_session": (busy["round_trips_per_s"] - idle["round_trips_per_s"]) / n,
        "commands_per_s_per_streaming_session": (busy["commands_per_s"] - idle["commands_per_s"]) / n,
    }


async def phase_drops(sessions: list[Session], drops: int, every_ms: float, budget_s: float) -> dict[str, Any]:
    stop = asyncio.Event()
    done = 0
    errors: list[str] = []

    async def stream(s: Session) -> None:
        try:
            while not stop.is_set():
                await s.answer()
            await s.settle()
        except (RealtimeError, TimeoutError) as exc:
            errors.append(f"{s.rt.session_id}: {exc!r}")

    before = [len(s.resumes) for s in sessions]
    tasks = [asyncio.create_task(stream(s)) for s in sessions]
    rng = random.Random()
    t0 = time.perf_counter()
    while done < drops and time.perf_counter() - t0 < budget_s and len(errors) < len(sessions):
        await asyncio.sleep(rng.uniform(0.5, 1.5) * every_ms / 1000)
        candidates = [s for s in sessions if s.rt.connected and s.dropped_at is None]
        if candidates and rng.choice(candidates).drop():
            done += 1
    stop.set()
    await asyncio.gather(*tasks)
    tally = Tally(failures=errors)
    for s in sessions:
        s.tally(tally)
    resumes = [r for s, b in zip(sessions, before, strict=True) for r in s.resumes[b:]]
    return {"drops": done, "seconds": time.perf_counter() - t0, **resume_figures(resumes), "tally": asdict(tally)}


async def owner_of(r: aioredis.Redis, session_id: str) -> int | None:
    raw = await r.hget(f"{KEY_PREFIX}s:{{{session_id}}}:lease", "owner")
    text = raw.decode() if isinstance(raw, bytes) else raw
    return int(text[1:]) if text else None


async def kill_once(
    cluster: Cluster, r: aioredis.Redis, s: Session, kill_at: int, on_resumed: Callable[[int], None]
) -> None:
    """``s`` starts an answer; its replica is SIGKILLed at word ``kill_at`` (noted in ``s.victim``);
    the SDK resumes on another replica, then ``on_resumed(victim)`` runs (it restarts the victim: not
    before, so that the restart's CPU does not slow the resume being measured). Raises when the
    guarantees do not hold."""
    await s.open()
    assert s.rt.session_id is not None
    owner = await owner_of(r, s.rt.session_id)
    assert owner is not None, "no lease"
    words = 0

    async def on_event(event: dict[str, Any]) -> None:
        nonlocal words
        if event["type"] in ("session.resumed", "session.resync_required") and s.victim is not None:
            on_resumed(s.victim)
        if event["type"] == TRANSCRIPT_DELTA and s.victim is None:
            words += 1
            if words == kill_at:
                cluster.kill_replica(owner, signal.SIGKILL)
                s.dropped_at = time.perf_counter()
                s.victim = owner

    s.on_event = on_event
    await s.answer()
    await s.settle(0.2)
    if s.gaps or s.rt.stats.gaps or not s.resumes:
        raise AssertionError(f"gaps {s.gaps}/{s.rt.stats.gaps}, resumes {len(s.resumes)}")


async def phase_kills(
    cluster: Cluster, r: aioredis.Redis, kills: int, budget_s: float, max_failures: int
) -> dict[str, Any]:
    rng = random.Random()
    tally = Tally()
    resumes: list[Resume] = []
    restarting: dict[int, asyncio.Task[None]] = {}
    done = consecutive_failures = 0
    t0 = time.perf_counter()

    async def restart(index: int) -> None:
        await cluster.await_exit(index, 30)
        await cluster.astart_replica(index)

    def start_restart(index: int) -> None:
        if index not in restarting:
            restarting[index] = asyncio.create_task(restart(index))

    async def all_replicas_up() -> None:
        """Every replica back before the next kill (a restart that overlapped the resume would have
        slowed it: on a small machine the new process's start takes a core for about a second)."""
        for index, task in list(restarting.items()):
            await task
            del restarting[index]

    try:
        while done < kills and time.perf_counter() - t0 < budget_s and consecutive_failures < max_failures:
            await all_replicas_up()
            session = Session(cluster.url, binary=done % 2 == 1)
            try:
                await kill_once(cluster, r, session, rng.randint(10, 30), start_restart)
                consecutive_failures = 0
            except (RealtimeError, TimeoutError, AssertionError, OSError) as exc:
                tally.failures.append(f"kill {done + 1}: {exc!r}"[:300])
                consecutive_failures += 1
            finally:
                await session.rt.close()
            if session.victim is not None:
                start_restart(session.victim)
            session.tally(tally)
            resumes.extend(session.resumes)
            done += 1
    finally:
        for task in restarting.values():
            with contextlib.suppress(Exception):
                await task
    return {"kills": done, "seconds": time.perf_counter() - t0, "stopped_early": done < kills,
            **resume_figures(resumes), "tally": asdict(tally)}  # fmt: skip


# --- main ---------------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    env = {"OMNI_GATEWAY_VIDEO_ENGINE": "none", "OMNI_GATEWAY_DRAIN_WINDOW_S": "1"}
    results: dict[str, Any] = {"replicas": args.replicas, "sessions": args.sessions}
    async with Cluster(replicas=args.replicas, engine="passthrough", api_keys=(API_KEY,), env=env,
                       stop_timeout_s=15) as cluster:  # fmt: skip
        r = aioredis.from_url(cluster.redis_url)
        try:
            print(f"cluster up: {args.replicas} replicas behind {cluster.url} (run dir {cluster.run_dir})", flush=True)
            sessions = [Session(cluster.url, binary=i % 2 == 1) for i in range(args.sessions)]
            for s in sessions:
                await s.open()
            if args.stream_s > 0:
                print(f"[1/3] redis round trips: {args.sessions} sessions streaming {args.stream_s:.0f} s, then idle",
                      flush=True)  # fmt: skip
                rt = await phase_round_trips(cluster, r, sessions, args.stream_s)
                results["round_trips"] = rt
                busy, idle = rt["streaming"], rt["idle"]
                print(
                    f"      streaming: {busy['round_trips_per_s']:.0f} round trips/s, "
                    f"{busy['commands_per_s']:.0f} commands/s with those run inside scripts "
                    f"(instantaneous_ops_per_sec {busy['instantaneous_ops_per_sec_mean']:.0f}); idle: "
                    f"{idle['round_trips_per_s']:.1f} round trips/s, {idle['commands_per_s']:.1f} commands/s"
                )
                print(f"      calls/s while streaming: {busy['calls_per_s']}")
                print(f"      => {rt['round_trips_per_s_per_streaming_session']:.1f} round trips/s per streaming "
                      f"session (target <= {TARGET_ROUND_TRIPS:.0f}); "
                      f"{rt['commands_per_s_per_streaming_session']:.0f} Redis commands/s per session counting "
                      "those inside the scripts", flush=True)  # fmt: skip
            if args.drops > 0:
                print(f"[2/3] dropped sockets: {args.drops} drops across {args.sessions} streaming sessions",
                      flush=True)  # fmt: skip
                d = await phase_drops(sessions, args.drops, args.drop_every_ms, args.phase_budget_s)
                results["drops"] = d
                print_resumes(d)
            for s in sessions:
                await s.rt.close()
            if args.kills > 0:
                print(f"[3/3] SIGKILL loop: {args.kills} kills", flush=True)
                k = await phase_kills(cluster, r, args.kills, args.phase_budget_s, args.max_failures)
                results["kills"] = k
                print_resumes(k)
        finally:
            await r.aclose()
    return results


def print_resumes(p: dict[str, Any]) -> None:
    t = p["tally"]
    count = p.get("drops", p.get("kills"))
    print(f"      {count} done in {p['seconds']:.0f} s; {p['resumes']} resumes ({p['with_replay']} with a replay)")
    for key, label in (("open_to_first_replayed", "resume latency: socket open -> 1st replayed"),
                       ("open_to_resumed", "socket open -> session.resumed"),
                       ("open_to_first_event", "socket open -> 1st event after resume"),
                       ("outage_drop_to_first_event", "outage: drop/kill -> 1st event after")):  # fmt: skip
        print("      " + show(label, p[key]))
    print(f"      answers: {t['answers_completed']} completed whole, {t['answers_interrupted']} interrupted "
          f"(incomplete/replica_lost, then re-issued), {t['answers_bad']} bad; replayed events "
          f"{t['replayed_events']}, duplicates dropped {t['duplicates_dropped']}, gaps {t['gaps']}, resyncs "
          f"{t['resyncs']}, failed attempts {t['failed_attempts']}, failures {len(t['failures'])}")  # fmt: skip
    for f in t["failures"][:5]:
        print(f"        failure: {f}")
    if p.get("stopped_early"):
        print("      stopped early (time budget or consecutive failures)")
    print(flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=6, help="streaming sessions (phases 1 and 2)")
    parser.add_argument("--stream-s", type=float, default=10.0, help="phase 1 length (0: skip)")
    parser.add_argument("--drops", type=int, default=200, help="phase 2 socket drops (0: skip)")
    parser.add_argument("--drop-every-ms", type=float, default=200.0, help="mean time between drops")
    parser.add_argument("--kills", type=int, default=100, help="phase 3 SIGKILLs (0: skip)")
    parser.add_argument("--max-failures", type=int, default=5, help="phase 3 stops after this many failures in a row")
    parser.add_argument("--phase-budget-s", type=float, default=300.0, help="time limit of phases 2 and 3, each")
    parser.add_argument("--quick", action="store_true", help="3 s of streaming, 40 drops, 10 kills")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    if args.quick:
        args.stream_s, args.drops, args.kills = 3.0, 40, 10
    if args.replicas < 2:
        parser.error("resume across replicas needs --replicas >= 2")
    started = time.perf_counter()
    load_before = os.getloadavg()
    results = asyncio.run(run(args))
    results["seconds"] = time.perf_counter() - started
    # Everything (replicas, nginx, redis, this client) shares this machine: its load says how much
    # of a latency tail is the machine's rather than the gateway's.
    results["machine"] = {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()}
    verdicts = []
    if "round_trips" in results:
        v = results["round_trips"]["round_trips_per_s_per_streaming_session"]
        verdicts.append(f"round trips/s/session {v:.1f} {'<=' if v <= TARGET_ROUND_TRIPS else '>'} "
                        f"{TARGET_ROUND_TRIPS:.0f}")  # fmt: skip
    for phase, key in (("drops", "open_to_first_replayed"), ("kills", "open_to_resumed")):
        if phase in results:
            p = results[phase]
            failures = len(p["tally"]["failures"])
            p99 = p[key]["p99_ms"]
            verdict = f"{phase}: {p['resumes']} resumes, {failures} sessions lost"
            if p99 == p99:  # not NaN
                verdict += f", resume p99 {p99:.1f} ms {'<=' if p99 <= TARGET_RESUME_P99_MS else '>'} "
                verdict += f"{TARGET_RESUME_P99_MS:.0f} ({key})"
            verdicts.append(verdict)
    m = results["machine"]
    print(f"machine: {m['cpus']} CPUs, load average {m['loadavg_before'][0]:.1f} before, "
          f"{m['loadavg_after'][0]:.1f} after")  # fmt: skip
    print(f"done in {results['seconds']:.0f} s; " + "; ".join(verdicts))
    if args.json:
        args.json.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
