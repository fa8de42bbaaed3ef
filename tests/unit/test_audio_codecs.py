"""G.711 and PCM conversions, checked bit-exact against CPython's audioop."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from gateway.audio.codecs import (
    AudioFormat,
    alaw_decode,
    alaw_encode,
    decode_to_pcm16,
    encode_from_pcm16,
    float_to_pcm16,
    pcm16_to_float,
    ulaw_decode,
    ulaw_encode,
)

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

ALL_PCM = np.arange(-32768, 32768, dtype="<i2").tobytes()  # every 16-bit sample
ALL_CODES = bytes(range(256))


def test_ulaw_encode_matches_audioop_for_every_sample() -> None:
    assert ulaw_encode(ALL_PCM) == audioop.lin2ulaw(ALL_PCM, 2)


def test_alaw_encode_matches_audioop_for_every_sample() -> None:
    assert alaw_encode(ALL_PCM) == audioop.lin2alaw(ALL_PCM, 2)


def test_ulaw_decode_matches_audioop_for_every_code() -> None:
    assert ulaw_decode(ALL_CODES) == audioop.ulaw2lin(ALL_CODES, 2)


def test_alaw_decode_matches_audioop_for_every_code() -> None:
    assert alaw_decode(ALL_CODES) == audioop.alaw2lin(ALL_CODES, 2)


def test_g711_round_trip_is_idempotent_after_first_pass() -> None:
    # decode(encode(x)) quantises; quantising again changes nothing.
    for enc, dec in ((ulaw_encode, ulaw_decode), (alaw_encode, alaw_decode)):
        once = dec(enc(ALL_PCM))
        assert dec(enc(once)) == once


def test_encoders_drop_a_trailing_odd_byte() -> None:
    assert ulaw_encode(b"\x00\x10\x07") == ulaw_encode(b"\x00\x10")
    assert alaw_encode(b"\x07") == b""


def test_pcm16_float_round_trip_and_clipping() -> None:
    pcm = np.array([0, 1000, -1000, 32767, -32767], dtype="<i2").tobytes()
    f = pcm16_to_float(pcm)
    assert f.dtype == np.float32
    assert np.all(np.abs(f) <= 1.0)
    back = np.frombuffer(float_to_pcm16(f), dtype="<i2")
    assert np.all(np.abs(back.astype(int) - np.frombuffer(pcm, "<i2")) <= 1)
    clipped = np.frombuffer(float_to_pcm16([2.0, -3.0]), dtype="<i2")
    assert clipped.tolist() == [32767, -32767]


def test_audio_format_sizes_and_durations() -> None:
    assert AudioFormat("pcm16", 24000).bytes_per_sample == 2
    assert AudioFormat("pcmu", 8000).bytes_per_sample == 1
    assert AudioFormat("pcm16", 24000).duration_ms(4800) == pytest.approx(100.0)
    assert AudioFormat("pcma", 8000).duration_ms(160) == pytest.approx(20.0)


@pytest.mark.parametrize("codec", ["pcm16", "pcmu", "pcma"])
def test_format_encode_decode_round_trip(codec: str) -> None:
    fmt = AudioFormat(codec, 8000)  # type: ignore[arg-type]
    pcm = (np.sin(np.arange(800) / 10) * 12000).astype("<i2").tobytes()
    wire = encode_from_pcm16(fmt, pcm)
    assert len(wire) == len(pcm) // 2 * fmt.bytes_per_sample
    back = np.frombuffer(decode_to_pcm16(fmt, wire), dtype="<i2").astype(int)
    err = np.abs(back - np.frombuffer(pcm, "<i2")).max()
    assert err <= (0 if codec == "pcm16" else 400)  # G.711 step at ~12000 is 256-512
