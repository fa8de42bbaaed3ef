"""Phone paths side by side, in one run: SIP calls, a WebSocket baseline and a carrier's media stream.

Three phases, one after the other, each on a gateway of its own (``python -m gateway serve``,
the passthrough engine: a tone of ``--answer-s`` per turn, so that what is measured is the
path, not a model), every one pinned to the same CPU (``--cpu``, taskset), with the same N
calls (``--calls``), the same callers (a spoken sentence, eSpeak NG, then quiet, every
``--cycle-s``, staggered, μ-law 8 kHz paced 20 ms), the same default session (server VAD,
its 500 ms silence window) and the same measured window (``--window-s``, after one cycle to
settle):

1. **WebSocket**: N plain sessions on ``/v1/realtime``, μ-law 8 kHz in and out
   (``audio/pcmu``), the caller's audio as ``input_audio_buffer.append`` of 20 ms at real
   time; the baseline.
2. **SIP**: ``bench/sip_calls.py``'s load: sipp places N held calls, the bench's RTP peers
   are their media.
3. **Media stream**: ``bench/phone_calls.py``'s load, N Twilio calls (simulated,
   ``tests/support/twilio_sim.py``), then its latency trials (``response.create`` -> first
   answer audio, phone call against a μ-law WebSocket session, server VAD off).

For each: the gateway's CPU over the window (psutil) -> calls per core; the turn latency,
the caller's last speech packet to the first answer audio with sound (at the RTP peer, the
WebSocket client, the carrier), which includes server VAD's silence window on every path.
What a path adds is its turn latency minus the WebSocket's (p50); the media stream's
``response.create`` figure is printed beside it.

    python bench/phone_paths.py                              # N=10, 20 s windows: ~2 min
    python bench/phone_paths.py --calls 20 --window-s 30 --json figures.json

Only 127.0.0.1; each gateway (and sipp) is ended on exit, error or Ctrl-C. Figures: bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (the two benches this one runs)

import phone_calls
import sip_calls
from sip_calls import Caller, turn_stats

MULAW_VAD = {"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcmu"}},
                                           "output": {"format": {"type": "audio/pcmu"}}}}  # fmt: skip


@dataclass
class WsCaller(Caller):
    """One caller on a plain WebSocket session: its 20 ms of μ-law as ``input_audio_buffer.append``."""

    ws: Any = None
    errors: list[str] = field(default_factory=list)
    _reader: asyncio.Task[None] | None = None

    async def open(self, url: str) -> None:
        self.ws = await websockets.connect(url, max_size=None, compression=None, open_timeout=30)
        await self.ws.send(orjson.dumps({"type": "session.update", "session": MULAW_VAD}).decode())
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for raw in self.ws:
                event = orjson.loads(raw)
                kind = event["type"]
                if kind == "response.output_audio.delta":
                    self.heard(base64.b64decode(event["delta"]), time.monotonic())
                elif kind == "session.updated":
                    self.up.set()
                elif kind == "error":
                    self.errors.append(str(event["error"].get("code")))

    async def send(self, payload: bytes) -> bool:
        append = {"type": "input_audio_buffer.append", "audio": base64.b64encode(payload).decode()}
        try:
            await self.ws.send(orjson.dumps(append).decode())
        except websockets.ConnectionClosed:
            return False
        return True

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self.ws is not None:
            await self.ws.close()


async def websocket_load(calls: int, *, window_s: float, cycle_s: float, answer_s: float, cpu: int) -> dict[str, Any]:
    """N WebSocket sessions talking as the SIP callers do, on a gateway like sip_calls' (SIP on, idle)."""
    from support.speech import speak

    speech = await speak("what is your name", rate=8000)
    gateway = sip_calls.Gateway(cpu, answer_s, calls)
    callers = [WsCaller() for _ in range(calls)]
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        await asyncio.to_thread(gateway.wait_ready)
        for c in callers:
            await c.open(f"ws://127.0.0.1:{gateway.port}/v1/realtime")
        await asyncio.wait_for(asyncio.gather(*(c.up.wait() for c in callers)), 60)
        tasks = [asyncio.create_task(c.run(speech, cycle_s, i * cycle_s / calls, stop)) for i, c in enumerate(callers)]
        await asyncio.sleep(cycle_s)  # one cycle to settle, then the window
        cores, own, elapsed = await sip_calls.measured_window(gateway, callers, window_s)
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        for c in callers:
            await c.close()
        gateway.stop()
    return {
        "calls": calls, "window_s": round(elapsed, 1), "gateway_cores": round(cores, 3),
        "calls_per_core": round(calls / max(cores, 1e-6), 1), "callers_cores": round(own, 2),
        "turns_spoken": sum(len(c.speech_ends) for c in callers),
        "turn_latency_ms": turn_stats([t for c in callers for t in c.turn_latencies()]),
        "errors": sorted({e for c in callers for e in c.errors}),
    }  # fmt: skip


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 1)


def _ms(x: float | None, signed: bool = False) -> str:
    return "n/a" if x is None else (f"{x:+.0f} ms" if signed else f"{x:.0f}")


def table(f: dict[str, Any], carrier: str) -> str:
    ws, sip, stream = f["websocket"], f["sip"], f["media_stream"]["load"]
    lat = f["media_stream"].get("latency")
    base = ws["turn_latency_ms"]["p50"]
    stream_added = f"{_ms(_minus(stream['turn_latency_ms']['p50'], base), True)} (turns)"
    if lat:
        stream_added += f"; {lat['added_p50_ms']:+.1f} ms (`response.create`, {lat['phone_ms']['n']} trials)"
    rows = [
        ("WebSocket, μ-law 8 kHz (baseline)", ws, "0 (the baseline)"),
        ("SIP (sipp, RTP μ-law 8 kHz)", sip, f"{_ms(_minus(sip['turn_latency_ms']['p50'], base), True)} (turns)"),
        (f"media stream ({carrier}, μ-law 8 kHz)", stream, stream_added),
    ]
    lines = ["| path | calls | gateway cores | calls per core | turn latency p50 / p95 (ms) | latency added (p50) |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]  # fmt: skip
    for name, x, added in rows:
        t = x["turn_latency_ms"]
        lines.append(f"| {name} | {x['calls']} | {x['gateway_cores']:.3f} | {x['calls_per_core']:.0f} | "
                     f"{_ms(t['p50'])} / {_ms(t['p95'])} ({t['n']} turns) | {added} |")  # fmt: skip
    return "\n".join(lines)


async def run(a: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    print(f"1/3 WebSocket: {a.calls} sessions, window {a.window_s:g} s", flush=True)
    figures["websocket"] = ws = await websocket_load(a.calls, window_s=a.window_s, cycle_s=a.cycle_s,
                                                     answer_s=a.answer_s, cpu=a.cpu)  # fmt: skip
    print(f"callers' process: {ws['callers_cores']:.2f} cores; the gateway used {ws['gateway_cores']:.2f} cores -> "
          f"{ws['calls_per_core']:.0f} calls per core; turn latency p50 {ws['turn_latency_ms']['p50']} ms "
          f"({ws['turn_latency_ms']['n']} of {ws['turns_spoken']} turns answered){'; errors ' if ws['errors'] else ''}"
          f"{', '.join(ws['errors'])}")  # fmt: skip
    print(f"2/3 SIP: {a.calls} calls (sipp at {a.rate}/s), window {a.window_s:g} s", flush=True)
    hold_s = a.calls / a.rate + 2 * a.cycle_s + a.window_s  # (sip_calls.window_s of it is --window-s)
    figures["sip"] = await sip_calls.measure(a.calls, rate=a.rate, hold_s=hold_s, cycle_s=a.cycle_s,
                                             answer_s=a.answer_s, late_ms=a.late_ms, cpu=a.cpu)  # fmt: skip
    sip_calls.report(figures["sip"])
    print(f"3/3 media stream: {a.calls} {a.carrier} calls, window {a.window_s:g} s, then {a.latency_trials} "
          "latency trials", flush=True)  # fmt: skip
    figures["media_stream"] = await phone_calls.measure(
        a.carrier, a.calls, duration=a.window_s, warmup=a.cycle_s, cycle_s=a.cycle_s, answer_s=a.answer_s,
        latency_trials=a.latency_trials, cpu=a.cpu)  # fmt: skip
    phone_calls.report(figures["media_stream"], a.carrier)
    return figures


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=10, help="N: calls (sessions) at once on every path")
    p.add_argument("--window-s", type=float, default=20.0, help="the measured window of every path, s")
    p.add_argument("--cycle-s", type=float, default=4.0, help="a caller speaks once every this long")
    p.add_argument("--answer-s", type=float, default=1.0, help="the passthrough answer's length")
    p.add_argument("--rate", type=float, default=10.0, help="SIP calls placed per second")
    p.add_argument("--late-ms", type=float, default=40.0, help="SIP pacing: a packet later than this is late")
    p.add_argument("--latency-trials", type=int, default=20, help="the media stream's response.create trials")
    p.add_argument("--carrier", choices=["twilio", "plivo"], default="twilio", help="whose (μ-law) media stream")
    p.add_argument("--cpu", type=int, default=0, help="the CPU every gateway is pinned to")
    p.add_argument("--json", type=Path, help="write the figures here too")
    a = p.parse_args()
    if a.window_s < a.cycle_s:
        p.error("--window-s must be at least --cycle-s (a turn per caller in the window)")
    figures = asyncio.run(run(a))
    print()
    print(f"N={a.calls}, window {a.window_s:g} s, every gateway pinned to CPU {a.cpu}; turn latency: the caller's "
          "last speech packet -> the first answer audio with sound, server VAD's 500 ms silence window included "
          "on every path; added: the path's p50 minus the WebSocket's")  # fmt: skip
    print(table(figures, a.carrier))
    if a.json:
        a.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
