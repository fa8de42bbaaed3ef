"""Decoded frames -> mono PCM16 chunks at the frames' own rate, never resampled (the Sans-I/O
half of audio_in; the session converts them to the engine's rate in one step:
tests/unit/test_one_conversion.py; the real Opus track: test_loopback.py)."""

from __future__ import annotations

import numpy as np
import pytest
from av import AudioFrame

from gateway.audio.codecs import AudioFormat
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
    tail = inbound.flush()
    assert all(fmt == inbound.format for _, fmt in chunks + tail)
    return [c for c, _ in chunks], b"".join(c for c, _ in tail)


def test_stereo_48k_becomes_mono_48k_in_20_ms_chunks_unresampled() -> None:
    inbound = InboundAudio()
    frames = [frame(tone(440, 960, 960 * i), tone(440, 960, 960 * i), pts=960 * i) for i in range(50)]
    chunks, tail = run(inbound, frames)
    assert inbound.format == AudioFormat("pcm16", 48000)
    assert len(chunks) == 50 and all(len(c) == 1920 for c in chunks) and tail == b""  # 20 ms at 48 kHz
    # Identical channels: the mono stream is the left channel, sample for sample (nothing resampled).
    assert b"".join(chunks) == tone(440, 960 * 50).astype("<i2").tobytes()
    assert inbound.gaps_filled_ms == 0


def test_channels_are_averaged() -> None:
    inbound = InboundAudio()
    chunks, _ = run(inbound, [frame(np.full(960, 1000), np.full(960, 3000), pts=0)])
    assert np.frombuffer(chunks[0], dtype="<i2").tolist() == [2000] * 960


def test_a_hole_in_the_timestamps_is_filled_with_silence() -> None:
    inbound = InboundAudio()
    ones = np.full(960, 1000)
    frames = [frame(ones, ones, pts=0), frame(ones, ones, pts=960), frame(ones, ones, pts=960 * 5)]  # 3 frames lost
    chunks, _ = run(inbound, frames)
    out = np.frombuffer(b"".join(chunks), dtype="<i2")
    assert len(out) == 960 * 6
    assert (out[: 960 * 2] == 1000).all() and not out[960 * 2 : 960 * 5].any() and (out[960 * 5 :] == 1000).all()
    assert inbound.gaps_filled_ms == pytest.approx(60)


def test_a_long_silence_is_capped_and_old_frames_fill_nothing() -> None:
    inbound = InboundAudio(max_gap_ms=100)
    ones = np.full(960, 1000)
    chunks, _ = run(inbound, [frame(ones, pts=0), frame(ones, pts=48000 * 30)])  # 30 s later
    assert len(b"".join(chunks)) // 2 == 960 * 2 + 4800  # at most 100 ms of fill
    late = InboundAudio()
    chunks, _ = run(late, [frame(ones, pts=9600), frame(ones, pts=0)])  # reordered: nothing to fill
    assert len(b"".join(chunks)) // 2 == 1920 and late.gaps_filled_ms == 0


def test_the_rtp_timestamp_may_wrap() -> None:
    inbound = InboundAudio()
    ones = np.full(960, 1000)
    start = (1 << 32) - 960
    chunks, _ = run(inbound, [frame(ones, pts=start), frame(ones, pts=0), frame(ones, pts=960)])
    assert len(b"".join(chunks)) // 2 == 960 * 3 and inbound.gaps_filled_ms == 0


@pytest.mark.parametrize("fmt", ["fltp", "s32"])
def test_other_sample_formats(fmt: str) -> None:
    inbound = InboundAudio()
    frames = [frame(tone(1000, 960, 960 * i), tone(1000, 960, 960 * i), pts=960 * i, fmt=fmt) for i in range(25)]
    chunks, _ = run(inbound, frames)
    assert len(chunks) == 25 and all(len(c) == 1920 for c in chunks)
    pcm = b"".join(chunks)
    assert dominant_hz(pcm, 48000) == pytest.approx(1000, abs=3)
    rms = float(np.sqrt(np.mean(np.frombuffer(pcm, dtype="<i2").astype(float) ** 2)))
    assert rms == pytest.approx(8000 / np.sqrt(2), rel=0.05)


def test_a_change_of_source_rate_is_followed() -> None:
    inbound = InboundAudio()
    first = [frame(tone(440, 900, 900 * i), pts=900 * i) for i in range(10)]  # 18.75 ms frames: a part left
    second = [frame(tone(440, 480, 480 * i, rate=24000), pts=480 * i, rate=24000) for i in range(10)]
    out = [c for f in first + second for c in inbound.push(f)] + inbound.flush()
    at_48k = [c for c, fmt in out if fmt == AudioFormat("pcm16", 48000)]
    at_24k = [c for c, fmt in out if fmt == AudioFormat("pcm16", 24000)]
    assert len(at_48k) + len(at_24k) == len(out)
    assert len(b"".join(at_48k)) == 2 * 9000 and len(b"".join(at_24k)) == 2 * 4800  # nothing lost, nothing added
    assert len(at_48k[-1]) < 1920  # what was left at the old rate went out before the new rate's audio


def test_bad_rates() -> None:
    with pytest.raises(ValueError):
        InboundAudio(chunk_ms=0)
    with pytest.raises(ValueError):
        InboundAudio(chunk_ms=7).push(frame(np.zeros(441, dtype=np.int16), pts=0, rate=22050))
