"""Session snapshots: what a replica needs to carry a session on (pure).

A snapshot holds the configuration, the conversation, the event sequence and
epoch, and the responses that were running. It does not hold audio: the
uncommitted input buffer and running engine requests live only on the replica
that owns the session; a takeover ends them explicitly (see ``restore``).
"""

from __future__ import annotations

import base64
from typing import Any

import orjson

from gateway.audio.codecs import AudioFormat
from gateway.audio.convert import Converter, engine_format
from gateway.protocol.image_size import image_size
from gateway.protocol.session_config import SessionConfig, Transcription, TurnDetection
from gateway.session.conversation import Conversation, Item, Marks, Part
from gateway.session.response import Response

VERSION = 1


def config_from_dict(d: dict[str, Any]) -> SessionConfig:
    d = dict(d)
    d["input_format"] = AudioFormat(**d["input_format"])
    d["output_format"] = AudioFormat(**d["output_format"])
    d["output_modalities"] = tuple(d["output_modalities"])
    d["tools"] = tuple(d["tools"])
    d["include"] = tuple(d.get("include") or ())
    tr = d["transcription"]
    if tr:
        for key in ("languages", "keywords"):
            if tr.get(key) is not None:
                tr[key] = tuple(tr[key])
    d["transcription"] = Transcription(**tr) if tr else None
    d["turn_detection"] = TurnDetection(**d["turn_detection"]) if d["turn_detection"] else None
    return SessionConfig(**d)


def item_to_dict(item: Item) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": item.id,
        "role": item.role,
        "status": item.status,
        "pending": item.pending_transcription,
        "content": [part_to_dict(p) for p in item.content],
    }
    if item.type != "message":
        out.update(type=item.type, call_id=item.call_id, name=item.name, arguments=item.arguments, output=item.output)
    if item.type.startswith("mcp_"):
        out.update(server_label=item.server_label, tools=item.tools, approval_request_id=item.approval_request_id,
                   approve=item.approve, reason=item.reason, error=item.error)  # fmt: skip
    return out


def part_to_dict(part: Part) -> dict[str, Any]:
    return {
        "type": part.type,
        "text": part.text,
        "transcript": part.transcript,
        "audio_ms": part.audio_ms,
        "marks": part.marks.to_list(),
        "image_url": part.image_url,
        "detail": part.detail,
        "pixels": part.pixels,
    }


def _pixels(p: dict[str, Any]) -> int:
    """An image part's declared pixels (a snapshot written before they were kept: read again)."""
    pixels = p.get("pixels")
    if isinstance(pixels, int):
        return pixels
    url = p.get("image_url")
    if not url:
        return 0
    size = image_size(base64.b64decode(url.partition(",")[2]))
    return size[0] * size[1] if size is not None else 0


def item_from_dict(d: dict[str, Any]) -> Item:
    parts = [
        Part(
            p["type"],
            text=p["text"],
            transcript=p["transcript"],
            audio_ms=p["audio_ms"],
            marks=Marks((m[0], m[1]) for m in p["marks"]),
            image_url=p.get("image_url"),  # (snapshots written before images have none)
            detail=p.get("detail"),
            pixels=_pixels(p),
        )
        for p in d["content"]
    ]
    item = Item(d["id"], d["role"], parts, status=d["status"], pending_transcription=d["pending"])
    if d.get("type", "message") != "message":
        item.type = d["type"]
        item.call_id, item.name = d["call_id"], d["name"]
        item.arguments, item.output = d["arguments"], d["output"]
    if item.type.startswith("mcp_"):
        item.server_label, item.tools = d["server_label"], d["tools"]
        item.approval_request_id, item.approve, item.reason = d["approval_request_id"], d["approve"], d["reason"]
        item.error = d["error"]
    return item


def item_bytes(item: Item) -> bytes:
    """One item's record in the store."""
    return orjson.dumps(item_to_dict(item))


def assemble(head: bytes, items: dict[str, bytes]) -> dict[str, Any]:
    """A session's state from its snapshot and its item records (as ``snapshot_state()``
    returns it). A snapshot that carries its items (written whole) needs none."""
    state = loads(head)
    if "items" not in state:
        missing = [i for i in state["item_ids"] if i not in items]
        if missing:
            raise ValueError(f"snapshot names items the store lacks: {missing[:3]}")
        state["items"] = [orjson.loads(items[i]) for i in state["item_ids"]]
    return state


def dumps(state: dict[str, Any]) -> bytes:
    """``state["config"]`` may be the ``SessionConfig`` itself: orjson writes a
    dataclass as ``dataclasses.asdict`` would, in a tenth of the time."""
    return orjson.dumps({"v": VERSION, **state})


def loads(data: bytes) -> dict[str, Any]:
    state: dict[str, Any] = orjson.loads(data)
    if state.get("v") != VERSION:
        raise ValueError(f"unsupported snapshot version {state.get('v')!r}")
    return state


def response_to_dict(resp: Response) -> dict[str, Any]:
    """A running response in a snapshot (its outputs so far, and what re-issuing it needs)."""
    return {
        "id": resp.id,
        "outputs": [item_to_dict(it) for it in resp.outputs],
        "message": None if resp.message is None else resp.message.id,
        "calls": {str(index): it.id for index, it in resp.calls.items()},
        "overrides": resp.overrides,
        "in_conversation": resp.in_conversation,
        "modalities": list(resp.modalities),
        "output_format": [resp.output_format.codec, resp.output_format.rate],
        "voice": resp.voice,
        "max_output_tokens": resp.max_output_tokens,
        "metadata": resp.metadata,
        "instructions": resp.instructions,
    }


def response_from_dict(r: dict[str, Any], conversation: Conversation, engine_rate: int) -> Response:
    """A response ``response_to_dict`` wrote; its outputs already in ``conversation`` are
    those items (the rest, an out-of-band answer's, are made again); ``engine_rate``:
    the sample rate of the engine's output audio."""
    outputs = [conversation.get(d["id"]) or item_from_dict(d) for d in r["outputs"]]
    by_id = {it.id: it for it in outputs}
    message = by_id.get(r["message"]) if r["message"] else None
    codec, rate = r["output_format"]
    fmt = AudioFormat(codec, rate)
    return Response(
        id=r["id"],
        outputs=outputs,
        message=message,
        part=message.content[0] if message is not None and message.content else None,
        calls={int(index): by_id[item_id] for index, item_id in r["calls"].items()},
        overrides=r["overrides"],
        in_conversation=r["in_conversation"],
        modalities=tuple(r["modalities"]),
        output_format=fmt,
        voice=r["voice"],
        max_output_tokens=r["max_output_tokens"],
        metadata=r["metadata"],
        converter=Converter(engine_format(engine_rate), fmt),
        awaiting=set(),
        instructions=r["instructions"],
    )
