"""The long fuzz run: hostile input against a real ``serve --engine passthrough`` process.

``--workers`` concurrent hostile clients (tests/support/fuzz.py: every client event type
with wrong types, extreme values, deep nesting, invalid base64 and UTF-8, oversize
frames, huge conversations, mixed with probes that must be answered) send ``--inputs``
frames per round, ``--rounds`` times, while ``/healthz`` is probed every 200 ms from a
process of its own (the fuzz clients' busy loop must not delay the probe). The gateway
runs as its own process (its log in the run directory), so its CPU and memory are its
own. It forgets a session 5 s after its socket went (``journal_ttl_s``, swept as often), so
after each round the bench waits ``--settle`` seconds, opening a socket a second (what makes
the memory store sweep), and reads RSS again: what the round left once the gateway forgot its
sessions (and glibc was given its free memory back: ``malloc_trim_s``, 10 s). Printed:

- inputs, sockets, coded errors by code, error events without a code (must be 0),
  close codes, probes answered / sent / left unanswered on open sockets;
- the server log's tracebacks and ERROR lines (must be 0);
- RSS before and after each round, then settled (after ``--settle``), CPU per hostile input;
- whether RSS is bounded: a leak grows RSS by as much in every round; a bounded
  server's later rounds reuse what the first one took (each later round must grow
  it by under a quarter of the first round's growth); and whether the last settled RSS
  is within 20 % of the RSS before the first round (what hostile input leaves behind);
- /healthz: failures (must be 0), p50/p99 latency.

    python bench/fuzz_long.py                     # 2 rounds of 100,000 inputs, 50 workers: ~3 min
    python bench/fuzz_long.py --inputs 10000 --workers 10 --rounds 3   # ~1.5 min, most of it settling
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing as mp
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support.fuzz import DOCUMENTED_CLOSES, FuzzStats, fuzz_worker  # noqa: E402
from support.gateway import free_port  # noqa: E402


def start_gateway(port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMNI_GATEWAY_PORT": str(port), "OMNI_GATEWAY_VIDEO_ENGINE": "none",
           "OMNI_GATEWAY_DETACH_GRACE_S": "1", "OMNI_GATEWAY_JOURNAL_TTL_S": "5"}  # fmt: skip
    out = log.open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--engine", "passthrough"],
                            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1):
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the gateway did not start; see {log}")


def health_probe(port: int, stop: mp.synchronize.Event, path: Path) -> None:
    """In its own process: GET /healthz every 200 ms, 2 s to answer; a line per probe to
    ``path``: its latency in seconds, then the failure (nothing when it answered 200)."""
    with path.open("a", buffering=1) as out:
        while not stop.is_set():
            began = time.perf_counter()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    status = sock.makefile("rb").readline()
                failure = "" if b" 200 " in status else status.decode(errors="replace").strip()
            except OSError as exc:
                failure = repr(exc)
            out.write(f"{time.perf_counter() - began:.6f} {failure}\n")
            time.sleep(max(0.0, 0.2 - (time.monotonic() % 0.2)))


async def settle(port: int, seconds: float) -> None:
    """Wait ``seconds``, opening (and closing) one socket a second: the memory store forgets
    expired sessions when it is used, and an idle gateway does not use it."""
    from support.raw_ws import open_raw

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        client = await open_raw(port)
        await client.event()  # session.created
        client.abort()
        await asyncio.sleep(1.0)


async def fuzz_round(args: argparse.Namespace, port: int, seed: int) -> FuzzStats:
    per_worker = args.inputs // args.workers
    results = await asyncio.gather(*(fuzz_worker(port, seed=seed + i, inputs=per_worker, timeout=60.0)
                                     for i in range(args.workers)))  # fmt: skip
    stats = FuzzStats()
    for r in results:
        stats.merge(r)
    return stats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=100_000, help="hostile inputs per round (default 100,000)")
    parser.add_argument("--workers", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2, help="rounds (default 2: the second shows RSS bounded)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--settle", type=float, default=25.0,
                        help="seconds after each round before RSS is read again (default 25: the 5 s TTL, "
                             "its sweep, one malloc_trim)")  # fmt: skip
    args = parser.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="fuzz-long-"))
    log = run_dir / "gateway.log"
    port = free_port()
    proc = start_gateway(port, log)
    server = psutil.Process(proc.pid)
    ctx = mp.get_context("spawn")
    stop, probes = ctx.Event(), run_dir / "healthz.txt"
    prober = ctx.Process(target=health_probe, args=(port, stop, probes), daemon=True)
    stats = FuzzStats()
    rss = [server.memory_info().rss]
    settled: list[int] = []
    try:
        prober.start()
        deadline = time.monotonic() + 30
        while not (probes.exists() and probes.stat().st_size) and time.monotonic() < deadline:
            time.sleep(0.05)  # the prober is up (its first probe is in) before the fuzz starts
        cpu_before = sum(server.cpu_times()[:2])
        cpu_settling = 0.0
        began = time.monotonic()
        for r in range(args.rounds):
            stats.merge(asyncio.run(fuzz_round(args, port, args.seed + 1000 * r)))
            rss.append(server.memory_info().rss)
            cpu_fuzz = sum(server.cpu_times()[:2])
            asyncio.run(settle(port, args.settle))
            cpu_settling += sum(server.cpu_times()[:2]) - cpu_fuzz
            settled.append(server.memory_info().rss)
            print(f"round {r + 1}: RSS {rss[-1] / 2**20:.0f} MiB, settled {settled[-1] / 2**20:.0f} MiB", flush=True)
        wall = time.monotonic() - began - args.rounds * args.settle
        cpu = sum(server.cpu_times()[:2]) - cpu_before - cpu_settling
        stop.set()
        prober.join(5)
    finally:
        if prober.is_alive():
            prober.kill()
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    lines = [line.split(" ", 1) for line in probes.read_text().splitlines()] if probes.exists() else []
    latencies = [float(line[0]) for line in lines]
    failures = [line[1] for line in lines if len(line) > 1 and line[1]]
    text = log.read_text(errors="replace")
    tracebacks = text.count("Traceback (most recent call last)")
    errors = [line for line in text.splitlines() if " ERROR " in line or line.startswith("ERROR")]
    undocumented = {c: n for c, n in stats.closes.items() if c not in DOCUMENTED_CLOSES | {1006}}
    growth = [b - a for a, b in itertools.pairwise(rss)]
    bounded = all(g < growth[0] / 4 for g in growth[1:]) if len(growth) > 1 else None
    returned = bool(settled) and settled[-1] <= 1.2 * rss[0]
    lat = sorted(latencies) or [0.0]
    print(f"inputs            {stats.inputs:,} over {stats.sockets:,} sockets from {args.workers} workers "
          f"in {wall:.0f} s ({args.rounds} rounds)")  # fmt: skip
    print(f"coded errors      {stats.errors:,}  without a code: {stats.errors_without_code}")
    for code, n in sorted(stats.errors_by_code.items(), key=lambda kv: -kv[1]):
        print(f"    {code:<40} {n:,}")
    print(f"close codes       {dict(sorted(stats.closes.items()))}  undocumented: {undocumented or 'none'}")
    print(f"probes            {stats.probes_answered:,} answered of {stats.probes_sent:,}; "
          f"unanswered on open sockets: {len(stats.unanswered)}")  # fmt: skip
    print(f"server log        {tracebacks} tracebacks, {len(errors)} ERROR lines ({log})")
    steps = " -> ".join(f"{x / 2**20:.0f}" for x in rss)
    verdict = {None: "one round: run --rounds 2 to tell", True: "bounded", False: "GROWING"}[bounded]
    print(f"RSS               {steps} MiB (before, after each round): {verdict}")
    after = " -> ".join(f"{x / 2**20:.0f}" for x in [rss[0], *settled])
    print(
        f"RSS settled       {after} MiB (before, {args.settle:.0f} s after each round): last "
        f"{100 * settled[-1] / rss[0] - 100:+.0f} % of the start, {'within' if returned else 'NOT within'} 20 %"
    )
    print(f"server CPU        {cpu:.1f} s: {1000 * cpu / max(1, stats.inputs):.2f} ms per hostile input")
    print(
        f"/healthz          {len(latencies)} probes, {len(failures)} failed; "
        f"p50 {1000 * statistics.median(lat):.1f} ms, p99 {1000 * lat[int(0.99 * (len(lat) - 1))]:.1f} ms"
    )
    for failure in sorted(set(failures))[:5]:
        print(f"    failed probe: {failure}")
    ok = bool(latencies) and not (
        tracebacks or errors or stats.errors_without_code or undocumented or stats.unanswered or failures
    )
    ok = ok and bounded is not False and returned
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
