"""StreamResampler: chunked output equals one-shot output, with nothing lost."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.audio.resample import HALF_TAPS, StreamResampler, resample_once


def _tone(rate: int, seconds: float, freq: float = 440.0) -> bytes:
    t = np.arange(int(rate * seconds)) / rate
    return (np.sin(2 * np.pi * freq * t) * 10000).astype("<i2").tobytes()


def _chunked(r: StreamResampler, pcm: bytes, chunk: int) -> bytes:
    return b"".join(r.process(pcm[i : i + chunk]) for i in range(0, len(pcm), chunk)) + r.flush()


@pytest.mark.parametrize(
    ("src", "dst"), [(24000, 16000), (16000, 24000), (22050, 16000), (22050, 24000), (8000, 16000)]
)
def test_chunked_output_matches_one_shot(src: int, dst: int) -> None:
    pcm = _tone(src, 1.0)
    # 10 ms chunks with an odd byte count, so chunks also split samples.
    out = _chunked(StreamResampler(src, dst), pcm, src // 100 * 2 + 1)
    one = resample_once(pcm, src, dst)
    expected = len(pcm) // 2 * dst / src
    assert abs(len(out) // 2 - expected) <= 4
    assert abs(len(out) - len(one)) <= 8
    a = np.frombuffer(out, "<i2").astype(int)
    b = np.frombuffer(one, "<i2").astype(int)
    n = min(len(a), len(b))
    assert np.abs(a[:n] - b[:n]).max() <= 4  # same samples, no gap or repeat


def test_chunked_output_is_continuous() -> None:
    src, dst = 22050, 16000
    out = np.frombuffer(_chunked(StreamResampler(src, dst), _tone(src, 1.0, 200.0), 441 * 2), "<i2")
    # A 200 Hz tone moves at most ~800 per sample at 16 kHz: a dropped or
    # repeated block would show as a jump well above that.
    steps = np.abs(np.diff(out[200:-200].astype(int)))
    assert steps.max() < 1000


def test_identity_returns_input_without_copy() -> None:
    r = StreamResampler(16000, 16000)
    pcm = _tone(16000, 0.1)
    assert r.identity
    assert r.process(pcm) is pcm
    assert r.flush() == b""
    assert resample_once(pcm, 16000, 16000) is pcm


def test_process_after_flush_raises() -> None:
    r = StreamResampler(24000, 16000)
    r.process(_tone(24000, 0.05))
    r.flush()
    with pytest.raises(RuntimeError):
        r.process(b"\x00\x00")


# --- the integer ratios' short filter (the telephone and WebRTC rates) -------------------

INTEGER_RATIOS = [(8000, 16000), (8000, 24000), (24000, 8000), (16000, 8000), (48000, 24000), (24000, 48000),
                  (8000, 48000), (48000, 8000)]  # fmt: skip


def _level_db(pcm: bytes, rate: int, freq: float) -> float:
    """The level of ``freq`` in ``pcm`` (its middle, past the edges), in dB of full scale."""
    x = np.frombuffer(pcm, "<i2").astype(float)[rate // 10 : -rate // 10]
    t = np.arange(len(x)) / rate
    amplitude = 2 * abs(np.dot(x, np.exp(-2j * np.pi * freq * t))) / len(x)
    return float(20 * np.log10(max(amplitude, 1e-9) / 32768))


@pytest.mark.parametrize(("src", "dst"), INTEGER_RATIOS)
def test_an_integer_ratio_holds_back_only_its_filters_half_length(src: int, dst: int) -> None:
    # soxr released its output in blocks: it held back 12-115 ms at 8 -> 16 kHz.
    r = StreamResampler(src, dst)
    pcm = _tone(src, 1.0)
    sent = received = 0
    chunk = src // 50 * 2  # 20 ms
    for i in range(0, len(pcm), chunk):
        piece = pcm[i : i + chunk]
        sent += len(piece) // 2
        received += len(r.process(piece)) // 2
        held_ms = (sent * dst / src - received) / dst * 1000
        assert held_ms <= HALF_TAPS / min(src, dst) * 1000 + 1e-6, (i, held_ms)
    received += len(r.flush()) // 2
    assert received == sent * dst // src  # nothing lost, nothing added


@pytest.mark.parametrize(("src", "dst"), INTEGER_RATIOS)
def test_an_integer_ratios_output_is_time_aligned_and_in_band_tones_pass(src: int, dst: int) -> None:
    click = np.zeros(src // 10, dtype="<i2")
    click[src // 20] = 20000
    r = StreamResampler(src, dst)
    out = np.frombuffer(r.process(click.tobytes()) + r.flush(), "<i2")
    assert abs(int(np.argmax(np.abs(out))) - src // 20 * dst // src) <= 1  # where it was: no delay added
    low = min(src, dst)
    for freq in (300.0, 1000.0, 0.4 * low):  # the telephone band at 8 kHz, and up to 80 % of Nyquist
        tone = _tone(src, 1.0, freq)
        assert abs(_level_db(resample_once(tone, src, dst), dst, freq) - _level_db(tone, src, freq)) < 0.1, freq


@pytest.mark.parametrize(("src", "dst"), [(24000, 8000), (48000, 24000), (16000, 8000)])
def test_going_down_a_tone_above_the_new_nyquist_does_not_alias(src: int, dst: int) -> None:
    freq = dst * 0.56  # above dst's Nyquist (0.5): it would fold to dst * 0.44
    out = resample_once(_tone(src, 1.0, freq), src, dst)
    assert _level_db(out, dst, dst - freq) < _level_db(_tone(src, 1.0, freq), src, freq) - 60


@pytest.mark.parametrize(("src", "dst"), [(8000, 24000), (24000, 48000), (8000, 16000)])
def test_going_up_the_image_of_a_tone_is_suppressed(src: int, dst: int) -> None:
    freq = src * 0.3
    out = resample_once(_tone(src, 1.0, freq), src, dst)
    assert _level_db(out, dst, src - freq) < _level_db(out, dst, freq) - 60  # the first image, at src - freq
