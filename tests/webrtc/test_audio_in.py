"""Decoded frames -> mono PCM16 chunks at the session's rate (the Sans-I/O half of audio_in;
the real Opus track: test_loopback.py)."""

from __future__ import annotations

import numpy as np
import pytest
from av import AudioFrame

from gateway.transport.webrtc.audio_in import InboundAudio


def frame(
    left: np.ndarray, right: np.ndarray | None = None, *, pts: int, rate: int = 48000, fmt: str = "s16"
) -> AudioFrame:
    channels = [left] if right is None else [left, right]
    layout = "mono" if right is None else "stereo"
    if fmt == "s16":
        arr = np.stack(channels, axis=1).reshape(1, -1).astype(np.int16)
    elif fmt == "fltp":
        arr = (np.stack(channels) / 32768.0).astype(np.float32)
    elif fmt == "s32":
        arr = (np.stack(channels, axis=1).reshape(1, -1).astype(np.int32) << 16).astype(np.int32)
    else:
        raise AssertionError(fmt)
    out = AudioFrame.from_ndarray(arr, format=fmt, layout=layout)
    out.sample_rate = rate
    out.pts = pts
    return out


def tone(hz: float, n: int, start: int = 0, rate: int = 48000, amp: float = 8000) -> np.ndarray:
    t = (np.arange(n) + start) / rate
    return (amp * np.sin(2 * np.pi * hz * t)).astype(np.int16)


def dominant_hz(pcm: bytes, rate: int) -> float:
    x = np.frombuffer(pcm, dtype="<i2").astype(float)
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1 / rate)[int(np.argmax(spectrum))])


def run(inbound: InboundAudio, frames: list[AudioFrame]) -> tuple[list[bytes], bytes]:
    chunks = [c for f in frames for c in inbound.push(f)]
    return chunks, inbound.flush()


def test_stereo_48k_becomes_mono_16k_in_20_ms_chunks() -> None:
    inbound = InboundAudio(16000)
    frames = [frame(tone(440, 960, 960 * i), tone(440, 960, 960 * i), pts=960 * i) for i in range(50)]
    chunks, tail = run(inbound, frames)
    assert chunks and all(len(c) == 640 for c in chunks)  # 20 ms at 16 kHz
    total = len(b"".join(chunks) + tail) // 2
    assert abs(total - 16000) <= 16  # one second in, one second out (soxr releases its tail on flush)
    assert dominant_hz(b"".join(chunks), 16000) == pytest.approx(440, abs=2)
    assert inbound.gaps_filled_ms == 0


def test_channels_are_averaged() -> None:
    inbound = InboundAudio(48000)
    chunks, _ = run(inbound, [frame(np.full(960, 1000), np.full(960, 3000), pts=0)])
    assert np.frombuffer(chunks[0], dtype="<i2").tolist() == [2000] * 960


def test_a_hole_in_the_timestamps_is_filled_with_silence() -> None:
    inbound = InboundAudio(48000)
    ones = np.full(960, 1000)
    frames = [frame(ones, ones, pts=0), frame(ones, ones, pts=960), frame(ones, ones, pts=960 * 5)]  # 3 frames lost
    chunks, _ = run(inbound, frames)
    out = np.frombuffer(b"".join(chunks), dtype="<i2")
    assert len(out) == 960 * 6
    assert (out[: 960 * 2] == 1000).all() and not out[960 * 2 : 960 * 5].any() and (out[960 * 5 :] == 1000).all()
    assert inbound.gaps_filled_ms == pytest.approx(60)


def test_a_long_silence_is_capped_and_old_frames_fill_nothing() -> None:
    inbound = InboundAudio(48000, max_gap_ms=100)
    ones = np.full(960, 1000)
    chunks, _ = run(inbound, [frame(ones, pts=0), frame(ones, pts=48000 * 30)])  # 30 s later
    assert len(b"".join(chunks)) // 2 == 960 * 2 + 4800  # at most 100 ms of fill
    late = InboundAudio(48000)
    chunks, _ = run(late, [frame(ones, pts=9600), frame(ones, pts=0)])  # reordered: nothing to fill
    assert len(b"".join(chunks)) // 2 == 1920 and late.gaps_filled_ms == 0


def test_the_rtp_timestamp_may_wrap() -> None:
    inbound = InboundAudio(48000)
    ones = np.full(960, 1000)
    start = (1 << 32) - 960
    chunks, _ = run(inbound, [frame(ones, pts=start), frame(ones, pts=0), frame(ones, pts=960)])
    assert len(b"".join(chunks)) // 2 == 960 * 3 and inbound.gaps_filled_ms == 0


@pytest.mark.parametrize("fmt", ["fltp", "s32"])
def test_other_sample_formats(fmt: str) -> None:
    inbound = InboundAudio(24000)
    frames = [frame(tone(1000, 960, 960 * i), tone(1000, 960, 960 * i), pts=960 * i, fmt=fmt) for i in range(25)]
    chunks, _ = run(inbound, frames)
    assert all(len(c) == 960 for c in chunks)
    pcm = b"".join(chunks)
    assert dominant_hz(pcm, 24000) == pytest.approx(1000, abs=3)
    rms = float(np.sqrt(np.mean(np.frombuffer(pcm, dtype="<i2").astype(float) ** 2)))
    assert rms == pytest.approx(8000 / np.sqrt(2), rel=0.05)


def test_a_change_of_source_rate_is_followed() -> None:
    inbound = InboundAudio(16000)
    first = [frame(tone(440, 960, 960 * i), pts=960 * i) for i in range(10)]
    second = [frame(tone(440, 480, 480 * i, rate=24000), pts=480 * i, rate=24000) for i in range(10)]
    chunks, tail = run(inbound, first + second)
    assert abs(len(b"".join(chunks) + tail) // 2 - 6400) <= 16


def test_bad_rates() -> None:
    with pytest.raises(ValueError):
        InboundAudio(0)
    with pytest.raises(ValueError):
        InboundAudio(22050, chunk_ms=7)
