"""Phone calls through a carrier's media stream: calls per core, and the latency the bridge adds.

The gateway is a process of its own (``python -m gateway serve``, the passthrough engine: a
tone of ``--answer-s`` per turn, so that what is measured is the bridge, not a model), its
CPU read with psutil. The carriers are simulators (``tests/support/twilio_sim.py``, written
from each carrier's documents) in this process, Twilio's by default on ``/v1/telephony/twilio``
(``--carrier`` picks another: telnyx, plivo, plivo-l16, vonage, exotel): each holds one call,
μ-law 8 kHz both ways (Vonage: binary PCM16 at 16 kHz; Exotel: PCM16 at 8 kHz; plivo-l16:
Plivo's ``audio/x-l16`` at 16 kHz), the caller's audio at real time, marks echoed as the
answer's audio plays in real time from its buffer.

1. **Calls per core.** N calls at once for ``--duration`` s; each caller's voice loops a
   spoken sentence (eSpeak NG) then quiet over ``--cycle-s``, the calls staggered; the
   gateway hears it (server VAD), answers (a tone), paces the answer out with its marks.
   Calls per core = N / the gateway's CPU (in cores) over the window. Pacing is reported as
   the most audio that ever waited in any caller's buffer (the gateway's bound is
   ``LEAD_MS`` plus one chunk in flight) and the answer audio heard; the turn latency as
   ``bench/sip_calls.py`` times it: the caller's last speech message -> the first answer
   audio with sound at the carrier (server VAD's silence window included).
2. **Latency** (``--latency-trials``, the order rotating): the same request,
   ``response.create`` (server VAD off), to the first audio of the answer at the client: over
   a plain WebSocket session in PCM 24 kHz and in μ-law 8 kHz (the first
   ``response.output_audio.delta``), and over a phone call (sent on the call's sideband; the
   first ``media`` message at the carrier). Phone minus WebSocket in the session's format
   (μ-law; PCM 24 kHz for Vonage, Exotel and plivo-l16, whose call converts to the carrier's
   rate) is what the bridge adds (the pacer, the carrier's messages); μ-law minus PCM is what the
   conversion to 8 kHz costs on any path (the resampler's filter delay).

    python bench/phone_calls.py                      # N=8 for 20 s, then 20 latency trials: ~1 min
    python bench/phone_calls.py --calls 32 --duration 30 --latency-trials 0
    python bench/phone_calls.py --carrier vonage
    python bench/phone_calls.py --cpu 0              # the gateway pinned to CPU 0 (taskset)

Only 127.0.0.1; the gateway is ended on exit, error or Ctrl-C. Figures: bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil
import websockets

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the carrier simulator (tests/support/twilio_sim.py)
sys.path.insert(0, str(ROOT))

from sip_calls import is_loud, turn_stats, turns_after  # noqa: E402  (bench/sip_calls.py: one way of timing a turn)
from support.speech import silence, speak  # noqa: E402
from support.twilio_sim import (  # noqa: E402
    ExotelCall,
    PlivoCall,
    PlivoL16Call,
    TelnyxCall,
    TwilioCall,
    VonageCall,
    alaw,
    mulaw,
    pcm16,
)

from gateway.audio.codecs import AudioFormat, Codec  # noqa: E402

# --carrier: its simulator, how it encodes the caller's voice, at what rate, whether its session is G.711
# (and the codec of the carrier's audio both ways: the answer's is decoded to find where its sound begins)
CARRIERS: dict[str, tuple[type[TwilioCall], Any, int, bool]] = {
    "twilio": (TwilioCall, mulaw, 8000, True),
    "telnyx": (TelnyxCall, alaw, 8000, True),
    "plivo": (PlivoCall, mulaw, 8000, True),
    "plivo-l16": (PlivoL16Call, pcm16, 16000, False),  # contentType="audio/x-l16;rate=16000"
    "vonage": (VonageCall, pcm16, 16000, False),
    "exotel": (ExotelCall, pcm16, 8000, False),
}
CODECS: dict[str, Codec] = {
    "twilio": "pcmu",
    "telnyx": "pcma",
    "plivo": "pcmu",
    "plivo-l16": "pcm16",
    "vonage": "pcm16",
    "exotel": "pcm16",
}

MODEL = "bench-passthrough"
NO_VAD: dict[str, Any] = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Gateway:
    """``python -m gateway serve`` on 127.0.0.1 with the passthrough engine, pinned to ``cpu`` if
    given; ended by ``stop``."""

    def __init__(self, answer_s: float, cpu: int | None = None) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="phone_calls_", suffix=".log", delete=False)
        # (log level info: a call's id is in its log line, which the latency phase reads, as a backend
        # that does not use the call webhook would)
        route = {"name": MODEL, "engine": "passthrough", "audio_chunks": int(answer_s * 50), "words_every": 20}
        env = dict(os.environ, OMNI_GATEWAY_LOG_LEVEL="info", OMNI_GATEWAY_API_KEYS="", OMNI_GATEWAY_REDIS_URL="",
                   OMNI_GATEWAY_MODELS=orjson.dumps({"models": [route]}).decode(), OMNI_GATEWAY_MODEL=MODEL,
                   OMNI_GATEWAY_MAX_SESSIONS="10000", OMNI_GATEWAY_DRAIN_WINDOW_S="1")  # fmt: skip
        cmd = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--engine", "passthrough"]  # fmt: skip
        if cpu is not None and shutil.which("taskset"):
            cmd = ["taskset", "-c", str(cpu), *cmd]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.ps = psutil.Process(self.proc.pid)

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the gateway exited with {self.proc.returncode}; see {self.log.name}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.base}/readyz", timeout=1) as r:
                    if r.status == 200:
                        return
            time.sleep(0.2)
        raise RuntimeError(f"the gateway was not ready after {timeout:.0f} s; see {self.log.name}")

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


async def mint(http: httpx.AsyncClient, gw: Gateway, session: dict[str, Any] | None = None) -> str:
    res = await http.post(gw.base + "/v1/realtime/client_secrets", json={"session": session or {"type": "realtime"}})
    res.raise_for_status()
    return str(res.json()["value"])


def stream_url(gw: Gateway, carrier: str) -> str:
    """The carrier's endpoint (``plivo-l16``: Plivo's, in another format)."""
    return f"ws://127.0.0.1:{gw.port}/v1/telephony/{carrier.partition('-')[0]}"


async def load(gw: Gateway, carrier: str, n: int, duration: float, cycle_s: float, warmup: float) -> dict[str, Any]:
    simulator, encode, rate, _ = CARRIERS[carrier]
    speech = await speak("what is your name", rate)  # (PCM16)
    quiet_ms = max(200, int(cycle_s * 1000) - len(speech) * 1000 // (2 * rate))
    spoken, quiet = encode(speech), encode(silence(quiet_ms, rate))
    calls: list[TwilioCall] = []
    async with httpx.AsyncClient(timeout=30) as http:
        for i in range(n):
            call = simulator(stream_url(gw, carrier), await mint(http, gw),
                             stream_sid=f"MZ{i:032d}", call_sid=f"CA{i:032d}")  # fmt: skip
            await call.connect()
            calls.append(call)

    speech_ends: dict[int, list[float]] = {id(c): [] for c in calls}

    async def talk(call: TwilioCall, offset: float) -> None:
        await asyncio.sleep(offset)
        while not call.closed.is_set():
            await call.speak(spoken)
            speech_ends[id(call)].append(call.last_media_at)
            await call.speak(quiet)

    talkers = [asyncio.create_task(talk(c, cycle_s * i / n)) for i, c in enumerate(calls)]
    try:
        await asyncio.sleep(warmup)
        heard0 = sum(c.heard_ms() for c in calls)
        cpu0, t0 = gw.cpu_s(), time.monotonic()
        await asyncio.sleep(duration)
        cpu1, t1 = gw.cpu_s(), time.monotonic()
        heard1 = sum(c.heard_ms() for c in calls)
    finally:
        for task in talkers:
            task.cancel()
        for call in calls:
            await call.close()
    cores = (cpu1 - cpu0) / (t1 - t0)
    fmt = AudioFormat(CODECS[carrier], rate)
    turns = []
    for c in calls:
        loud = [at for at, m in zip(c.arrivals, c.received, strict=True) if at >= t0 and _is_loud_media(c, m, fmt)]
        turns += turns_after([end for end in speech_ends[id(c)] if t0 <= end <= t1], loud)
    return {
        "calls": n,
        "connected": sum(1 for c in calls if c.close_code is None or c.close_code == 1000),
        "window_s": round(t1 - t0, 1),
        "gateway_cores": round(cores, 3),
        "calls_per_core": round(n / cores, 1) if cores > 0 else float("inf"),
        "core_share_per_call_pct": round(100 * cores / n, 2),
        "answer_audio_heard_s": round((heard1 - heard0) / 1000, 1),
        "max_buffered_ms": round(max(c.max_buffered_ms for c in calls), 1),
        "marks_echoed": sum(len(c.marks_echoed) for c in calls),
        "clears": sum(len(c.clears) for c in calls),
        "turn_latency_ms": turn_stats(turns),
    }


def _is_loud_media(call: TwilioCall, message: dict[str, Any], fmt: AudioFormat) -> bool:
    kind, audio = call.classify(message)
    return kind == "audio" and is_loud(fmt, audio)


MULAW_OUT = {**NO_VAD, "audio": {**NO_VAD["audio"], "output": {"format": {"type": "audio/pcmu"}}}}


async def first_ws_audio(gw: Gateway, session: dict[str, Any]) -> float:
    async with websockets.connect(f"ws://127.0.0.1:{gw.port}/v1/realtime", max_size=None, compression=None) as ws:
        await ws.send(orjson.dumps({"type": "session.update", "session": session}).decode())
        async for raw in ws:
            if orjson.loads(raw)["type"] == "session.updated":
                break
        sent = time.monotonic()
        await ws.send('{"type": "response.create"}')
        async for raw in ws:
            if orjson.loads(raw)["type"] == "response.output_audio.delta":
                return 1000 * (time.monotonic() - sent)
    raise RuntimeError("the session ended before its answer's audio")


async def first_phone_audio(gw: Gateway, http: httpx.AsyncClient, carrier: str) -> float:
    simulator = CARRIERS[carrier][0]
    call = simulator(stream_url(gw, carrier), await mint(http, gw, NO_VAD),
                     call_sid="CA" + os.urandom(16).hex())  # fmt: skip
    await call.connect()
    try:
        call_id = None
        for _ in range(500):  # the gateway logs the call id; a backend learns it so (or by the webhook)
            call_id = _call_id_from_log(gw, call.call_sid)
            if call_id:
                break
            await asyncio.sleep(0.01)
        if call_id is None:
            raise RuntimeError("the call's id never appeared in the gateway's log (log level info?)")
        async with websockets.connect(f"ws://127.0.0.1:{gw.port}/v1/realtime?call_id={call_id}") as sideband:
            sent = time.monotonic()
            await sideband.send('{"type": "response.create"}')
            for _ in range(30_000):  # (polled every ms, at most 30 s: the arrival time is the simulator's)
                if any(m.get("event") == call.media_event for m in call.received):
                    break
                await asyncio.sleep(0.001)
            first = next((i for i, m in enumerate(call.received) if m.get("event") == call.media_event), None)
            if first is None:
                raise RuntimeError(
                    f"no answer audio reached the phone call; it got {[m.get('event') for m in call.received][:5]}"
                )
            at = call.arrivals[first]
            return 1000 * (at - sent)
    finally:
        await call.close()


def _call_id_from_log(gw: Gateway, call_sid: str) -> str | None:
    text = Path(gw.log.name).read_text(errors="replace")
    for line in text.splitlines():
        if f"call {call_sid} " in line and " is call rtc_" in line:
            return line.split(" is call ", 1)[1].split(",", 1)[0]
    return None


async def latency(gw: Gateway, carrier: str, trials: int) -> dict[str, Any]:
    legs: dict[str, list[float]] = {"websocket_pcm_ms": [], "websocket_mulaw_ms": [], "phone_ms": []}
    async with httpx.AsyncClient(timeout=30) as http:
        for i in range(trials):
            runs = [("websocket_pcm_ms", lambda: first_ws_audio(gw, NO_VAD)),
                    ("websocket_mulaw_ms", lambda: first_ws_audio(gw, MULAW_OUT)),
                    ("phone_ms", lambda: first_phone_audio(gw, http, carrier))]  # fmt: skip
            for name, run in runs[i % 3 :] + runs[: i % 3]:  # (the order rotates)
                legs[name].append(await run())

    def stats(xs: list[float]) -> dict[str, float]:
        xs = sorted(xs)
        return {"n": len(xs), "p50": round(statistics.median(xs), 1), "max": round(xs[-1], 1)}

    out: dict[str, Any] = {name: stats(xs) for name, xs in legs.items()}
    same = "websocket_mulaw_ms" if CARRIERS[carrier][3] else "websocket_pcm_ms"  # (the session's format)
    out["added_p50_ms"] = round(out["phone_ms"]["p50"] - out[same]["p50"], 1)
    return out


async def measure(carrier: str, calls: int, *, duration: float, warmup: float, cycle_s: float, answer_s: float,
                  latency_trials: int, cpu: int | None = None) -> dict[str, Any]:  # fmt: skip
    """The load (``calls`` > 0) and the latency trials (``latency_trials`` > 0) on a gateway of their own."""
    gw = Gateway(answer_s, cpu)
    figures: dict[str, Any] = {}
    try:
        await asyncio.to_thread(gw.wait_ready)
        if calls:
            figures["load"] = await load(gw, carrier, calls, duration, cycle_s, warmup)
        if latency_trials:
            figures["latency"] = await latency(gw, carrier, latency_trials)
    finally:
        gw.stop()
    return figures


def report(figures: dict[str, Any], carrier: str) -> None:
    if ld := figures.get("load"):
        turns = ld["turn_latency_ms"]
        print(f"{ld['calls']} {carrier} calls (paced): gateway {ld['gateway_cores']:.3f} cores -> "
              f"{ld['calls_per_core']} calls per core ({ld['core_share_per_call_pct']} % of a core per call); "
              f"answer audio heard {ld['answer_audio_heard_s']} s, at most {ld['max_buffered_ms']} ms waited "
              f"in a carrier's buffer, {ld['marks_echoed']} marks echoed; turn latency (end of speech -> first "
              f"answer sound at the carrier, incl. the VAD's silence window): {turns['n']} turns, p50 "
              f"{turns['p50']} ms")  # fmt: skip
    if lat := figures.get("latency"):
        print(f"response.create -> first answer audio, p50 over {lat['phone_ms']['n']} trials: WebSocket "
              f"(PCM 24 kHz) {lat['websocket_pcm_ms']['p50']} ms, WebSocket (μ-law 8 kHz) "
              f"{lat['websocket_mulaw_ms']['p50']} ms, {carrier} call {lat['phone_ms']['p50']} ms; "
              f"the bridge adds {lat['added_p50_ms']} ms (p50) to the WebSocket path in the session's "
              "format")  # fmt: skip


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--carrier", choices=sorted(CARRIERS), default="twilio", help="whose media stream the calls use")
    p.add_argument("--calls", type=int, default=8, help="calls at once (0: no load phase)")
    p.add_argument("--duration", type=float, default=20.0, help="the measured window, s")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--cycle-s", type=float, default=5.0, help="each caller's turn cycle, s")
    p.add_argument("--answer-s", type=float, default=2.0, help="seconds of answer per turn (the passthrough tone)")
    p.add_argument("--latency-trials", type=int, default=20, help="0: no latency phase")
    p.add_argument("--cpu", type=int, help="pin the gateway to this CPU (taskset; default: not pinned)")
    p.add_argument("--json", type=Path, help="write the figures here too")
    args = p.parse_args()
    result = asyncio.run(measure(args.carrier, args.calls, duration=args.duration, warmup=args.warmup,
                                 cycle_s=args.cycle_s, answer_s=args.answer_s, latency_trials=args.latency_trials,
                                 cpu=args.cpu))  # fmt: skip
    report(result, args.carrier)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
