"""vLLM-Omni's duplex dialect of ``/v1/realtime`` (``?duplex=1``): its client
events, its spellings of our server events, and its connection events (pure).

The dialect is vLLM-Omni's ``docs/serving/realtime_duplex_api.md``: the OpenAI
Realtime vocabulary (tier 1), OpenAI names with extensions (tier 2) and the
duplex-only events (tier 3: heartbeat, event acks, close, playback acks,
barge-in, turn signals, listen/speak decisions, overlap decisions). A session
speaks one dialect for its whole life; the session model underneath (seq,
epoch, journal, resume) is the same as the GA and beta dialects'.

Client events the GA decoder already knows (``session.update``,
``conversation.item.*``, ``response.*``...) are decoded by it; the duplex ones
and the duplex forms of ``append`` / ``commit`` (with their hints) are decoded
here, aliases included (the alias table of upstream's contract).

Server events: the session builds GA-shaped events (the GA names are the
dialect's: ``response.output_audio.delta`` and ``response.output_audio_transcript.*``,
as the document's catalogue, revision 2e9bf1cb, names them); ``encode`` adds
``response_id`` at the top of ``response.created``/``done`` and gives upstream's
error codes where ours have an upstream equivalent (``ERROR_CODES``). Every
event of a session carries ``server_event_seq`` (``session.heartbeat_ack`` and
``session.closed`` included: the session emits them). Connection events
(resumed, replaced, resync, and what is said before a session exists or
outside its stream: a heartbeat ack or close with no session, refused resumes,
malformed acks) carry **none**: upstream's client drops an event whose seq is
not above its last as a replayed duplicate (so a ``session.resumed`` with a seq
would lose its rotated token, or make the replay behind it look duplicated),
and acks every seq it sees.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from gateway.protocol import client_events as ce
from gateway.protocol.errors import Code, ProtocolError, json_object

TRUTHY = frozenset({"1", "true", "yes", "on"})  # ?duplex= / ?resume= (upstream's RealtimeEnvelope)
FALSY = frozenset({"0", "false", "no", "off"})  # ?autostart=

# Upstream's aliases (they share the payload of their canonical event): its catalogue's
# list, and ``input.commit``, which the catalogue lists as a type of its own.
ALIASES = {
    "input.commit": "input_audio_buffer.commit",
    "input_text.append": "input.text.append",
    "push_text": "input.text.append",
    "signal_turn": "turn.signal",
    "audio.playback_ack": "playback.ack",
    "close_session": "session.close",
    "close": "session.close",
}
# The pre-Realtime WAV-append aliases the document says are not accepted on this route.
NOT_ACCEPTED = frozenset({"push_chunk", "input.audio.append"})

# turn.signal events (upstream's DuplexTurnEventType) and the turn states they lead to.
TURN_SIGNALS = frozenset(
    {
        "user_started",
        "user_committed",
        "assistant_started",
        "assistant_done",
        "barge_in",
        "playback_ack",
        "timeout",
        "close",
    }
)
TURN_STATES = ("idle", "user_speaking", "user_committed", "assistant_generating", "assistant_playing", "barge_in")

# Our error code -> upstream's, where upstream has one for the same failure. Every other
# code is ours (docs/errors.md); upstream standardises only the envelope and the classes.
ERROR_CODES = {
    Code.BUFFER_TOO_SMALL: "input_audio_buffer_empty",
    Code.SESSION_NOT_FOUND: "session_resume_expired",
    Code.RESUME_TOKEN_INVALID: "invalid_resume_token",
    Code.RESUME_SEQ_INVALID: "invalid_session_resume",
    Code.RESUME_NOT_FIRST: "invalid_session_resume",
}

_RESPONSE_ID_TOP = frozenset({"response.created", "response.done"})


def enabled(value: str | None) -> bool:
    return value is not None and value.strip().lower() in TRUTHY


# --- client events -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Heartbeat:
    event_id: str | None


@dataclass(frozen=True, slots=True)
class Close:
    event_id: str | None


@dataclass(frozen=True, slots=True)
class Append:
    """``input_audio_buffer.append`` with upstream's hints (``is_speech``; the per-event
    format must be the session's; ``video_frames`` are accepted and not used)."""

    event_id: str | None
    audio: bytes
    is_speech: bool | None = None
    sample_rate_hz: int | None = None
    encoding: str | None = None
    video_frames: int = 0


@dataclass(frozen=True, slots=True)
class Commit:
    event_id: str | None
    final: bool = True
    response_create: bool | None = None  # None: the session's auto_response decides
    is_speech: bool | None = None  # False: a silence declaration (answered with response.listen)


@dataclass(frozen=True, slots=True)
class InputCancel:
    event_id: str | None


@dataclass(frozen=True, slots=True)
class TextAppend:
    event_id: str | None
    text: str


@dataclass(frozen=True, slots=True)
class OutputAudioClear:
    event_id: str | None


@dataclass(frozen=True, slots=True)
class BargeIn:
    event_id: str | None
    source: str = "client_event"


@dataclass(frozen=True, slots=True)
class TurnSignal:
    event_id: str | None
    event: str
    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class PlaybackAck:
    event_id: str | None
    played_ms: int
    committed_ms: int | None = None  # None: = played_ms
    response_id: str | None = None
    item_id: str | None = None
    truncate: bool = False


DuplexEvent = (
    Heartbeat
    | Close
    | Append
    | Commit
    | InputCancel
    | TextAppend
    | OutputAudioClear
    | BargeIn
    | TurnSignal
    | PlaybackAck
)
ClientEvent = DuplexEvent | ce.ClientEvent


def decode(raw: str | bytes) -> ClientEvent:
    """One text frame of a duplex socket: a duplex event, or a GA one."""
    data = json_object(raw)
    kind = data.get("type")
    if kind in NOT_ACCEPTED:
        event_id = data.get("event_id")
        raise ProtocolError(
            Code.UNKNOWN_EVENT,
            f"{kind!r} is not accepted on this route; send input_audio_buffer.append.",
            param="type",
            event_id=event_id if isinstance(event_id, str) else None,
        )
    if isinstance(kind, str) and kind in ALIASES:
        kind = ALIASES[kind]
        data = {**data, "type": kind}
    parser = _PARSERS.get(kind) if isinstance(kind, str) else None
    if parser is None:
        if kind == "session.resume" and "last_received_server_event_seq" not in data:
            data = {**data, "last_received_server_event_seq": 0}  # upstream's default
        return ce.decode_object(data)
    event_id = data.get("event_id")
    if event_id is not None and not isinstance(event_id, str):
        raise ProtocolError(Code.INVALID_TYPE, "'event_id' must be a string.", param="event_id")
    ctx = ce.DecodeContext(event_id)
    result: ClientEvent = parser(ctx, data)
    return result


def _opt_bool(ctx: ce.DecodeContext, d: dict[str, Any], key: str) -> bool | None:
    value = d.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise ctx.err(f"'{key}' must be true or false.", key, Code.INVALID_TYPE)
    return value


def _opt_int(ctx: ce.DecodeContext, d: dict[str, Any], key: str) -> int | None:
    if d.get(key) is None:
        return None
    value = d[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ctx.err(f"'{key}' must be an integer.", key, Code.INVALID_TYPE)
    if value < 0:
        raise ctx.err(f"'{key}' must be >= 0, got {value}.", key)
    return value


def _append(ctx: ce.DecodeContext, d: dict[str, Any]) -> Append:
    if "audio" not in d:
        raise ctx.err("Missing required parameter: 'audio'.", "audio", Code.MISSING_FIELD)
    encoding = d.get("format", d.get("input_audio_format"))
    if encoding is not None and not isinstance(encoding, str):
        raise ctx.err("'format' must be a string.", "format", Code.INVALID_TYPE)
    frames = d.get("video_frames")
    if frames is not None and not isinstance(frames, list):
        raise ctx.err("'video_frames' must be an array of base64 images.", "video_frames", Code.INVALID_TYPE)
    return Append(
        ctx.event_id,
        ctx.b64(d["audio"], "audio"),
        is_speech=_opt_bool(ctx, d, "is_speech"),
        sample_rate_hz=_opt_int(ctx, d, "sample_rate_hz"),
        encoding=encoding,
        video_frames=len(frames or ()),
    )


def _commit(ctx: ce.DecodeContext, d: dict[str, Any]) -> Commit:
    final = _opt_bool(ctx, d, "final")
    return Commit(
        ctx.event_id,
        final=True if final is None else final,
        response_create=_opt_bool(ctx, d, "response_create"),
        is_speech=_opt_bool(ctx, d, "is_speech"),
    )


def _text(ctx: ce.DecodeContext, d: dict[str, Any]) -> TextAppend:
    text = d.get("text", d.get("delta"))
    if not isinstance(text, str):
        code = Code.MISSING_FIELD if text is None else Code.INVALID_TYPE
        raise ctx.err("input.text.append needs 'text' (a string).", "text", code)
    return TextAppend(ctx.event_id, text)


def _turn_signal(ctx: ce.DecodeContext, d: dict[str, Any]) -> TurnSignal:
    event = d.get("event")
    if not isinstance(event, str) or event not in TURN_SIGNALS:
        raise ctx.err(f"'event' must be one of: {', '.join(sorted(TURN_SIGNALS))}.", "event")
    payload = d.get("payload") or {}
    if not isinstance(payload, dict):
        raise ctx.err("'payload' must be an object.", "payload", Code.INVALID_TYPE)
    return TurnSignal(ctx.event_id, event, payload)


def _barge_in(ctx: ce.DecodeContext, d: dict[str, Any]) -> BargeIn:
    payload = d.get("payload")
    source = payload.get("source") if isinstance(payload, dict) else None
    return BargeIn(ctx.event_id, source if isinstance(source, str) else "client_event")


def _playback_ack(ctx: ce.DecodeContext, d: dict[str, Any]) -> PlaybackAck:
    played = _opt_int(ctx, d, "played_ms")
    if played is None:
        raise ctx.err("Missing required parameter: 'played_ms'.", "played_ms", Code.MISSING_FIELD)
    return PlaybackAck(
        ctx.event_id,
        played,
        committed_ms=_opt_int(ctx, d, "committed_ms"),
        response_id=ctx.str_(d, "response_id"),
        item_id=ctx.str_(d, "item_id"),
        truncate=bool(_opt_bool(ctx, d, "truncate")),
    )


_PARSERS: dict[str, Any] = {
    "session.heartbeat": lambda ctx, d: Heartbeat(ctx.event_id),
    "session.close": lambda ctx, d: Close(ctx.event_id),
    "input_audio_buffer.append": _append,
    "input_audio_buffer.commit": _commit,
    "input.cancel": lambda ctx, d: InputCancel(ctx.event_id),
    "input.text.append": _text,
    "output_audio_buffer.clear": lambda ctx, d: OutputAudioClear(ctx.event_id),
    "barge_in": _barge_in,
    "turn.signal": _turn_signal,
    "playback.ack": _playback_ack,
}

CLIENT_EVENT_TYPES = tuple(sorted({*_PARSERS, *ce.CLIENT_EVENT_TYPES, *ALIASES}))


# --- server events ------------------------------------------------------------------------


def encode(event: dict[str, Any]) -> bytes:
    """One session event in the duplex spellings (the journal keeps these bytes)."""
    kind = event["type"]
    if kind in _RESPONSE_ID_TOP or kind == "error":
        event = dict(event)
        if kind in _RESPONSE_ID_TOP:
            event["response_id"] = event["response"]["id"]
        if kind == "error":
            event["error"] = upstream_error(event["error"])
    delta = event.get("delta")
    if isinstance(delta, bytes | bytearray | memoryview):
        event = {**event, "delta": base64.b64encode(delta).decode("ascii")}
    return orjson.dumps(event)


def upstream_error(error: dict[str, Any]) -> dict[str, Any]:
    code = ERROR_CODES.get(error.get("code", ""))
    return error if code is None else {**error, "code": code}


def connection_event(type_: str, **fields: Any) -> bytes:
    """A connection event of this dialect: no ``server_event_seq`` (see the module docstring)."""
    return orjson.dumps({"type": type_, "event_id": "event_" + secrets.token_hex(8), **fields})


def error_event(err: ProtocolError) -> bytes:
    return connection_event(
        "error",
        error=upstream_error(
            {"type": err.type, "code": err.code, "message": err.message, "param": err.param, "event_id": err.event_id}
        ),
    )


def handshake_error(err: ProtocolError) -> bytes:
    """A refused resume, before any session is bound to the connection: the document's
    flat handshake shape ("Errors"), ``{"type": "error", "error": "<message>", "code"}``."""
    code = ERROR_CODES.get(err.code, err.code)
    return connection_event("error", error=err.message, code=code)


def resumed_event(
    *,
    session_id: str,
    resume_token: str,
    attachment_generation: int,
    session: dict[str, Any],
    replay_from: int,
    replay_to: int,
) -> bytes:
    return connection_event(
        "session.resumed",
        session_id=session_id,
        attachment_generation=attachment_generation,
        resume_token=resume_token,
        session=session,
        replay_from=replay_from,
        replay_to=replay_to,
    )


# Our resync reasons (``hosting.takeover``) -> upstream's: events trimmed from a journal that goes
# on are its ``journal_overflow``; events the client holds that the journal never got, a gap.
RESYNC_REASONS = {"journal_trimmed": "journal_overflow", "client_ahead": "journal_gap"}


def resync_event(
    *,
    session_id: str,
    resume_token: str,
    reason: str,
    message: str,
    session: dict[str, Any],
    conversation: list[dict[str, Any]],
    last_server_event_seq: int,
    attachment_generation: int,
) -> bytes:
    return connection_event(
        "session.resync_required",
        session_id=session_id,
        reason=RESYNC_REASONS.get(reason, reason),  # upstream's spelling; ours in gateway_reason
        gateway_reason=reason,
        message=message,
        attachment_generation=attachment_generation,
        resume_token=resume_token,
        session=session,
        conversation=conversation,
        last_server_event_seq=last_server_event_seq,
    )


def replaced_event(session_id: str, attachment_generation: int) -> bytes:
    return connection_event("session.replaced", session_id=session_id, attachment_generation=attachment_generation)


def heartbeat_ack(session_id: str | None) -> bytes:
    return connection_event("session.heartbeat_ack", session_id=session_id)


CloseReason = Literal["client_close", "timeout"]  # session.close (and aliases); turn.signal timeout


def closed_fields(session_id: str | None, epoch: int, reason: CloseReason) -> dict[str, Any]:
    """What ``session.closed`` says ("Session lifecycle": ``session_id``, ``epoch``,
    ``reason``, and the native event under ``event``)."""
    return {"session_id": session_id, "epoch": epoch, "reason": reason,
            "event": {"type": "session.closed", "reason": reason}}  # fmt: skip


def closed_event(session_id: str | None, reason: CloseReason = "client_close") -> bytes:
    """``session.closed`` on a connection with no session (a close before any was opened)."""
    return connection_event("session.closed", **closed_fields(session_id, 0, reason))
