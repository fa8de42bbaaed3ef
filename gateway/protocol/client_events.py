"""Decode and validate client events (pure: no socket, no engine).

``decode`` turns one text frame into a typed event or raises ``ProtocolError``
carrying the offending ``param`` and the client's ``event_id``. Structural
checks live here; checks that need session state (does the item exist? is a
response active?) live in the session.
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.protocol import session_fields
from gateway.protocol.bounds import MAX_CONTENT_PARTS, MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, shape_violation
from gateway.protocol.errors import Code, ProtocolError, json_object
from gateway.protocol.image_size import image_size
from gateway.protocol.session_fields import MAX_OUTPUT_TOKENS

Role = Literal["user", "assistant", "system"]


@dataclass(frozen=True, slots=True)
class PartSpec:
    """A content part as a client sent it, normalised to GA names."""

    type: Literal["input_text", "input_audio", "input_image", "output_text", "output_audio"]
    text: str | None = None
    audio: bytes | None = None  # decoded input_audio bytes, in the session's input format
    transcript: str | None = None
    # input_image: a checked data URL (data:image/png;base64,... or image/jpeg), and its detail
    image_url: str | None = None
    detail: Literal["auto", "low", "high"] = "auto"
    pixels: int = 0  # input_image: width x height, as its header declares them


@dataclass(frozen=True, slots=True)
class ItemSpec:
    """A conversation item as a client sent it: a message (``role``, ``content``),
    a function call (``call_id``, ``name``, ``arguments``), a function call's
    output (``call_id``, ``output``), or the answer to an MCP approval request
    (``approval_request_id``, ``approve``, ``reason``)."""

    id: str | None
    role: Role
    content: tuple[PartSpec, ...]
    type: Literal["message", "function_call", "function_call_output", "mcp_approval_response"] = "message"
    call_id: str | None = None
    name: str | None = None
    arguments: str = ""
    output: str = ""
    approval_request_id: str | None = None
    approve: bool = False
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class ResponseParams:
    output_modalities: tuple[Literal["text", "audio"], ...] | None = None
    instructions: str | None = None
    voice: str | None = None
    custom_voice: bool = False  # voice came as {"id": ...}: any id is accepted
    output_format: Any = None  # raw format object; validated by the session config parser
    max_output_tokens: int | Literal["unset"] | None = "unset"
    temperature: float | None = None
    conversation: Literal["auto", "none"] = "auto"
    input: tuple[ItemSpec | str, ...] | None = None  # str: an item_reference id
    metadata: dict[str, Any] | None = None
    # None: the session's
    tools: tuple[dict[str, Any], ...] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    # Not a client field: what an answer must communicate (``ResponseRequest.say``), set by a
    # dialect that speaks results (the Live dialect's commentary).
    say: str | None = None


@dataclass(frozen=True, slots=True)
class SessionUpdate:
    event_id: str | None
    session: dict[str, Any]


@dataclass(frozen=True, slots=True)
class TranscriptionSessionUpdate:
    """The beta's ``transcription_session.update`` (GA: ``session.update`` with ``type``
    ``transcription``)."""

    event_id: str | None
    session: dict[str, Any]


@dataclass(frozen=True, slots=True)
class AudioAppend:
    event_id: str | None
    audio: bytes


@dataclass(frozen=True, slots=True)
class AudioCommit:
    event_id: str | None


@dataclass(frozen=True, slots=True)
class AudioClear:
    event_id: str | None


@dataclass(frozen=True, slots=True)
class ItemCreate:
    event_id: str | None
    item: ItemSpec
    previous_item_id: str | None = None


@dataclass(frozen=True, slots=True)
class ItemRetrieve:
    event_id: str | None
    item_id: str


@dataclass(frozen=True, slots=True)
class ItemTruncate:
    event_id: str | None
    item_id: str
    content_index: int
    audio_end_ms: int


@dataclass(frozen=True, slots=True)
class ItemDelete:
    event_id: str | None
    item_id: str


@dataclass(frozen=True, slots=True)
class ResponseCreate:
    event_id: str | None
    response: ResponseParams = field(default_factory=ResponseParams)


@dataclass(frozen=True, slots=True)
class ResponseCancel:
    event_id: str | None
    response_id: str | None = None


@dataclass(frozen=True, slots=True)
class OutputAudioClear:
    """``output_audio_buffer.clear``: WebRTC/SIP only (the server holds no output
    buffer on a WebSocket); answered with an ``unsupported`` error."""

    event_id: str | None


@dataclass(frozen=True, slots=True)
class SessionResume:
    """Gateway extension: continue an existing session on this connection."""

    event_id: str | None
    session_id: str
    resume_token: str
    last_received_server_event_seq: int


@dataclass(frozen=True, slots=True)
class EventAck:
    """Gateway extension: the client holds every event up to this seq; trim the journal."""

    event_id: str | None
    last_received_server_event_seq: int


ClientEvent = (
    SessionResume
    | EventAck
    | SessionUpdate
    | TranscriptionSessionUpdate
    | AudioAppend
    | AudioCommit
    | AudioClear
    | ItemCreate
    | ItemRetrieve
    | ItemTruncate
    | ItemDelete
    | ResponseCreate
    | ResponseCancel
    | OutputAudioClear
)


class DecodeContext:
    """Carries the client's event_id into every error raised while decoding."""

    __slots__ = ("event_id",)

    def __init__(self, event_id: str | None) -> None:
        self.event_id = event_id

    def err(self, message: str, param: str | None, code: str = Code.INVALID_VALUE) -> ProtocolError:
        return ProtocolError(code, message, param=param, event_id=self.event_id)

    def str_(self, obj: dict[str, Any], key: str, *, required: bool = False) -> str | None:
        value = obj.get(key)
        if value is None:
            if required:
                raise self.err(f"Missing required parameter: '{key}'.", key, Code.MISSING_FIELD)
            return None
        if not isinstance(value, str):
            raise self.err(f"'{key}' must be a string.", key, Code.INVALID_TYPE)
        return value

    def int_(self, obj: dict[str, Any], key: str, lo: int = 0) -> int:
        value = obj.get(key)
        if value is None:
            raise self.err(f"Missing required parameter: '{key}'.", key, Code.MISSING_FIELD)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.err(f"'{key}' must be an integer.", key, Code.INVALID_TYPE)
        if value < lo:
            raise self.err(f"'{key}' must be >= {lo}, got {value}.", key)
        return value

    def b64(self, value: Any, param: str) -> bytes:
        if not isinstance(value, str):
            raise self.err(f"'{param}' must be a base64 string.", param, Code.INVALID_TYPE)
        try:
            # a2b_base64's strict mode validates in C what b64decode(validate=True) checks
            # with a regex first: ~30 % less CPU per audio append.
            return binascii.a2b_base64(value, strict_mode=True)
        except (binascii.Error, ValueError):
            raise self.err(f"'{param}' is not valid base64.", param, Code.INVALID_BASE64) from None


def decode(raw: str | bytes) -> ClientEvent:
    """Parse one JSON text frame into a client event."""
    return decode_object(json_object(raw))


def decode_object(data: dict[str, Any]) -> ClientEvent:
    """A client event already parsed from JSON (``decode`` without the parse)."""
    event_id = data.get("event_id")
    if event_id is not None and not isinstance(event_id, str):
        raise ProtocolError(Code.INVALID_TYPE, "'event_id' must be a string.", param="event_id")
    ctx = DecodeContext(event_id)
    kind = data.get("type")
    if kind is None:
        raise ctx.err("Missing required parameter: 'type'.", "type", Code.MISSING_FIELD)
    if not isinstance(kind, str):
        raise ctx.err("'type' must be a string.", "type", Code.INVALID_TYPE)
    parser = _PARSERS.get(kind)
    if parser is None:
        raise ctx.err(f"Unknown client event type {kind!r}.", "type", Code.UNKNOWN_EVENT)
    if kind != "input_audio_buffer.append":  # the hot path: its fields are checked one by one
        violation = shape_violation(data)
        if violation is not None:
            raise ctx.err(f"The event is {violation[0]}.", violation[1] or None)
    return parser(ctx, data)


def _session_update(ctx: DecodeContext, d: dict[str, Any]) -> SessionUpdate:
    session = d.get("session")
    if session is None:
        raise ctx.err("Missing required parameter: 'session'.", "session", Code.MISSING_FIELD)
    if not isinstance(session, dict):
        raise ctx.err("'session' must be an object.", "session", Code.INVALID_TYPE)
    return SessionUpdate(ctx.event_id, session)


def _transcription_session_update(ctx: DecodeContext, d: dict[str, Any]) -> TranscriptionSessionUpdate:
    return TranscriptionSessionUpdate(ctx.event_id, _session_update(ctx, d).session)


def _append(ctx: DecodeContext, d: dict[str, Any]) -> AudioAppend:
    if "audio" not in d:
        raise ctx.err("Missing required parameter: 'audio'.", "audio", Code.MISSING_FIELD)
    return AudioAppend(ctx.event_id, ctx.b64(d["audio"], "audio"))


def _part(ctx: DecodeContext, p: Any, param: str, role: Role) -> PartSpec:
    if not isinstance(p, dict):
        raise ctx.err(f"'{param}' must be an object.", param, Code.INVALID_TYPE)
    kind: Any = p.get("type")
    # Beta spellings of the assistant parts.
    kind = {"text": "output_text", "audio": "output_audio"}.get(kind, kind) if isinstance(kind, str) else kind
    if kind == "input_text" or kind == "output_text":
        text = p.get("text")
        if not isinstance(text, str):
            code = Code.MISSING_FIELD if text is None else Code.INVALID_TYPE
            raise ctx.err(f"'{param}.text' must be a string.", f"{param}.text", code)
        if role == "assistant" and kind == "input_text":
            kind = "output_text"
        return PartSpec(kind, text=text)
    if kind == "input_audio":
        audio = ctx.b64(p.get("audio", ""), f"{param}.audio") if p.get("audio") else None
        transcript = p.get("transcript")
        if transcript is not None and not isinstance(transcript, str):
            raise ctx.err(f"'{param}.transcript' must be a string.", f"{param}.transcript", Code.INVALID_TYPE)
        if audio is None and transcript is None:
            raise ctx.err(f"'{param}' needs 'audio' or 'transcript'.", f"{param}.audio", Code.MISSING_FIELD)
        return PartSpec("input_audio", audio=audio, transcript=transcript)
    if kind == "input_image":
        if role != "user":
            raise ctx.err(f"Only user messages carry images; this item's role is {role!r}.", f"{param}.type")
        url = p.get("image_url")
        if not isinstance(url, str):
            code = Code.MISSING_FIELD if url is None else Code.INVALID_TYPE
            raise ctx.err(f"'{param}.image_url' must be a data URL string.", f"{param}.image_url", code)
        raw_detail = p.get("detail") or "auto"
        detail: Literal["auto", "low", "high"]
        if raw_detail == "low":
            detail = "low"
        elif raw_detail == "high":
            detail = "high"
        elif raw_detail == "auto":
            detail = "auto"
        else:
            raise ctx.err(f"'{param}.detail' must be auto, low or high.", f"{param}.detail")
        checked, pixels = _image_url(ctx, url, f"{param}.image_url")
        return PartSpec("input_image", image_url=checked, detail=detail, pixels=pixels)
    if kind == "output_audio":
        transcript = p.get("transcript")
        if not isinstance(transcript, str):
            raise ctx.err(f"'{param}.transcript' must be a string.", f"{param}.transcript", Code.MISSING_FIELD)
        return PartSpec("output_audio", transcript=transcript)
    raise ctx.err(
        f"Unsupported content type {kind!r}; use input_text, input_audio, input_image, output_text or output_audio.",
        f"{param}.type",
    )


# The first bytes of each image format taken (what a file of that type starts with).
_IMAGE_MAGIC: dict[str, bytes] = {"image/png": b"\x89PNG\r\n\x1a\n", "image/jpeg": b"\xff\xd8\xff"}


def _image_url(ctx: DecodeContext, url: str, param: str) -> tuple[str, int]:
    """``url``, a ``data:image/png;base64,...`` (or JPEG) URL whose bytes are checked to be
    that image type, as ``data:<type>;base64,<body>``, and the pixels its header declares
    (at most ``MAX_IMAGE_PIXELS``). Any other URL is refused: the gateway fetches nothing
    on a client's behalf."""
    if not url.startswith("data:"):
        raise ctx.err(
            f"'{param}' must be a data URL (data:image/png;base64,... or data:image/jpeg;base64,...); "
            "the gateway fetches no URL.",
            param,
        )
    head, _, body = url.partition(",")
    media = head[len("data:") :].split(";")
    kind = media[0].lower()
    mime: Literal["image/png", "image/jpeg"]
    if kind == "image/png":
        mime = "image/png"
    elif kind in ("image/jpeg", "image/jpg"):
        mime = "image/jpeg"
    else:
        raise ctx.err(f"Unsupported image type {media[0]!r} in '{param}'; send PNG or JPEG.", param)
    if "base64" not in media[1:]:
        raise ctx.err(f"'{param}' must carry its image as base64 (data:{mime};base64,...).", param)
    if len(body) > (MAX_IMAGE_BYTES + 2) // 3 * 4:
        raise ctx.err(f"The image in '{param}' is over {MAX_IMAGE_BYTES >> 20} MiB; send a smaller one.", param)
    data = ctx.b64(body, param)
    if not data.startswith(_IMAGE_MAGIC[mime]):
        raise ctx.err(f"'{param}' does not hold a {mime} image (its bytes do not start as one).", param)
    size = image_size(data)
    if size is None:
        raise ctx.err(f"'{param}' holds a {mime} file whose size (width and height) cannot be read.", param)
    width, height = size
    if width * height > MAX_IMAGE_PIXELS:
        raise ctx.err(f"The image in '{param}' declares {width}x{height} pixels, over the {MAX_IMAGE_PIXELS:,} one "
                      "image may have: scale it down.", param)  # fmt: skip
    return f"data:{mime};base64,{body}", width * height


def _field(ctx: DecodeContext, item: dict[str, Any], key: str, param: str, *, required: bool) -> str | None:
    value = item.get(key)
    if value is None:
        if required:
            raise ctx.err(f"Missing required parameter: '{param}.{key}'.", f"{param}.{key}", Code.MISSING_FIELD)
        return None
    if not isinstance(value, str):
        raise ctx.err(f"'{param}.{key}' must be a string.", f"{param}.{key}", Code.INVALID_TYPE)
    return value


def _item(ctx: DecodeContext, item: Any, param: str) -> ItemSpec:
    if not isinstance(item, dict):
        code = Code.MISSING_FIELD if item is None else Code.INVALID_TYPE
        raise ctx.err(f"'{param}' must be an object.", param, code)
    kind = item.get("type", "message")
    item_id = item.get("id")
    if item_id is not None and (not isinstance(item_id, str) or not 0 < len(item_id) <= 64):
        raise ctx.err(f"'{param}.id' must be a string of 1 to 64 characters.", f"{param}.id")
    if kind == "function_call":
        name = _field(ctx, item, "name", param, required=True)
        arguments = _field(ctx, item, "arguments", param, required=True)
        call_id = _field(ctx, item, "call_id", param, required=False)
        return ItemSpec(
            item_id, "assistant", (), "function_call", call_id=call_id, name=name, arguments=arguments or ""
        )
    if kind == "function_call_output":
        call_id = _field(ctx, item, "call_id", param, required=True)
        output = _field(ctx, item, "output", param, required=True)
        return ItemSpec(item_id, "user", (), "function_call_output", call_id=call_id, output=output or "")
    if kind == "mcp_approval_response":
        request_id = _field(ctx, item, "approval_request_id", param, required=True)
        approve = item.get("approve")
        if not isinstance(approve, bool):
            code = Code.MISSING_FIELD if approve is None else Code.INVALID_TYPE
            raise ctx.err(f"'{param}.approve' must be true or false.", f"{param}.approve", code)
        reason = _field(ctx, item, "reason", param, required=False)
        return ItemSpec(item_id, "user", (), "mcp_approval_response", approval_request_id=request_id,
                        approve=approve, reason=reason)  # fmt: skip
    if kind in ("mcp_call", "mcp_list_tools", "mcp_approval_request"):
        raise ctx.err(
            f"Item type {kind!r} is made by the gateway when it lists and calls an MCP server's tools; a client "
            "creates only an mcp_approval_response (or message, function_call, function_call_output).",
            f"{param}.type",
        )
    if kind != "message":
        raise ctx.err(
            f"Item type {kind!r} is not supported here; use message, function_call, function_call_output "
            "or mcp_approval_response.",
            f"{param}.type",
        )
    role = item.get("role")
    if role not in ("user", "assistant", "system"):
        raise ctx.err(f"'{param}.role' must be user, assistant or system.", f"{param}.role")
    content = item.get("content")
    if not isinstance(content, list) or not content:
        raise ctx.err(f"'{param}.content' must be a non-empty array.", f"{param}.content", Code.MISSING_FIELD)
    if len(content) > MAX_CONTENT_PARTS:
        raise ctx.err(f"An item may have at most {MAX_CONTENT_PARTS} content parts; this one has {len(content)}.",
                      f"{param}.content")  # fmt: skip
    parts = tuple(_part(ctx, p, f"{param}.content[{i}]", role) for i, p in enumerate(content))
    return ItemSpec(item_id, role, parts)


def _item_create(ctx: DecodeContext, d: dict[str, Any]) -> ItemCreate:
    return ItemCreate(ctx.event_id, _item(ctx, d.get("item"), "item"), ctx.str_(d, "previous_item_id"))


def _item_id_event(cls: type) -> Any:
    def parse(ctx: DecodeContext, d: dict[str, Any]) -> Any:
        return cls(ctx.event_id, ctx.str_(d, "item_id", required=True))

    return parse


def _truncate(ctx: DecodeContext, d: dict[str, Any]) -> ItemTruncate:
    item_id = ctx.str_(d, "item_id", required=True)
    assert item_id is not None
    return ItemTruncate(ctx.event_id, item_id, ctx.int_(d, "content_index"), ctx.int_(d, "audio_end_ms"))


def _response_create(ctx: DecodeContext, d: dict[str, Any]) -> ResponseCreate:
    r = d.get("response")
    if r is None:
        return ResponseCreate(ctx.event_id)
    if not isinstance(r, dict):
        raise ctx.err("'response' must be an object.", "response", Code.INVALID_TYPE)
    # The GA's output_modalities is one of ["audio"], ["text"]; the beta's modalities may be both.
    ga_mods = "output_modalities" in r
    mods = r.get("output_modalities", r.get("modalities"))
    if mods is not None:
        if (
            not isinstance(mods, list)
            or not mods
            or any(m not in ("text", "audio") for m in mods)
            or (ga_mods and len(mods) != 1)
        ):
            raise ctx.err("'response.output_modalities' must be [\"audio\"] or [\"text\"].",
                          "response.output_modalities")  # fmt: skip
    modalities: tuple[Literal["text", "audio"], ...] | None = None
    if mods is not None:
        modalities = ("audio",) if "audio" in mods else ("text",)
    instructions = r.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ctx.err("'response.instructions' must be a string.", "response.instructions", Code.INVALID_TYPE)
    voice: Any = r.get("voice")
    out_format = r.get("output_audio_format")
    audio = r.get("audio")
    if isinstance(audio, dict) and isinstance(audio.get("output"), dict):
        voice = audio["output"].get("voice", voice)
        out_format = audio["output"].get("format", out_format)
    custom_voice = isinstance(voice, dict)
    if custom_voice:  # a custom voice {"id": ...}
        voice = voice.get("id")
    if voice is not None and not isinstance(voice, str):
        raise ctx.err(
            "'response.audio.output.voice' must be a voice name or {\"id\": ...}.", "response.audio.output.voice"
        )
    max_tokens: int | Literal["unset"] | None = "unset"
    raw_max = r.get("max_output_tokens", r.get("max_response_output_tokens", "unset"))
    if raw_max == "inf":
        max_tokens = None
    elif raw_max != "unset":
        if isinstance(raw_max, bool) or not isinstance(raw_max, int) or raw_max < 1:
            raise ctx.err("'response.max_output_tokens' must be a positive integer or \"inf\".",
                          "response.max_output_tokens")  # fmt: skip
        if raw_max > MAX_OUTPUT_TOKENS:
            raise ctx.err(f"Invalid 'response.max_output_tokens': integer above maximum value. Expected a value "
                          f"<= {MAX_OUTPUT_TOKENS}, but got {raw_max} instead (\"inf\" leaves it to the engine).",
                          "response.max_output_tokens", Code.INTEGER_ABOVE_MAX)  # fmt: skip
        max_tokens = raw_max
    temperature = r.get("temperature")
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, int | float)):
        raise ctx.err("'response.temperature' must be a number.", "response.temperature", Code.INVALID_TYPE)
    conversation = r.get("conversation", "auto")
    if conversation not in ("auto", "none"):
        raise ctx.err('\'response.conversation\' must be "auto" or "none".', "response.conversation")
    items: tuple[ItemSpec | str, ...] | None = None
    if r.get("input") is not None:
        if not isinstance(r["input"], list):
            raise ctx.err("'response.input' must be an array.", "response.input", Code.INVALID_TYPE)
        parsed: list[ItemSpec | str] = []
        for i, it in enumerate(r["input"]):
            if isinstance(it, dict) and it.get("type") == "item_reference":
                ref = it.get("id")
                if not isinstance(ref, str):
                    raise ctx.err("An item_reference needs an 'id'.", f"response.input[{i}].id")
                parsed.append(ref)
            else:
                parsed.append(_item(ctx, it, f"response.input[{i}]"))
        items = tuple(parsed)
    metadata = r.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise ctx.err("'response.metadata' must be an object.", "response.metadata", Code.INVALID_TYPE)
    try:
        tools = None if r.get("tools") is None else session_fields.tools(r["tools"], "response.tools")
        choice = r.get("tool_choice")
        tool_choice = None if choice is None else session_fields.tool_choice(choice, "response.tool_choice")
        parallel = r.get("parallel_tool_calls")
        if parallel is not None:
            session_fields.boolean(parallel, "response.parallel_tool_calls")
        # Accepted and not acted on, as in the session: validated only.
        session_fields.prompt(r.get("prompt"), "response.prompt")
        session_fields.reasoning(r.get("reasoning"), "response.reasoning")
    except ProtocolError as exc:
        exc.event_id = ctx.event_id
        raise
    return ResponseCreate(
        ctx.event_id,
        ResponseParams(
            output_modalities=modalities,
            instructions=instructions,
            voice=voice,
            custom_voice=custom_voice,
            output_format=out_format,
            max_output_tokens=max_tokens,
            temperature=None if temperature is None else float(temperature),
            conversation=conversation,
            input=items,
            metadata=metadata,
            tools=tools,
            tool_choice=tool_choice,
            parallel_tool_calls=parallel,
        ),
    )


def _resume(ctx: DecodeContext, d: dict[str, Any]) -> SessionResume:
    session_id = ctx.str_(d, "session_id", required=True)
    token = ctx.str_(d, "resume_token", required=True)
    assert session_id is not None and token is not None
    return SessionResume(ctx.event_id, session_id, token, ctx.int_(d, "last_received_server_event_seq"))


class AckError(ProtocolError):
    """A malformed ``session.event_ack``: answered on the connection only (an event with a
    seq would itself be acked, and a client that acks every event would never stop)."""


def _ack(ctx: DecodeContext, d: dict[str, Any]) -> EventAck:
    # ``server_event_seq`` is vLLM-Omni's spelling (its DuplexClient acks every event with it).
    key = "server_event_seq" if "last_received_server_event_seq" not in d and "server_event_seq" in d else None
    try:
        return EventAck(ctx.event_id, ctx.int_(d, key or "last_received_server_event_seq"))
    except ProtocolError as err:
        raise AckError(err.code, err.message, param=err.param, event_id=err.event_id) from None


def parse_resume(ctx: DecodeContext, d: dict[str, Any]) -> SessionResume:
    """``session.resume``, the gateway's extension in every dialect."""
    return _resume(ctx, d)


def parse_ack(ctx: DecodeContext, d: dict[str, Any]) -> EventAck:
    """``session.event_ack``, the gateway's extension in every dialect (raises ``AckError``)."""
    return _ack(ctx, d)


_PARSERS: dict[str, Any] = {
    "session.resume": _resume,
    "session.event_ack": _ack,
    "session.update": _session_update,
    "transcription_session.update": _transcription_session_update,
    "input_audio_buffer.append": _append,
    "input_audio_buffer.commit": lambda ctx, d: AudioCommit(ctx.event_id),
    "input_audio_buffer.clear": lambda ctx, d: AudioClear(ctx.event_id),
    "conversation.item.create": _item_create,
    "conversation.item.retrieve": _item_id_event(ItemRetrieve),
    "conversation.item.delete": _item_id_event(ItemDelete),
    "conversation.item.truncate": _truncate,
    "response.create": _response_create,
    "response.cancel": lambda ctx, d: ResponseCancel(ctx.event_id, ctx.str_(d, "response_id")),
    "output_audio_buffer.clear": lambda ctx, d: OutputAudioClear(ctx.event_id),
}

CLIENT_EVENT_TYPES = tuple(_PARSERS)
