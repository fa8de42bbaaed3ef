"""The door: one connection's way to a realtime session on this replica, for every transport.

A transport makes a ``Door`` for each connection it accepts (a WebSocket of
any dialect, a WebRTC call, a sideband socket) and hands it what the client
sends, as it arrives, in order:

- ``receive(text)``: a JSON text message in the connection's dialect;
- ``receive_frame(data)``: a binary frame (``omni-binary.v1`` input audio);
- ``receive_audio(audio, fmt)``: a media transport's input audio (a WebRTC track, a
  phone's or a SIP trunk's G.711), in the transport's own format ``fmt``: the session
  converts it to what the engine takes in one step (``audio/convert.py``), never through
  the session's client-visible input format. It counts against the tenant's input audio,
  not its messages.

Each returns None once the message is handled, or an awaitable that the
transport awaits before it hands in the next message: the message waits for
the store (a ``session.resume``, a tenant budget to lease, a session opened
by the duplex dialect's first event).

The door does what belongs to the connection: the message size limit, the
tenant's event and input audio limits, decoding in the dialect, the events
that are the connection's (``session.event_ack``, ``session.resume``, the
duplex heartbeat, close and idle timeout), opening or resuming the session
(the takeover plan of ``takeover.py`` carried out) and what the connection is
sent and when (``Delivery``). Everything else goes to the session's host
(``SessionHost.receive``), which calls the session and flushes. The transport
only reads and writes (``Peer``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Literal, Protocol

from gateway.audio.codecs import AudioFormat
from gateway.hosting.context import HostContext
from gateway.hosting.delivery import Delivery
from gateway.hosting.host import SessionHost
from gateway.hosting.peer import Peer
from gateway.hosting.resume import take_over
from gateway.protocol import client_events as ce
from gateway.protocol import duplex_events as de
from gateway.protocol.dialects import SESSION_NOT_OPEN, Control, Dialect
from gateway.protocol.errors import CloseCode, Code, ProtocolError
from gateway.protocol.server_events import decode_input_frame
from gateway.quotas import NeedBudget, Seat
from gateway.session.events import MediaEvent
from gateway.session.session import RealtimeSession
from gateway.store.base import StateLimitExceeded, StateQuota, StoreError
from gateway.store.health import THROTTLE
from gateway.telemetry import SessionTrace
from orchestrator.orchestrator import Orchestrator

log = logging.getLogger("omni.door")

Pending = Coroutine[Any, Any, None] | None  # what the transport awaits before the next message
Kind = Literal["text", "frame", "audio"]
_AUDIO_APPENDS = (ce.AudioAppend, de.Append)  # events that carry input audio (the tenant's input limit)


class Sessions(Protocol):
    """What a door needs of the process it runs in (the runtime provides it)."""

    def serves(self, model: str) -> bool:
        """Whether a route here serves ``model``."""

    async def open_session(
        self,
        model: str,
        *,
        principal: str,
        dialect: Dialect,
        requested: dict[str, Any] | None = None,
        quota: StateQuota | None = None,
        session_id: str | None = None,
    ) -> SessionHost:
        """A new session hosted here, in ``dialect``, configured by the gateway's defaults
        and ``requested`` (a client secret's session settings), its state kept within
        ``quota``, with ``session_id`` (None: a new one; an announced phone call's was
        given out before the session opened); raises ProtocolError (no route) or StoreError (StateLimitExceeded: the
        quota has no room for it)."""

    async def fork_session(
        self, source: str, *, principal: str, quota: StateQuota | None = None, minted: str | None = None
    ) -> SessionHost:
        """A new session hosted here that carries on the stored session ``source`` (its model,
        conversation and settings); for a client secret (``minted``: its binding), only one
        opened with a secret minted the same. Raises ProtocolError (session_not_found) or
        StoreError."""

    def restore_session(self, state: dict[str, Any]) -> tuple[RealtimeSession, Orchestrator]:
        """A session rebuilt from its snapshot's head on this replica (a takeover), its
        conversation not yet loaded (``SessionHost.load_conversation``); raises
        ProtocolError (model_not_found) when its model is not served here."""


class Entrance(Protocol):
    """What a transport's connection hands its messages to: a ``Door``, or the relay of a
    sideband socket whose call runs on another replica (``calls.Relay``)."""

    @property
    def ready(self) -> bool:
        """Messages may be handed in as they are read (else the transport queues them)."""

    @property
    def trace(self) -> SessionTrace | None: ...

    def receive(self, text: str) -> Pending: ...

    def receive_frame(self, data: bytes) -> Pending: ...

    def detach(self) -> None:
        """The connection is gone."""


class Media(Protocol):
    """A connection that plays the answers' audio itself (a WebRTC call, a phone call): the
    door asks it to cut the audio on ``output_audio_buffer.clear``."""

    @property
    def reconnects(self) -> bool:
        """Whether its client can reconnect and resume (a WebRTC re-offer); a carrier's phone
        call cannot: a drain lets it finish rather than close it at an idle moment."""

    def clear_audio(self) -> tuple[str, str, int] | None:
        """Cut the audio now: (response id, item id, ms of that item's audio sent), or None
        when nothing was playing or queued."""


class Screened:
    """A frontend's peer behind its session's channel policy: a server event the policy does
    not allow is not sent (``ChannelPolicy.allows_server``; the journal and the sidebands
    still have it). A ``MediaEvent`` is the call's, never the channel's: it passes."""

    def __init__(self, peer: Peer, policy: Callable[[], Any]) -> None:
        self.peer = peer
        self._policy = policy

    def send(self, data: bytes, event: dict[str, Any] | None = None) -> None:
        policy = self._policy()
        if policy is None or isinstance(event, MediaEvent) or policy.allows_server(event, data):
            self.peer.send(data, event)

    def close(self, code: int, reason: str) -> None:
        self.peer.close(code, reason)


class Door:
    def __init__(
        self,
        ctx: HostContext,
        sessions: Sessions | None,  # None: the door only joins sessions (a relayed sideband)
        peer: Peer,
        *,
        dialect: Dialect,
        principal: str,
        model: str,
        max_message_bytes: int,
        seat: Seat | None = None,
        resume_only: bool = False,
        media: Media | None = None,
        requested: dict[str, Any] | None = None,
        model_bound: bool = False,
        source: str | None = None,
        minted: str | None = None,
        frontend: bool = False,
        session_id: str | None = None,
    ) -> None:
        self.ctx = ctx
        self.session_id = session_id  # the id of the session opened here (None: a new one)
        self.sessions = sessions
        self.peer = peer
        # An untrusted frontend's data channel (a GPT-Live WebRTC session's): the session's
        # channel policy says what it may send (``_text``) and what it is sent (``Screened``).
        self.frontend = frontend
        self.delivery = Delivery(Screened(peer, self._policy) if frontend else peer, gated=dialect.gated)
        self.dialect = dialect
        self.principal = principal
        self.model = model  # the model a session opened through this door serves by default
        self.max_message_bytes = max_message_bytes  # a larger text or frame: message_too_large
        self.seat = seat  # this connection's share of its principal's limits
        self.resume_only = resume_only  # (duplex) the first event must open or resume explicitly
        self.media = media  # the connection plays the audio (WebRTC): it knows what was played
        self.requested = requested  # a client secret's session settings: every session opened here has them
        self.model_bound = model_bound  # a client secret's: ``model`` is the only one a session here may use
        self.source = source  # a stored session the session opened here carries on (a fork), or None
        self.minted = minted  # a client secret's binding: what its sessions carry, the only ones it resumes
        self.sideband = False  # joined a session beside its connection (``join``)
        self.host: SessionHost | None = None
        self.opened = False  # a session was opened or resumed through this door
        self.resumed = False  # the client sent session.resume: it speaks the gateway's extensions
        self.generation = 0  # (duplex) the session's attachment generation on this connection
        self._client_events = 0
        self._paid = False  # the message being handled was counted against the events limit
        self._audio_refused = False  # the track's audio was refused (said once, until taken again)
        self._binary_counter = ctx.metrics.client_event_counter("binary.append")
        self._track_counter = ctx.metrics.client_event_counter("track.audio")  # a call's microphone, 20 ms a chunk
        self._counters: dict[type, Any] = {}  # client event type -> its metric's counter, bound once
        self._controls = dialect.control  # None: the dialect has no connection events but acks and resumes
        self._loop = asyncio.get_running_loop()
        self._last_event = self._loop.time()
        self._idle: asyncio.TimerHandle | None = None
        ctx.doors.add(self)

    @property
    def quota(self) -> StateQuota | None:
        """What the store may keep of the principal's sessions (None: no limits here)."""
        return self.seat.state_quota if self.seat is not None else None

    @property
    def ready(self) -> bool:
        """A session is behind the door: a message can be handed in as it is read."""
        return self.host is not None

    @property
    def interrupted_by_speech(self) -> bool:
        """Whether the caller's speech interrupts an answer (server VAD's ``interrupt_response``):
        a connection that plays the audio cuts it then, even an answer already written."""
        return self.host is not None and self.host.interrupted_by_speech

    @property
    def trace(self) -> SessionTrace | None:
        """The trace of the session behind the door (what reached the client ends a turn)."""
        return self.host.trace if self.host is not None else None

    # --- what the client sends -------------------------------------------------------

    def receive(self, text: str) -> Pending:
        return self._take(text, "text")

    def receive_frame(self, data: bytes) -> Pending:
        return self._take(data, "frame")

    def receive_audio(self, audio: bytes, fmt: AudioFormat) -> Pending:
        """A media transport's input audio in its own format ``fmt`` (converted once, by the
        session's input, to what the engine takes); dropped while no session is behind the door."""
        if self.host is None:
            return None
        return self._take((audio, fmt), "audio")

    def played(self, kind: str, response_id: str | None, item_id: str | None = None, audio_end_ms: int = 0) -> None:
        """What the connection played (``SessionHost.playback``): a media connection's report."""
        if self.host is not None:
            self.host.playback(kind, response_id, item_id, audio_end_ms)

    def dtmf(self, digit: str) -> None:
        """A key the caller pressed (a phone call's carrier): counted as a client event."""
        host = self.host
        if host is None:
            return
        try:
            if self.seat is not None:
                self.seat.message()
        except NeedBudget as need:
            self.ctx.spawn(self._dtmf_after(need, digit))  # (lease more of the limit, then say it)
            return
        except ProtocolError as err:
            host.refuse(err)
            return
        self._client_events += 1
        host.dtmf(digit)

    async def _dtmf_after(self, need: NeedBudget, digit: str) -> None:
        await need.wait()
        self.dtmf(digit)

    def _take(self, message: Any, kind: Kind) -> Pending:
        host = self.host
        if host is None:
            # No session yet (the duplex dialect opens on the first event), or none any
            # more (replaced, closed): then what still comes before the close is ignored.
            return None if self.opened else self._first(message, kind)
        if self._idle is not None:
            self._last_event = self._loop.time()  # (the duplex dialect's idle clock)
        seat = self.seat
        pending: Pending = None
        try:
            if seat is not None and not self._paid and kind != "audio":
                seat.message()  # the events limit, before any work on the message (a track's audio is no message)
                self._paid = True
            if kind == "text":
                pending = self._text(host, message)
            else:
                fmt: AudioFormat | None = None  # a frame's: the session's input format
                if kind == "frame":
                    self._check_size(len(message))
                    audio = decode_input_frame(message)
                else:
                    audio, fmt = message
                if seat is not None:
                    seat.audio_in(host.input_ms(len(audio), fmt), None)
                (self._binary_counter if kind == "frame" else self._track_counter).inc()
                self._client_events += 1
                self._audio_refused = False
                host.receive_audio(audio, fmt)
        except NeedBudget as need:
            return self._after_budget(need, message, kind)  # paid: taken again without paying
        except ce.AckError as err:
            self.delivery.send_now(self.dialect.error(err))  # never an event with a seq: it would be acked
        except ProtocolError as err:
            if kind != "audio" or not self._audio_refused:
                host.refuse(err)
            # A track's audio comes every 20 ms whatever happens: its refusal is said once,
            # until audio is taken again (a tenant's input limit, reached).
            self._audio_refused = kind == "audio"
        except Exception:  # a bug must cost one event, not the session
            log.exception("session %s: unexpected failure handling a client message", host.id)
            host.refuse(ProtocolError(Code.INTERNAL, "The gateway failed on this event.", type="server_error"))
        self._paid = False
        return pending

    def _text(self, host: SessionHost, text: str) -> Pending:
        # Bytes, not characters (é is 2): a text of n characters is at most 4n bytes.
        if len(text) * 4 > self.max_message_bytes:
            self._check_size(len(text.encode()))
        event = self.dialect.decode(text)
        if self.seat is not None and isinstance(event, _AUDIO_APPENDS):
            self.seat.audio_in(host.input_ms(len(event.audio)), event.event_id)
        kind = type(event)
        counter = self._counters.get(kind)
        if counter is None:
            counter = self._counters[kind] = self.ctx.metrics.client_event_counter(self.dialect.event_name(kind))
        counter.inc()
        if (
            self.dialect.primary_only
            and isinstance(event, self.dialect.primary_only)
            and (self.sideband or self.media is not None)
        ):
            raise ProtocolError(Code.UNSUPPORTED, "Only a primary WebSocket sends this event: a WebRTC call's audio "
                                "goes on its track, and a sideband sends none.", param="type",
                                event_id=getattr(event, "event_id", None))  # fmt: skip
        if self.frontend:
            policy = host.session.channel_policy
            if policy is not None and not policy.allows_client(event):
                raise policy.refusal(event)
        if isinstance(event, ce.SessionResume):
            if self.sideband:
                raise ProtocolError(Code.UNSUPPORTED, "A sideband socket holds its call's session: it resumes none.",
                                    param="type")  # fmt: skip
            return self._resume(event)
        if isinstance(event, ce.EventAck):
            host.ack(event.last_received_server_event_seq)
            return None
        self._client_events += 1
        control = self._controls(event) if self._controls is not None else None
        if control is not None:
            self._control(host, control, event)
        elif isinstance(event, ce.OutputAudioClear) and (media := self._media_of(host)) is not None:
            # The audio plays here (or, for a sideband, on its call): cut it, and the session ends
            # the answer where it was cut.
            cut = media.clear_audio()
            if cut is not None:
                host.playback("cleared", cut[0], cut[1], cut[2])
            else:
                host.playback("cleared", host.session.active_response_id)
        else:
            host.receive(event)
        return None

    def _media_of(self, host: SessionHost) -> Media | None:
        """The connection that plays the session's audio: this one, or, for a sideband, its call's."""
        if self.media is not None:
            return self.media
        return host.call_media if self.sideband else None

    def _check_size(self, size: int) -> None:
        limit = self.max_message_bytes
        if size > limit:
            raise ProtocolError(
                Code.MESSAGE_TOO_LARGE,
                f"A message may be at most {limit} bytes; this one has {size}. Send audio in smaller appends.",
            )

    async def _after_budget(self, need: NeedBudget, message: Any, kind: Kind) -> None:
        """This replica's share of a limit is spent: lease more from the store, then the
        message is taken or refused."""
        await need.wait()
        pending = self._take(message, kind)
        if pending is not None:
            await pending

    def _control(self, host: SessionHost, control: Control, event: Any) -> None:
        """An event that is the connection's (the duplex dialect's heartbeat and close).
        Both are answered by the session, in its stream (a seq, journaled, in order)."""
        if control == "heartbeat":
            host.receive(event)  # session.heartbeat_ack
            return
        # The client ends the session for good: session.closed is the last event. Nothing
        # more is taken; the socket closes once what the commit gate holds is out.
        log.info("session %s closed by the client (%s)", host.id, control)
        self.host = None
        self._disarm_idle()
        host.receive(event)  # the session stops and says session.closed
        self.delivery.close(CloseCode.NORMAL, "session closed")
        self.ctx.spawn(self._end_closed(host))

    async def _end_closed(self, host: SessionHost) -> None:
        await self.delivery.closed()  # session.closed went out (or the gate gave up waiting)
        await host.end(reason="closed by the client", delete=True)

    def _policy(self) -> Any:
        """The channel policy of the session behind the door (None: none, or no session yet)."""
        host = self.host
        return host.session.channel_policy if host is not None else None

    # --- opening a session --------------------------------------------------------------

    async def open(self, requested: dict[str, Any] | None = None, **start: Any) -> bool:
        """A new session for this connection (``requested``: a client secret's session
        settings; ``start``: what the dialect's opening adds); False: refused, the
        connection is closing."""
        host = await self._new_host(self.model, requested if requested is not None else self.requested)
        if host is None:
            return False
        self._begin(host, **start)
        return True

    async def open_media(self, config: dict[str, Any]) -> ProtocolError | None:
        """A new session for a media connection whose request carried its settings (GPT-Live's
        ``POST /v1/live/sessions``: ``session``, applied as ``MediaSessionConfigParam``), started
        at once (``session.started`` waits for the data channel); or why not (nothing is said on
        the connection: the request's answer says it)."""
        opened = await self._open_host(self.model, self.requested)
        if isinstance(opened, tuple):
            return opened[0]
        try:
            warnings = opened.configure(config, media=True)
        except ProtocolError as err:
            await opened.end(reason="its settings were refused", delete=True)
            return err
        self._begin(opened, configured=True, warnings=warnings)
        return None

    async def open_call(self, config: dict[str, Any] | None) -> bool:
        """A phone call's session (SIP), in the door's dialect: ``config`` over the gateway's
        defaults (``open``), or, where the dialect starts a media session with its request's
        settings (``Dialect.media_start``: GPT-Live), as its start settings (``open_media``);
        False: refused (the call is then refused)."""
        if not self.dialect.media_start:
            return await self.open(config)
        refused = await self.open_media(config or {})
        if refused is not None:
            log.info("a call's session was refused: %s (%s)", refused.message, refused.code)
        return refused is None

    async def open_media_fork(self, source: str, config: dict[str, Any]) -> ProtocolError | None:
        """A new session for a media connection that carries on the stored session ``source``
        (GPT-Live's ``POST /v1/live/sessions/{id}/fork``: ``config``, the request's ``session``
        overrides), started at once; or why not (the request's answer says it)."""
        assert self.sessions is not None, "a door that only joins opens no session"
        try:
            host = await self.sessions.fork_session(source, principal=self.principal, quota=self.quota,
                                                    minted=self.minted)  # fmt: skip
        except ProtocolError as err:
            return err
        except StoreError as exc:
            log.warning("cannot fork %s: %s", source, exc)
            return ProtocolError(Code.STORE_UNAVAILABLE, "Session state is unavailable; try again shortly.")
        try:
            warnings = host.configure(config, media=True)
        except ProtocolError as err:
            await host.end(reason="its fork's settings were refused", delete=True)
            return err
        self._begin(host, configured=True, warnings=warnings)
        return None

    async def _new_host(self, model: str, requested: dict[str, Any] | None = None) -> SessionHost | None:
        opened = await self._open_host(model, requested)
        if isinstance(opened, tuple):
            self._refuse_connection(*opened)
            return None
        return opened

    async def _open_host(
        self, model: str, requested: dict[str, Any] | None = None
    ) -> SessionHost | tuple[ProtocolError, int]:
        """A new session's host, or why not (with the close code that says it on a socket)."""
        assert self.sessions is not None, "a door that only joins opens no session"
        try:
            given = {"session_id": self.session_id} if self.session_id is not None else {}
            return await self.sessions.open_session(
                model, principal=self.principal, dialect=self.dialect, requested=requested, quota=self.quota, **given
            )
        except StateLimitExceeded as exc:
            log.info("session refused: %s", exc)
            if self.seat is not None:
                self.seat.refused("max_state_mib")
            mib = exc.limit / (1 << 20)
            return (
                ProtocolError(
                    Code.RATE_LIMIT_EXCEEDED,
                    f"This credential's sessions hold {mib:g} MiB of session state, its limit: close one, or "
                    "try again once closed ones are forgotten.",
                ),
                CloseCode.RATE_LIMITED,
            )
        except StoreError as exc:
            THROTTLE.warning(log, "open", "cannot open a session: %s", exc)
            return (
                ProtocolError(Code.STORE_UNAVAILABLE, "Session state is unavailable; try again shortly."),
                CloseCode.TRY_AGAIN_LATER,
            )

    def _begin(self, host: SessionHost, **start: Any) -> None:
        """Serve ``host``'s new session through this door: attach, ``session.created``."""
        log.info("session %s opened principal=%s dialect=%s", host.id, self.principal, self.dialect.name)
        self.host = host
        self.opened = True
        host.minted = self.minted
        host.attach(self)
        host.start(**start)
        self.generation = host.attachment_generation
        self._arm_idle()

    def _refuse_connection(self, err: ProtocolError, close: int) -> None:
        self.delivery.send_now(self.dialect.error(err))
        self.peer.close(close, err.code)

    async def _first(self, message: Any, kind: Kind) -> None:
        """The first message of a connection that has no session yet: the dialect's opening
        rules (``Dialect.opening``; a Realtime resume-only socket's: ``transport/realtime.py``)."""
        opening = self.dialect.opening
        try:
            if kind != "text":
                raise ProtocolError(SESSION_NOT_OPEN, "Binary audio before the session is open; " + opening.not_open)
            event = self.dialect.decode(message)
        except ProtocolError as err:
            self.delivery.send_now(self.dialect.error(err))
            return
        control = self._controls(event) if self._controls is not None else None
        if opening.with_config is not None and isinstance(event, opening.with_config):
            await self._open_with(event)
        elif isinstance(event, ce.SessionResume):
            await self._resume(event)
        elif control == "heartbeat":
            assert self.dialect.heartbeat_ack is not None
            self.delivery.send_now(self.dialect.heartbeat_ack(None))
        elif control is not None:
            if self.dialect.closed is not None:  # (a dialect without one has nothing to say of no session)
                self.delivery.send_now(self.dialect.closed(None, "client_close"))
            self.opened = True  # nothing more is taken
            self.peer.close(CloseCode.NORMAL, "session closed")
        elif isinstance(event, ce.EventAck):
            pass  # nothing to acknowledge yet
        elif not opening.opens_default(event, self.resume_only):
            refused = ProtocolError(SESSION_NOT_OPEN, opening.not_open, param="type",
                                    event_id=getattr(event, "event_id", None))  # fmt: skip
            self.delivery.send_now(self.dialect.error(refused))
        elif await self.open():
            # The default session opens, then the event is handled (upstream's first-message
            # rule; a Realtime resume-only socket's session.update: session.created, then updated).
            pending = self._take(message, kind)
            if pending is not None:
                await pending

    async def _open_with(self, event: Any) -> None:
        """The dialect's opening event (``Opening.with_config``: duplex ``session.update``)
        opens the session with its ``session`` object (``event.session``, ``event.event_id``);
        on a fork's connection, the session carries the stored one on, with those overrides."""
        if self.source is not None:
            host = await self._fork_host(event)
            if host is None:
                return
            await self._configure_and_begin(host, event)
            return
        model = event.session.get("model")
        model = model if isinstance(model, str) and model else self.model
        assert self.sessions is not None
        if self.model_bound and model != self.model:
            err = ProtocolError(Code.MODEL_NOT_ALLOWED, f"This client secret was minted for the model "
                                f"{self.model!r}: leave 'model' out or send that.", param="session.model",
                                event_id=event.event_id)  # fmt: skip
            self.opened = True
            self._refuse_connection(err, CloseCode.FORBIDDEN)
            return
        if not self.sessions.serves(model):
            err = ProtocolError(Code.MODEL_NOT_FOUND, f"No model {model!r} is served here; GET /v1/models lists them.",
                                param="session.model", event_id=event.event_id)  # fmt: skip
            self.opened = True
            self._refuse_connection(err, CloseCode.UNKNOWN_MODEL)
            return
        if self.seat is not None and not self.seat.tenant.allows_model(model):
            err = ProtocolError(Code.MODEL_NOT_ALLOWED, f"This credential may not use the model {model!r}.",
                                param="session.model", event_id=event.event_id)  # fmt: skip
            self.opened = True
            self._refuse_connection(err, CloseCode.FORBIDDEN)
            return
        host = await self._new_host(model, self.requested)  # the update applies over what was minted
        if host is None:
            self.opened = True
            return
        await self._configure_and_begin(host, event)

    async def _fork_host(self, event: Any) -> SessionHost | None:
        assert self.sessions is not None and self.source is not None
        try:
            return await self.sessions.fork_session(self.source, principal=self.principal, quota=self.quota,
                                                    minted=self.minted)  # fmt: skip
        except ProtocolError as err:
            err.event_id = event.event_id
            self.opened = True
            self._refuse_connection(err, CloseCode.UNKNOWN_CALL)
        except StoreError as exc:
            log.warning("cannot fork %s: %s", self.source, exc)
            self.opened = True
            self._refuse_connection(
                ProtocolError(Code.STORE_UNAVAILABLE, "Session state is unavailable; try again shortly."),
                CloseCode.TRY_AGAIN_LATER,
            )
        return None

    async def _configure_and_begin(self, host: SessionHost, event: Any) -> None:
        try:
            warnings = host.configure(event.session)
        except ProtocolError as err:
            err.event_id = event.event_id
            self.delivery.send_now(self.dialect.error(err))  # the client may send another
            await host.end(reason="its first session.update was refused", delete=True)
            return
        self._begin(host, configured=True, warnings=warnings, event_id=event.event_id)

    # --- joining a session beside its connection -----------------------------------------

    def join(self, host: SessionHost) -> None:
        """A sideband: this connection joins ``host``'s session beside the connection that
        carries it (a backend's socket beside a WebRTC call: it watches every event, updates
        the session, answers function calls). It replaces nothing; it is replaced when the
        session moves to another replica."""
        self.host = host
        self.opened = True
        self.sideband = True
        host.attach(self, sideband=True)

    # --- resuming a session -----------------------------------------------------------

    async def _resume(self, event: ce.SessionResume) -> None:
        await self.resume(event)

    async def resume_at_connect(self, event: ce.SessionResume) -> bool:
        """A resume the connection asked for in its URL, before any message: as ``session.resume``
        first. The connection is served either way (a refusal is said on it)."""
        await self.resume(event)
        return True

    async def resume(self, event: ce.SessionResume) -> ProtocolError | None:
        """Resume ``event.session_id`` through this door (what ``session.resume`` does; a
        WebRTC re-offer carries one). The refusal, if any, is said to the client and returned."""
        self.resumed = True
        provisional = self.host  # the session this connection opened at connect (None: it opened none)
        refusal: ProtocolError | None = None
        try:
            if self._client_events:
                raise ProtocolError(
                    Code.RESUME_NOT_FIRST,
                    "session.resume must be the first event on a connection; reconnect and send it first.",
                    param="type",
                )
            await take_over(self, event, provisional)
        except ProtocolError as err:
            err.event_id = event.event_id
            refusal = err
        except StoreError as exc:
            THROTTLE.warning(log, "resume", "resume of %s failed: %s", event.session_id, exc)
            refusal = ProtocolError(
                Code.STORE_UNAVAILABLE, "Session state is unavailable; try again shortly.", event_id=event.event_id
            )
        except Exception:  # a bug must cost one event, not the session
            log.exception("unexpected failure resuming %s", event.session_id)
            refusal = ProtocolError(Code.INTERNAL, "The gateway failed on this event.", type="server_error",
                                    event_id=event.event_id)  # fmt: skip
        if refusal is not None:
            self._refuse(provisional, refusal)
            if refusal.code == Code.STORE_UNAVAILABLE and self.resume_only and self.host is None:
                # A resume-only socket with nothing to serve: close it (1013), so the client
                # resumes again shortly, with the same token (it was not rotated).
                self.delivery.close(CloseCode.TRY_AGAIN_LATER, Code.STORE_UNAVAILABLE)
        return refusal

    def _refuse(self, host: SessionHost | None, err: ProtocolError) -> None:
        """A refused resume: an error in the connection's own session, or on the connection
        when it has none (or has already moved to the session it asked for), in the dialect's
        handshake shape (duplex: the document's flat one)."""
        if host is None or host is not self.host:
            self.delivery.send_now(self.dialect.refusal(err))
        else:
            host.refuse(err)

    def took_over(self, host: SessionHost) -> None:
        """``host``'s session came to this connection by a resume (``resume.take_over``)."""
        self.host = host
        self.opened = True
        host.attach(self)
        self.generation = host.reattached()
        self._last_event = self._loop.time()
        self._arm_idle()

    # --- what hosting tells the connection ------------------------------------------------

    def replaced(self, session_id: str) -> None:
        """Another connection took the session: say so (to a client that knows the
        event: it resumed, opted in, or speaks the duplex dialect) and close (4009)."""
        host, self.host = self.host, None
        self._disarm_idle()
        announce = self.dialect.always_announces_replaced or self.resumed
        if announce or (host is not None and host.session.sends_gateway_events):
            self.delivery.send_now(self.dialect.replaced(session_id, self.generation))
        self.ctx.metrics.closes.labels(str(int(CloseCode.SESSION_REPLACED))).inc()
        self.peer.close(CloseCode.SESSION_REPLACED, "session replaced")

    def close(self, code: int, reason: str) -> None:
        """Close from outside (drain, shutdown, expiry): what is queued goes out first, and
        on a commit-gated connection what waits for its commit too."""
        self.delivery.close(code, reason)

    def detach(self) -> None:
        """The connection is gone: its session stays resumable for the grace period."""
        self._disarm_idle()
        if self.host is not None:
            self.host.detach(self)
            self.host = None
        self.ctx.doors.discard(self)

    # --- the idle timeout (the duplex dialect's idle_timeout_s) --------------------------

    def _arm_idle(self) -> None:
        self._disarm_idle()
        host = self.host
        timeout = host.idle_timeout_s if host is not None else None
        if timeout is not None:
            left = self._last_event + timeout - self._loop.time()
            self._idle = self._loop.call_later(max(0.0, left), self._idle_check)

    def _disarm_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _idle_check(self) -> None:
        self._idle = None
        host = self.host
        timeout = host.idle_timeout_s if host is not None else None
        if host is None or host.ended or timeout is None:
            return
        if self._loop.time() - self._last_event < timeout:
            self._arm_idle()  # an event came (or the timeout grew): look again later
            return
        log.info("session %s idle for %.0f s: expired", host.id, timeout)
        host.expire_idle()
