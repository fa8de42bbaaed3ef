"""WebRTC calls on ``omni-gateway serve``: calls per core, and the latency WebRTC adds against WebSocket.

The gateway is a process of its own (``python -m gateway serve``, pinned to one CPU, its CPU
read with psutil: every thread counts, aiortc's Opus encoder threads included); the callers
are aiortc peers in another process, pinned to the other CPUs, that dial
``POST /v1/realtime/calls`` as a browser does (SDP offer in, answer out; ``oai-events`` data
channel; one Opus track each way).

1. **Calls per core** (``--engine cascade|passthrough|both``, default both). N calls at once;
   each caller's microphone loops a spoken sentence (eSpeak NG, ~2.2 s) then quiet (a low
   noise floor) over ``--cycle-s``, the calls staggered over the cycle. The gateway hears it
   (server VAD, the default session), answers, and its answer track carries the answer's
   audio (silence between answers, as always). ``cascade`` is the embedded default (silero VAD,
   pocketsphinx, the echo thinker, eSpeak NG): its speech-to-text costs more than the media,
   so ``passthrough`` (no model: a tone of ``--answer-s`` per turn) runs too and shows what the
   transport costs. Calls per core = N / the gateway's CPU (in cores) over the window, at a
   load where pacing holds: no frame of any call's answer track skipped (the gateway's track
   re-anchors after falling 40 ms behind) and at most ``--late-share`` of its frames reach the
   caller more than ``--late-ms`` behind their schedule (from their RTP timestamps, anchored
   at the call's least-delayed frame). ``--find-max`` ramps N (a fresh gateway per step) until
   pacing fails, a call fails or the gateway's core saturates.

   The callers do not cost what a browser does, so that one core of them outlasts the gateway's:
   the microphone is encoded once (mono Opus at 32 kb/s, as a browser sends) and its packets
   are replayed with fresh timestamps; the answer's RTP packets are decrypted, timed and
   measured (an Opus packet of more than 10 bytes is sound: the gateway's encoder makes 3-byte
   packets of its digital silence), but not decoded or played.

2. **Latency** (after part 1, or alone with ``--only-latency``; the passthrough engine unless
   ``--latency-engine``): WebSocket sessions and WebRTC calls on the same gateway, at the same
   time, with the same audio (a short sentence after silence, every 3 s; server VAD with
   ``create_response`` off). No engine echoes the input, so two legs:

   - **in**: the caller hands the first 20 ms carrying the onset to its transport (the
     WebSocket append, or the Opus packet to aiortc's sender) -> ``speech_started`` arrives
     (the socket, or the data channel). The VAD is the same code on the same audio either way;
     what differs is the path (Opus, the gateway's receive buffer, resampling).
   - **out**: the caller sends ``response.create`` 0-20 ms (at random) after ``speech_stopped``
     arrives -> the first audio of the answer arrives (the first ``response.output_audio.delta``;
     the first RTP packet with sound, before any jitter buffer: a browser's playout buffer comes
     on top, as a WebSocket client's does). For WebRTC the ``output_audio_buffer.started`` event (the
     gateway handing the first frame to its sender) is shown too.

    python bench/webrtc_calls.py                             # both engines at N=8, then the latency: ~3 min
    python bench/webrtc_calls.py --engine passthrough --calls 16 --duration 30 --no-latency
    python bench/webrtc_calls.py --find-max --engine passthrough --steps 8,12,16,18,20   # ~4 min
    python bench/webrtc_calls.py --only-latency --latency-s 60

Only 127.0.0.1 signals and the machine's own address carries media; the gateway and the
callers are ended on exit, error or Ctrl-C. Figures and how to read them: bench/README.md.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import base64
import contextlib
import fractions
import json
import math
import os
import queue
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, cast

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import orjson  # noqa: E402
import psutil  # noqa: E402

OPUS_RATE = 48_000
FRAME_S = 0.020
FRAME_TS = 960  # RTP timestamp units of one 20 ms Opus frame
WS_RATE = 24_000  # the GA default input format: pcm16 at 24 kHz
SOUND_BYTES = 10  # an answer packet larger than this carries sound (the gateway's silence: 3 bytes)
LOUD_RMS = 500.0  # a 20 ms frame of the sentence louder than this is speech (the noise floor: ~30)
SENTENCE = "What is the weather like in Paris today?"  # ~2.2 s; the echo thinker says it back
SHORT = "Hello there, how are you?"  # the latency phase's turn (~1.3 s)
LATENCY_CYCLE_S = 3.0
STALL_AFTER_S = 1.0  # a stall this soon after an end of turn is put down to it
QUIET_CORES = 0.15  # others' CPU in a window above this: --retries measures it again
IDLE_S = 3.0  # the gateway's idle CPU is read over this long before the calls
PASSTHROUGH_MODEL = "bench-passthrough"
SPEECH_STARTED = "input_audio_buffer.speech_started"
SPEECH_STOPPED = "input_audio_buffer.speech_stopped"
AUDIO_DELTA = "response.output_audio.delta"
STARTED = "output_audio_buffer.started"
# Server VAD that reports turns but starts no response: the caller asks (response.create), so
# the out leg starts at a moment it knows.
LATENCY_SESSION = {
    "type": "realtime",
    "audio": {"input": {"turn_detection": {"type": "server_vad", "create_response": False}}},
}


# --- the callers' audio ----------------------------------------------------------------------


def _speech(text: str, rate: int) -> bytes:
    from gateway.audio.resample import resample_once
    from orchestrator.engines.cascade.tts import EspeakSynthesizer

    async def run() -> bytes:
        synth = EspeakSynthesizer()
        pcm = b"".join([chunk async for chunk in synth.stream(text)])
        return resample_once(pcm, synth.sample_rate, rate)

    return asyncio.run(run())


def mic_cycle(text: str, cycle_s: float) -> np.ndarray:
    """One cycle of the microphone at 48 kHz: the sentence, then a low noise floor (a real mic is
    never digital zero, and Opus codes zeros as 3-byte packets: too cheap to be fair)."""
    speech = np.frombuffer(_speech(text, OPUS_RATE), dtype="<i2").astype(np.float64)
    n = int(cycle_s * OPUS_RATE) // FRAME_TS * FRAME_TS
    if len(speech) > n - OPUS_RATE // 2:
        raise ValueError(f"a cycle of {cycle_s} s is too short for the sentence ({len(speech) / OPUS_RATE:.1f} s)")
    x = np.random.default_rng(3).normal(0, 30, n)
    x[: len(speech)] += speech
    return x.clip(-32768, 32767).astype("<i2")


def opus_packets(pcm: np.ndarray) -> list[bytes]:
    """The cycle as a browser sends it: mono Opus, 32 kb/s, 20 ms packets."""
    import av

    codec = av.CodecContext.create("libopus", "w")
    codec.bit_rate = 32_000
    codec.format = "s16"
    codec.layout = "mono"
    codec.sample_rate = OPUS_RATE
    codec.time_base = fractions.Fraction(1, OPUS_RATE)
    codec.options = {"application": "voip"}
    out: list[bytes] = []
    for i in range(len(pcm) // FRAME_TS):
        frame = av.AudioFrame.from_ndarray(pcm[i * FRAME_TS : (i + 1) * FRAME_TS].reshape(1, -1), format="s16",
                                           layout="mono")  # fmt: skip
        frame.sample_rate, frame.pts = OPUS_RATE, i * FRAME_TS
        out += [bytes(p) for p in codec.encode(frame)]
    return out


def first_loud(frames: list[np.ndarray]) -> int:
    return next(i for i, x in enumerate(frames) if float(np.sqrt(np.mean(x.astype(float) ** 2))) > LOUD_RMS)


def decoded_onset(packets: list[bytes]) -> int:
    """The first packet whose decoded audio is speech: what the gateway's VAD hears first."""
    from aiortc.codecs.opus import OpusDecoder
    from aiortc.jitterbuffer import JitterFrame
    from av import AudioFrame

    decoder = OpusDecoder()
    frames = [cast(AudioFrame, f).to_ndarray()[0, ::2] for i, p in enumerate(packets)
              for f in decoder.decode(JitterFrame(p, i * FRAME_TS))]  # fmt: skip
    return first_loud(frames)  # (stereo, interleaved: the left channel)


# --- the callers' process ---------------------------------------------------------------------


class RxLog:
    """The answer track's RTP packets as they arrive (decrypted, before any jitter buffer)."""

    def __init__(self) -> None:
        self.recording = False
        self.t = array.array("d")
        self.ts = array.array("q")
        self.packets = 0  # over the whole call (the window's are len(t))
        self.sound = 0  # packets with sound, whole call
        self.sound_window = 0
        self.on_sound: Callable[[float], None] | None = None

    def packet(self, t: float, ts: int, size: int) -> None:
        self.packets += 1
        if size > SOUND_BYTES:
            self.sound += 1
            if self.on_sound is not None:
                self.on_sound(t)
        if self.recording:
            self.t.append(t)
            self.ts.append(ts)
            self.sound_window += size > SOUND_BYTES

    def pacing(self, late_ms: float) -> dict[str, Any]:
        if len(self.t) < 2:
            return {"frames": len(self.t), "late": 0, "skipped": 0, "late_p99_ms": math.nan, "late_max_ms": math.nan,
                    "stalls": []}  # fmt: skip
        ts = np.array(self.ts, dtype=np.int64)
        rel = ((ts - ts[0]) & 0xFFFFFFFF).astype(np.float64)  # RTP timestamps wrap at 2**32
        delay = np.array(self.t) - rel / OPUS_RATE
        late = 1000 * (delay - delay.min())  # behind the schedule of the call's least-delayed frame
        steps = np.diff(rel) / FRAME_TS
        gaps = np.maximum(np.rint(steps) - 1, 0)
        skipped = int(gaps.sum())  # the track re-anchored past them
        stalls = [float(x) for x in np.array(self.t)[1:][gaps > 0]]  # when the frame after each gap came
        return {"frames": len(ts), "late": int((late > late_ms).sum()) + skipped, "skipped": skipped,
                "late_p99_ms": float(np.percentile(late, 99)), "late_max_ms": float(late.max()),
                "stalls": stalls}  # fmt: skip


def install_rx_tap() -> None:
    """Replace aiortc's RTP receive (jitter buffer, decoder thread) with a log, in this process
    only: the callers need the packets' timing and size, not their sound."""
    from aiortc.rtcrtpreceiver import RTCRtpReceiver

    async def tap(self: Any, packet: Any, arrival_time_ms: int) -> None:
        log = getattr(self, "bench_rx", None)
        if log is not None:
            log.packet(time.monotonic(), packet.timestamp, len(packet.payload))

    setattr(RTCRtpReceiver, "_handle_rtp_packet", tap)  # noqa: B010 (mypy: no assignment to a method)


def mic_track(packets: list[bytes], offset: int, on_sent: Callable[[int, float], None] | None) -> Any:
    """A paced track handing out pre-encoded packets (aiortc's sender packs them, no encoding)."""
    import av
    from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

    time_base = fractions.Fraction(1, OPUS_RATE)

    class Mic(MediaStreamTrack):
        kind = "audio"

        def __init__(self) -> None:
            super().__init__()
            self.n = 0
            self.t0: float | None = None
            self.max_lag_s = 0.0  # the caller's own lateness in the window (its core too busy?)
            self.recording = False

        async def recv(self) -> av.Packet:
            if self.readyState != "live":
                raise MediaStreamError
            now = time.monotonic()
            if self.t0 is None:
                self.t0 = now
            due = self.t0 + self.n * FRAME_S
            if due > now:
                await asyncio.sleep(due - now)
                now = time.monotonic()
            if self.recording:
                self.max_lag_s = max(self.max_lag_s, now - due)
            i = (offset + self.n) % len(packets)
            packet = av.Packet(packets[i])
            packet.pts, packet.time_base = self.n * FRAME_TS, time_base
            if on_sent is not None:
                on_sent(i, now)
            self.n += 1
            return packet

    return Mic()


@dataclass
class Probe:
    """One connection's latency samples (ms); the same code for a WebSocket and a call."""

    path: str
    send: Callable[[str], None]
    onset: int = -1  # the index of the cycle's first unit (chunk or packet) carrying the onset
    armed: bool = False  # the session has the latency settings
    onsets: list[float] = field(default_factory=list)
    created_at: float | None = None  # the pending response.create's (cleared by its first audio)
    asked_at: float | None = None  # the last response.create's
    in_ms: list[float] = field(default_factory=list)
    out_ms: list[float] = field(default_factory=list)
    started_ms: list[float] = field(default_factory=list)
    recording: bool = False

    def sent(self, index: int, t: float) -> None:
        if index == self.onset:
            self.onsets.append(t)

    def event(self, kind: str, t: float) -> None:
        if not self.armed:
            return
        if kind == SPEECH_STARTED:
            before = [s for s in self.onsets if s <= t]
            if before and t - before[-1] < LATENCY_CYCLE_S / 2 and self.recording:
                self.in_ms.append(1000 * (t - before[-1]))
        elif kind == SPEECH_STOPPED:
            # After a random 0-20 ms: the caller's events keep the phase of its 20 ms microphone
            # clock, so an immediate request would meet the gateway's 20 ms frame clock at the same
            # phase every turn of a call; at a random one, the samples cover every phase.
            asyncio.get_running_loop().call_later(random.uniform(0, FRAME_S), self._create)
        elif kind == STARTED and self.asked_at is not None and self.recording:
            self.started_ms.append(1000 * (t - self.asked_at))
            self.asked_at = None
        elif kind == AUDIO_DELTA:
            self.sound(t)

    def _create(self) -> None:
        self.created_at = self.asked_at = time.monotonic()
        self.send('{"type":"response.create"}')

    def sound(self, t: float) -> None:
        if self.created_at is not None:
            if self.recording:
                self.out_ms.append(1000 * (t - self.created_at))
            self.created_at = None


class Caller:
    """One call, the browser's side."""

    def __init__(self, packets: list[bytes], offset: int, probe: Probe | None, turn_ends: list[float]) -> None:
        from aiortc import RTCConfiguration, RTCPeerConnection

        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.channel = self.pc.createDataChannel("oai-events")
        self.mic = mic_track(packets, offset, probe.sent if probe is not None else None)
        self.pc.addTrack(self.mic)
        self.rx = RxLog()
        self.probe = probe
        if probe is not None:
            self.rx.on_sound = probe.sound
        self.session = False
        self.events: Counter[str] = Counter()  # the whole call
        self.window: Counter[str] = Counter()
        self.recording = False
        self.errors: list[str] = []
        self.said: list[str] = []  # the answers' transcripts (the first few that said something)
        self.turn_ends = turn_ends  # every call's speech_stopped arrivals (a stall hits every call)
        self.channel.on("message", self._message)

    def _message(self, raw: str | bytes) -> None:
        t = time.monotonic()
        event = orjson.loads(raw)
        kind = event.get("type", "")
        self.events[kind] += 1
        if self.recording:
            self.window[kind] += 1
        if kind == "session.created":
            self.session = True
            if self.probe is not None:  # dialed with its settings (the unified form): armed from the start
                self.probe.armed = True
        elif kind == SPEECH_STOPPED:
            self.turn_ends.append(t)
        elif kind == "error" and len(self.errors) < 5:
            self.errors.append(str(event.get("error", {}).get("message", event)))
        elif kind == "response.output_audio_transcript.done" and len(self.said) < 3 and event.get("transcript"):
            self.said.append(str(event["transcript"]))  # (an answer cut before its first word says nothing)
        if self.probe is not None:
            self.probe.event(kind, t)

    async def dial(self, client: Any, base: str, session: dict[str, Any] | None) -> str | None:
        from aiortc import RTCSessionDescription

        for transceiver in self.pc.getTransceivers():
            transceiver.receiver.bench_rx = self.rx  # type: ignore[attr-defined]
        await self.pc.setLocalDescription(await self.pc.createOffer())
        offer = self.pc.localDescription.sdp
        if session is None:  # a browser's plain offer: the default session
            r = await client.post(f"{base}/v1/realtime/calls", content=offer,
                                  headers={"Content-Type": "application/sdp"})  # fmt: skip
        else:  # the unified form: the session's settings from the start
            r = await client.post(f"{base}/v1/realtime/calls", files={"sdp": (None, offer),
                                  "session": (None, json.dumps(session))})  # fmt: skip
        if r.status_code != 201:
            return f"POST /v1/realtime/calls: {r.status_code} {r.text[:200]}"
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=r.text, type="answer"))
        return None

    def connected(self) -> bool:
        return self.pc.connectionState == "connected" and self.channel.readyState == "open" and self.session

    def record(self, on: bool) -> None:
        self.recording = self.rx.recording = self.mic.recording = on
        if self.probe is not None:
            self.probe.recording = on

    def report(self, late_ms: float) -> dict[str, Any]:
        pacing = self.rx.pacing(late_ms)
        # A stall seen within STALL_AFTER_S of some call's end of turn: the gateway's work at the end
        # of a turn (the final transcription, the answer's start) is what held its loop.
        stalls = pacing.pop("stalls")
        pacing["stalls"] = len(stalls)
        pacing["stalls_after_turn_end"] = sum(any(0 <= t - e <= STALL_AFTER_S for e in self.turn_ends) for t in stalls)
        return {"connected": self.connected(), "state": self.pc.connectionState, "mic_packets": self.mic.n,
                "mic_max_lag_ms": 1000 * self.mic.max_lag_s, "rx_packets": self.rx.packets,
                "rx_sound": self.rx.sound, "rx_sound_window": self.rx.sound_window, "pacing": pacing,
                "events": dict(self.events), "window": dict(self.window), "errors": self.errors,
                "said": self.said}  # fmt: skip


async def ws_line(url: str, chunks: list[str], offset: int, probe: Probe, stop: asyncio.Event) -> dict[str, Any]:
    """One WebSocket session streaming the latency phase's audio, paced at 20 ms."""
    from websockets.asyncio.client import connect

    loop = asyncio.get_running_loop()
    errors: list[str] = []
    armed = asyncio.Event()
    sending: set[asyncio.Task[None]] = set()
    async with connect(url, compression=None, max_size=None) as ws:

        def send(text: str) -> None:
            task = loop.create_task(ws.send(text))
            sending.add(task)
            task.add_done_callback(sending.discard)

        probe.send = send
        await ws.send(orjson.dumps({"type": "session.update", "session": LATENCY_SESSION}).decode())

        async def read() -> None:
            async for raw in ws:
                t = time.monotonic()
                event = orjson.loads(raw)
                kind = event.get("type", "")
                if kind == "session.updated":
                    probe.armed = True
                    armed.set()
                elif kind == "error" and len(errors) < 5:
                    errors.append(str(event.get("error", {}).get("message", event)))
                probe.event(kind, t)

        reader = loop.create_task(read())
        await asyncio.wait_for(armed.wait(), 30)  # stream only with the latency settings on (no automatic responses)
        t0, n = time.monotonic(), 0
        while not stop.is_set():
            due = t0 + n * FRAME_S
            now = time.monotonic()
            if due > now:
                await asyncio.sleep(due - now)
                now = time.monotonic()
            i = (offset + n) % len(chunks)
            probe.sent(i, now)
            await ws.send(chunks[i])
            n += 1
        reader.cancel()
    return {"errors": errors, "chunks": n}


def _stdin_line(loop: asyncio.AbstractEventLoop) -> Any:
    return loop.run_in_executor(None, sys.stdin.readline)


def _say(what: str, **data: Any) -> None:
    print(json.dumps({what: data}), flush=True)


async def run_callers(spec: dict[str, Any], pcm: np.ndarray) -> None:
    """The callers' process: a JSON spec in, JSON lines out ("ready", then "report" after the
    parent's "go" and "stop" lines on stdin)."""
    import httpx

    install_rx_tap()
    loop = asyncio.get_running_loop()
    latency = spec["mode"] == "latency"
    packets = opus_packets(pcm)
    n = spec["calls"]
    frames = len(packets)
    probes: list[Probe] = []
    callers: list[Caller] = []
    turn_ends: list[float] = []
    for i in range(n):
        probe = None
        if latency:  # the WebSocket lines take the first half of each slot, the calls the second
            probe = Probe("webrtc", lambda _: None, onset=decoded_onset(packets))
            probes.append(probe)
        caller = Caller(packets, (frames * (2 * i + 1)) // (2 * n) if latency else frames * i // n, probe, turn_ends)
        if probe is not None:
            probe.send = caller.channel.send
        callers.append(caller)
    failures: list[str] = []
    async with httpx.AsyncClient(timeout=30) as client:
        for batch in range(0, n, 4):  # a few offers at a time: each answer sets up ICE and DTLS
            results = await asyncio.gather(*(c.dial(client, spec["base"], LATENCY_SESSION if latency else None)
                                             for c in callers[batch : batch + 4]))  # fmt: skip
            failures += [r for r in results if r is not None]
    for _ in range(600):  # 30 s at most for ICE, DTLS, SCTP and session.created
        if failures or all(c.connected() for c in callers):
            break
        await asyncio.sleep(0.05)
    stop = asyncio.Event()
    ws_tasks: list[asyncio.Task[dict[str, Any]]] = []
    ws_probes: list[Probe] = []
    if latency:
        ws_pcm = np.frombuffer(_resample(pcm.tobytes(), OPUS_RATE, WS_RATE), dtype="<i2")
        step = WS_RATE // 50
        pieces = [ws_pcm[i * step : (i + 1) * step] for i in range(len(ws_pcm) // step)]
        chunks = [orjson.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(p.tobytes()).decode()}
                               ).decode() for p in pieces]  # fmt: skip
        url = spec["base"].replace("http", "ws", 1) + "/v1/realtime"
        for i in range(n):
            probe = Probe("websocket", lambda _: None, onset=first_loud(pieces))
            ws_probes.append(probe)
            ws_tasks.append(loop.create_task(ws_line(url, chunks, len(chunks) * i // n, probe, stop)))
    _say("ready", connected=sum(c.connected() for c in callers), failures=failures[:5])
    await _stdin_line(loop)  # "go"
    for c in callers:
        c.record(True)
    for p in ws_probes:
        p.recording = True
    await _stdin_line(loop)  # "stop"
    for c in callers:
        c.record(False)
    for p in ws_probes:
        p.recording = False
    stop.set()
    ws_results = [await t for t in ws_tasks] if ws_tasks else []
    report: dict[str, Any] = {"calls": [c.report(spec["late_ms"]) for c in callers]}
    if latency:
        report["latency"] = {
            path: {"in_ms": [x for p in ps for x in p.in_ms], "out_ms": [x for p in ps for x in p.out_ms],
                   "started_ms": [x for p in ps for x in p.started_ms]}
            for path, ps in (("websocket", ws_probes), ("webrtc", probes))
        }  # fmt: skip
        report["ws"] = ws_results
    _say("report", **report)
    await asyncio.gather(*(c.pc.close() for c in callers), return_exceptions=True)


def _resample(pcm: bytes, src: int, dst: int) -> bytes:
    from gateway.audio.resample import resample_once

    return resample_once(pcm, src, dst)


# --- the parent: processes, CPU, figures ------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _machine_busy_s() -> float:
    """CPU seconds every process on the machine has used (``/proc/stat``); less ours: others' load."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, *_ = (int(x) for x in f.readline().split()[1:])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def wait_quiet(limit_s: float, threshold: float = 0.2, hold_s: int = 3) -> None:
    """Wait (at most ``limit_s``) until the machine's other processes used under ``threshold`` of a
    core for ``hold_s`` seconds in a row (a shared machine: quote figures taken then)."""
    deadline, quiet = time.monotonic() + limit_s, 0
    while quiet < hold_s and time.monotonic() < deadline:
        before, own = _machine_busy_s(), _own_s([])
        time.sleep(1.0)
        quiet = quiet + 1 if (_machine_busy_s() - before) - (_own_s([]) - own) < threshold else 0


def _cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


def _pinned(cmd: list[str], cpus: tuple[int, ...] | None) -> list[str]:
    """taskset from the start, so every thread (onnxruntime's, aiortc's encoders) is on those CPUs."""
    if cpus and shutil.which("taskset"):
        return ["taskset", "-c", ",".join(map(str, cpus)), *cmd]
    return cmd


class Gateway:
    """``python -m gateway serve`` on 127.0.0.1, pinned; always ended by ``stop``."""

    def __init__(self, engine: str, cpus: tuple[int, ...] | None, answer_s: float) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix=f"webrtc_calls_{engine}_", suffix=".log", delete=False)
        env = dict(os.environ, OMNI_GATEWAY_LOG_LEVEL="warning", OMNI_GATEWAY_API_KEYS="", OMNI_GATEWAY_REDIS_URL="",
                   OMNI_GATEWAY_DRAIN_WINDOW_S="1")  # fmt: skip
        cmd = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        if engine == "passthrough":
            # A tone of answer_s per turn (the cascade's answer to the sentence is about as long), a
            # transcript word every 400 ms (the passthrough's default is one per 20 ms delta).
            route = {"name": PASSTHROUGH_MODEL, "engine": "passthrough", "audio_chunks": int(answer_s * 50),
                     "words_every": 20}  # fmt: skip
            env.update(OMNI_GATEWAY_MODELS=orjson.dumps({"models": [route]}).decode(),
                       OMNI_GATEWAY_MODEL=PASSTHROUGH_MODEL)  # fmt: skip
            cmd += ["--engine", "passthrough"]
        self.proc = subprocess.Popen(_pinned(cmd, cpus), cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.ps = psutil.Process(self.proc.pid)
        if cpus and not shutil.which("taskset"):
            os.sched_setaffinity(self.proc.pid, cpus)

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
        return _cpu_s(self.ps)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


class Callers:
    """The callers' process; always ended by ``stop``."""

    def __init__(self, spec: dict[str, Any], cpus: tuple[int, ...] | None) -> None:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--callers", json.dumps(spec)]
        self.proc = subprocess.Popen(_pinned(cmd, cpus), cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))  # fmt: skip
        self.ps = psutil.Process(self.proc.pid)
        if cpus and not shutil.which("taskset"):
            os.sched_setaffinity(self.proc.pid, cpus)
        self.lines: queue.Queue[str | None] = queue.Queue()
        # A thread reads their output, so that every wait on it has a timeout.
        threading.Thread(target=self._read_lines, args=(self.proc.stdout,), daemon=True).start()

    def _read_lines(self, out: TextIO) -> None:
        for line in out:
            self.lines.put(line)
        self.lines.put(None)

    def read(self, what: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                raise RuntimeError(f"the callers exited ({self.proc.wait()}) before {what!r}")
            with contextlib.suppress(ValueError):
                msg = json.loads(line)
                if isinstance(msg, dict) and what in msg:
                    return dict(msg[what])
        raise RuntimeError(f"no {what!r} from the callers in {timeout:.0f} s")

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def cpu_s(self) -> float:
        return _cpu_s(self.ps)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.send("stop")
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@dataclass(frozen=True)
class Setup:
    gateway_cpus: tuple[int, ...] | None
    caller_cpus: tuple[int, ...] | None
    warmup: float
    duration: float
    cycle_s: float
    answer_s: float
    late_ms: float
    late_share: float
    wait_quiet_s: float = 0.0
    retries: int = 0


def measure(engine: str, n: int, setup: Setup, mode: str = "load") -> dict[str, Any]:
    """``measure_once``, again (up to ``setup.retries`` times) while other processes used more than
    ``QUIET_CORES`` during the window; the quietest run is kept."""
    runs: list[dict[str, Any]] = []
    for attempt in range(1 + setup.retries):
        runs.append(measure_once(engine, n, setup, mode))
        if runs[-1]["others_cores"] <= QUIET_CORES:
            break
        if attempt < setup.retries:
            print(f"  others used {100 * runs[-1]['others_cores']:.0f} % of a core: measuring again", flush=True)
    return min(runs, key=lambda r: float(r["others_cores"]))


def measure_once(engine: str, n: int, setup: Setup, mode: str = "load") -> dict[str, Any]:
    """One run: a fresh gateway, N calls (and, for latency, N WebSocket sessions), one window."""
    if setup.wait_quiet_s:
        wait_quiet(setup.wait_quiet_s)
    gateway = Gateway(engine, setup.gateway_cpus, setup.answer_s)
    callers: Callers | None = None
    try:
        gateway.wait_ready()
        # Its CPU with no call (lease loop, metrics, the engines' idle threads): a fixed cost that
        # calls per core (N / CPU) carry at every N, shown apart.
        time.sleep(1.0)
        i0, t0 = gateway.cpu_s(), time.monotonic()
        time.sleep(IDLE_S)
        idle = (gateway.cpu_s() - i0) / (time.monotonic() - t0)
        spec = {"mode": mode, "base": gateway.base, "calls": n, "cycle_s": setup.cycle_s, "late_ms": setup.late_ms}
        callers = Callers(spec, setup.caller_cpus)
        ready = callers.read("ready", 120)
        time.sleep(setup.warmup)
        me = [gateway.ps, callers.ps]
        g0, c0, m0, o0, w0 = gateway.cpu_s(), callers.cpu_s(), _machine_busy_s(), _own_s(me), time.monotonic()
        callers.send("go")
        time.sleep(setup.duration)
        g1, c1, m1, o1, w1 = gateway.cpu_s(), callers.cpu_s(), _machine_busy_s(), _own_s(me), time.monotonic()
        callers.send("stop")
        report = callers.read("report", 60)
    finally:
        if callers is not None:
            callers.stop()
        gateway.stop()
    wall = w1 - w0
    return {"engine": engine, "mode": mode, "n": n, "ready": ready, "wall_s": wall, "gateway_idle_cores": idle,
            "gateway_cores": (g1 - g0) / wall, "caller_cores": (c1 - c0) / wall,
            "others_cores": max(0.0, (m1 - m0) - (o1 - o0)) / wall, **report}  # fmt: skip


def _own_s(procs: list[psutil.Process]) -> float:
    """This process and the ones we started (their CPU is not others' load)."""
    return _cpu_s(psutil.Process()) + sum(_cpu_s(p) for p in procs)


def load_figures(run: dict[str, Any], setup: Setup) -> dict[str, Any]:
    calls = run["calls"]
    frames = sum(c["pacing"]["frames"] for c in calls)
    late = sum(c["pacing"]["late"] for c in calls)
    skipped = sum(c["pacing"]["skipped"] for c in calls)
    cores = run["gateway_cores"]
    connected = sum(c["connected"] for c in calls)
    errors = sum(len(c["errors"]) for c in calls)
    heard = sum(c["window"].get(SPEECH_STARTED, 0) for c in calls)
    answered = sum(c["window"].get("response.done", 0) for c in calls)
    fig = {
        "engine": run["engine"], "n": run["n"], "connected": connected, "gateway_cores": cores,
        "calls_per_core": run["n"] / cores if cores > 0 else math.nan,
        "ms_per_call_s": 1000 * cores / run["n"], "idle_cores": run["gateway_idle_cores"],
        "marginal_ms_per_call_s": 1000 * (cores - run["gateway_idle_cores"]) / run["n"],
        "frames": frames, "late": late, "skipped": skipped,
        "late_share": late / frames if frames else math.nan,
        "late_p99_ms": max((c["pacing"]["late_p99_ms"] for c in calls), default=math.nan),
        "late_max_ms": max((c["pacing"]["late_max_ms"] for c in calls), default=math.nan),
        "sound_share": sum(c["rx_sound_window"] for c in calls) / frames if frames else math.nan,
        "turns_heard": heard, "answers": answered, "errors": errors,
        "stalls": sum(c["pacing"].get("stalls", 0) for c in calls),
        "stalls_after_turn_end": sum(c["pacing"].get("stalls_after_turn_end", 0) for c in calls),
        # the share of the window within STALL_AFTER_S of some end of turn: what chance alone would give
        "turn_end_cover": min(1.0, sum(c["window"].get(SPEECH_STOPPED, 0) for c in calls) * STALL_AFTER_S
                              / run["wall_s"]),
        "first_error": next((e for c in calls for e in c["errors"]), None),
        "said": next((c["said"][0] for c in calls if c["said"]), None),
        "caller_cores": run["caller_cores"], "others_cores": run["others_cores"],
        "caller_max_lag_ms": max((c["mic_max_lag_ms"] for c in calls), default=math.nan),
    }  # fmt: skip
    fig["paced"] = bool(frames and skipped == 0 and fig["late_share"] <= setup.late_share)
    fig["healthy"] = connected == run["n"] and errors == 0 and heard > 0 and answered > 0
    return fig


def _f(x: float, nd: int = 1) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{nd}f}"


def print_load(figs: list[dict[str, Any]], setup: Setup) -> None:
    print(f"\nWebRTC calls per core (pacing holds: no frame skipped and <= {100 * setup.late_share:g} % of "
          f"the answer tracks' frames > {setup.late_ms:g} ms behind schedule at the caller)")  # fmt: skip
    print(
        "| engine | N | connected | gateway CPU (idle) | calls per core | CPU per call (beyond idle) | paced | "
        "late / frames (skipped) | lateness p99 / max | sound out | turns heard / answered | errors | callers CPU "
        "| others |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for f in figs:
        print(f"| {f['engine']} | {f['n']} | {f['connected']}/{f['n']} | {100 * f['gateway_cores']:.1f} % "
              f"({100 * f['idle_cores']:.1f} %) | **{_f(f['calls_per_core'])}** | {_f(f['ms_per_call_s'])} "
              f"({_f(f['marginal_ms_per_call_s'])}) ms/s | {'yes' if f['paced'] else 'NO'} | {f['late']} / "
              f"{f['frames']:,} ({f['skipped']}) | {_f(f['late_p99_ms'])} / {_f(f['late_max_ms'])} ms | "
              f"{100 * f['sound_share']:.0f} % | {f['turns_heard']} / {f['answers']} | {f['errors']} | "
              f"{100 * f['caller_cores']:.0f} % | {100 * f['others_cores']:.0f} % |")  # fmt: skip
    for f in figs:
        if f["stalls"]:
            print(f"  {f['engine']} N={f['n']}: {f['stalls']} stalls (gaps in the answer tracks' timestamps, summed "
                  f"over the calls), {f['stalls_after_turn_end']} of them within {STALL_AFTER_S:g} s after an end "
                  f"of turn (chance: {100 * f['turn_end_cover']:.0f} %)")  # fmt: skip
        if f["first_error"]:
            print(f"  {f['engine']} N={f['n']}: first error: {f['first_error']}")
        if f["caller_cores"] > 0.8 * len(setup.caller_cpus or [0, 0]) or f["caller_max_lag_ms"] > 40:
            print(f"  {f['engine']} N={f['n']}: the callers may have been the bottleneck (CPU "
                  f"{100 * f['caller_cores']:.0f} %, sent up to {f['caller_max_lag_ms']:.0f} ms late)")  # fmt: skip
    said = next((f["said"] for f in figs if f["engine"] == "cascade" and f["said"]), None)
    if said:
        print(f"  the cascade answered: {said!r}")


def _stats(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0, "p50": math.nan, "p90": math.nan, "max": math.nan}
    return {"n": len(xs), "p50": statistics.median(xs), "p90": float(np.percentile(xs, 90)), "max": max(xs)}


def latency_figures(run: dict[str, Any]) -> dict[str, Any]:
    lat = run["latency"]
    out: dict[str, Any] = {"engine": run["engine"], "n": run["n"], "others_cores": run["others_cores"],
                           "connected": sum(c["connected"] for c in run["calls"]),
                           "errors": sum(len(c["errors"]) for c in run["calls"]) + sum(len(w["errors"])
                                                                                    for w in run["ws"])}  # fmt: skip
    for path in ("websocket", "webrtc"):
        for leg in ("in_ms", "out_ms", "started_ms"):
            out[f"{path}_{leg}"] = _stats(lat[path][leg])
    return out


def print_latency(f: dict[str, Any]) -> None:
    def cell(s: dict[str, float]) -> str:
        return f"{_f(s['p50'])} / {_f(s['p90'])} / {_f(s['max'])} ms ({s['n']})" if s["n"] else "-"

    def diff(leg: str) -> str:
        a, b = f[f"websocket_{leg}"]["p50"], f[f"webrtc_{leg}"]["p50"]
        return f"**{b - a:+.1f} ms**" if not (math.isnan(a) or math.isnan(b)) else "-"

    print(f"\nLatency, WebSocket and WebRTC side by side ({f['engine']} engine, {f['n']} session(s) of each at "
          f"once; p50 / p90 / max (samples))")  # fmt: skip
    print("| leg | WebSocket | WebRTC | WebRTC - WebSocket (p50) |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| in: onset handed to the transport -> `speech_started` at the caller | {cell(f['websocket_in_ms'])} | "
          f"{cell(f['webrtc_in_ms'])} | {diff('in_ms')} |")  # fmt: skip
    print(f"| out: `response.create` sent -> first answer audio at the caller | {cell(f['websocket_out_ms'])} | "
          f"{cell(f['webrtc_out_ms'])} | {diff('out_ms')} |")  # fmt: skip
    print(f"| out: `response.create` sent -> `output_audio_buffer.started` | | {cell(f['webrtc_started_ms'])} | |")
    print(f"  calls connected {f['connected']}/{f['n']}, errors {f['errors']}, others' CPU "
          f"{100 * f['others_cores']:.0f} % of a core")  # fmt: skip


STEPS = "4,8,12,16,20,24,28,32,40,48,56,64"


def find_max(engine: str, setup: Setup, steps: list[int]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    figs: list[dict[str, Any]] = []
    best = None
    for n in steps:
        for _ in (1, 2):  # a failing step is measured once more: one episode of others' load can sink it
            print(f"{engine}: N={n} ...", flush=True)
            fig = load_figures(measure(engine, n, setup), setup)
            figs.append(fig)
            print(f"  gateway {100 * fig['gateway_cores']:.0f} %, paced {fig['paced']}, late {fig['late']}, skipped "
                  f"{fig['skipped']}, connected {fig['connected']}/{n}, errors {fig['errors']}, others "
                  f"{100 * fig['others_cores']:.0f} %", flush=True)  # fmt: skip
            if fig["paced"] and fig["healthy"]:
                break
        if not (fig["paced"] and fig["healthy"]):
            break
        best = fig
        if fig["gateway_cores"] > 0.95:  # saturated: a step more would fail on pacing
            break
    return figs, best


def _parse(argv: list[str] | None) -> tuple[argparse.Namespace, Setup]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--engine",
        choices=["cascade", "passthrough", "both"],
        default="both",
        help="the gateway's engine for calls per core (default both: cascade, the default; passthrough)",
    )
    p.add_argument("--calls", type=int, default=8, help="N concurrent calls (default 8)")
    p.add_argument("--duration", type=float, default=20.0, help="measured seconds per run (default 20)")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds after every call connected (default 5)")
    p.add_argument("--cycle-s", type=float, default=8.0, help="a caller's turn: the sentence, then quiet (default 8)")
    p.add_argument("--answer-s", type=float, default=2.4, help="passthrough: seconds of answer per turn (default 2.4)")
    p.add_argument("--late-ms", type=float, default=40.0, help="a frame later than this is late (default 40)")
    p.add_argument("--late-share", type=float, default=0.001, help="pacing holds up to this share late (0.1 %%)")
    p.add_argument("--find-max", action="store_true", help="ramp N (--steps) per engine until pacing fails")
    p.add_argument("--steps", default=STEPS, help=f"N for --find-max (default {STEPS})")
    p.add_argument(
        "--latency",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also the latency comparison, WebSocket against WebRTC (default on)",
    )
    p.add_argument("--only-latency", action="store_true", help="the latency comparison only")
    p.add_argument("--latency-engine", choices=["cascade", "passthrough"], default="passthrough")
    p.add_argument("--latency-calls", type=int, default=2, help="WebSocket sessions and calls, each (default 2)")
    p.add_argument("--latency-s", type=float, default=45.0, help="measured seconds (default 45: ~15 turns each)")
    p.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the gateway on the first CPU, the callers on the others (default on with >= 2 CPUs)",
    )
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="S",
        help="before each run, wait up to S s for other processes to use < 20%% of a core (default 0)",
    )
    p.add_argument(
        "--retries",
        type=int,
        default=0,
        help="measure a run again (up to this many times) while other processes used > 15%% of a core "
        "in its window; the quietest is kept (default 0)",
    )
    p.add_argument("--json", type=Path, help="also write every figure here, as JSON")
    p.add_argument("--callers", help=argparse.SUPPRESS)
    args = p.parse_args(argv)  # fmt: skip
    cpus = sorted(os.sched_getaffinity(0))
    pin = args.pin and len(cpus) >= 2
    setup = Setup(gateway_cpus=(cpus[0],) if pin else None, caller_cpus=tuple(cpus[1:]) if pin else None,
                  warmup=args.warmup, duration=args.duration, cycle_s=args.cycle_s, answer_s=args.answer_s,
                  late_ms=args.late_ms, late_share=args.late_share, wait_quiet_s=args.wait_quiet,
                  retries=args.retries)  # fmt: skip
    return args, setup


def main(argv: list[str] | None = None) -> int:
    args, setup = _parse(argv)
    if args.callers:
        import uvloop

        spec = json.loads(args.callers)
        latency = spec["mode"] == "latency"
        pcm = mic_cycle(SHORT if latency else SENTENCE, LATENCY_CYCLE_S if latency else spec["cycle_s"])
        uvloop.run(run_callers(spec, pcm))
        return 0
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    engines = ["cascade", "passthrough"] if args.engine == "both" else [args.engine]
    print(f"webrtc_calls: {os.cpu_count()} CPUs, gateway on {setup.gateway_cpus or 'any'}, callers on "
          f"{setup.caller_cpus or 'any'}; load average {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    out: dict[str, Any] = {"setup": setup.__dict__, "load": [], "find_max": {}}
    if not args.only_latency:
        for engine in engines:
            if args.find_max:
                figs, best = find_max(engine, setup, [int(x) for x in args.steps.split(",")])
                out["load"] += figs
                out["find_max"][engine] = best
            else:
                print(f"{engine}: {args.calls} calls, {setup.warmup:g} s warm-up + {setup.duration:g} s ...",
                      flush=True)  # fmt: skip
                out["load"].append(load_figures(measure(engine, args.calls, setup), setup))
        print_load(out["load"], setup)
        for engine, best in out["find_max"].items():
            if best is None:
                print(f"  {engine}: pacing failed at the first step")
            else:
                print(f"  {engine}: max N where pacing holds: **{best['n']}** ({100 * best['gateway_cores']:.0f} % "
                      f"of the core: {best['calls_per_core']:.1f} calls per core)")  # fmt: skip
    if args.latency or args.only_latency:
        lat_setup = Setup(**{**setup.__dict__, "duration": args.latency_s, "warmup": 1.0})
        print(f"latency: {args.latency_calls} WebSocket session(s) and call(s), {args.latency_s:g} s ...", flush=True)
        out["latency"] = latency_figures(measure(args.latency_engine, args.latency_calls, lat_setup, "latency"))
        print_latency(out["latency"])
    if args.json:
        args.json.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted: the gateway and the callers were stopped", file=sys.stderr)
        sys.exit(130)
