"""Session snapshots: what a replica needs to carry a session on (pure).

A snapshot holds the configuration, the conversation, the event sequence and
epoch, and the response that was running. It does not hold audio: the
uncommitted input buffer and running engine requests live only on the replica
that owns the session; a takeover ends them explicitly (see ``restore``).
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.audio.codecs import AudioFormat
from gateway.protocol.session_config import SessionConfig, Transcription, TurnDetection
from gateway.session.conversation import Item, Part

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
        "content": item.content,  # orjson writes each Part as {type, text, transcript, audio_ms, marks}
    }
    if item.type != "message":
        out.update(type=item.type, call_id=item.call_id, name=item.name, arguments=item.arguments, output=item.output)
    return out


def item_from_dict(d: dict[str, Any]) -> Item:
    parts = [
        Part(
            p["type"],
            text=p["text"],
            transcript=p["transcript"],
            audio_ms=p["audio_ms"],
            marks=[(m[0], m[1]) for m in p["marks"]],
        )
        for p in d["content"]
    ]
    item = Item(d["id"], d["role"], parts, status=d["status"], pending_transcription=d["pending"])
    if d.get("type", "message") != "message":
        item.type = d["type"]
        item.call_id, item.name = d["call_id"], d["name"]
        item.arguments, item.output = d["arguments"], d["output"]
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
