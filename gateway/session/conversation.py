"""Conversation items: the session's memory of the dialogue (pure data).

Items render in the GA shape, or the beta shape for beta clients: messages
(content parts), function calls the assistant made (``function_call``: name,
JSON arguments) and their results (``function_call_output``). Input audio
is not kept once it has been transcribed: an ``input_audio`` part holds its
transcript only (documented in docs/realtime.md), so a long session's memory stays
proportional to its text. An ``input_image`` part keeps its image (a checked data
URL), counted in the conversation's bytes. ``item_from_spec`` makes an item of what a client
sent (``conversation.item.create``, a response's ``input``).
"""

from __future__ import annotations

import base64
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from gateway.audio.codecs import AudioFormat
from gateway.protocol import client_events as ce
from gateway.protocol.errors import Code, ProtocolError
from orchestrator.engine import Image, Message, ToolCall

PartType = Literal["input_text", "input_audio", "input_image", "output_text", "output_audio"]
ItemType = Literal[
    "message", "function_call", "function_call_output",
    "mcp_list_tools", "mcp_call", "mcp_approval_request", "mcp_approval_response",
]  # fmt: skip
_BETA_PART = {"output_text": "text", "output_audio": "audio"}


MARK_BYTES = 12  # one mark of Marks: a float64 offset and a uint32 length
_NO_MS, _NO_CHARS = array("d"), array("I")  # the marks of every part that has none (see Marks)


class Marks:
    """Where an answer's transcript was spoken: (audio offset in ms at which a piece
    of text was produced, transcript length after it), in the order produced.

    Truncating an answer keeps the text whose audio had started before the cut
    (``kept_before``). Packed in two arrays, 12 bytes a mark where a tuple of a
    float and an int costs about 100: an answer has one mark per text delta and
    the conversation keeps them for every assistant item (bench/README.md,
    "Streaming memory"). A mark at the offset of the one before it replaces it:
    only the longest text produced by an offset matters to a cut.
    """

    __slots__ = ("_chars", "_ms")

    def __init__(self, marks: Iterable[tuple[float, int]] = ()) -> None:
        # Every part has marks and most never get one: until the first, the arrays are
        # shared empty ones (never appended to), not 160 bytes of a part's own.
        self._ms = _NO_MS
        self._chars = _NO_CHARS
        for ms, chars in marks:
            self.add(ms, chars)

    def add(self, ms: float, chars: int) -> None:
        if self._ms is _NO_MS:
            self._ms, self._chars = array("d"), array("I")  # (a transcript is far below 4 G characters)
        elif self._ms[-1] == ms:
            self._chars[-1] = chars
            return
        self._ms.append(ms)
        self._chars.append(chars)

    def kept_before(self, end_ms: float) -> int:
        """The transcript length to keep when the audio is cut at ``end_ms``."""
        kept = 0
        for ms, chars in zip(self._ms, self._chars, strict=True):
            if ms < end_ms:
                kept = chars
        return kept

    def upto(self, chars: int) -> Marks:
        """The marks of a transcript cut back to ``chars`` characters."""
        return Marks(m for m in self if m[1] <= chars)

    def copy(self) -> Marks:
        return Marks(self)

    def to_list(self) -> list[list[float]]:
        """As snapshots write them: ``[[ms, chars], ...]``."""
        return [[ms, chars] for ms, chars in self]

    def __iter__(self) -> Iterator[tuple[float, int]]:
        return zip(self._ms, self._chars, strict=True)

    def __len__(self) -> int:
        return len(self._ms)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Marks) and self._ms == other._ms and self._chars == other._chars

    def __repr__(self) -> str:
        return f"Marks({list(self)!r})"


@dataclass(slots=True)
class Part:
    type: PartType
    text: str | None = None
    transcript: str | None = None
    audio_ms: float = 0.0  # output audio sent for this part (truncate checks against it)
    # lets truncate keep only the transcript whose audio had started playing
    marks: Marks = field(default_factory=Marks)
    # input_image: its checked data URL (the protocol's) and detail; echoed as sent
    image_url: str | None = None
    detail: str | None = None
    pixels: int = 0  # input_image: what its header declares (max_conversation_image_pixels counts them)

    def render(self, beta: bool) -> dict[str, Any]:
        """As content of a conversation item (GA ``output_audio``, beta ``audio``)."""
        kind = _BETA_PART.get(self.type, self.type) if beta else self.type
        if self.type in ("input_text", "output_text"):
            return {"type": kind, "text": self.text or ""}
        if self.type == "input_image":
            return {"type": "input_image", "image_url": self.image_url, "detail": self.detail}
        return {"type": kind, "transcript": self.transcript}

    def image(self) -> Image:
        """An input_image part as the engine takes it (its URL was checked when it came in)."""
        head, _, body = (self.image_url or "").partition(",")
        mime: Literal["image/png", "image/jpeg"] = "image/jpeg" if head.startswith("data:image/jpeg") else "image/png"
        detail: Literal["auto", "low", "high"] = (
            "low" if self.detail == "low" else "high" if self.detail == "high" else "auto"
        )
        return Image(mime, base64.b64decode(body), detail)

    def render_part(self) -> dict[str, Any]:
        """As the ``part`` of ``response.content_part.added/done``: both dialects
        name a response's content part ``text`` or ``audio`` (the SDK's models
        allow nothing else there)."""
        if self.type == "output_audio":
            return {"type": "audio", "transcript": self.transcript or ""}
        return {"type": "text", "text": self.text or ""}

    @property
    def content_text(self) -> str:
        return (self.text if self.type.endswith("_text") else self.transcript) or ""


@dataclass(slots=True)
class Item:
    id: str
    role: Literal["user", "assistant", "system"]
    content: list[Part]
    status: Literal["completed", "in_progress", "incomplete"] = "completed"
    pending_transcription: bool = False  # an input_audio part still being transcribed
    type: ItemType = "message"
    call_id: str | None = None  # function_call, function_call_output
    name: str | None = None  # function_call: the function
    arguments: str = ""  # function_call: JSON text, as the model wrote it
    output: str = ""  # function_call_output: the result, as the client gave it; mcp_call: the server's
    # MCP items (gateway/session/mcp.py): the server, its tools, approvals and a call's error
    server_label: str | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)  # mcp_list_tools: as the SDK's Tool
    approval_request_id: str | None = None  # mcp_call, mcp_approval_response
    approve: bool = False  # mcp_approval_response
    reason: str | None = None  # mcp_approval_response
    error: dict[str, Any] | None = None  # mcp_call that failed: the SDK's protocol/tool/http error
    # as_message()'s result, kept until the session says the item changed (forget()):
    # a response's context then costs one lookup per item, not a walk of every part.
    _message: Message | None = field(default=None, repr=False, compare=False)

    def render(self, beta: bool) -> dict[str, Any]:
        if self.type.startswith("mcp_"):
            return self._render_mcp()
        if self.type == "function_call":
            return {
                "id": self.id,
                "object": "realtime.item",
                "type": "function_call",
                "status": self.status,
                "call_id": self.call_id,
                "name": self.name,
                "arguments": self.arguments,
            }
        if self.type == "function_call_output":
            return {
                "id": self.id,
                "object": "realtime.item",
                "type": "function_call_output",
                "status": self.status,
                "call_id": self.call_id,
                "output": self.output,
            }
        return {
            "id": self.id,
            "object": "realtime.item",
            "type": "message",
            "status": self.status,
            "role": self.role,
            "content": [p.render(beta) for p in self.content],
        }

    def _render_mcp(self) -> dict[str, Any]:
        """As the SDK's ``RealtimeMcpListTools``, ``RealtimeMcpToolCall``,
        ``RealtimeMcpApprovalRequest`` and ``RealtimeMcpApprovalResponse`` (no status)."""
        out: dict[str, Any] = {"id": self.id, "type": self.type}
        if self.type == "mcp_list_tools":
            out.update(server_label=self.server_label, tools=self.tools)
        elif self.type == "mcp_call":
            done = self.status == "completed"
            out.update(server_label=self.server_label, name=self.name, arguments=self.arguments,
                       approval_request_id=self.approval_request_id,
                       output=self.output if done else None, error=self.error)  # fmt: skip
        elif self.type == "mcp_approval_request":
            out.update(server_label=self.server_label, name=self.name, arguments=self.arguments)
        else:
            out.update(approval_request_id=self.approval_request_id, approve=self.approve, reason=self.reason)
        return out

    def counted_bytes(self) -> int:
        """What max_conversation_bytes counts of the item: the UTF-8 size of its text and
        images, of a call's arguments and output, and its transcripts' marks."""
        size = sum(len(p.content_text.encode()) + len(p.image_url or "") + MARK_BYTES * len(p.marks)
                   for p in self.content)  # fmt: skip
        if self.type != "message":
            size += len(self.arguments.encode()) + len(self.output.encode())
            size += sum(len(str(t)) for t in self.tools)  # (an estimate: the schemas' repr)
        return size

    def images(self) -> tuple[int, int]:
        """(input_image parts, the pixels they declare): what the conversation's image limits count."""
        count = pixels = 0
        for part in self.content:
            if part.type == "input_image":
                count += 1
                pixels += part.pixels
        return count, pixels

    def as_message(self) -> Message:
        message = self._message
        if message is None:
            text = " ".join(p.content_text for p in self.content if p.content_text)
            images = tuple(p.image() for p in self.content if p.type == "input_image")
            message = self._message = Message(self.role, text, images=images)
        return message

    def forget(self) -> None:
        """The item changed: its message is made again when next asked for."""
        self._message = None


class Conversation:
    """Ordered items with O(1) lookup by id."""

    def __init__(self) -> None:
        self._items: list[Item] = []
        self._by_id: dict[str, Item] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Item]:
        return iter(self._items)

    def get(self, item_id: str) -> Item | None:
        return self._by_id.get(item_id)

    def last_id(self) -> str | None:
        return self._items[-1].id if self._items else None

    def previous_id(self, item_id: str) -> str | None:
        """The id of the item before ``item_id`` (None: it is first, or not here). Searched
        from the end: the item asked about is nearly always the newest."""
        items = self._items
        for i in range(len(items) - 1, -1, -1):
            if items[i].id == item_id:
                return items[i - 1].id if i else None
        return None

    def insert(self, item: Item, previous_item_id: str | None = None) -> str | None:
        """Insert after ``previous_item_id`` (None: at the end); returns the id before it."""
        if previous_item_id is None:
            prev = self.last_id()
            self._items.append(item)
        elif previous_item_id == "root":
            prev = None
            self._items.insert(0, item)
        else:
            index = next(i for i, it in enumerate(self._items) if it.id == previous_item_id)
            prev = previous_item_id
            self._items.insert(index + 1, item)
        self._by_id[item.id] = item
        return prev

    def remove(self, item_id: str) -> Item:
        item = self._by_id.pop(item_id)
        self._items.remove(item)
        return item

    def forget(self, item_id: str) -> None:
        """The item changed: what it cached is made again when next asked for."""
        item = self._by_id.get(item_id)
        if item is not None:
            item.forget()

    def oldest(self) -> Item | None:
        return self._items[0] if self._items else None

    def messages(self) -> list[Message]:
        return to_messages(self._items)


def to_messages(items: Iterable[Item]) -> list[Message]:
    """The engine's view of ``items``: a function call joins the assistant turn
    before it (as chat templates expect: one assistant message with its calls),
    a function call output becomes a ``tool`` turn."""
    out: list[Message] = []
    items = list(items)
    # An MCP tool call: the assistant's call and, once it ran, its result (or why not).
    declined = {it.approval_request_id: it for it in items if it.type == "mcp_approval_response" and not it.approve}
    for item in items:
        if item.type in ("mcp_call", "mcp_approval_request"):
            if item.type == "mcp_call":
                if item.status == "in_progress":
                    continue  # (running: the response that made it is not over)
                result = item.output if item.status == "completed" else mcp_failure_text(item)
            elif (answer := declined.get(item.id)) is not None:
                result = "The user declined to run this tool" + (f": {answer.reason}" if answer.reason else ".")
            else:
                continue  # approved (its mcp_call follows) or not answered yet
            call = ToolCall(item.id, item.name or "", item.arguments)
            if out and out[-1].role == "assistant":
                out[-1] = replace(out[-1], tool_calls=(*out[-1].tool_calls, call))
            else:
                out.append(Message("assistant", "", tool_calls=(call,)))
            out.append(Message("tool", result, tool_call_id=item.id))
        elif item.type.startswith("mcp_"):
            continue  # a server's tool list, an approval: what the engine sees is the call
        elif item.type == "function_call":
            call = ToolCall(item.call_id or item.id, item.name or "", item.arguments)
            if out and out[-1].role == "assistant":
                out[-1] = replace(out[-1], tool_calls=(*out[-1].tool_calls, call))
            else:
                out.append(Message("assistant", "", tool_calls=(call,)))
        elif item.type == "function_call_output":
            out.append(Message("tool", item.output, tool_call_id=item.call_id))
        else:
            out.append(item.as_message())
    return out


def mcp_failure_text(item: Item) -> str:
    """What the model reads of an MCP call that did not complete."""
    if item.error is not None:
        return f"The tool call failed: {item.error.get('message', '')}"
    return "The tool call was interrupted before it returned."


def item_from_spec(
    spec: ce.ItemSpec, param: str, new_id: Callable[[str], str], fmt: AudioFormat
) -> tuple[Item, bytes | None]:
    """The item a client's spec describes, and the audio of its one ``input_audio`` part
    without a transcript (in ``fmt``: the caller transcribes it), or None. A bad part
    raises a ProtocolError whose ``param`` starts with ``param``."""
    if spec.type == "mcp_approval_response":
        item = Item(spec.id or new_id("item"), "user", [], type="mcp_approval_response",
                    approval_request_id=spec.approval_request_id, approve=spec.approve, reason=spec.reason)  # fmt: skip
        return item, None
    if spec.type != "message":
        item = Item(
            spec.id or new_id("item"),
            spec.role,
            [],
            type=spec.type,
            call_id=spec.call_id or new_id("call"),
            name=spec.name,
            arguments=spec.arguments,
            output=spec.output,
        )
        return item, None
    item = Item(spec.id or new_id("item"), spec.role, [])
    audio: bytes | None = None
    for i, p in enumerate(spec.content):
        if p.audio is not None and p.transcript is None:
            if len(p.audio) % fmt.bytes_per_sample:
                raise ProtocolError(
                    Code.INVALID_AUDIO,
                    f"Audio length {len(p.audio)} is not a whole number of {fmt.codec} samples.",
                    param=f"{param}.content[{i}].audio",
                )
            if audio is not None:
                raise ProtocolError(Code.INVALID_VALUE, "Only one input_audio part per item.", param=f"{param}.content")
            audio = p.audio
        if p.type == "input_image":
            item.content.append(Part("input_image", image_url=p.image_url, detail=p.detail, pixels=p.pixels))
        else:
            item.content.append(Part(p.type, text=p.text, transcript=p.transcript))
    return item, audio
