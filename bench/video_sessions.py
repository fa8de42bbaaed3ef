"""Video sessions: how many concurrent real-time streams one gateway process sustains.

The gateway runs as a subprocess (``python -m gateway serve --engine
passthrough``: the embedded CPU video engine renders and encodes every
frame), with ``OMNI_GATEWAY_MAX_VIDEOS`` raised so that admission is not the
limit. Clients run in another process and only read: each of N sessions
starts an endless 256x256 stream at 12 fps (fMP4, half-second chunks) and
records when each chunk arrives and what its metadata reports.

Per step N, after ``--warmup`` seconds, over ``--duration`` seconds:

- real-time ratio per session: frames delivered per second between the first
  and the last chunk of the window, divided by the requested fps. The
  gateway paces generation to real time (``video_lead_chunks`` ahead), so a
  server that keeps up delivers exactly 1.0; one that cannot falls below;
- margin: how much video a player that started playing at the first chunk
  still had buffered when the last chunk of the window arrived (that chunk's
  play time minus its arrival time): about a second (the lead) when the
  server keeps up; below 0 the stream is behind real time. A ratio above 1
  is a stream catching up after it fell behind (at start-up, or when the
  machine's other load peaked);
- drops: ``dropped_chunks`` reported in the metadata (the client reads at
  once, so a drop means the client process fell behind, not the server);
- server CPU: the server process's CPU time over the window / wall time, in
  cores (all threads: the event loop and the render workers); "others" is
  the CPU the rest of the machine used meanwhile (busy cores minus server and
  client): on a shared machine it is what the server competed with, and the
  figures only mean something next to it.

The CPU engine serves at most 64 requests (``DEFAULT_MAX_ACTIVE_REQUESTS``;
more fail with ``capacity_exceeded``), so the default ramp ends at 64.

A step passes when every session has ratio >= 0.95, is not behind real time
at the end (margin >= 0) and nothing was dropped;
N ramps through ``--steps`` until a step fails (retried ``--retries`` times,
as other load on the machine can fail one). The max N that passed is
printed. The whole thing runs twice: with torch's default intra-op threads
and with ``OMP_NUM_THREADS=1`` for the server (one thread per render
worker, as ``torch.set_num_threads(1)``).

Only 127.0.0.1 is used; every phase is bounded in time; the server and the
client process are killed on exit, error or Ctrl-C.

    python bench/video_sessions.py                      # both thread modes, ~5 min
    python bench/video_sessions.py --threads 1 --steps 1,2,4,6,8 --duration 8
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import orjson
import psutil

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "A serene lakeside sunrise with mist over the water"
PASS_RATIO = 0.95


# --- the client process --------------------------------------------------------------------


@dataclass
class SessionLog:
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (time, cumulative frames)
    dropped: int = 0
    error: str | None = None


async def _session(url: str, start: dict[str, Any], log: SessionLog, stop: asyncio.Event) -> None:
    import websockets

    try:
        async with websockets.connect(url, max_size=None, compression=None, open_timeout=20) as ws:
            await ws.send(orjson.dumps(start).decode())
            frames = 0
            while not stop.is_set():
                try:
                    message = await asyncio.wait_for(ws.recv(), 1.0)
                except TimeoutError:
                    continue
                if isinstance(message, bytes):
                    continue
                event = orjson.loads(message)
                if event["type"] == "video.chunk_metadata":
                    frames += event["num_frames"]
                    log.arrivals.append((time.monotonic(), frames))
                    log.dropped += event["dropped_chunks"]
                elif event["type"] == "error":
                    log.error = event.get("code")
                elif event["type"] == "session.done":
                    return
            with contextlib.suppress(Exception):
                await ws.send('{"type":"session.stop"}')
    except Exception as exc:  # a refused or broken session counts as a failed one
        log.error = log.error or f"{type(exc).__name__}: {exc}"


async def _client_step(url: str, n: int, start: dict[str, Any], warmup: float, duration: float,
                       conn: Connection) -> None:  # fmt: skip
    stop = asyncio.Event()
    logs = [SessionLog() for _ in range(n)]
    tasks = [asyncio.create_task(_session(url, start, log, stop)) for log in logs]
    began = time.monotonic()
    await asyncio.sleep(warmup)
    t0 = time.monotonic()
    conn.send(("window", t0))
    await asyncio.sleep(duration)
    t1 = time.monotonic()
    conn.send(("window_end", t1))
    stop.set()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 15)
    conn.send(("result", {"began": began, "t0": t0, "t1": t1, "logs": [asdict(log) for log in logs]}))


def _client_main(url: str, n: int, start: dict[str, Any], warmup: float, duration: float, conn: Connection) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_client_step(url, n, start, warmup, duration, conn))


# --- figures ------------------------------------------------------------------------------------


@dataclass
class Step:
    sessions: int
    min_ratio: float
    median_ratio: float
    min_margin_s: float
    dropped: int
    errors: int
    server_cpu_cores: float
    client_cpu_cores: float
    others_cpu_cores: float
    ok: bool


def _ratio(log: dict[str, Any], t0: float, t1: float, fps: int) -> float:
    window = [(t, f) for t, f in log["arrivals"] if t0 <= t <= t1]
    if len(window) < 2 or window[-1][0] <= window[0][0]:
        return 0.0
    (ta, fa), (tb, fb) = window[0], window[-1]
    return (fb - fa) / (tb - ta) / fps


def _margin(log: dict[str, Any], t1: float, fps: int) -> float:
    """The buffer (seconds) a player that started at the first chunk had when the last chunk
    before t1 arrived: that chunk's play time minus its arrival time (negative: behind)."""
    arrivals = [(t, f) for t, f in log["arrivals"] if t <= t1]
    if len(arrivals) < 2:
        return float("-inf")
    (last, _), (_, before) = arrivals[-1], arrivals[-2]
    return arrivals[0][0] + before / fps - last


def _busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (all cores) since boot."""
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


def _figures(n: int, result: dict[str, Any], fps: int, cpu: tuple[float, float, float]) -> Step:
    t0, t1, logs = result["t0"], result["t1"], result["logs"]
    ratios = [_ratio(log, t0, t1, fps) for log in logs]
    margins = [_margin(log, t1, fps) for log in logs]
    dropped = sum(log["dropped"] for log in logs)
    errors = sum(1 for log in logs if log["error"])
    ok = min(ratios) >= PASS_RATIO and min(margins) >= 0 and dropped == 0 and errors == 0
    server, client, busy = cpu
    others = max(0.0, busy - server - client)
    return Step(n, min(ratios), statistics.median(ratios), min(margins), dropped, errors, server, client, others, ok)


# --- the server -------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _http(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return resp.status, resp.read()
    except OSError:
        return 0, b""


def _metric(port: int, name: str) -> float:
    _, text = _http(port, "/metrics")
    for line in text.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


class Server:
    def __init__(self, one_thread: bool, log_dir: Path) -> None:
        self.port = _free_port()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMNI_GATEWAY_MAX_VIDEOS": "1000",
               "OMNI_GATEWAY_LOG_LEVEL": "warning"}  # fmt: skip
        if one_thread:
            env["OMP_NUM_THREADS"] = "1"
        else:
            env.pop("OMP_NUM_THREADS", None)
        self.log_path = log_dir / f"server-{'1thread' if one_thread else 'default'}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve", "--engine", "passthrough", "--host", "127.0.0.1",
                 "--port", str(self.port)],
                env=env, cwd=str(ROOT), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.ps = psutil.Process(self.proc.pid)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while _http(self.port, "/readyz")[0] != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_bytes()[-2000:].decode(errors="replace")
                raise RuntimeError(f"the gateway did not start; its log ends:\n{tail}")
            time.sleep(0.1)

    def wait_idle(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while _metric(self.port, "omni_sessions_active") > 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)  # the last aborts and renders settle

    def cpu_seconds(self) -> float:
        t = self.ps.cpu_times()
        return float(t.user + t.system)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


# --- one step, one ramp ----------------------------------------------------------------------------


def run_step(server: Server, n: int, args: argparse.Namespace) -> Step:
    start = {"type": "session.start", "prompt": PROMPT, "width": args.width, "height": args.height, "fps": args.fps,
             "format": args.format}  # fmt: skip
    url = f"ws://127.0.0.1:{server.port}/v1/realtime/video"
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_client_main, args=(url, n, start, args.warmup, args.duration, child), daemon=True)
    proc.start()
    limit = time.monotonic() + args.warmup + args.duration + 60
    try:
        client_ps = psutil.Process(proc.pid)
        cpu0 = cl0 = cpu1 = cl1 = all0 = all1 = 0.0
        result: dict[str, Any] | None = None
        while result is None:
            left = limit - time.monotonic()
            if left <= 0 or not parent.poll(left):
                raise RuntimeError(f"the client process did not finish step N={n} in time")
            kind, payload = parent.recv()
            if kind == "window":
                cpu0, cl0, all0 = server.cpu_seconds(), sum(client_ps.cpu_times()[:2]), _busy_seconds()
            elif kind == "window_end":
                cpu1, cl1, all1 = server.cpu_seconds(), sum(client_ps.cpu_times()[:2]), _busy_seconds()
            else:
                result = payload
        proc.join(10)
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    server.wait_idle()
    d = args.duration
    return _figures(n, result, args.fps, ((cpu1 - cpu0) / d, (cl1 - cl0) / d, (all1 - all0) / d))


def ramp(one_thread: bool, args: argparse.Namespace, deadline: float, log_dir: Path) -> tuple[int, list[Step]]:
    label = "OMP_NUM_THREADS=1" if one_thread else "torch default threads"
    print(f"\n== server with {label} ({os.cpu_count()} CPUs) ==", flush=True)
    print(f"{'N':>4} {'min ratio':>9} {'median':>7} {'margin':>7} {'drops':>5} {'errors':>6} "
          f"{'server CPU':>10} {'client CPU':>10} {'others':>7}  result")  # fmt: skip
    server = Server(one_thread, log_dir)
    best, steps = 0, []
    try:
        server.wait_ready()
        for n in args.steps:
            if time.monotonic() > deadline:
                print("   (time budget spent: stopping the ramp)")
                break
            for attempt in range(args.retries + 1):
                step = run_step(server, n, args)
                steps.append(step)
                verdict = "ok" if step.ok else ("fail, retrying" if attempt < args.retries else "fail")
                print(f"{n:>4} {step.min_ratio:>9.3f} {step.median_ratio:>7.3f} {step.min_margin_s:>6.2f}s "
                      f"{step.dropped:>5} {step.errors:>6} {step.server_cpu_cores:>9.2f}c "
                      f"{step.client_cpu_cores:>9.2f}c {step.others_cpu_cores:>6.2f}c  {verdict}",
                      flush=True)  # fmt: skip
                if step.ok or time.monotonic() > deadline:
                    break
            if not step.ok:
                break
            best = n
    finally:
        server.stop()
    print(f"max N in real time (every session >= {PASS_RATIO} of {args.fps} fps, not behind, no drops), "
          f"{label}: {best}")  # fmt: skip
    passed = [s for s in steps if s.ok and s.sessions == best]
    if passed:
        per_session = passed[-1].server_cpu_cores / best
        print(f"server CPU per session at N={best}: {per_session:.3f} cores; CPU-bound estimate for "
              f"{os.cpu_count()} idle cores: {int((os.cpu_count() or 1) / per_session)} sessions")  # fmt: skip
    return best, steps


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", default="1,2,4,6,8,10,12,14,16,18,20,24,28,32,40,48,56,64",
                   help="session counts to ramp through (comma separated)")  # fmt: skip
    p.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds per step (default 3)")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per step (default 10)")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--height", type=int, default=256)
    p.add_argument("--fps", type=int, default=12)
    p.add_argument("--format", default="m4s", choices=["m4s", "jpeg"])
    p.add_argument("--threads", choices=["default", "1", "both"], default="both",
                   help="the server's torch threads: default, OMP_NUM_THREADS=1, or both runs (default)")  # fmt: skip
    p.add_argument("--retries", type=int, default=1, help="retry a failing step this many times (default 1)")
    p.add_argument("--max-minutes", type=float, default=12.0, help="no step starts after this (default 12)")
    p.add_argument("--json", type=Path, help="also write the figures here, as JSON")
    args = p.parse_args(argv)
    args.steps = [int(s) for s in args.steps.split(",") if s.strip()]
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    deadline = time.monotonic() + args.max_minutes * 60
    modes = {"default": [False], "1": [True], "both": [False, True]}[args.threads]
    print(f"video sessions: {args.width}x{args.height} @ {args.fps} fps, {args.format}, "
          f"warmup {args.warmup:.0f}s + {args.duration:.0f}s per step")  # fmt: skip
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="video-bench-") as tmp:
        for one_thread in modes:
            best, steps = ramp(one_thread, args, deadline, Path(tmp))
            figures["omp1" if one_thread else "default"] = {"max_sessions": best, "steps": [asdict(s) for s in steps]}
    if len(modes) == 2:
        a, b = figures["default"]["max_sessions"], figures["omp1"]["max_sessions"]
        print(f"\nmax real-time sessions: {a} (torch default threads), {b} (OMP_NUM_THREADS=1)")
    if args.json:
        args.json.write_bytes(orjson.dumps(figures, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
