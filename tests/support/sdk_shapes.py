"""Strict validation of server events against the official ``openai`` SDK's models.

``check_event(event, beta=...)`` validates one server event (a dict as read off
the socket) the way typed clients do (openai-agents validates every event with
a pydantic ``TypeAdapter`` over the SDK's discriminated union), and stricter:

- the event must validate against the GA union ``openai.types.realtime``
  ``RealtimeServerEvent`` (beta clients: ``openai.types.beta.realtime``);
- no key anywhere in it may be unknown to the SDK's model of that spot
  (the models allow extras, so a misspelt or invented field would pass
  pydantic silently), except the gateway's documented extension fields in
  ``EXTENSION_FIELDS``;
- gateway extension *events* (``session.resumed``, ``session.warning``, ...)
  are not in the SDK: ``check_event`` refuses them unless ``extensions`` is
  true (a client that opted in), and then checks their documented shape.

``ShapeError`` names the event type and the path of every problem.
"""

from __future__ import annotations

from typing import Annotated, Any

import pydantic
from openai.types.beta.realtime import RealtimeServerEvent as BetaServerEvent
from openai.types.live import ConnectServerEvent as LiveSidebandEvent
from openai.types.live import ServerEvent as LiveServerEvent
from openai.types.realtime import (
    RealtimeServerEvent as GaServerEvent,
)
from openai.types.realtime import (
    RealtimeSessionCreateResponse,
    RealtimeTranscriptionSessionCreateResponse,
)

_GA = pydantic.TypeAdapter(Annotated[GaServerEvent, pydantic.Field(discriminator="type")])
_BETA = pydantic.TypeAdapter(Annotated[BetaServerEvent, pydantic.Field(discriminator="type")])
_LIVE = pydantic.TypeAdapter(Annotated[LiveServerEvent, pydantic.Field(discriminator="type")])
_LIVE_SIDEBAND = pydantic.TypeAdapter(Annotated[LiveSidebandEvent, pydantic.Field(discriminator="type")])

# GPT-Live: the gateway's extension fields on its events (docs: "GPT-Live", "Gateway extensions").
LIVE_EXTENSION_FIELDS = frozenset(
    {
        ("*", "server_event_seq"),
        ("*", "event_id"),  # the SDK's audio deltas name none (the server's do: the resume extension replays by it)
        ("session.started", "resume_token"),
    }
)

# Gateway extension fields on SDK events (docs/realtime.md: "Shapes, extensions and dialects"): (event type
# or "*", dotted path of the extra key). Everything else unknown is a defect.
EXTENSION_FIELDS = frozenset(
    {
        ("*", "server_event_seq"),
        # The SDK's model of this SIP-only event names no event_id; every server event here has one.
        ("input_audio_buffer.dtmf_event_received", "event_id"),
        ("session.created", "resume_token"),
        ("session.created", "session.reissue_interrupted_responses"),
        ("session.updated", "session.reissue_interrupted_responses"),
        ("session.created", "session.gateway_events"),
        ("session.updated", "session.gateway_events"),
        ("response.done", "response.status_details.gateway_reason"),
        ("rate_limits.updated", "tenant_limits"),  # every limit of the caller (docs/tenants.md)
    }
)

# What OpenAI's beta server sent in a session (and the gateway sends beta clients)
# but the SDK's beta ``Session`` model never declared.
BETA_SESSION_FIELDS = frozenset({"session.object", "session.expires_at"})

# Gateway extension events: type -> required keys (beyond type, event_id, server_event_seq).
EXTENSION_EVENTS: dict[str, frozenset[str]] = {
    "session.resumed": frozenset({"session_id", "resume_token", "replay_from", "replay_to"}),
    "session.resync_required": frozenset(
        {"session_id", "resume_token", "reason", "session", "conversation", "last_server_event_seq"}
    ),
    "session.replaced": frozenset({"session_id"}),
    "session.warning": frozenset({"code", "message", "param"}),
}


# The SDK types ``session.created``/``session.updated``'s session as the *request* shape,
# which lacks ``id``, ``object`` and ``expires_at``: the server sends the *response*
# shape, so session fields are checked against that model too.
_SESSION_RESPONSES = {
    "realtime": pydantic.TypeAdapter(RealtimeSessionCreateResponse),
    "transcription": pydantic.TypeAdapter(RealtimeTranscriptionSessionCreateResponse),
}


class ShapeError(AssertionError):
    pass


def _summary(exc: pydantic.ValidationError) -> str:
    """Each problem as ``path: message (input)``, without pydantic's list of union members."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc'][1:]) or '<event>'}: {e['msg']} (got {e.get('input')!r:.80})"
        for e in exc.errors()
    )


def _extras(model: Any, path: str, out: list[str]) -> None:
    """Dotted paths of every key the SDK's models do not declare."""
    if isinstance(model, pydantic.BaseModel):
        for key in model.model_extra or {}:
            out.append(f"{path}.{key}" if path else key)
        for name in type(model).model_fields:
            _extras(getattr(model, name), f"{path}.{name}" if path else name, out)
    elif isinstance(model, list | tuple):
        for i, entry in enumerate(model):
            _extras(entry, f"{path}[{i}]", out)
    elif isinstance(model, dict):
        for key, value in model.items():
            _extras(value, f"{path}.{key}", out)


def _voice_as_name(session: dict[str, Any]) -> dict[str, Any]:
    """The session with a custom voice ``{"id": ...}`` as its id, for the response model only:
    the event's model (the request shape, checked strictly before this) types the voice as a
    name or ``VoiceID``; ``RealtimeSessionCreateResponse`` (the REST answer's) as a name only."""
    output = (session.get("audio") or {}).get("output")
    voice = output.get("voice") if isinstance(output, dict) else None
    if not (isinstance(voice, dict) and set(voice) == {"id"} and isinstance(voice["id"], str)):
        return session
    audio = session["audio"]
    return {**session, "audio": {**audio, "output": {**output, "voice": voice["id"]}}}


def check_event(event: dict[str, Any], *, beta: bool = False, extensions: bool = False) -> None:
    """Raise ``ShapeError`` unless ``event`` is one the SDK accepts, strictly."""
    kind = event.get("type")
    if kind in EXTENSION_EVENTS:
        if not extensions:
            raise ShapeError(f"{kind}: a gateway extension event sent to a client that did not opt in")
        missing = EXTENSION_EVENTS[kind] - event.keys()
        if missing or not isinstance(event.get("event_id"), str):
            raise ShapeError(f"{kind}: missing {sorted(missing) or ['event_id']}: {event}")
        return
    adapter = _BETA if beta else _GA
    checked = event
    if beta and kind in ("session.created", "session.updated") and isinstance(event.get("session"), dict):
        # The beta SDK types session.model as a closed list of OpenAI's models: no
        # gateway's model name can pass, so that one field is checked as a string only.
        model = event["session"].get("model")
        if not isinstance(model, str):
            raise ShapeError(f"{kind} (beta): session.model must be a string, got {model!r}")
        checked = {**event, "session": {**event["session"], "model": "gpt-4o-realtime-preview"}}
    if beta and kind == "transcription_session.updated" and isinstance(event.get("session"), dict):
        # The beta SDK's TranscriptionSession requires client_secret {value, expires_at}: the
        # event carries one (validated as is, below), and it must be the empty one, so that no
        # usable key ever goes out over the socket (or into the journal).
        secret = event["session"].get("client_secret")
        if secret != {"value": "", "expires_at": 0}:
            raise ShapeError(f"{kind}: client_secret must be the empty {{value: '', expires_at: 0}}: {event}")
    try:
        parsed = adapter.validate_python(checked, strict=True)
    except pydantic.ValidationError as exc:
        raise ShapeError(f"{kind} ({'beta' if beta else 'GA'}): {_summary(exc)}\nevent: {event}") from None
    extras: list[str] = []
    _extras(parsed, "", extras)
    session = event.get("session")
    if not beta and kind in ("session.created", "session.updated") and isinstance(session, dict):
        try:
            response = _SESSION_RESPONSES[session.get("type", "realtime")].validate_python(
                _voice_as_name(session), strict=True
            )
        except (KeyError, pydantic.ValidationError) as exc:
            detail = _summary(exc) if isinstance(exc, pydantic.ValidationError) else f"type {exc}"
            raise ShapeError(f"{kind}: not the SDK's session response shape: {detail}\nevent: {event}") from None
        declared_extras: list[str] = []
        _extras(response, "session", declared_extras)
        extras = [p for p in extras if not p.startswith("session.") or p in declared_extras]
    if beta and kind in ("session.created", "session.updated"):
        extras = [p for p in extras if p not in BETA_SESSION_FIELDS]
    unknown = [p for p in extras if ("*", p) not in EXTENSION_FIELDS and (kind, p) not in EXTENSION_FIELDS]
    if unknown:
        raise ShapeError(
            f"{kind} ({'beta' if beta else 'GA'}): fields the SDK does not know: {unknown}\nevent: {event}"
        )


def check_live_event(event: dict[str, Any], *, sideband: bool = False, extensions: bool = False) -> None:
    """Raise ``ShapeError`` unless ``event`` is one the SDK's Live models accept, strictly:
    ``openai.types.live.ServerEvent`` on a primary connection, ``ConnectServerEvent`` on a
    sideband; no key the models do not declare, but the gateway's ``LIVE_EXTENSION_FIELDS``."""
    kind = event.get("type")
    wake = kind in ("session.paused", "session.resumed") and "session_id" not in event  # (a Live WebRTC wake's)
    if kind in EXTENSION_EVENTS and not wake:
        if not extensions:
            raise ShapeError(f"{kind}: a gateway extension event sent to a client that did not opt in")
        missing = EXTENSION_EVENTS[kind] - event.keys()
        if missing or not isinstance(event.get("event_id"), str):
            raise ShapeError(f"{kind}: missing {sorted(missing) or ['event_id']}: {event}")
        return
    adapter = _LIVE_SIDEBAND if sideband or wake else _LIVE  # (a wake's events: the ConnectServerEvent union)
    try:
        parsed = adapter.validate_python(event, strict=True)
    except pydantic.ValidationError as exc:
        raise ShapeError(f"{kind} (Live): {_summary(exc)}\nevent: {event}") from None
    extras: list[str] = []
    _extras(parsed, "", extras)
    if kind == "response.event":  # the nested Responses event is a dict the SDK leaves open
        extras = [p for p in extras if not p.startswith("event.")]
    unknown = [p for p in extras if ("*", p) not in LIVE_EXTENSION_FIELDS and (kind, p) not in LIVE_EXTENSION_FIELDS]
    if unknown:
        raise ShapeError(f"{kind} (Live): fields the SDK does not know: {unknown}\nevent: {event}")
