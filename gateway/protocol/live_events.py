"""GPT-Live's client events, decoded strictly, and its server events on the wire (pure).

The shapes are openai-python's ``openai.types.live`` (revision 3.63.0):
``ClientEvent`` on a primary WebSocket, ``ConnectClientEvent`` on a sideband.
As the API does, an event is strict: a field its type does not have is refused
(``unknown_parameter``), an unknown event type is refused with the list of
those there are (``unknown_event``).

Decoded events reuse the Realtime ones where they mean the same to hosting
(``client_events.AudioAppend``: the tenant's input audio limit counts it;
``SessionResume`` and ``EventAck``: the gateway's resume extension, on this
dialect too); the rest are this module's.

Server events are built by the session already spelled the Live way
(``gateway/session/live_spelling.py``); ``encode`` writes them as JSON, audio
bytes as base64. Every one carries ``event_id`` and the gateway's
``server_event_seq`` (the resume extension's ordering, an extra field the SDK's
models allow); errors name the client's event as ``client_event_id``.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from gateway.protocol import client_events as ce
from gateway.protocol.bounds import shape_violation
from gateway.protocol.errors import Code, ProtocolError, json_object

LIVE_PREFIX = "live_"  # session ids: ``^live_[A-Za-z0-9_-]{1,128}$``, as the API's
MAX_FIXTURE_MS = 30_000  # the API's bound on one audio fixture
FIXTURE_RATE = 24_000  # a fixture is raw mono PCM16 at 24 kHz, whatever the session's format
DECISIONS_UNSUPPORTED = "decisions_unsupported"
Append = Literal["instructions", "thinking", "commentary"]


@dataclass(frozen=True, slots=True)
class SessionStart:
    event_id: str | None
    session: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SessionUpdate:
    event_id: str | None
    session: dict[str, Any]


@dataclass(frozen=True, slots=True)
class InputMute:
    """``session.input_audio.mute`` (``muted``) or ``.unmute``."""

    event_id: str | None
    muted: bool


@dataclass(frozen=True, slots=True)
class ContextAppend:
    """``session.instructions.append``, ``.thinking.append`` or ``.commentary.append``."""

    event_id: str | None
    kind: Append
    content: str
    delegation_id: str | None


@dataclass(frozen=True, slots=True)
class FixturePlay:
    event_id: str | None
    audio: bytes  # raw mono PCM16 at 24 kHz


@dataclass(frozen=True, slots=True)
class ResponseItemCreate:
    event_id: str | None
    item: dict[str, Any]  # a Responses API input item, as given


@dataclass(frozen=True, slots=True)
class ResponseCreate:
    event_id: str | None


@dataclass(frozen=True, slots=True)
class Close:
    event_id: str | None


@dataclass(frozen=True, slots=True)
class DtmfSend:
    """``transport.dtmf.send`` (a sideband's, for a SIP call)."""

    event_id: str | None
    digit: str


ClientEvent = (
    SessionStart
    | SessionUpdate
    | ce.AudioAppend
    | InputMute
    | ContextAppend
    | FixturePlay
    | ResponseItemCreate
    | ResponseCreate
    | Close
    | DtmfSend
    | ce.SessionResume
    | ce.EventAck
)


def decode(raw: str | bytes) -> ClientEvent:
    """One JSON text message as a Live client event."""
    data = json_object(raw)
    event_id = data.get("event_id")
    if event_id is not None and not isinstance(event_id, str):
        raise ProtocolError(Code.INVALID_TYPE, "'event_id' must be a string.", param="event_id")
    ctx = ce.DecodeContext(event_id)
    kind = data.get("type")
    if kind is None:
        raise ctx.err("Missing required parameter: 'type'.", "type", Code.MISSING_FIELD)
    if not isinstance(kind, str):
        raise ctx.err("'type' must be a string.", "type", Code.INVALID_TYPE)
    if kind == "session.input_audio.append":  # the hot path: checked field by field
        if "audio" not in data:
            raise ctx.err("Missing required parameter: 'audio'.", "audio", Code.MISSING_FIELD)
        if len(data) > 2 + (event_id is not None or "event_id" in data):
            _keys(ctx, data, ("audio",))
        return ce.AudioAppend(event_id, ctx.b64(data["audio"], "audio"))
    parser = _PARSERS.get(kind)
    if parser is None:
        if kind.startswith("decision."):
            raise ctx.err(f"{kind} runs on OpenAI's Decisions API, which this gateway does not serve.", "type",
                          DECISIONS_UNSUPPORTED)  # fmt: skip
        names = ", ".join(CLIENT_EVENT_TYPES)
        raise ctx.err(f"Unknown client event type {kind!r}; the Live client events are: {names}.", "type",
                      Code.UNKNOWN_EVENT)  # fmt: skip
    violation = shape_violation(data)
    if violation is not None:
        raise ctx.err(f"The event is {violation[0]}.", violation[1] or None)
    fields, parse = parser
    _keys(ctx, data, fields)
    event: ClientEvent = parse(ctx, data)
    return event


def _keys(ctx: ce.DecodeContext, data: dict[str, Any], fields: tuple[str, ...]) -> None:
    for key in data:
        if key not in fields and key not in ("type", "event_id"):
            raise ctx.err(f"Unknown parameter: '{key}'.", key, Code.UNKNOWN_PARAMETER)


def _object(ctx: ce.DecodeContext, data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    if value is None:
        raise ctx.err(f"Missing required parameter: '{key}'.", key, Code.MISSING_FIELD)
    if not isinstance(value, dict):
        raise ctx.err(f"'{key}' must be an object.", key, Code.INVALID_TYPE)
    return value


def _append(kind: Append) -> Any:
    def parse(ctx: ce.DecodeContext, d: dict[str, Any]) -> ContextAppend:
        content = ctx.str_(d, "content", required=True)
        assert content is not None
        if "delegation_id" not in d:  # "Required, nullable" (the SDK's words)
            raise ctx.err("Missing required parameter: 'delegation_id' (null for general session context).",
                          "delegation_id", Code.MISSING_FIELD)  # fmt: skip
        return ContextAppend(ctx.event_id, kind, content, ctx.str_(d, "delegation_id"))

    return parse


def _fixture(ctx: ce.DecodeContext, d: dict[str, Any]) -> FixturePlay:
    if "audio" not in d:
        raise ctx.err("Missing required parameter: 'audio'.", "audio", Code.MISSING_FIELD)
    audio = ctx.b64(d["audio"], "audio")
    if len(audio) % 2:
        raise ctx.err("'audio' must be raw PCM16 (an even number of bytes).", "audio", Code.INVALID_AUDIO)
    ms = len(audio) / 2 * 1000 / FIXTURE_RATE
    if ms > MAX_FIXTURE_MS:
        raise ctx.err(f"An audio fixture may last at most {MAX_FIXTURE_MS // 1000} s (raw mono PCM16 at 24 kHz); "
                      f"this one lasts {ms / 1000:.1f} s.", "audio")  # fmt: skip
    if not audio:
        raise ctx.err("'audio' is empty.", "audio")
    return FixturePlay(ctx.event_id, audio)


def _dtmf(ctx: ce.DecodeContext, d: dict[str, Any]) -> DtmfSend:
    digit = ctx.str_(d, "event", required=True)
    assert digit is not None
    if len(digit) != 1 or digit not in "0123456789ABCD*#":
        raise ctx.err("'event' must be one DTMF key: 0-9, A-D, * or #.", "event")
    return DtmfSend(ctx.event_id, digit)


_PARSERS: dict[str, tuple[tuple[str, ...], Any]] = {
    "session.start": (("session",), lambda ctx, d: SessionStart(ctx.event_id, _object(ctx, d, "session"))),
    "session.update": (("session",), lambda ctx, d: SessionUpdate(ctx.event_id, _object(ctx, d, "session"))),
    "session.input_audio.mute": ((), lambda ctx, d: InputMute(ctx.event_id, True)),
    "session.input_audio.unmute": ((), lambda ctx, d: InputMute(ctx.event_id, False)),
    "session.output_audio.fixture.play": (("audio",), _fixture),
    "session.instructions.append": (("content", "delegation_id"), _append("instructions")),
    "session.thinking.append": (("content", "delegation_id"), _append("thinking")),
    "session.commentary.append": (("content", "delegation_id"), _append("commentary")),
    "response.item.create": (("item",), lambda ctx, d: ResponseItemCreate(ctx.event_id, _object(ctx, d, "item"))),
    "response.create": ((), lambda ctx, d: ResponseCreate(ctx.event_id)),
    "session.close": ((), lambda ctx, d: Close(ctx.event_id)),
    "transport.dtmf.send": (("event",), _dtmf),
    # The gateway's resume extension (as on /v1/realtime).
    "session.resume": (("session_id", "resume_token", "last_received_server_event_seq"), ce.parse_resume),
    "session.event_ack": (("last_received_server_event_seq", "server_event_seq"), ce.parse_ack),
}

CLIENT_EVENT_TYPES = ("session.input_audio.append", *_PARSERS)

# Client event type -> its name in metrics.
EVENT_NAMES: dict[type, str] = {
    SessionStart: "session.start",
    SessionUpdate: "session.update",
    ce.AudioAppend: "session.input_audio.append",
    InputMute: "session.input_audio.mute",
    ContextAppend: "session.context.append",
    FixturePlay: "session.output_audio.fixture.play",
    ResponseItemCreate: "response.item.create",
    ResponseCreate: "response.create",
    Close: "session.close",
    DtmfSend: "transport.dtmf.send",
    ce.SessionResume: "session.resume",
    ce.EventAck: "session.event_ack",
}


# --- server events ----------------------------------------------------------------------


def encode(event: dict[str, Any]) -> bytes:
    """A session's event (already spelled the Live way) as sent and journaled."""
    delta = event.get("delta")
    if isinstance(delta, bytes | bytearray | memoryview):
        event = {**event, "delta": base64.b64encode(delta).decode("ascii")}
    return orjson.dumps(event)


def error_fields(err: ProtocolError) -> dict[str, Any]:
    """The fields of a Live ``error`` event for ``err`` (the client's event as ``client_event_id``)."""
    detail: dict[str, Any] = {"type": err.type, "code": err.code, "message": err.message}
    if err.param is not None:
        detail["param"] = err.param
    if err.event_id is not None:
        detail["client_event_id"] = err.event_id
        return {"error": detail, "client_event_id": err.event_id}
    return {"error": detail}


def error_event(err: ProtocolError) -> bytes:
    """An error outside the session's stream (before ``session.started``, a refused resume):
    ``server_event_seq`` 0, never journaled."""
    return orjson.dumps(
        {"type": "error", "event_id": "event_" + secrets.token_hex(8), "server_event_seq": 0, **error_fields(err)}
    )


REFLECTED_RATE = 24_000  # reflected input audio is always mono PCM16LE at 24 kHz (the SDK's words)


def reflected_audio(pcm: bytes) -> bytes:
    """The primary's input audio reflected to a sideband: ``session.input_audio.append``
    with the audio only (mono PCM16LE at 24 kHz), "with no timestamps or event_id", as
    the API reflects it; outside the session's stream (no ``server_event_seq``, never
    journaled)."""
    return orjson.dumps({"type": "session.input_audio.append", "audio": base64.b64encode(pcm).decode("ascii")})
