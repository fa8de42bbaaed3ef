"""Shape bounds on what a client sends, checked before anything is copied, stored or echoed.

A client event is parsed by orjson, which accepts 1,024 levels of nesting; but the
gateway copies (``copy.deepcopy``), snapshots and echoes what it keeps, and orjson
writes at most 254 levels, so a value nested deeper than that would break the
session's snapshot long after it was accepted. Every event (but the audio append,
whose fields are checked one by one on the hot path) is walked once, iteratively:

- ``MAX_DEPTH`` levels of objects and arrays at most (the event itself is level 1);
- ``MAX_NODES`` object members and array elements in all.

Past either: error ``invalid_value`` with the path that went too far, the event is
dropped, the session goes on. An item has at most ``MAX_CONTENT_PARTS`` parts
(checked where items are read). Sizes in bytes are bounded before parsing
(``max_message_bytes``); lengths of single fields where they are read.
"""

from __future__ import annotations

from typing import Any

MAX_DEPTH = 32  # deep enough for any JSON schema of a tool's parameters
MAX_NODES = 50_000  # members and elements in one event (a 15 MiB item of tiny parts has fewer than this)
# One input_image, decoded (PNG or JPEG; never a URL to fetch). Larger: invalid_value, the
# item is not added. (The message limit, max_message_bytes, bounds the base64 before it.)
MAX_IMAGE_BYTES = 10 << 20
# Pixels one input_image may declare in its header (5000 x 5000; 75 MB decoded as RGB): a small
# file of one colour can declare any size. More: invalid_value, the item is not added.
MAX_IMAGE_PIXELS = 25_000_000
# A session's instructions, in UTF-8 bytes: 128 KiB is about 32k tokens, the whole context of
# OpenAI's realtime models (more could never be followed). They live in the session's snapshot
# (and its session.created/updated events) for as long as it is kept: longer is
# string_above_max_length, nothing of the update is applied.
MAX_INSTRUCTIONS_BYTES = 128 << 10
MAX_CONTENT_PARTS = 64  # parts of one conversation item; more: invalid_value (a response's context
#   walks every part of every item, so parts are bounded where they come in)


def shape_violation(data: Any, *, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> tuple[str, str] | None:
    """(what, param path) of the first bound ``data`` exceeds, or None."""
    stack: list[tuple[Any, int, str]] = [(data, 1, "")]
    nodes = 0
    while stack:
        value, depth, path = stack.pop()
        if isinstance(value, dict):
            children: Any = value.items()
        elif isinstance(value, list):
            children = enumerate(value)
        else:
            continue
        if depth > max_depth:
            return f"nested deeper than {max_depth} levels", path
        nodes += len(value)
        if nodes > max_nodes:
            return f"more than {max_nodes} values in one event", path
        for key, child in children:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1, f"{path}.{key}" if path else str(key)))
    return None
