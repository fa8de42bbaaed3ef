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


class Timeline:
    """The caller's audio timeline from RTP: a packet older than the last one taken (late,
    reordered, duplicated) is dropped, so no audio is heard twice or out of order; a gap in
    the timestamps (lost packets, the caller's silence suppression) is filled with silence,
    up to ``max_gap`` samples, so the session's input time stays on the caller's clock (its
    speech events' ``audio_start_ms``/``audio_end_ms``). A jump beyond that is a new timeline
    (a restarted sender), taken without filling."""

    def __init__(self, max_gap: int = 8000) -> None:
        self.max_gap = max_gap
        self._seq: int | None = None  # the last sequence number taken
        self._next_ts: int | None = None  # the timestamp the next packet should carry
        self.dropped = 0
        self.filled = 0  # samples of silence put in

    def push(self, packet: RtpPacket, samples: int) -> int | None:
        """Take ``packet`` (``samples`` long): the samples of silence to put before it, or None:
        drop it."""
        if self._seq is not None:
            ahead = (packet.sequence - self._seq) & 0xFFFF
            if ahead == 0 or ahead >= 0x8000:  # a duplicate, or older than the last taken
                self.dropped += 1
                return None
        self._seq = packet.sequence
        gap = 0
        if self._next_ts is not None:
            gap = (packet.timestamp - self._next_ts) & 0xFFFFFFFF
            if gap >= 0x80000000 or gap > self.max_gap:
                gap = 0  # behind (a sender that went back) or a new timeline: nothing to fill
        self._next_ts = (packet.timestamp + samples) & 0xFFFFFFFF
        self.filled += gap
        return gap
