"""The caller's microphone: aiortc's decoded Opus frames (48 kHz, stereo as Opus is
negotiated) turned into mono PCM16 at their own rate, in 20 ms chunks. Nothing is resampled
here: the door hands each chunk, with its format, to the session, whose input converts it to
what the engine takes in one step (``audio/convert.py``).

``InboundAudio`` is the Sans-I/O part (frame in, chunks out), ``AudioIn`` the pump that reads
the remote track and hands the chunks to a callback.

aiortc hands out only what arrived: a lost or late packet leaves a hole, not concealment.
Holes are filled with silence from the frames' RTP timestamps (up to ``max_gap_ms`` each),
so the session's input timeline (``audio_start_ms``/``audio_end_ms`` of speech events, the
truncation points) stays on the caller's clock instead of drifting early.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame, AudioResampler

from gateway.audio.codecs import AudioFormat

CHUNK_MS = 20
_RTP_WRAP = 1 << 32


Chunk = tuple[bytes, AudioFormat]  # mono PCM16 and its format (the frames' rate)


class InboundAudio:
    """Decoded audio frames in, mono PCM16 chunks of ``chunk_ms`` at the frames' own rate out."""

    def __init__(self, *, chunk_ms: int = CHUNK_MS, max_gap_ms: int = 1000) -> None:
        if chunk_ms <= 0:
            raise ValueError("chunk_ms must be positive")
        self.chunk_ms = chunk_ms
        self.max_gap_ms = max_gap_ms
        self.format: AudioFormat | None = None  # of the chunks (None: no frame yet)
        self.chunk_bytes = 0
        self._fallback: AudioResampler | None = None  # for sample formats numpy is not taught here (no rate change)
        self._buf = bytearray()
        self._next_pts: int | None = None  # the RTP timestamp the next frame should carry
        # counters
        self.frames = 0
        self.gaps_filled_ms = 0.0

    def push(self, frame: AudioFrame) -> list[Chunk]:
        """One decoded frame; returns the whole chunks now ready (maybe none). A change of
        the frames' rate first hands out what was left at the old rate (a short chunk)."""
        self.frames += 1
        rate = frame.sample_rate
        chunks: list[Chunk] = []
        if self.format is None or rate != self.format.rate:
            chunks += self.flush()
            if rate <= 0 or rate * self.chunk_ms % 1000:
                raise ValueError(f"a {rate} Hz frame holds no whole number of samples per {self.chunk_ms} ms")
            self.format = AudioFormat("pcm16", rate)
            self.chunk_bytes = 2 * rate * self.chunk_ms // 1000
            self._next_pts = None
        mono = self._mono(frame)
        gap = self._gap_samples(frame, len(mono))
        if gap:
            self.gaps_filled_ms += gap * 1000 / rate
            self._buf += bytes(2 * gap)
        self._buf += mono.tobytes()
        return chunks + self._take()

    def flush(self) -> list[Chunk]:
        """The end of the stream: whatever is left (less than a chunk)."""
        out, self._buf = bytes(self._buf), bytearray()
        return [(out, self.format)] if out and self.format is not None else []

    def _take(self) -> list[Chunk]:
        n = self.chunk_bytes
        count = len(self._buf) // n
        if not count:
            return []
        fmt = self.format
        assert fmt is not None
        chunks = [(bytes(self._buf[i * n : (i + 1) * n]), fmt) for i in range(count)]
        del self._buf[: count * n]
        return chunks

    def _gap_samples(self, frame: AudioFrame, samples: int) -> int:
        pts = frame.pts
        if pts is None:
            return 0
        expected, self._next_pts = self._next_pts, (pts + samples) % _RTP_WRAP
        if expected is None:
            return 0
        gap = (pts - expected) % _RTP_WRAP
        if gap == 0 or gap > _RTP_WRAP // 2:  # on time, or a reordered/old frame: nothing to fill
            return 0
        # A huge jump is a new timeline (a restarted sender), not a hole: fill at most max_gap_ms.
        return min(gap, frame.sample_rate * self.max_gap_ms // 1000)

    def _mono(self, frame: AudioFrame) -> np.ndarray:
        channels = len(frame.layout.channels)
        name = frame.format.name
        if name in ("s16", "s16p", "flt", "fltp"):
            arr = frame.to_ndarray()
            if name in ("s16", "flt"):  # packed: one row, channels interleaved
                arr = arr.reshape(-1, channels).T
            if name in ("flt", "fltp"):
                arr = np.clip(arr * 32768.0, -32768, 32767)
            if channels == 1:
                return np.ascontiguousarray(arr[0], dtype="<i2")
            # A browser's microphone is mono sent as identical channels: the mean is exact then.
            return (arr.astype(np.int32).sum(axis=0) // channels).astype("<i2")
        if self._fallback is None:
            self._fallback = AudioResampler(format="s16", layout="mono", rate=frame.sample_rate)
        parts = [f.to_ndarray().reshape(-1) for f in self._fallback.resample(frame)]
        return np.concatenate(parts).astype("<i2") if parts else np.zeros(0, dtype="<i2")


class AudioIn:
    """Reads the remote audio track until it ends; every chunk goes to ``on_chunk`` with its
    format (a plain function or a coroutine function; awaited before the next frame is read,
    so a slow consumer slows the reading rather than piling chunks up)."""

    def __init__(
        self,
        track: MediaStreamTrack,
        on_chunk: Callable[[bytes, AudioFormat], Awaitable[None] | None],
        *,
        chunk_ms: int = CHUNK_MS,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        if track.kind != "audio":
            raise ValueError("AudioIn reads an audio track")
        self.track = track
        self.inbound = InboundAudio(chunk_ms=chunk_ms)
        self.on_chunk = on_chunk
        self.on_end = on_end
        self.chunks = 0
        self.last_frame_at: float | None = None  # time.monotonic() of the last frame read
        self._task: asyncio.Task[None] | None = None

    def start(self) -> asyncio.Task[None]:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="webrtc-audio-in")
        return self._task

    async def run(self) -> None:
        try:
            while True:
                try:
                    frame = await self.track.recv()
                except MediaStreamError:
                    break
                if not isinstance(frame, AudioFrame):
                    continue
                self.last_frame_at = time.monotonic()
                for chunk, fmt in self.inbound.push(frame):
                    await self._deliver(chunk, fmt)
            for chunk, fmt in self.inbound.flush():
                await self._deliver(chunk, fmt)
        finally:
            if self.on_end is not None:
                self.on_end()

    async def _deliver(self, chunk: bytes, fmt: AudioFormat) -> None:
        self.chunks += 1
        result = self.on_chunk(chunk, fmt)
        if inspect.isawaitable(result):
            await result

    async def stop(self) -> None:
        """Stop reading (the track itself belongs to the peer connection)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
