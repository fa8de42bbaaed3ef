"""The trailer of a fragmented MP4 stream (pure): its random-access index.

vLLM-Omni's ``/v1/realtime/video`` ends a completed stream with a ``trailer``
chunk: the bytes its encoder writes when it closes. For fragmented MP4 that
is the ``mfra`` box (ISO/IEC 14496-12, 8.8.9-8.8.11): a ``tfra`` entry per
fragment (its decode time and the byte offset of its ``moof`` in the stream)
and an ``mfro`` box giving the ``mfra`` size, so that a player can seek a
saved stream from its end. The gateway builds it from the fragments it
actually delivered (a chunk dropped for a slow client is not in it), so the
offsets are those of the bytes the client holds.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator


def _boxes(data: bytes, start: int = 0, end: int | None = None) -> Iterator[tuple[bytes, int, int]]:
    """(type, payload start, box end) of each box in ``data[start:end]``."""
    end = len(data) if end is None else end
    pos = start
    while pos + 8 <= end:
        size = int.from_bytes(data[pos : pos + 4], "big")
        kind = data[pos + 4 : pos + 8]
        header = 8
        if size == 1 and pos + 16 <= end:
            size, header = int.from_bytes(data[pos + 8 : pos + 16], "big"), 16
        if size < header or pos + size > end:
            return
        yield kind, pos + header, pos + size
        pos += size


def fragment_info(fragment: bytes) -> tuple[int, int, int] | None:
    """(offset of its ``moof`` in ``fragment``, track id, base decode time), or None when
    ``fragment`` holds no ``moof`` with a ``tfhd`` and a ``tfdt``."""
    for kind, body, end in _boxes(fragment):
        if kind != b"moof":
            continue
        for traf_kind, traf_body, traf_end in _boxes(fragment, body, end):
            if traf_kind != b"traf":
                continue
            track: int | None = None
            time: int | None = None
            for inner, payload, _ in _boxes(fragment, traf_body, traf_end):
                if inner == b"tfhd":
                    track = int.from_bytes(fragment[payload + 4 : payload + 8], "big")
                elif inner == b"tfdt":
                    version = fragment[payload]
                    width = 8 if version == 1 else 4
                    time = int.from_bytes(fragment[payload + 4 : payload + 4 + width], "big")
            if track is not None and time is not None:
                return body - 8, track, time
    return None


def mfra(track_id: int, entries: list[tuple[int, int]]) -> bytes:
    """The ``mfra`` box for ``entries`` of (decode time, moof offset), one sample each."""
    tfra_body = struct.pack(">IIII", 1 << 24, track_id, 0, len(entries))  # version 1; 1-byte numbers
    tfra_body += b"".join(struct.pack(">QQBBB", time, offset, 1, 1, 1) for time, offset in entries)
    tfra = struct.pack(">I", 8 + len(tfra_body)) + b"tfra" + tfra_body
    size = 8 + len(tfra) + 16
    mfro = struct.pack(">I", 16) + b"mfro" + struct.pack(">II", 0, size)
    return struct.pack(">I", size) + b"mfra" + tfra + mfro
