"""PCM16 <-> float and ITU-T G.711 (µ-law, A-law) codecs, in pure numpy.

All PCM here is 16-bit signed little-endian mono. G.711 is a per-sample
mapping, so every direction is one table lookup: 256-entry decode tables and
65536-entry encode tables (indexed by the int16 sample reinterpreted as
uint16), built once at import (about 0.2 MB, a few milliseconds). The tables
are computed with the segment arithmetic of the ITU reference (the Sun
``g711.c`` that ``audioop`` also uses), so output is bit-exact with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

Codec = Literal["pcm16", "pcmu", "pcma"]

_I16 = np.dtype("<i2")


def pcm16_to_float(b: bytes) -> npt.NDArray[np.float32]:
    """PCM16 bytes -> float32 samples in [-1, 1). A trailing odd byte is dropped."""
    n = len(b) // 2
    return np.frombuffer(b, dtype=_I16, count=n).astype(np.float32) / 32768.0


def float_to_pcm16(a: npt.ArrayLike) -> bytes:
    """Float samples -> PCM16 bytes; values outside [-1, 1] are clipped."""
    x = np.clip(np.asarray(a, dtype=np.float32), -1.0, 1.0)
    # Scale by 32767 so +1.0 maps to the largest positive sample without overflow.
    return (np.rint(x * 32767.0)).astype(_I16).tobytes()


# --- µ-law --------------------------------------------------------------------

_ULAW_BIAS = 0x84  # 132, added to the magnitude before segment search
_ULAW_CLIP = 8159  # largest 14-bit magnitude µ-law can represent


def _ulaw_decode_table() -> npt.NDArray[np.int16]:
    u = (~np.arange(256, dtype=np.int32)) & 0xFF
    t = ((u & 0x0F) << 3) + _ULAW_BIAS
    t = t << ((u & 0x70) >> 4)
    return np.where(u & 0x80, _ULAW_BIAS - t, t - _ULAW_BIAS).astype(np.int16)


def _ulaw_encode_table() -> npt.NDArray[np.uint8]:
    # Every int16 value, in uint16 index order (0..32767, then -32768..-1).
    pcm = np.arange(65536, dtype=np.uint16).view(np.int16).astype(np.int32)
    v = pcm >> 2  # the reference works on 14-bit samples (arithmetic shift)
    mask = np.where(v < 0, 0x7F, 0xFF)
    mag = np.minimum(np.abs(v), _ULAW_CLIP) + (_ULAW_BIAS >> 2)
    # Segment = number of segment ends (0x3F, 0x7F, ... 0x1FFF) below the magnitude.
    seg_end = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])
    seg = np.searchsorted(seg_end, mag, side="left")
    uval = np.where(seg >= 8, 0x7F, (seg << 4) | ((mag >> (seg + 1)) & 0x0F))
    return ((uval ^ mask) & 0xFF).astype(np.uint8)


# --- A-law --------------------------------------------------------------------


def _alaw_decode_table() -> npt.NDArray[np.int16]:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    t = (a & 0x0F) << 4
    seg = (a & 0x70) >> 4
    t = np.where(seg == 0, t + 8, t + 0x108)
    t = np.where(seg > 1, t << np.maximum(seg - 1, 0), t)
    return np.where(a & 0x80, t, -t).astype(np.int16)


def _alaw_encode_table() -> npt.NDArray[np.uint8]:
    pcm = np.arange(65536, dtype=np.uint16).view(np.int16).astype(np.int32)
    v = pcm >> 3  # the reference works on 13-bit samples
    mask = np.where(v >= 0, 0xD5, 0x55)
    mag = np.where(v >= 0, v, -v - 1)
    seg_end = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])
    seg = np.searchsorted(seg_end, mag, side="left")
    quant = np.where(seg < 2, (mag >> 1) & 0x0F, (mag >> np.minimum(seg, 7)) & 0x0F)
    aval = np.where(seg >= 8, 0x7F, (seg << 4) | quant)
    return ((aval ^ mask) & 0xFF).astype(np.uint8)


_ULAW_DEC = _ulaw_decode_table()
_ULAW_ENC = _ulaw_encode_table()
_ALAW_DEC = _alaw_decode_table()
_ALAW_ENC = _alaw_encode_table()


def _decode(table: npt.NDArray[np.int16], data: bytes) -> bytes:
    codes = np.frombuffer(data, dtype=np.uint8)
    return table[codes].astype(_I16, copy=False).tobytes()


def _encode(table: npt.NDArray[np.uint8], pcm: bytes) -> bytes:
    idx = np.frombuffer(pcm, dtype=_I16, count=len(pcm) // 2).view(np.uint16)
    return table[idx].tobytes()


def ulaw_decode(data: bytes) -> bytes:
    """G.711 µ-law bytes -> PCM16 bytes (two bytes out per byte in)."""
    return _decode(_ULAW_DEC, data)


def ulaw_encode(pcm: bytes) -> bytes:
    """PCM16 bytes -> G.711 µ-law bytes. A trailing odd byte is dropped."""
    return _encode(_ULAW_ENC, pcm)


def alaw_decode(data: bytes) -> bytes:
    """G.711 A-law bytes -> PCM16 bytes (two bytes out per byte in)."""
    return _decode(_ALAW_DEC, data)


def alaw_encode(pcm: bytes) -> bytes:
    """PCM16 bytes -> G.711 A-law bytes. A trailing odd byte is dropped."""
    return _encode(_ALAW_ENC, pcm)


# --- formats ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AudioFormat:
    """A wire audio format: codec and sample rate (mono)."""

    codec: Codec
    rate: int

    @property
    def bytes_per_sample(self) -> int:
        return 2 if self.codec == "pcm16" else 1

    def duration_ms(self, nbytes: int) -> float:
        """Play time of ``nbytes`` of this format, in milliseconds."""
        return nbytes / self.bytes_per_sample * 1000.0 / self.rate


def decode_to_pcm16(fmt: AudioFormat, data: bytes) -> bytes:
    """Wire bytes in ``fmt`` -> PCM16 at ``fmt.rate`` (no resampling)."""
    if fmt.codec == "pcm16":
        return data
    if fmt.codec == "pcmu":
        return ulaw_decode(data)
    if fmt.codec == "pcma":
        return alaw_decode(data)
    raise ValueError(f"unknown codec {fmt.codec!r}")


def encode_from_pcm16(fmt: AudioFormat, pcm: bytes) -> bytes:
    """PCM16 at ``fmt.rate`` -> wire bytes in ``fmt`` (no resampling)."""
    if fmt.codec == "pcm16":
        return pcm
    if fmt.codec == "pcmu":
        return ulaw_encode(pcm)
    if fmt.codec == "pcma":
        return alaw_encode(pcm)
    raise ValueError(f"unknown codec {fmt.codec!r}")
