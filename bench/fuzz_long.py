"""The long fuzz run: hostile input against a real ``serve --engine passthrough`` process.

``--workers`` concurrent hostile clients (tests/support/fuzz.py: every client event type
with wrong types, extreme values, deep nesting, invalid base64 and UTF-8, oversize
frames, huge conversations, mixed with probes that must be answered) send ``--inputs``
frames in all, while ``/healthz`` is probed every 200 ms. The gateway runs as its own
process (its log in the run directory), so its CPU and memory are its own. Printed:

- inputs, sockets, coded errors by code, error events without a code (must be 0),
  close codes, probes answered / sent / left unanswered on open sockets;
- the server log's tracebacks and ERROR lines (must be 0);
- RSS before / after (and after the sessions ended), CPU seconds per 1,000 hostile inputs;
- /healthz: failures, p50/p99 latency.

    python bench/fuzz_long.py                     # 100,000 inputs, 50 workers
    python bench/fuzz_long.py --inputs 20000 --workers 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
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
           "OMNI_GATEWAY_DETACH_GRACE_S": "1"}  # fmt: skip
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


async def health_probe(port: int, stop: asyncio.Event, latencies: list[float], failures: list[str]) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        began = time.perf_counter()
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 2)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            status = await asyncio.wait_for(reader.readline(), 2)
            writer.close()
            if b" 200 " not in status:
                failures.append(status.decode(errors="replace").strip())
            latencies.append(time.perf_counter() - began)
        except (OSError, TimeoutError) as exc:
            failures.append(repr(exc))
        await asyncio.sleep(max(0.0, 0.2 - (loop.time() % 0.2)))


async def run(args: argparse.Namespace, port: int, server: psutil.Process) -> tuple[FuzzStats, list[float], list[str]]:
    stop = asyncio.Event()
    latencies: list[float] = []
    failures: list[str] = []
    probe = asyncio.get_running_loop().create_task(health_probe(port, stop, latencies, failures))
    per_worker = args.inputs // args.workers
    results = await asyncio.gather(*(fuzz_worker(port, seed=args.seed + i, inputs=per_worker)
                                     for i in range(args.workers)))  # fmt: skip
    stop.set()
    await probe
    stats = FuzzStats()
    for r in results:
        stats.merge(r)
    return stats, latencies, failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="fuzz-long-"))
    log = run_dir / "gateway.log"
    port = free_port()
    proc = start_gateway(port, log)
    server = psutil.Process(proc.pid)
    try:
        rss_before = server.memory_info().rss
        cpu_before = sum(server.cpu_times()[:2])
        began = time.monotonic()
        stats, latencies, failures = asyncio.run(run(args, port, server))
        wall = time.monotonic() - began
        cpu = sum(server.cpu_times()[:2]) - cpu_before
        rss_after = server.memory_info().rss
        time.sleep(3)  # the dropped sockets' sessions end (detach grace 1 s)
        rss_settled = server.memory_info().rss
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    text = log.read_text(errors="replace")
    tracebacks = text.count("Traceback (most recent call last)")
    errors = [line for line in text.splitlines() if " ERROR " in line or line.startswith("ERROR")]
    undocumented = {c: n for c, n in stats.closes.items() if c not in DOCUMENTED_CLOSES | {1006}}
    lat = sorted(latencies) or [0.0]
    print(f"inputs            {stats.inputs:,} over {stats.sockets:,} sockets from {args.workers} workers "
          f"in {wall:.0f} s")  # fmt: skip
    print(f"coded errors      {stats.errors:,}  without a code: {stats.errors_without_code}")
    for code, n in sorted(stats.errors_by_code.items(), key=lambda kv: -kv[1]):
        print(f"    {code:<40} {n:,}")
    print(f"close codes       {dict(sorted(stats.closes.items()))}  undocumented: {undocumented or 'none'}")
    print(f"probes            {stats.probes_answered:,} answered of {stats.probes_sent:,}; "
          f"unanswered on open sockets: {len(stats.unanswered)}")  # fmt: skip
    print(f"server log        {tracebacks} tracebacks, {len(errors)} ERROR lines ({log})")
    print(f"RSS               {rss_before / 2**20:.0f} MiB before, {rss_after / 2**20:.0f} MiB after, "
          f"{rss_settled / 2**20:.0f} MiB once the sessions ended")  # fmt: skip
    print(f"server CPU        {cpu:.1f} s: {1000 * cpu / max(1, stats.inputs):.2f} ms per hostile input")
    print(
        f"/healthz          {len(latencies)} probes, {len(failures)} failed; "
        f"p50 {1000 * statistics.median(lat):.1f} ms, p99 {1000 * lat[int(0.99 * (len(lat) - 1))]:.1f} ms"
    )
    ok = not (tracebacks or errors or stats.errors_without_code or undocumented or stats.unanswered or failures)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
