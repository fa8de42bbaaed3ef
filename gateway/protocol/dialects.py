"""The dialects a realtime connection may speak, each ONE object (pure).

A ``Dialect`` is everything about a connection's language that the floors
above consult, so that none of them asks which dialect it is: how a client
message decodes and a server event encodes (``encode``: the session's events,
spelled for the wire and the journal), how the connection-level events are
spelled (errors outside the session's stream, ``session.resumed``,
``session.resync_required``, ``session.replaced``), which decoded events are
the connection's rather than the session's (the duplex dialect's heartbeat and
close), how a connection opens its session (``Opening``), the subprotocols a
socket may echo and whether it may take binary frames, the metric names of
client events, and whether the connection is commit-gated. The session floor
keeps, beside each dialect, how its sessions are built (``session/kinds.py``).

- ``GA`` and ``BETA``: the OpenAI Realtime API (``client_events``,
  ``connection_events``);
- ``DUPLEX``: vLLM-Omni's duplex dialect (``duplex_events``);
- ``LIVE``: OpenAI's GPT-Live (``live_events``, ``live_config``).

``name`` is for logs, metrics and snapshots (``by_name`` finds the dialect a
snapshot was written in); no floor above this one compares it
(tests/unit/test_dialect_names.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gateway.protocol import client_events as ce
from gateway.protocol import connection_events as conn
from gateway.protocol import duplex_events as de
from gateway.protocol import live_events as le
from gateway.protocol.errors import ProtocolError
from gateway.protocol.server_events import AUDIO_DELTA, BINARY_SUBPROTOCOL, encode_beta, encode_ga

BETA_SUBPROTOCOL = "openai-beta.realtime-v1"
SESSION_NOT_OPEN = "session_not_open"  # a first event that opens nothing on a socket with no session yet

# What a client event is when it is the connection's, not the session's: a heartbeat
# (answered, and it keeps the session from idling out), or the end of the session for
# good (``session_close`` asked for, ``timeout`` signalled).
Control = Literal["heartbeat", "session_close", "timeout"]


@dataclass(frozen=True, slots=True)
class Resumed:
    """What ``session.resumed`` says, in every dialect."""

    session_id: str
    resume_token: str
    replay_from: int
    replay_to: int
    generation: int  # the attachment generation (duplex)
    session: dict[str, Any]  # the rendered session config (duplex)


@dataclass(frozen=True, slots=True)
class Resync:
    """What ``session.resync_required`` says, in every dialect."""

    session_id: str
    resume_token: str
    reason: str
    message: str
    session: dict[str, Any]
    conversation: list[dict[str, Any]]
    last_server_event_seq: int
    generation: int


@dataclass(frozen=True, slots=True)
class Opening:
    """How a connection of the dialect opens its session."""

    at_connect: Callable[[bool, bool], bool]  # (the URL named a model, a resume-only socket): open at connect
    with_config: type | None  # the first event that opens the session with its own settings (None: none does)
    opens_default: Callable[[Any, bool], bool]  # (first event, resume-only): it opens the default session
    not_open: str  # what a first event that opens nothing is told (``session_not_open``)


@dataclass(frozen=True, slots=True, eq=False, repr=False)  # one object each: compared (and hashed) by identity
class Dialect:
    name: str  # for logs, metrics and snapshots: never compared above this floor
    decode: Callable[[str | bytes], Any]
    encode: Callable[[dict[str, Any]], bytes | None]  # a session event as sent and journaled; None: never sent
    opening: Opening
    subprotocols: tuple[str, ...]  # what a socket may echo of the offered ones, in this order of preference
    error: Callable[[ProtocolError], bytes]  # an error outside the session's stream (no seq)
    resumed: Callable[[Resumed], bytes]
    resync: Callable[[Resync], bytes]
    replaced: Callable[[str, int], bytes]  # (session id, attachment generation)
    control: Callable[[Any], Control | None] | None  # None: no connection events but acks and resumes
    event_names: Mapping[type, str]  # client event type -> its name in metrics
    gated: bool  # session events go out only once the store holds them
    heartbeat_ack: Callable[[str | None], bytes] | None = None  # for a ``heartbeat`` control
    closed: Callable[[str | None, Any], bytes] | None = None  # the last event of a closed session
    handshake_error: Callable[[ProtocolError], bytes] | None = None  # a refused resume; None: ``error``
    always_announces_replaced: bool = False  # every client knows ``session.replaced`` (else only those that opted in)
    model_at_start: bool = False  # the opening event names the model (checked then), never the URL
    # A media transport (WebRTC) plays this event's audio on its track (``delta``), never on its
    # data channel; ``media_playback``: it reports what it played to the session (the Realtime
    # API's output_audio_buffer.* and truncation at the audio heard; the Live dialect has neither).
    media_audio: str = AUDIO_DELTA
    media_playback: bool = True
    # A phone call's session (SIP) opens with its settings as the session's start settings, the
    # way a media request's do (GPT-Live's accept and ``POST /v1/live/sessions``: ``Door.open_media``),
    # rather than over the gateway's defaults (the Realtime API's accept: ``Door.open``).
    media_start: bool = False
    # Events only a primary WebSocket sends (a sideband's or a data channel's: ``unsupported``;
    # their audio goes on the primary connection, or on the call's track).
    primary_only: tuple[type, ...] = ()
    # The primary's input audio reflected to the session's sidebands (mono PCM16 at 24 kHz in;
    # the message out), outside the session's stream; None: sidebands are not sent it.
    reflect: Callable[[bytes], bytes] | None = None

    def __repr__(self) -> str:
        return f"<Dialect {self.name}>"

    @property
    def binary(self) -> bool:
        """Whether a socket may carry audio as binary frames (``omni-binary.v1``)."""
        return BINARY_SUBPROTOCOL in self.subprotocols

    def subprotocol(self, offered: list[str]) -> str | None:
        """The subprotocol to echo of those the client offered (never the key)."""
        return next((name for name in self.subprotocols if name in offered), None)

    def event_name(self, event_type: type) -> str:
        return self.event_names.get(event_type, "other")

    def refusal(self, err: ProtocolError) -> bytes:
        """A refused resume, said on a connection with no session of its own."""
        return (self.handshake_error or self.error)(err)


def _ga_error(err: ProtocolError) -> bytes:
    return conn.error_event(err.code, err.message, param=err.param, event_id=err.event_id)


def _ga_resumed(r: Resumed) -> bytes:
    return conn.resumed_event(
        session_id=r.session_id, resume_token=r.resume_token, replay_from=r.replay_from, replay_to=r.replay_to
    )


def _ga_resync(r: Resync) -> bytes:
    return conn.resync_event(
        session_id=r.session_id, resume_token=r.resume_token, reason=r.reason, message=r.message,
        session=r.session, conversation=r.conversation, last_server_event_seq=r.last_server_event_seq,
    )  # fmt: skip


GA_EVENT_NAMES: dict[type, str] = {
    ce.SessionUpdate: "session.update",
    ce.SessionResume: "session.resume",
    ce.EventAck: "session.event_ack",
    ce.AudioAppend: "input_audio_buffer.append",
    ce.AudioCommit: "input_audio_buffer.commit",
    ce.AudioClear: "input_audio_buffer.clear",
    ce.ItemCreate: "conversation.item.create",
    ce.ItemRetrieve: "conversation.item.retrieve",
    ce.ItemTruncate: "conversation.item.truncate",
    ce.ItemDelete: "conversation.item.delete",
    ce.ResponseCreate: "response.create",
    ce.ResponseCancel: "response.cancel",
    ce.OutputAudioClear: "output_audio_buffer.clear",
}


def _open_at_connect(model_named: bool, resume_only: bool) -> bool:
    return not resume_only


def _opens_with_update(event: Any, resume_only: bool) -> bool:
    return isinstance(event, ce.SessionUpdate)


REALTIME_OPENING = Opening(
    # As OpenAI's: the session opens at connect (``session.created`` first), unless the socket is
    # resume-only (``?resume=1``, ``?autostart=0``): then a ``session.update`` opens it (the default
    # session, then the update applies) and anything but a resume is refused.
    at_connect=_open_at_connect,
    with_config=None,
    opens_default=_opens_with_update,
    not_open="This socket was opened with autostart=0 (or resume=1): send session.update to open a session "
    "or session.resume to resume one first.",
)


def _realtime(name: Literal["ga", "beta"]) -> Dialect:
    return Dialect(
        name=name,
        decode=ce.decode,
        encode=encode_ga if name == "ga" else encode_beta,
        opening=REALTIME_OPENING,
        subprotocols=(BINARY_SUBPROTOCOL, "realtime", BETA_SUBPROTOCOL),
        error=_ga_error,
        resumed=_ga_resumed,
        resync=_ga_resync,
        replaced=lambda session_id, generation: conn.replaced_event(session_id),
        control=None,
        event_names=GA_EVENT_NAMES,
        gated=False,
    )


GA = _realtime("ga")
BETA = _realtime("beta")


def _duplex_resumed(r: Resumed) -> bytes:
    return de.resumed_event(
        session_id=r.session_id, resume_token=r.resume_token, attachment_generation=r.generation,
        session=r.session, replay_from=r.replay_from, replay_to=r.replay_to,
    )  # fmt: skip


def _duplex_resync(r: Resync) -> bytes:
    return de.resync_event(
        session_id=r.session_id, resume_token=r.resume_token, reason=r.reason, message=r.message,
        session=r.session, conversation=r.conversation, last_server_event_seq=r.last_server_event_seq,
        attachment_generation=r.generation,
    )  # fmt: skip


def _duplex_control(event: Any) -> Control | None:
    if isinstance(event, de.Heartbeat):
        return "heartbeat"
    if isinstance(event, de.Close):
        return "session_close"
    if isinstance(event, de.TurnSignal) and event.event in ("close", "timeout"):
        return "session_close" if event.event == "close" else "timeout"
    return None


DUPLEX_EVENT_NAMES: dict[type, str] = {
    **GA_EVENT_NAMES,
    de.Heartbeat: "session.heartbeat",
    de.Close: "session.close",
    de.Append: "input_audio_buffer.append",
    de.Commit: "input_audio_buffer.commit",
    de.InputCancel: "input.cancel",
    de.TextAppend: "input.text.append",
    de.OutputAudioClear: "output_audio_buffer.clear",
    de.BargeIn: "barge_in",
    de.TurnSignal: "turn.signal",
    de.PlaybackAck: "playback.ack",
}


def _duplex_at_connect(model_named: bool, resume_only: bool) -> bool:
    return model_named and not resume_only


def _duplex_opens_default(event: Any, resume_only: bool) -> bool:
    return not resume_only


DUPLEX = Dialect(
    name="duplex",
    decode=de.decode,
    encode=de.encode,
    # vLLM-Omni's "Endpoint and transport": with ``?model=`` (and no ``autostart=0`` / ``resume=1``)
    # the session opens at connect; otherwise the first event decides: ``session.update`` opens it
    # with its ``session`` object, any other opens the default session and is then handled
    # (refused on a resume-only socket).
    opening=Opening(
        at_connect=_duplex_at_connect,
        with_config=ce.SessionUpdate,
        opens_default=_duplex_opens_default,
        not_open="This socket was opened with autostart=0 (or resume=1): send session.update to open a "
        "session or session.resume to resume one first.",
    ),
    subprotocols=("realtime",),  # JSON only: no binary fast path
    error=de.error_event,
    resumed=_duplex_resumed,
    resync=_duplex_resync,
    replaced=de.replaced_event,
    control=_duplex_control,
    event_names=DUPLEX_EVENT_NAMES,
    gated=True,  # upstream's client ends its session on a resync: never be ahead of the store
    heartbeat_ack=de.heartbeat_ack,
    closed=de.closed_event,
    handshake_error=de.handshake_error,  # the document's flat handshake-stage shape
    always_announces_replaced=True,  # its catalogue has session.replaced
)


def _never(*_: Any) -> bool:
    return False


def _live_control(event: Any) -> Control | None:
    return "session_close" if isinstance(event, le.Close) else None


LIVE = Dialect(
    name="live",
    decode=le.decode,
    encode=le.encode,
    # GPT-Live's primary WebSocket: nothing opens until ``session.start`` (its settings, strict);
    # any other first event is refused, and the client may then send session.start.
    opening=Opening(
        at_connect=_never,
        with_config=le.SessionStart,
        opens_default=_never,
        not_open="Send session.start first, and wait for session.started before other events (or "
        "session.resume, the gateway's extension, to resume a session).",
    ),
    subprotocols=("realtime",),  # JSON only
    error=le.error_event,
    resumed=_ga_resumed,  # the gateway's resume extension, spelled as on /v1/realtime
    resync=_ga_resync,
    replaced=lambda session_id, generation: conn.replaced_event(session_id),
    control=_live_control,  # session.close: the session's last event, then the socket closes
    event_names=le.EVENT_NAMES,
    gated=False,
    model_at_start=True,  # "required in the session configuration ...; do not pass it as a URL query parameter"
    media_audio="session.output_audio.delta",
    media_playback=False,  # no items to truncate, no output_audio_buffer.* events
    media_start=True,  # accept's ``session`` (and a SIP create's) is the session's start settings
    primary_only=(ce.AudioAppend,),  # "Primary WebSocket only; media transports use their audio track"
    reflect=le.reflected_audio,  # "Reflected sideband server events reuse this event type and audio key"
)

DIALECTS: dict[str, Dialect] = {d.name: d for d in (GA, BETA, DUPLEX, LIVE)}


def by_name(name: str) -> Dialect:
    """The dialect a snapshot names (``snapshot_state``'s ``dialect``)."""
    return DIALECTS[name]
