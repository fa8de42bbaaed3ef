"""What WebRTC media costs the gateway per call, and the latency its media path adds.

1. **Codec path** (always; one thread, no sockets): the CPU time (``time.process_time``) of
   one call-second of each step the gateway runs per call, over ``--seconds`` of audio:

   - ``decode``: aiortc's ``OpusDecoder`` on the caller's packets (20 ms, 48 kHz, encoded
     beforehand by aiortc's ``OpusEncoder``, so as a stereo 96 kb/s stream: heavier than a
     browser's mono ~32 kb/s);
   - ``inbound``: ``InboundAudio`` (downmix to mono, 20 ms chunks at Opus's 48 kHz: no resampling);
   - ``to engine``: the session's one conversion of those chunks to the engine's ``--rate``
     (``audio.convert.Converter``, as ``session/input.py`` runs it);
   - ``to track``: the call's one conversion of the engine's 24 kHz answer to the track's
     48 kHz (``Converter``, as ``webrtc/call.py`` runs it, in 20 ms deltas);
   - ``compose``: ``AudioOutTrack`` handing out frames at 48 kHz (fake clock, no sleeping);
   - ``encode speech`` / ``encode silence``: aiortc's ``OpusEncoder`` on those frames
     (libswresample only doubles the channel, the rate is Opus's already; then libopus at 96 kb/s).

   A call costs decode + inbound + to engine + compose + encode, and to track while the answer
   plays (speech while the answer plays, silence between answers): the "calls per core"
   lines divide one second by that.

2. **Full stack** (``--calls N``): N real calls on this machine's addresses. The callers
   (aiortc, in a subprocess, so their CPU is not charged) play a quiet tone with a loud
   100 ms burst every second; the gateway side (this process) reads their tracks with
   ``AudioIn`` and plays the same pattern back on ``AudioOutTrack``, for ``--duration`` s,
   full duplex: the worst case. Printed: the gateway process's CPU per call-second (SRTP,
   RTP, SCTP, asyncio and the executor threads aiortc encodes in included), the pacing
   (late frames, stalls) and the burst latencies: caller hand-out -> gateway chunk
   (``in``: network, aiortc's receive jitter buffer, decode) and
   gateway hand-out -> caller decode (``out``: its mirror; the caller's jitter buffer is
   aiortc's here, a browser's own instead in real life).

    python bench/webrtc_media.py                       # codec path, 30 s of audio (~10 s)
    python bench/webrtc_media.py --calls 1,8 --duration 10        # + full stack on uvloop
    python bench/webrtc_media.py --calls 8 --loop asyncio
    python bench/webrtc_media.py --calls 8 --silent     # the gateway listening: silence frames out
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription  # noqa: E402
from aiortc.codecs.opus import OpusDecoder, OpusEncoder  # noqa: E402
from aiortc.jitterbuffer import JitterFrame  # noqa: E402
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack  # noqa: E402
from av import AudioFrame  # noqa: E402

from gateway.audio.codecs import AudioFormat  # noqa: E402
from gateway.audio.convert import Converter  # noqa: E402
from gateway.transport.webrtc.audio_in import AudioIn, InboundAudio  # noqa: E402
from gateway.transport.webrtc.audio_out import AudioOutTrack  # noqa: E402
from gateway.transport.webrtc.call import TRACK_RATE  # noqa: E402
from gateway.transport.webrtc.config import WebRTCConfig  # noqa: E402
from gateway.transport.webrtc.peer import PeerFactory  # noqa: E402

OUT_RATE = 24000
LOUD = 3000.0  # rms threshold of a burst (the quiet tone is ~210)


def speechlike(seconds: float, rate: int) -> np.ndarray:
    """Not speech, but not easy for Opus either: harmonics gliding under a syllable envelope, plus noise."""
    t = np.arange(int(seconds * rate)) / rate
    f0 = 140 + 40 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    voice = sum(np.sin(k * phase) / k for k in range(1, 12))
    syllables = 0.5 + 0.5 * np.sin(2 * np.pi * 4 * t) ** 2
    noise = np.random.default_rng(1).normal(0, 0.05, len(t))
    return (6000 * (voice * syllables + noise) / 2).clip(-32768, 32767).astype("<i2")


def pcm_frames(pcm: np.ndarray, rate: int, layout: str = "mono") -> list[AudioFrame]:
    step = rate // 50
    frames = []
    for i in range(len(pcm) // step):
        chunk = pcm[i * step : (i + 1) * step]
        arr = (np.repeat(chunk, 2) if layout == "stereo" else chunk).reshape(1, -1)
        frame = AudioFrame.from_ndarray(arr, format="s16", layout=layout)
        frame.sample_rate, frame.pts = rate, i * step
        frames.append(frame)
    return frames


def codec_path(seconds: float, rate: int) -> dict[str, float]:
    """ms of CPU per call-second of each step."""
    mic = pcm_frames(speechlike(seconds, 48000), 48000)
    encoder = OpusEncoder()
    packets = []
    for frame in mic:
        payloads, timestamp = encoder.encode(frame)
        packets += [JitterFrame(p, timestamp) for p in payloads]
    out: dict[str, float] = {}

    decoder = OpusDecoder()
    t0 = time.process_time()
    decoded = [cast(AudioFrame, f) for p in packets for f in decoder.decode(p)]
    out["decode"] = time.process_time() - t0

    inbound = InboundAudio()
    t0 = time.process_time()
    chunks = [chunk for decoded_frame in decoded for chunk in inbound.push(decoded_frame)]
    out["inbound"] = time.process_time() - t0

    to_engine = Converter(chunks[0][1], AudioFormat("pcm16", rate))
    t0 = time.process_time()
    for pcm, _ in chunks:
        to_engine.process(pcm)
    out["to engine"] = time.process_time() - t0

    answer = speechlike(seconds, OUT_RATE).tobytes()
    step = OUT_RATE * 2 // 50
    deltas = [answer[i : i + step] for i in range(0, len(answer), step)]
    to_track = Converter(AudioFormat("pcm16", OUT_RATE), AudioFormat("pcm16", TRACK_RATE))
    t0 = time.process_time()
    answer_at_track = b"".join(to_track.process(d) for d in deltas) + to_track.flush()
    out["to track"] = time.process_time() - t0

    now = [0.0]

    async def no_sleep(s: float) -> None:
        now[0] += s

    for name, fill in (("speech", True), ("silence", False)):
        track = AudioOutTrack(TRACK_RATE, clock=lambda: now[0], sleep=no_sleep)
        if fill:
            track.feed(answer_at_track, response_id="r", item_id="i")
        count = int(seconds * 50)
        loop = asyncio.new_event_loop()
        t0 = time.process_time()
        frames = [loop.run_until_complete(track.recv()) for _ in range(count)]
        out[f"compose {name}"] = time.process_time() - t0
        loop.close()
        enc = OpusEncoder()
        t0 = time.process_time()
        for frame in frames:
            enc.encode(frame)
        out[f"encode {name}"] = time.process_time() - t0
    return {k: 1000 * v / seconds for k, v in out.items()}


# --- full stack ---


class BurstTrack(MediaStreamTrack):
    """A paced 24 kHz mic: a quiet 300 Hz tone, a loud 100 ms burst every second; notes when each burst leaves."""

    kind = "audio"

    def __init__(self, silent: bool = False) -> None:
        super().__init__()
        self.out = AudioOutTrack(OUT_RATE)
        self.bursts: list[float] = []
        self.silent = silent  # the gateway between answers: silence frames only
        self._n = 0

    async def recv(self) -> AudioFrame:
        if self.out.queued_ms < 200 and not self.silent:
            self.out.feed(pattern(), response_id="r", item_id="i")
        frame = await self.out.recv()
        if self._n % 50 == 0:
            self.bursts.append(time.monotonic())
        self._n += 1
        return frame


_PATTERN: bytes | None = None


def pattern() -> bytes:
    """One second: 100 ms loud 1 kHz, 900 ms quiet 300 Hz."""
    global _PATTERN
    if _PATTERN is None:
        t = np.arange(OUT_RATE) / OUT_RATE
        x = 300 * np.sin(2 * np.pi * 300 * t)
        x[: OUT_RATE // 10] = 12000 * np.sin(2 * np.pi * 1000 * t[: OUT_RATE // 10])
        _PATTERN = x.astype("<i2").tobytes()
    return _PATTERN


def onsets(times_and_rms: list[tuple[float, float]]) -> list[float]:
    found, quiet = [], True
    for t, level in times_and_rms:
        if level > LOUD and quiet:
            found.append(t)
        quiet = level < LOUD / 3
    return found


def latencies(sent: list[float], heard: list[float]) -> list[float]:
    """Each heard onset against the latest burst sent before it (bursts are 1 s apart)."""
    out = []
    for h in heard:
        before = [s for s in sent if s <= h]
        if before and h - before[-1] < 0.5:
            out.append(h - before[-1])
    return out


async def run_client(n: int) -> None:
    """The callers' process: JSON lines on stdin/stdout."""
    pcs, tracks, heard = [], [], []
    loop = asyncio.get_running_loop()
    for _ in range(n):
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.createDataChannel("oai-events")
        track = BurstTrack()
        pc.addTrack(track)
        levels: list[tuple[float, float]] = []

        async def record(remote: MediaStreamTrack, into: list[tuple[float, float]]) -> None:
            try:
                while True:
                    frame = await remote.recv()
                    x = frame.to_ndarray().astype(float)  # type: ignore[union-attr]
                    into.append((time.monotonic(), float(np.sqrt(np.mean(x**2)))))
            except MediaStreamError:
                pass

        pc.on("track", lambda remote, into=levels: asyncio.ensure_future(record(remote, into)))
        await pc.setLocalDescription(await pc.createOffer())
        print(json.dumps({"sdp": pc.localDescription.sdp}), flush=True)
        pcs.append(pc)
        tracks.append(track)
        heard.append(levels)
    for pc in pcs:
        answer = json.loads(await loop.run_in_executor(None, sys.stdin.readline))["sdp"]
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
    await loop.run_in_executor(None, sys.stdin.readline)  # "stop"
    report = [{"bursts": t.bursts, "heard": onsets(h)} for t, h in zip(tracks, heard, strict=True)]
    print(json.dumps(report), flush=True)
    for pc in pcs:
        await pc.close()


class Seat:
    """The gateway's side of one call."""

    def __init__(self, factory: PeerFactory, rate: int, silent: bool) -> None:
        self.pc = factory.create()
        self.out = BurstTrack(silent)
        self.levels: list[tuple[float, float]] = []
        self.rate = rate
        self.pc.on("track", self._track)

    def _track(self, track: MediaStreamTrack) -> None:
        def chunk(pcm: bytes, fmt: AudioFormat) -> None:
            x = np.frombuffer(pcm, dtype="<i2").astype(float)
            self.levels.append((time.monotonic(), float(np.sqrt(np.mean(x**2)))))

        AudioIn(track, chunk).start()


async def full_stack(n: int, duration: float, rate: int, silent: bool = False) -> dict[str, Any]:
    factory = PeerFactory(WebRTCConfig())
    await factory.start()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--client", str(n), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None
    seats = []
    try:
        answers = []
        for _ in range(n):
            offer = json.loads(await proc.stdout.readline())["sdp"]
            seat = Seat(factory, rate, silent)
            answers.append(await factory.answer(seat.pc, offer, audio_track=seat.out))
            seats.append(seat)
        for answer in answers:
            proc.stdin.write(json.dumps({"sdp": answer}).encode() + b"\n")
        await proc.stdin.drain()
        deadline = time.monotonic() + 60
        while not all(s.pc.connectionState == "connected" for s in seats):
            if time.monotonic() > deadline:
                raise RuntimeError("calls did not connect")
            await asyncio.sleep(0.05)
        await asyncio.sleep(2.0)  # warm up: DTLS done, jitter buffers filled
        cpu0, wall0 = time.process_time(), time.monotonic()
        await asyncio.sleep(duration)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        proc.stdin.write(b"stop\n")
        await proc.stdin.drain()
        report = json.loads(await proc.stdout.readline())
    finally:
        if proc.returncode is None:
            await asyncio.wait_for(proc.wait(), 30)
        for seat in seats:
            await seat.pc.close()
    lat_in = [x for seat, r in zip(seats, report, strict=True) for x in latencies(r["bursts"], onsets(seat.levels))]
    lat_out = [x for seat, r in zip(seats, report, strict=True) for x in latencies(seat.out.bursts, r["heard"])]
    return {
        "calls": n,
        "cpu_ms_per_call_s": 1000 * cpu / (n * wall),
        "stalls": sum(s.out.out.stalls for s in seats),
        "max_late_ms": 1000 * max(s.out.out.max_late_s for s in seats),
        "in_ms": 1000 * statistics.median(lat_in) if lat_in else float("nan"),
        "out_ms": 1000 * statistics.median(lat_out) if lat_out else float("nan"),
        "samples": (len(lat_in), len(lat_out)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0, help="audio for the codec path")
    parser.add_argument("--rate", type=int, default=16000, help="the engine's input rate")
    parser.add_argument("--calls", default="", help="full stack: comma-separated call counts (e.g. 1,8)")
    parser.add_argument("--duration", type=float, default=10.0, help="full stack: seconds measured per run")
    parser.add_argument(
        "--loop", choices=("uvloop", "asyncio"), default="uvloop", help="full stack: the gateway's loop"
    )
    parser.add_argument("--silent", action="store_true", help="full stack: the gateway sends silence (between answers)")
    parser.add_argument("--client", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        asyncio.run(run_client(args.client))
        return

    cost = codec_path(args.seconds, args.rate)
    print(f"codec path, ms of CPU per call-second (one thread; {args.seconds:.0f} s of audio, in at {args.rate} Hz):")
    for name, ms in cost.items():
        print(f"  {name:16s} {ms:6.2f}")
    base = cost["decode"] + cost["inbound"] + cost["to engine"]
    speaking = base + cost["to track"] + cost["compose speech"] + cost["encode speech"]
    listening = base + cost["compose silence"] + cost["encode silence"]
    print(f"  a call while the answer plays:   {speaking:6.2f} ms/s -> {1000 / speaking:5.0f} calls per core")
    print(f"  a call between answers:          {listening:6.2f} ms/s -> {1000 / listening:5.0f} calls per core")
    for n in [int(x) for x in args.calls.split(",") if x.strip()]:
        if args.loop == "uvloop":  # as ``omni-gateway serve`` runs
            import uvloop

            r = uvloop.run(full_stack(n, args.duration, args.rate, args.silent))
        else:
            r = asyncio.run(full_stack(n, args.duration, args.rate, args.silent))
        per_call = r["cpu_ms_per_call_s"]
        print(
            f"full stack ({args.loop}), {n} call(s), {args.duration:.0f} s "
            f"{'silence out' if args.silent else 'full duplex'}: {per_call:.1f} ms CPU "
            f"per call-second -> {1000 / per_call:.0f} calls per core; stalls {r['stalls']}, latest frame "
            f"{r['max_late_ms']:.1f} ms; burst latency in {r['in_ms']:.0f} ms, out {r['out_ms']:.0f} ms "
            f"(medians of {r['samples'][0]}/{r['samples'][1]})"
        )


if __name__ == "__main__":
    main()
