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

``measure`` returns these figures (``report`` prints them): ``bench/phone_paths.py`` runs it in
one run beside a WebSocket baseline and a carrier's media stream, for the latency SIP adds.
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.peer.received(data, addr, time.monotonic())


def is_loud(fmt: AudioFormat, audio: bytes) -> bool:
    """Whether ``audio`` carries sound (the passthrough answer's tone; never the quiet between)."""
    pcm = np.frombuffer(decode_to_pcm16(fmt, audio), dtype="<i2")
    return bool(pcm.size) and float(np.abs(pcm).max()) > 1000


def turns_after(speech_ends: list[float], loud_at: list[float]) -> list[float]:
    """Each end of speech -> the first sound after it (s); none where no answer came within 10 s."""
    out = []
    for end in speech_ends:
        first = next((t for t in loud_at if t > end), None)
        if first is not None and first - end < 10:
            out.append(first - end)
    return out


def turn_stats(turns: list[float]) -> dict[str, Any]:
    """n, p50 and p95 in ms (None without a turn)."""
    if not turns:
        return {"n": 0, "p50": None, "p95": None}
    return {"n": len(turns), "p50": round(1000 * statistics.median(turns), 1), "p95": round(1000 * _pct(turns, 95), 1)}


@dataclass
class Caller:
    """One caller's microphone (μ-law 8 kHz, paced on the clock) and ear; ``send`` is its wire."""

    up: asyncio.Event = field(default_factory=asyncio.Event)
    loud_at: list[float] = field(default_factory=list)  # arrivals of answer audio with sound
    speech_ends: list[float] = field(default_factory=list)  # when the caller's last speech packet left
    measuring: bool = False

    async def send(self, payload: bytes) -> bool:
        """20 ms of the caller's μ-law on the wire; whether it went."""
        raise NotImplementedError

    def heard(self, audio: bytes, now: float) -> None:
        if self.measuring and is_loud(ULAW, audio):
            self.loud_at.append(now)

    async def run(self, speech: bytes, cycle_s: float, offset_s: float, stop: asyncio.Event) -> None:
        """Speech, then quiet, every ``cycle_s``, paced on the clock from ``offset_s``."""
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
            due = start + n * 0.02
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if await self.send(frames[k] if k < len(frames) else quiet) and k == len(frames) - 1 and self.measuring:
                self.speech_ends.append(time.monotonic())
            n += 1

    def turn_latencies(self) -> list[float]:
        return turns_after(self.speech_ends, self.loud_at)


@dataclass
class Peer(Caller):
    """One SIP call's media: RTP to and from the gateway; times what comes back."""

    transport: asyncio.DatagramTransport | None = None
    port: int = 0
    remote: tuple[str, int] | None = None
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (arrival, RTP timestamp)
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
        if self.measuring:
            self.arrivals.append((now, packet.timestamp))
        self.heard(packet.payload, now)

    async def send(self, payload: bytes) -> bool:
        sent = False
        if self.transport is not None and self.remote is not None and not self.transport.is_closing():
            self._seq = (self._seq + 1) & 0xFFFF
            self.transport.sendto(build_rtp(0, self._seq, self._ts, 1234, payload), self.remote)
            sent = True
        self._ts += FRAME  # (the clock runs on, sent or not)
        return sent

    def pacing(self) -> list[float]:
        """Each packet's delay (s) against its timestamp's schedule, anchored at the least delayed."""
        if len(self.arrivals) < 2:
            return []
        base_ts = self.arrivals[0][1]
        offsets = [t - ((ts - base_ts) % (1 << 32)) / 8000 for t, ts in self.arrivals]
        anchor = min(offsets)
        return [o - anchor for o in offsets]


def _start_sipp(sip_port: int, rtp_ports: list[int], rate: float, hold_s: float) -> subprocess.Popen[bytes]:
    """sipp placing a held call per RTP peer, each offering its own peer's port."""
    inf = Path(tempfile.mkstemp(prefix="sip_calls_", suffix=".csv")[1])
    inf.write_text("SEQUENTIAL\n" + "".join(f"{port}\n" for port in rtp_ports))
    calls = len(rtp_ports)
    cmd = ["sipp", f"127.0.0.1:{sip_port}", "-sf", str(SCENARIO), "-inf", str(inf), "-i", "127.0.0.1",
           "-p", str(_free_port(socket.SOCK_DGRAM)), "-m", str(calls), "-l", str(calls),
           "-r", str(rate), "-d", str(int(hold_s * 1000)), "-nostdin",
           "-timeout", f"{int(hold_s + 120)}s"]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def measured_window(gateway: Any, callers: Sequence[Any], window_s: float) -> tuple[float, float, float]:
    """Run the callers' measuring for ``window_s``: (the gateway's cores, this process's cores,
    the seconds it really lasted). ``gateway``: anything with ``cpu_s()``; each caller has
    ``measuring``."""
    for c in callers:
        c.measuring = True
    me = psutil.Process()
    cpu0, own0, t0 = gateway.cpu_s(), sum(me.cpu_times()[:2]), time.monotonic()
    await asyncio.sleep(window_s)
    elapsed = time.monotonic() - t0
    cores = (gateway.cpu_s() - cpu0) / elapsed
    own = (sum(me.cpu_times()[:2]) - own0) / elapsed
    for c in callers:
        c.measuring = False
    return cores, own, elapsed


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def window_s(calls: int, rate: float, hold_s: float, cycle_s: float) -> float:
    """The measured window: every call up (``calls / rate``), one cycle to settle, one to spare."""
    return max(cycle_s, hold_s - calls / rate - 2 * cycle_s)


async def measure(calls: int, *, rate: float, hold_s: float, cycle_s: float, answer_s: float, late_ms: float,
                  cpu: int) -> dict[str, Any]:  # fmt: skip
    """Place ``calls`` held calls at a gateway pinned to ``cpu``; their figures (``report`` prints them)."""
    from support.speech import speak  # eSpeak NG, as the tests speak

    if shutil.which("sipp") is None:
        raise SystemExit("sipp is not installed (apt install sip-tester)")
    speech = await speak("what is your name", rate=8000)
    gateway = Gateway(cpu, answer_s, calls)
    peers = [Peer() for _ in range(calls)]
    sipp: subprocess.Popen[bytes] | None = None
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        await asyncio.to_thread(gateway.wait_ready)
        for peer in peers:
            await peer.open()
        sipp = await asyncio.to_thread(_start_sipp, gateway.sip_port, [p.port for p in peers], rate, hold_s)
        tasks = [asyncio.create_task(p.run(speech, cycle_s, i * cycle_s / calls, stop)) for i, p in enumerate(peers)]
        set_up = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*(p.up.wait() for p in peers)), calls / rate + 60)
        set_up_s = time.monotonic() - set_up
        await asyncio.sleep(cycle_s)  # one cycle to settle, then the window
        window = window_s(calls, rate, hold_s, cycle_s)
        cores, own, elapsed = await measured_window(gateway, peers, window)
        delays = [d for p in peers for d in p.pacing()]
        late = sum(1 for d in delays if d > late_ms / 1000) / max(1, len(delays))
        got = sorted(len(p.arrivals) / (50 * elapsed) for p in peers)
        rc = await asyncio.to_thread(sipp.wait, hold_s + 150)
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
    return {
        "calls": calls, "rate": rate, "set_up_s": round(set_up_s, 1), "window_s": round(elapsed, 1),
        "gateway_cores": round(cores, 3), "calls_per_core": round(calls / max(cores, 1e-6), 1),
        "callers_cores": round(own, 2),
        "received_min_pct": round(100 * got[0], 1), "received_median_pct": round(100 * statistics.median(got), 1),
        "pacing": {"packets": len(delays), "late_ms": late_ms, "late_pct": round(100 * late, 2),
                   "p50_ms": round(1000 * _pct(delays, 50), 1), "p99_ms": round(1000 * _pct(delays, 99), 1)},
        "turn_latency_ms": turn_stats([t for p in peers for t in p.turn_latencies()]),
        "sipp_rc": rc,
    }  # fmt: skip


def report(f: dict[str, Any]) -> None:
    pacing, turns = f["pacing"], f["turn_latency_ms"]
    print(f"{f['calls']} calls up in {f['set_up_s']:.1f} s (sipp at {f['rate']}/s)")
    print(f"callers' process: {f['callers_cores']:.2f} cores; packets received per call, of those sent: min "
          f"{f['received_min_pct']:.0f} %, median {f['received_median_pct']:.0f} % (below ~95 %: the callers' "
          "process or the machine is short of CPU, and the figures below are not the gateway's)")  # fmt: skip
    print(f"window {f['window_s']:.0f} s: the gateway used {f['gateway_cores']:.2f} cores for {f['calls']} calls "
          f"-> {f['calls_per_core']:.0f} calls per core (μ-law 8 kHz, paced 20 ms, both ways)")  # fmt: skip
    print(f"pacing: {pacing['packets']} packets, {pacing['late_pct']:.2f} % later than {pacing['late_ms']:g} ms, "
          f"p50 {pacing['p50_ms']:.1f} ms, p99 {pacing['p99_ms']:.1f} ms")  # fmt: skip
    if turns["n"]:
        print(f"turn latency (end of speech -> first answer sound, incl. the VAD's silence window): "
              f"{turns['n']} turns, median {turns['p50']:.0f} ms, p95 {turns['p95']:.0f} ms")  # fmt: skip
    else:
        print("turn latency: no answered turn in the window")
    print(f"sipp ended with {f['sipp_rc']} (0: every call completed)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--rate", type=float, default=10.0, help="calls placed per second")
    parser.add_argument("--hold-s", type=float, default=30.0, help="how long each call lasts")
    parser.add_argument("--cycle-s", type=float, default=4.0, help="a caller speaks once every this long")
    parser.add_argument("--answer-s", type=float, default=1.0, help="the passthrough answer's length")
    parser.add_argument("--late-ms", type=float, default=40.0)
    parser.add_argument("--cpu", type=int, default=0, help="the CPU the gateway is pinned to")
    a = parser.parse_args()
    report(asyncio.run(measure(a.calls, rate=a.rate, hold_s=a.hold_s, cycle_s=a.cycle_s, answer_s=a.answer_s,
                               late_ms=a.late_ms, cpu=a.cpu)))  # fmt: skip


if __name__ == "__main__":
    main()
