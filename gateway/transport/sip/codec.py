"""A SIP call's audio codec: RTP payloads <-> PCM16 mono at the codec's clock rate, Sans-I/O.

G.711 (PCMU, PCMA) at 8 kHz is the gateway's own table codec (``gateway/audio/codecs.py``).
Opus (RFC 7587: ``opus/48000/2``, a 48 kHz RTP clock) is libopus through PyAV, which the
webrtc extra already brings for aiortc: decoded to mono at 48 kHz (a stereo sender is mixed
down by libopus), encoded as mono 20 ms frames (RFC 7587 lets a sender send mono on the
``/2`` format; ``stereo=0`` in our fmtp says we want mono back). Either way the PCM is handed
on at the codec's rate, and the session converts it to what the engine takes in one step
(``Door.receive_audio``), as the engine's answers are converted to it in one step (``call.py``).
"""

from __future__ import annotations

import fractions
from typing import Protocol

import numpy as np

from gateway.audio.codecs import AudioFormat, decode_to_pcm16, encode_from_pcm16

OPUS_RATE = 48000
OPUS_BITRATE = 32000  # bits/s: wideband speech at 20 ms frames (the voip application)
_OPUS_FRAME_MS = (10, 20, 40, 60)  # SILK configurations 0-11, by config % 4
_HYBRID_FRAME_MS = (10, 20)  # configurations 12-15
_CELT_FRAME_TENTHS = (25, 50, 100, 200)  # configurations 16-31 (2.5 ms steps)


class PayloadCodec(Protocol):
    name: str  # as in the SDP's rtpmap: PCMU, PCMA, opus
    rate: int  # the RTP clock and the PCM's sample rate

    def samples(self, payload: bytes) -> int: ...

    def decode(self, payload: bytes) -> bytes: ...

    def encode(self, pcm: bytes) -> bytes: ...


class G711:
    def __init__(self, name: str) -> None:
        self.name = name
        self.rate = 8000
        self._format = AudioFormat("pcmu" if name == "PCMU" else "pcma", 8000)

    def samples(self, payload: bytes) -> int:
        return len(payload)  # a byte a sample

    def decode(self, payload: bytes) -> bytes:
        return decode_to_pcm16(self._format, payload)

    def encode(self, pcm: bytes) -> bytes:
        return encode_from_pcm16(self._format, pcm)


def opus_samples(payload: bytes) -> int:
    """The samples at 48 kHz an Opus packet holds (RFC 6716 3.1: its TOC byte), 0 when malformed."""
    if not payload:
        return 0
    toc = payload[0]
    config = toc >> 3
    if config < 12:
        per_frame = 48 * _OPUS_FRAME_MS[config % 4]
    elif config < 16:
        per_frame = 48 * _HYBRID_FRAME_MS[config % 2]
    else:
        per_frame = 48 * _CELT_FRAME_TENTHS[config % 4] // 10
    code = toc & 3
    if code == 0:
        frames = 1
    elif code in (1, 2):
        frames = 2
    else:
        if len(payload) < 2:
            return 0
        frames = payload[1] & 0x3F
    total = frames * per_frame
    return total if total <= 120 * 48 else 0  # RFC 6716: at most 120 ms a packet


class Opus:
    name = "opus"
    rate = OPUS_RATE

    def __init__(self) -> None:
        from av import AudioFrame, CodecContext  # the webrtc extra (PyAV), as the SIP media needs anyway

        self._frame = AudioFrame
        dec = CodecContext.create("libopus", "r")
        dec.format = "s16"
        dec.layout = "mono"
        dec.sample_rate = OPUS_RATE
        self._dec = dec
        enc = CodecContext.create("libopus", "w")
        enc.format = "s16"
        enc.layout = "mono"
        enc.sample_rate = OPUS_RATE
        enc.bit_rate = OPUS_BITRATE
        enc.time_base = fractions.Fraction(1, OPUS_RATE)
        enc.options = {"application": "voip"}
        self._enc = enc
        self._pts = 0
        self.decode_errors = 0

    def samples(self, payload: bytes) -> int:
        return opus_samples(payload)

    def decode(self, payload: bytes) -> bytes:
        from av.packet import Packet

        try:
            frames = self._dec.decode(Packet(payload))
        except Exception:  # (PyAV's InvalidDataError): a corrupt packet is dropped, the call goes on
            self.decode_errors += 1
            return b""
        return b"".join(f.to_ndarray().astype("<i2", copy=False).tobytes() for f in frames)

    def encode(self, pcm: bytes) -> bytes:
        """One 20 ms frame (960 samples) of PCM16 at 48 kHz -> one Opus packet."""
        samples = np.frombuffer(pcm, dtype="<i2").reshape(1, -1)
        frame = self._frame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate = OPUS_RATE
        frame.pts = self._pts
        self._pts += samples.shape[1]
        return b"".join(bytes(p) for p in self._enc.encode(frame))


def codec_for(name: str) -> PayloadCodec:
    return Opus() if name == "opus" else G711(name)
