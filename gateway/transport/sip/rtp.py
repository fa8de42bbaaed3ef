"""RTP (RFC 3550) packets and RFC 4733 telephone-events, Sans-I/O.

``parse_rtp`` reads a packet (CSRCs, the header extension and padding skipped), ``build_rtp``
writes one. ``DtmfReceiver`` turns telephone-event packets into key presses: a press is one
RTP timestamp, sent several times (and its end three times): reported once, at its first
packet, so a caller's key reaches the session as soon as it is pressed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_HEADER = struct.Struct("!BBHII")
DTMF_KEYS = "0123456789*#ABCD"  # RFC 4733 events 0-15
_RECENT = 16  # key presses remembered against repeats


@dataclass(frozen=True, slots=True)
class RtpPacket:
    payload_type: int
    sequence: int
    timestamp: int
    ssrc: int
    marker: bool
    payload: bytes


def parse_rtp(data: bytes) -> RtpPacket | None:
    """The packet, or None when it is not RTP version 2 (or is truncated)."""
    if len(data) < 12:
        return None
    b0, b1, seq, ts, ssrc = _HEADER.unpack_from(data)
    if b0 >> 6 != 2:
        return None
    offset = 12 + 4 * (b0 & 0x0F)
    if b0 & 0x10:  # a header extension: 4 bytes, then its length in 32-bit words
        if len(data) < offset + 4:
            return None
        (words,) = struct.unpack_from("!H", data, offset + 2)
        offset += 4 + 4 * words
    end = len(data)
    if b0 & 0x20:  # padding: its count is the last byte
        end -= data[-1]
    if end < offset:
        return None
    return RtpPacket(b1 & 0x7F, seq, ts, ssrc, bool(b1 & 0x80), bytes(data[offset:end]))


def build_rtp(payload_type: int, sequence: int, timestamp: int, ssrc: int, payload: bytes, *,
              marker: bool = False) -> bytes:  # fmt: skip
    b1 = (0x80 if marker else 0) | (payload_type & 0x7F)
    return _HEADER.pack(0x80, b1, sequence & 0xFFFF, timestamp & 0xFFFFFFFF, ssrc) + payload


def build_dtmf(key: str, *, end: bool, duration: int, volume: int = 10) -> bytes:
    """A telephone-event payload for ``key`` (one of ``DTMF_KEYS``)."""
    return struct.pack("!BBH", DTMF_KEYS.index(key), (0x80 if end else 0) | (volume & 0x3F), duration & 0xFFFF)


class DtmfReceiver:
    """Telephone-event packets in, key presses out (each once)."""

    def __init__(self) -> None:
        self._seen: list[tuple[int, int]] = []  # (ssrc, timestamp) of recent presses

    def push(self, packet: RtpPacket) -> str | None:
        """The key newly pressed, or None (a repeat of a press already reported, or not an event)."""
        if len(packet.payload) < 4:
            return None
        event = packet.payload[0]
        if event >= len(DTMF_KEYS):
            return None  # other telephone events (tones, flash): not keys
        key = (packet.ssrc, packet.timestamp)
        if key in self._seen:
            return None
        self._seen.append(key)
        del self._seen[:-_RECENT]
        return DTMF_KEYS[event]
