"""Encode server events for the wire (pure).

The session builds every event in the GA shape, as a dict whose ``type`` is
the GA name. Here it becomes bytes for the socket: JSON text (with the beta
names for beta clients), or, on the binary fast path, a binary frame for audio
deltas. (The client's side of the frames, encoding input and decoding output, is
the SDK's: ``omni_gateway_client/frames.py``, which the tests use too.)

Binary frames (subprotocol ``omni-binary.v1``), all integers big-endian:

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

import base64
import struct
from typing import Any

import orjson

from gateway.protocol.errors import Code, ProtocolError

BINARY_SUBPROTOCOL = "omni-binary.v1"
KIND_INPUT_AUDIO = 1
KIND_OUTPUT_AUDIO = 2
_OUT_FIXED = struct.Struct(">BBHQB")  # kind, header length, content_index, seq, item id length

AUDIO_DELTA = "response.output_audio.delta"

# GA name -> beta name, for clients that asked for the beta protocol.
BETA_NAMES = {
    "conversation.item.added": "conversation.item.created",
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
}
# Beta clients never saw these; they get the beta equivalent or nothing.
BETA_DROPPED = frozenset({"conversation.item.done"})


def encode_ga(event: dict[str, Any]) -> bytes:
    """A GA session's event as sent and journaled."""
    return encode_json(event, beta=False)


def encode_beta(event: dict[str, Any]) -> bytes | None:
    """A beta session's event as sent and journaled; None: the beta protocol has no such event."""
    return None if event["type"] in BETA_DROPPED else encode_json(event, beta=True)


def encode_json(event: dict[str, Any], *, beta: bool) -> bytes:
    """One server event as JSON; audio deltas carry raw bytes and are base64'd here."""
    if beta:
        name = event["type"]
        beta_name = BETA_NAMES.get(name)
        if beta_name is not None:
            event = {**event, "type": beta_name}
    delta = event.get("delta")
    if isinstance(delta, bytes | bytearray | memoryview):
        event = {**event, "delta": base64.b64encode(delta).decode("ascii")}
    return orjson.dumps(event)


def encode_audio_frame(event: dict[str, Any]) -> bytes:
    """A ``response.output_audio.delta`` event as one binary frame."""
    item_id = event["item_id"].encode("ascii")
    fixed = _OUT_FIXED.size + len(item_id)
    header_len = (fixed + 3) & ~3
    if header_len > 255:
        raise ValueError("item_id too long for a binary frame header")
    header = _OUT_FIXED.pack(
        KIND_OUTPUT_AUDIO, header_len, event["content_index"], event["server_event_seq"], len(item_id)
    )
    return b"".join((header, item_id, bytes(header_len - fixed), bytes(event["delta"])))


def decode_input_frame(frame: bytes) -> bytes:
    """The audio carried by a client's binary frame; ProtocolError if malformed."""
    if len(frame) < 4 or frame[0] != KIND_INPUT_AUDIO:
        raise ProtocolError(
            Code.INVALID_AUDIO,
            f"Binary frames must start with kind byte {KIND_INPUT_AUDIO} and 3 reserved bytes "
            "(input audio); see docs/realtime.md, 'The binary fast path'.",
            param="binary",
        )
    return frame[4:]
