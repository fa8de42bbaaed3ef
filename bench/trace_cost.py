"""What tracing costs the hot path: per client event and per output delta, off and on.

In one process, no sockets: a ``Runtime`` with the passthrough engine (unpaced) and
the memory store hosts one session whose peer discards what it is sent. Each trial
measures the gateway's CPU time (``time.process_time``, the engine's work included):

- **per client event**: ``--appends`` JSON ``input_audio_buffer.append`` events
  (20 ms of 24 kHz PCM16, base64) handed to the connection's door as the transport
  does (decoded, counted, handled and flushed), with transcription on, so each append also streams into the open
  transcription request and comes back as a transcript delta (held until the
  buffer is committed, as manual turns require; one commit ends the trial);
- **per delta**: ``response.create`` answered with ``--deltas`` audio chunks (a
  transcript word before each), timed from the create to the request's end.

Modes, alternated trial by trial (the figure is each mode's best trial, the one
least disturbed by the rest of the machine):

- ``off``: no ``otel_traces_endpoint``: what every gateway runs by default;
- ``unsampled``: tracing on, ``otel_sample_ratio`` 0: the session is not sampled;
- ``on``: every session traced, spans handed to the SDK's ``BatchSpanProcessor``
  with an exporter that discards them (the export itself runs on the SDK's thread).

The off path is one ``trace is not None`` test per flush of a session, i.e. per
client event and per engine output; its own cost is timed apart (``timeit`` of
that test), and so is the socket wrapper that tracing puts on each connection's
``send`` (per message written).

    python bench/trace_cost.py                 # ~30 s
    python bench/trace_cost.py --trials 9 --appends 20000
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import statistics
import sys
import time
import timeit
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

from gateway.hosting.door import Door  # noqa: E402
from gateway.protocol.dialects import GA  # noqa: E402
from gateway.runtime import Runtime  # noqa: E402
from gateway.settings import Settings  # noqa: E402
from gateway.telemetry import Telemetry  # noqa: E402
from orchestrator.engines.passthrough import PassthroughEngine  # noqa: E402

CHUNK = b"\x01\x00" * 480  # 20 ms of 24 kHz PCM16
APPEND = orjson.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(CHUNK).decode()}).decode()
MANUAL_WITH_TRANSCRIPTS = {"turn_detection": None, "transcription": {"model": "whisper-1"}}
UPDATE = orjson.dumps(
    {"type": "session.update", "session": {"type": "realtime", "audio": {"input": MANUAL_WITH_TRANSCRIPTS}}}
).decode()


class NullPeer:
    """A connection that takes every message and sends nothing."""

    def send(self, data: bytes, event: dict[str, Any] | None = None) -> None: ...
    def close(self, code: int, reason: str) -> None: ...


def telemetry_for(mode: str) -> Telemetry | None:
    if mode == "off":
        return None
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Discard(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    ratio = 0.0 if mode == "unsampled" else 1.0
    return Telemetry.with_processor(BatchSpanProcessor(Discard()), "bench", "bench", sample_ratio=ratio)


async def trial(mode: str, appends: int, deltas: int) -> tuple[float, float]:
    """(µs of CPU per client event, µs per output delta) for one fresh runtime."""
    engine = PassthroughEngine(audio_chunks=deltas, paced=False)
    settings = Settings(engine="passthrough", video_engine="none")
    rt = Runtime(settings, engine, vad_factory=None, video_engine=None, telemetry=telemetry_for(mode))
    await rt.start()
    try:
        door = Door(rt.hosting, rt, NullPeer(), dialect=GA, principal="bench", model=settings.model,
                    max_message_bytes=settings.max_message_bytes)  # fmt: skip
        assert await door.open()
        host = door.host
        assert host is not None and (host.trace is not None) == (mode == "on")
        door.receive(UPDATE)
        await asyncio.sleep(0)
        t0 = time.process_time()
        for i in range(appends):
            door.receive(APPEND)  # as the transport hands each message to the door
            if i % 64 == 63:
                await asyncio.sleep(0)  # the engine answers (a transcript delta per append)
        door.receive('{"type":"input_audio_buffer.commit"}')  # the request's end
        await rt.orchestrator.wait_idle()
        per_event = (time.process_time() - t0) / appends * 1e6
        t0 = time.process_time()
        door.receive('{"type":"response.create"}')
        await rt.orchestrator.wait_idle()
        per_delta = (time.process_time() - t0) / deltas * 1e6
        await host.end(reason="bench", delete=True)
        return per_event, per_delta
    finally:
        await rt.close()


def off_path_ns() -> float:
    """The off path's own work: the ``trace is not None`` test a flush makes."""

    class Host:
        __slots__ = ("trace",)
        trace: object

    h = Host()
    h.trace = None
    n = 5_000_000
    test = min(timeit.repeat("if h.trace is not None: pass", globals={"h": h}, number=n, repeat=7)) / n
    empty = min(timeit.repeat("pass", globals={"h": h}, number=n, repeat=7)) / n
    return (test - empty) * 1e9


async def wrapper_ns() -> float:
    """What the socket wrapper tracing puts on ``send`` adds per message (no turn waiting)."""

    async def send(message: dict[str, Any]) -> None:
        return None

    traced = telemetry_for("on").socket_sends(send, lambda: None)  # type: ignore[union-attr]
    message = {"type": "websocket.send", "text": "{}"}
    n = 200_000
    best = {}
    for name, fn in (("plain", send), ("traced", traced)):
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                await fn(message)
            times.append((time.perf_counter() - t0) / n)
        best[name] = min(times)
    return (best["traced"] - best["plain"]) * 1e9


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5, help="trials per mode (alternated)")
    parser.add_argument("--appends", type=int, default=10_000)
    parser.add_argument("--deltas", type=int, default=10_000)
    args = parser.parse_args()
    modes = ("off", "unsampled", "on")
    results: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    for i in range(args.trials):
        for mode in modes[i % 3 :] + modes[: i % 3]:  # rotate the order
            results[mode].append(await trial(mode, args.appends, args.deltas))
    print(f"{args.trials} trials per mode, {args.appends} appends, {args.deltas} deltas; best (median) µs of CPU")
    print(f"{'mode':<10} {'per client event':>22} {'per delta':>22}")
    base = min(r[0] for r in results["off"]), min(r[1] for r in results["off"])
    for mode in modes:
        ev = [r[0] for r in results[mode]]
        de = [r[1] for r in results[mode]]
        dev = f"{min(ev):6.2f} ({statistics.median(ev):6.2f}) {min(ev) - base[0]:+5.2f}"
        ded = f"{min(de):6.2f} ({statistics.median(de):6.2f}) {min(de) - base[1]:+5.2f}"
        print(f"{mode:<10} {dev:>22} {ded:>22}")
    print(f"off path, the test itself: {off_path_ns():.1f} ns per flush")
    print(f"tracing's socket wrapper: {await wrapper_ns():.0f} ns per message written")


if __name__ == "__main__":
    asyncio.run(main())
