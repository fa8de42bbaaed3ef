"""SIP calls on ``omni-gateway serve``: concurrent calls per core, pacing, and a turn's latency.

The gateway is a process of its own (``python -m gateway serve`` with ``sip_port``, pinned to
one CPU, its CPU read with psutil). sipp (Debian's ``sip-tester``) places ``--calls`` calls
at ``--rate`` a second (``bench/sip/held_call.xml``: INVITE, ACK, held ``--hold-s``, BYE), and
this process is their media: one RTP peer per call (the offer names its port, from sipp's
injection file), on 127.0.0.1. Each caller's audio is μ-law at 8 kHz, paced 20 ms a packet: a
spoken sentence (eSpeak NG, ~1.5 s) then quiet, every ``--cycle-s``, the calls staggered. The
gateway hears it (server VAD, the default session) and answers on the ``passthrough`` engine
(a tone of ``--answer-s``: no model, so what is measured is the SIP and media path; the
cascade's speech-to-text would dominate) as paced μ-law RTP.

Reported, over the window in which every call is up:

- **calls per core**: calls / the gateway's CPU (in cores) over the window;
- **pacing**: each received packet's delay against its RTP timestamp's schedule (anchored at
  the call's least-delayed packet); the share more than ``--late-ms`` late, and the p99;
- **turn latency**: the caller's last packet of speech -> the first packet of the answer that
  carries sound. This includes server VAD's silence window (``silence_duration_ms``, 500 ms
  by default), which any transport waits the same: the SIP path's own share is what is left.

    python bench/sip_calls.py                               # 20 calls held 30 s: ~45 s
    python bench/sip_calls.py --calls 60 --hold-s 40 --rate 10

The gateway and sipp are ended on exit, error or Ctrl-C. Only 127.0.0.1 is used.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from gateway.audio.codecs import AudioFormat, decode_to_pcm16, encode_from_pcm16  # noqa: E402
from gateway.transport.sip.rtp import build_rtp, parse_rtp  # noqa: E402

SCENARIO = ROOT / "bench" / "sip" / "held_call.xml"
ULAW = AudioFormat("pcmu", 8000)
FRAME = 160
MODEL = "bench-passthrough"


def _free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Gateway:
    """``python -m gateway serve`` with SIP on, pinned to ``cpu``; ended by ``stop``."""

    def __init__(self, cpu: int, answer_s: float, calls: int) -> None:
        self.port, self.sip_port = _free_port(), _free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="sip_calls_", suffix=".log", delete=False)
        route = {"name": MODEL, "engine": "passthrough", "audio_chunks": int(answer_s * 50), "words_every": 20}
        env = dict(os.environ, OMNI_GATEWAY_LOG_LEVEL="warning", OMNI_GATEWAY_API_KEYS="", OMNI_GATEWAY_REDIS_URL="",
                   OMNI_GATEWAY_MODELS=orjson.dumps({"models": [route]}).decode(), OMNI_GATEWAY_MODEL=MODEL,
                   OMNI_GATEWAY_SIP_PORT=str(self.sip_port), OMNI_GATEWAY_SIP_MAX_CALLS=str(calls + 10),
                   OMNI_GATEWAY_SIP_INVITES_PER_SOURCE_PER_MIN="0", OMNI_GATEWAY_SIP_INVITES_PER_MIN="0",
                   OMNI_GATEWAY_WEBRTC="false", OMNI_GATEWAY_VIDEO_ENGINE="none", OMNI_GATEWAY_WORKERS="1",
                   OMNI_GATEWAY_DRAIN_WINDOW_S="1")  # fmt: skip
        cmd = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--engine", "passthrough"]  # fmt: skip
        if shutil.which("taskset"):
            cmd = ["taskset", "-c", str(cpu), *cmd]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.ps = psutil.Process(self.proc.pid)

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the gateway exited with {self.proc.returncode}; see {self.log.name}")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz") as r:
                if r.status == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"the gateway was not ready in {timeout:.0f} s; see {self.log.name}")

    def cpu_s(self) -> float:
        t = self.ps.cpu_times()
        return float(t.user + t.system)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


class _Proto(asyncio.DatagramProtocol):
    def __init__(self, peer: Peer) -> None:
        self.peer = peer

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:  # type: ignore[override]
        self.peer.received(data, addr, time.monotonic())


@dataclass
class Peer:
    """One call's media: sends the caller's audio, times what comes back."""

    transport: asyncio.DatagramTransport | None = None
    port: int = 0
    remote: tuple[str, int] | None = None
    up: asyncio.Event = field(default_factory=asyncio.Event)
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (arrival, RTP timestamp)
    loud_at: list[float] = field(default_factory=list)  # arrivals of packets with sound
    speech_ends: list[float] = field(default_factory=list)  # when the caller's last speech packet left
    measuring: bool = False
    _seq: int = 0
    _ts: int = 0

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        self.transport, _ = await loop.create_datagram_endpoint(lambda: _Proto(self), local_addr=("127.0.0.1", 0))
        self.port = self.transport.get_extra_info("sockname")[1]

    def received(self, data: bytes, addr: tuple[str, int], now: float) -> None:
        packet = parse_rtp(data)
        if packet is None:
            return
        if self.remote is None:
            self.remote = addr
            self.up.set()
        if not self.measuring:
            return
        self.arrivals.append((now, packet.timestamp))
        pcm = np.frombuffer(decode_to_pcm16(ULAW, packet.payload), dtype="<i2")
        if pcm.size and float(np.abs(pcm).max()) > 1000:
            self.loud_at.append(now)

    async def run(self, speech: bytes, cycle_s: float, offset_s: float, stop: asyncio.Event) -> None:
        """The caller's microphone: speech, then quiet, every ``cycle_s``, paced on the clock."""
        await self.up.wait()
        loop = asyncio.get_running_loop()
        frames = [encode_from_pcm16(ULAW, speech[i : i + 2 * FRAME].ljust(2 * FRAME, b"\0"))
                  for i in range(0, len(speech), 2 * FRAME)]  # fmt: skip
        quiet = encode_from_pcm16(ULAW, bytes(2 * FRAME))
        per_cycle = int(cycle_s * 50)
        start = loop.time() + offset_s
        n = 0
        while not stop.is_set():
            k = n % per_cycle
            payload = frames[k] if k < len(frames) else quiet
            due = start + n * 0.02
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if self.transport is not None and self.remote is not None and not self.transport.is_closing():
                self._seq = (self._seq + 1) & 0xFFFF
                self.transport.sendto(build_rtp(0, self._seq, self._ts, 1234, payload), self.remote)
                if k == len(frames) - 1 and self.measuring:
                    self.speech_ends.append(time.monotonic())
            self._ts += FRAME
            n += 1

    def pacing(self) -> list[float]:
        """Each packet's delay (s) against its timestamp's schedule, anchored at the least delayed."""
        if len(self.arrivals) < 2:
            return []
        base_ts = self.arrivals[0][1]
        offsets = [t - ((ts - base_ts) % (1 << 32)) / 8000 for t, ts in self.arrivals]
        anchor = min(offsets)
        return [o - anchor for o in offsets]

    def turn_latencies(self) -> list[float]:
        out = []
        for end in self.speech_ends:
            first = next((t for t in self.loud_at if t > end), None)
            if first is not None and first - end < 10:
                out.append(first - end)
        return out


def _start_sipp(sip_port: int, rtp_ports: list[int], args: argparse.Namespace) -> subprocess.Popen[bytes]:
    """sipp placing ``args.calls`` held calls, each offering its own RTP peer's port."""
    inf = Path(tempfile.mkstemp(prefix="sip_calls_", suffix=".csv")[1])
    inf.write_text("SEQUENTIAL\n" + "".join(f"{port}\n" for port in rtp_ports))
    cmd = ["sipp", f"127.0.0.1:{sip_port}", "-sf", str(SCENARIO), "-inf", str(inf), "-i", "127.0.0.1",
           "-p", str(_free_port(socket.SOCK_DGRAM)), "-m", str(args.calls), "-l", str(args.calls),
           "-r", str(args.rate), "-d", str(int(args.hold_s * 1000)), "-nostdin",
           "-timeout", f"{int(args.hold_s + 120)}s"]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


async def bench(args: argparse.Namespace) -> None:
    from support.speech import speak  # eSpeak NG, as the tests speak

    if shutil.which("sipp") is None:
        raise SystemExit("sipp is not installed (apt install sip-tester)")
    speech = await speak("what is your name", rate=8000)
    gateway = Gateway(args.cpu, args.answer_s, args.calls)
    peers = [Peer() for _ in range(args.calls)]
    sipp: subprocess.Popen[bytes] | None = None
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        await asyncio.to_thread(gateway.wait_ready)
        for peer in peers:
            await peer.open()
        sipp = await asyncio.to_thread(_start_sipp, gateway.sip_port, [p.port for p in peers], args)
        tasks = [asyncio.create_task(p.run(speech, args.cycle_s, i * args.cycle_s / args.calls, stop))
                 for i, p in enumerate(peers)]  # fmt: skip
        set_up = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*(p.up.wait() for p in peers)), args.calls / args.rate + 60)
        print(f"{args.calls} calls up in {time.monotonic() - set_up:.1f} s (sipp at {args.rate}/s)")
        await asyncio.sleep(args.cycle_s)  # one cycle to settle, then the window
        window = max(args.cycle_s, args.hold_s - args.calls / args.rate - 2 * args.cycle_s)
        for p in peers:
            p.measuring = True
        me = psutil.Process()
        cpu0, own0, t0 = gateway.cpu_s(), sum(me.cpu_times()[:2]), time.monotonic()
        await asyncio.sleep(window)
        elapsed = time.monotonic() - t0
        cores = (gateway.cpu_s() - cpu0) / elapsed
        own = (sum(me.cpu_times()[:2]) - own0) / elapsed
        for p in peers:
            p.measuring = False
        delays = [d for p in peers for d in p.pacing()]
        turns = [t for p in peers for t in p.turn_latencies()]
        late = sum(1 for d in delays if d > args.late_ms / 1000) / max(1, len(delays))
        got = sorted(len(p.arrivals) / (50 * elapsed) for p in peers)
        print(f"callers' process: {own:.2f} cores; packets received per call, of those sent: min "
              f"{100 * got[0]:.0f} %, median {100 * statistics.median(got):.0f} % (below ~95 %: the callers' "
              "process or the machine is short of CPU, and the figures below are not the gateway's)")  # fmt: skip
        per_core = args.calls / max(cores, 1e-6)
        print(f"window {window:.0f} s: the gateway used {cores:.2f} cores for {args.calls} calls "
              f"-> {per_core:.0f} calls per core (μ-law 8 kHz, paced 20 ms, both ways)")  # fmt: skip
        print(f"pacing: {len(delays)} packets, {100 * late:.2f} % later than {args.late_ms} ms, "
              f"p50 {1000 * _pct(delays, 50):.1f} ms, p99 {1000 * _pct(delays, 99):.1f} ms")  # fmt: skip
        if turns:
            print(f"turn latency (end of speech -> first answer sound, incl. the VAD's silence window): "
                  f"{len(turns)} turns, median {1000 * statistics.median(turns):.0f} ms, "
                  f"p95 {1000 * _pct(turns, 95):.0f} ms")  # fmt: skip
        else:
            print("turn latency: no answered turn in the window")
        rc = await asyncio.to_thread(sipp.wait, args.hold_s + 150)
        print(f"sipp ended with {rc} (0: every call completed)")
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        if sipp is not None and sipp.poll() is None:
            sipp.kill()
        for p in peers:
            if p.transport is not None:
                p.transport.close()
        gateway.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--rate", type=float, default=10.0, help="calls placed per second")
    parser.add_argument("--hold-s", type=float, default=30.0, help="how long each call lasts")
    parser.add_argument("--cycle-s", type=float, default=4.0, help="a caller speaks once every this long")
    parser.add_argument("--answer-s", type=float, default=1.0, help="the passthrough answer's length")
    parser.add_argument("--late-ms", type=float, default=40.0)
    parser.add_argument("--cpu", type=int, default=0, help="the CPU the gateway is pinned to")
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
