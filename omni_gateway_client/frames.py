"""The binary fast path's frame codec (subprotocol ``omni-binary.v1``).

A copy of the gateway's layout, kept here so the SDK needs nothing but
``websockets`` and ``orjson``. All integers are big-endian.

Client -> server, input audio (same as ``input_audio_buffer.append``)::

    u8  kind = 1
    u8  reserved (0) x 3
    ..  audio bytes in the session's input format

Server -> client, output audio (same as ``response.output_audio.delta``)::

    u8  kind = 2
    u8  header length H, a multiple of 4 (the payload stays 4-byte aligned)
    u16 content_index
    u64 server_event_seq
    u8  item_id length L, then L bytes of ASCII item_id, zero padding up to H
    ..  audio bytes in the session's output format
"""

from __future__ import annotations

import struct
from typing import Any

BINARY_SUBPROTOCOL = "omni-binary.v1"
KIND_INPUT_AUDIO = 1
KIND_OUTPUT_AUDIO = 2
AUDIO_DELTA = "response.output_audio.delta"
BETA_AUDIO_DELTA = "response.audio.delta"

_INPUT_HEADER = bytes((KIND_INPUT_AUDIO, 0, 0, 0))
_OUT_FIXED = struct.Struct(">BBHQB")  # kind, header length, content_index, seq, item id length


class FrameError(ValueError):
    """A binary frame that does not follow the layout above."""


def encode_input_frame(audio: bytes | bytearray | memoryview) -> bytes:
    """Input audio as one client -> server binary frame."""
    return _INPUT_HEADER + bytes(audio)


def decode_input_frame(frame: bytes) -> bytes:
    """The audio in a client -> server frame (for fakes and tests)."""
    if len(frame) < 4 or frame[0] != KIND_INPUT_AUDIO:
        raise FrameError(f"not an input audio frame (kind {frame[0] if frame else None})")
    return frame[4:]


def encode_audio_frame(*, item_id: str, content_index: int, server_event_seq: int, audio: bytes) -> bytes:
    """An output audio delta as one server -> client frame (for fakes and tests)."""
    raw_id = item_id.encode("ascii")
    fixed = _OUT_FIXED.size + len(raw_id)
    header_len = (fixed + 3) & ~3
    if header_len > 255:
        raise FrameError("item_id too long for a binary frame header")
    header = _OUT_FIXED.pack(KIND_OUTPUT_AUDIO, header_len, content_index, server_event_seq, len(raw_id))
    return b"".join((header, raw_id, bytes(header_len - fixed), audio))


def decode_audio_frame(frame: bytes, *, event_type: str = AUDIO_DELTA) -> dict[str, Any]:
    """A server -> client frame as the dict a JSON audio delta would give, ``delta`` as bytes.

    The frame carries no ``event_id``, ``response_id`` or ``output_index``; the
    client fills the last two in from ``response.output_item.added`` when it
    has seen it.
    """
    if len(frame) < _OUT_FIXED.size:
        raise FrameError(f"binary frame of {len(frame)} bytes is shorter than its fixed header")
    kind, header_len, content_index, seq, id_len = _OUT_FIXED.unpack_from(frame)
    if kind != KIND_OUTPUT_AUDIO:
        raise FrameError(f"not an output audio frame (kind {kind})")
    if header_len % 4 or header_len < _OUT_FIXED.size + id_len or header_len > len(frame):
        raise FrameError(f"bad header length {header_len} (item id length {id_len}, frame {len(frame)} bytes)")
    try:
        item_id = frame[_OUT_FIXED.size : _OUT_FIXED.size + id_len].decode("ascii")
    except UnicodeDecodeError:
        raise FrameError("item_id is not ASCII") from None
    return {
        "type": event_type,
        "server_event_seq": seq,
        "item_id": item_id,
        "content_index": content_index,
        "delta": bytes(frame[header_len:]),
    }
