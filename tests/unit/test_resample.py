"""StreamResampler: chunked output equals one-shot output, with nothing lost."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.audio.resample import StreamResampler, resample_once


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
