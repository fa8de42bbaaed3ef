"""A frozen Redis (SIGSTOP) under streaming sessions: what the sessions hear, what the
replicas log, how much memory they take, and what readiness says.

A local cluster (``deploy/local_cluster.py``: redis-server and ``--replicas`` gateways,
``--engine passthrough``); ``--sessions`` raw WebSocket sessions, spread over the replicas
(straight to each, not through nginx), each asking for answers back to back
(``conversation.item.create`` + ``response.create`` after every ``response.done``). After
``--warmup`` seconds Redis is frozen for ``--freeze`` seconds, then thawed, and the run goes
on ``--after`` seconds. Printed: answers completed before, during and after the freeze, the
longest silence a session heard during it (no event for that long), the replicas' warning
lines during it (per second), their resident memory (VmRSS) before the freeze and at its
end, and ``/readyz`` as the freeze went (the first status, and the statuses seen).

    python bench/redis_freeze.py                        # 20 sessions, 2 replicas, a 20 s freeze
    python bench/redis_freeze.py --freeze 90            # the memory question

Only 127.0.0.1 is used; the cluster is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import orjson
import websockets

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from deploy.local_cluster import Cluster  # noqa: E402

API_KEY = "sk-bench-freeze"
TEXT = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello there"}]}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def readyz(http: str) -> int:
    try:
        with urllib.request.urlopen(http + "/readyz", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def warning_lines(path: Path, mark: int) -> int:
    with open(path, "rb") as f:
        f.seek(mark)
        return sum(1 for line in f if b"WARNING" in line)


def ready_again(http: str, timeout: float = 30.0) -> int:
    """Poll /readyz until 200 (or ``timeout``): its last status."""
    deadline = time.monotonic() + timeout
    while (status := readyz(http)) != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    return status


class Session:
    def __init__(self, url: str, freeze: tuple[float, float]) -> None:
        self.url = url
        self.freeze = freeze  # [start, end] in time.monotonic(), filled in when known
        self.answers: Counter[str] = Counter()
        self.silence = 0.0  # the longest time without an event during the freeze

    def phase(self, t: float) -> str:
        start, end = self.freeze
        return "before" if t < start else "during" if t < end else "after"

    async def run(self, stop_at: float) -> None:
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with websockets.connect(self.url, additional_headers=headers, max_size=None) as ws:
            await ws.send(orjson.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {
                "input": {"turn_detection": None}}}}).decode())  # fmt: skip
            last = time.monotonic()
            while time.monotonic() < stop_at:
                await ws.send(orjson.dumps({"type": "conversation.item.create", "item": TEXT}).decode())
                await ws.send(orjson.dumps({"type": "response.create"}).decode())
                while True:
                    try:
                        msg = await asyncio.wait_for(ws.recv(), max(0.1, stop_at + 60 - time.monotonic()))
                    except TimeoutError:
                        return
                    now = time.monotonic()
                    start, end = self.freeze
                    if start <= now and last <= end:  # a silence that overlaps the freeze
                        self.silence = max(self.silence, min(now, end) - max(last, start))
                    last = now
                    if isinstance(msg, str) and orjson.loads(msg).get("type") == "response.done":
                        self.answers[self.phase(now)] += 1
                        break


async def main(args: argparse.Namespace) -> int:
    env = {"OMNI_GATEWAY_LOG_LEVEL": "warning"}
    async with Cluster(replicas=args.replicas, engine="passthrough", api_keys=[API_KEY], env=env) as cluster:
        loop_start = time.monotonic()
        freeze = [loop_start + args.warmup, loop_start + args.warmup + args.freeze]
        stop_at = freeze[1] + args.after
        sessions = [Session(cluster.replicas[i % len(cluster.replicas)].url, (0.0, 0.0))
                    for i in range(args.sessions)]  # fmt: skip
        for s in sessions:
            s.freeze = (freeze[0], freeze[1])
        runs = [asyncio.create_task(s.run(stop_at)) for s in sessions]
        await asyncio.sleep(max(0.0, freeze[0] - time.monotonic()))
        pids = [r.pid for r in cluster.replicas if r.pid is not None]
        before = [rss_mb(p) for p in pids]
        logs = [r.log_path for r in cluster.replicas]
        marks = [p.stat().st_size for p in logs]
        redis_pid = cluster._redis.pid if cluster._redis is not None else None
        assert redis_pid is not None
        if not args.control:
            os.kill(redis_pid, signal.SIGSTOP)
        statuses: Counter[int] = Counter()
        first_503: float | None = None
        peak = list(before)
        try:
            while time.monotonic() < freeze[1]:
                code = await asyncio.to_thread(readyz, cluster.replicas[0].http)
                statuses[code] += 1
                if code == 503 and first_503 is None:
                    first_503 = time.monotonic() - freeze[0]
                peak = [max(a, rss_mb(p)) for a, p in zip(peak, pids, strict=True)]
                await asyncio.sleep(0.5)
        finally:
            if not args.control:
                os.kill(redis_pid, signal.SIGCONT)
        warnings = sum(warning_lines(path, mark) for path, mark in zip(logs, marks, strict=True))
        after_status = await asyncio.to_thread(ready_again, cluster.replicas[0].http)
        with contextlib.suppress(Exception):
            await asyncio.gather(*runs)
        answers = sum((s.answers for s in sessions), Counter())
        silences = sorted(s.silence for s in sessions)
        frozen = "not frozen (control run)" if args.control else "frozen"
        print(f"{args.sessions} sessions on {args.replicas} replicas, Redis {frozen} for {args.freeze:.0f} s")
        print(f"answers completed: before {answers['before']}, during the freeze {answers['during']}, "
              f"after {answers['after']}")  # fmt: skip
        print(f"longest silence during the freeze: median {silences[len(silences) // 2]:.1f} s, "
              f"max {silences[-1]:.1f} s")  # fmt: skip
        print(f"warning lines during the freeze: {warnings} ({warnings / args.freeze:.1f}/s, all replicas)")
        print("replica RSS MB before -> peak during: " + ", ".join(
            f"{b:.0f} -> {p:.0f} (+{p - b:.0f})" for b, p in zip(before, peak, strict=True)))  # fmt: skip
        print(
            f"/readyz during the freeze: {dict(statuses)}; first 503 after "
            f"{'never' if first_503 is None else f'{first_503:.1f} s'}; after the thaw: {after_status}"
        )
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=20)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--freeze", type=float, default=20.0)
    p.add_argument("--after", type=float, default=5.0)
    p.add_argument("--control", action="store_true", help="the same run without freezing Redis (a baseline)")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
