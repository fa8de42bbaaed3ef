"""``/v1/realtime``: the thin I/O shell around a ``RealtimeSession``.

Raw ASGI (no per-message framework wrapper: this is the hot path). One task
reads the socket and feeds the session; request tasks owned by the
orchestrator feed engine outputs back through callbacks; one writer task
drains the outbox. Everything the session produces is flushed right after
each input, in order.

Subprotocols a client may offer (one is echoed, never the key):
``omni-binary.v1`` (binary audio fast path), ``realtime``,
``openai-beta.realtime-v1`` (beta names and shapes),
``openai-insecure-api-key.<key or client secret>`` (browser auth).
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol
from urllib.parse import parse_qs

import orjson

from gateway.hosting.claim import claim
from gateway.hosting.host import HostContext, SessionHost
from gateway.hosting.takeover import Replay, Resync, plan
from gateway.protocol import client_events as ce
from gateway.protocol import duplex_events
from gateway.protocol.connection_events import error_event, replaced_event, resumed_event, resync_event
from gateway.protocol.duplex_config import DuplexConfig, default_session_config
from gateway.protocol.errors import CloseCode, Code, ProtocolError
from gateway.protocol.server_events import (
    AUDIO_DELTA,
    BINARY_SUBPROTOCOL,
    decode_input_frame,
    encode_audio_frame,
)
from gateway.protocol.session_config import ConfigLimits, SessionConfig, TurnDetection, apply_update
from gateway.quotas import NeedBudget, Seat
from gateway.session.session import RealtimeSession, VadStream
from gateway.store.base import StoreError
from gateway.transport.handshake import accept, admit_seat, common_refusal, refuse
from gateway.transport.lifecycle import bound_send_buffer, drop, settle
from gateway.transport.outbox import Outbox, SlowConsumer, WriteNow
from gateway.transport.services import Services
from gateway.transport.ws_server import ABORT_EXTENSION, DIRECT_EXTENSION, MESSAGES_PER_TURN, WRITE_EXTENSION
from orchestrator.engine import Engine
from orchestrator.orchestrator import Orchestrator

log = logging.getLogger("omni.realtime")

BETA_SUBPROTOCOL = "openai-beta.realtime-v1"
SLOW_CLOSE_GRACE_S = 5.0  # after the 4010 decision, how long the close frame may wait behind a full
#   socket before the connection is dropped without it
GATE_CLOSE_WAIT_S = 1.0  # a commit-gated socket's close waits this long at most for its last events' commit
_ECHO_ORDER = (BINARY_SUBPROTOCOL, "realtime", BETA_SUBPROTOCOL)


def choose_subprotocol(offered: list[str]) -> str | None:
    for name in _ECHO_ORDER:
        if name in offered:
            return name
    return None


def choose_duplex_subprotocol(offered: list[str]) -> str | None:
    """A duplex socket speaks JSON only: no binary fast path to echo."""
    return "realtime" if "realtime" in offered else None


class RealtimeServices(Services, Protocol):
    """What the realtime endpoint needs of the process (the runtime provides it)."""

    @property
    def hosting(self) -> HostContext: ...

    @property
    def connections(self) -> set[Connection]: ...

    @property
    def engine(self) -> Engine:
        """The default route's engine (voices for a client secret's session settings)."""

    @property
    def vad_factory(self) -> Callable[[], VadStream] | None: ...

    def route(self, model: str) -> tuple[Engine, Orchestrator] | None: ...

    async def open_session(
        self, config: SessionConfig, *, principal: str, beta: bool, duplex: DuplexConfig | None = None
    ) -> SessionHost:
        """A new session, hosted here (``duplex``: in the duplex dialect); raises ProtocolError
        (no route) or StoreError."""

    def restore_session(self, state: dict[str, Any]) -> tuple[RealtimeSession, Orchestrator]:
        """A session rebuilt from its snapshot on this replica (a takeover); raises
        ProtocolError (model_not_found) when its model is not served here."""


class RealtimeEndpoint:
    """ASGI app for the realtime WebSocket. ``duplex``: the connection class that serves
    ``?duplex=1`` sockets (``transport.duplex.DuplexConnection``; the app wires it)."""

    def __init__(self, runtime: RealtimeServices, *, duplex: type[Connection] | None = None) -> None:
        self.runtime = runtime
        self.duplex: Any = duplex

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        rt = self.runtime
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        duplex = self.duplex is not None and duplex_events.enabled((query.get("duplex") or [None])[0])

        def encode_error(code: str, message: str) -> bytes:
            return duplex_events.error_event(ProtocolError(code, message)) if duplex else error_event(code, message)

        choose = choose_duplex_subprotocol if duplex else choose_subprotocol
        hs = await accept(rt, scope, receive, send, choose, encode_error)
        if hs is None:
            return
        model = hs.param("model") or rt.settings.model
        refusal = common_refusal(rt, hs)
        if refusal is None and rt.route(model) is None:
            refusal = (
                Code.MODEL_NOT_FOUND,
                f"No model {model!r} is served here; GET /v1/models lists them.",
                CloseCode.UNKNOWN_MODEL,
            )
        if refusal is None and not hs.grant.tenant.allows_model(model):
            refusal = (Code.MODEL_NOT_ALLOWED, f"This credential may not use the model {model!r}.", CloseCode.FORBIDDEN)
        if refusal is not None:
            await refuse(rt, send, refusal, encode_error(refusal[0], refusal[1]))
            return
        seat = await admit_seat(rt, hs, send, encode_error)
        if seat is None:
            return
        if duplex:
            autostart = (hs.param("autostart") or "").strip().lower()
            resume_only = duplex_events.enabled(hs.param("resume")) or autostart in duplex_events.FALSY
            dconn = self.duplex(rt, receive, send, principal=hs.grant.principal, model=model,
                                     resume_only=resume_only)  # fmt: skip
            dconn.seat = seat
            dconn.direct = scope.get("extensions", {}).get(DIRECT_EXTENSION)
            dconn.abort = scope.get("extensions", {}).get(ABORT_EXTENSION)
            dconn.write_directly(scope.get("extensions", {}).get(WRITE_EXTENSION))
            bound_send_buffer(scope, rt.settings.socket_send_buffer_bytes)
            opens_now = hs.param("model") is not None and not resume_only
            await dconn.run(default_session_config(model) if opens_now else None)
            return
        beta = "realtime=v1" in hs.headers.get("openai-beta", "") or BETA_SUBPROTOCOL in hs.offered
        config = SessionConfig(model=model, turn_detection=TurnDetection() if rt.vad_factory else None)
        if hs.grant.session:
            try:
                config, _ = apply_update(
                    config, hs.grant.session, beta=False, limits=ConfigLimits(voices=rt.engine.info.voices)
                )
            except ProtocolError:
                pass  # validated when minted; a stale shape falls back to the defaults
            if rt.vad_factory is None:
                config = replace(config, turn_detection=None)  # no detector here: manual turns
        binary = BINARY_SUBPROTOCOL in hs.offered
        conn = Connection(rt, receive, send, beta=beta, binary=binary, principal=hs.grant.principal)
        conn.seat = seat
        conn.direct = scope.get("extensions", {}).get(DIRECT_EXTENSION)
        conn.abort = scope.get("extensions", {}).get(ABORT_EXTENSION)
        conn.write_directly(scope.get("extensions", {}).get(WRITE_EXTENSION))
        bound_send_buffer(scope, rt.settings.socket_send_buffer_bytes)
        await conn.run(config)


class Connection:
    """One client socket. The session it serves lives in a ``SessionHost``."""

    def __init__(
        self, runtime: RealtimeServices, receive: Any, send: Any, *, beta: bool, binary: bool, principal: str
    ) -> None:
        self.runtime = runtime
        self.principal = principal
        self.binary = binary
        self.beta = beta
        self._receive = receive
        telemetry = runtime.hosting.telemetry
        if telemetry is not None:  # traced: each turn ends when its first audio reaches the socket
            send = telemetry.socket_sends(send, self)
        self.outbox = Outbox(send, runtime.settings.outbound_queue_bytes, runtime.settings.outbound_stall_s)
        self.host: SessionHost | None = None
        self._held: list[tuple[dict[str, Any], bytes]] | None = None  # live events held back
        self._holds = 0
        self._release_after = 0
        self._reader_task: asyncio.Task[None] | None = None
        self._writer_task: asyncio.Task[None] | None = None
        self._client_events = 0
        self._resumed = False  # this client sent session.resume: it speaks the gateway's extensions
        self._busy = False  # the read loop is handling a message (the direct path must wait)
        self.direct: Callable[[Callable[[dict[str, Any]], bool]], None] | None = None  # the server's hook
        self.abort: Callable[[], None] | None = None  # the server's way to drop the TCP connection
        self._binary_counter = runtime.metrics.client_event_counter("binary.append")
        self._opened = False  # a session was opened or resumed on this socket
        self.seat: Seat | None = None  # this socket's share of its principal's limits
        self._paid = False  # the message being handled was counted against the events limit
        # Commit-gated (the duplex dialect): session events go out only once the store
        # holds them, so a replica's crash never leaves this client ahead of the store.
        self.gated = False
        self._gate: deque[tuple[dict[str, Any], bytes]] = deque()
        self._committed = 0  # the store holds this session's events up to this seq
        self._close_after_gate: tuple[int, str] | None = None

    def write_directly(self, write_now: WriteNow | None) -> None:
        """Use the server's direct write (``omni.websocket.write``) where it offers one.
        A traced process keeps ASGI ``send``: its traces see what reached the socket there."""
        if self.runtime.hosting.telemetry is None:
            self.outbox.write_now = write_now

    # --- main loop -----------------------------------------------------------

    async def run(self, config: SessionConfig | None) -> None:
        """Serve the socket; ``config`` None: no session until the client's first event
        (a duplex socket opened with ``?autostart=0``)."""
        rt = self.runtime
        loop = asyncio.get_running_loop()
        writer = self._writer_task = loop.create_task(self.outbox.run())
        rt.connections.add(self)
        rt.metrics.sessions.inc()
        rt.metrics.sessions_total.inc()
        reader: asyncio.Task[None] | None = None
        try:
            if config is not None and not await self._open(config):
                await writer
                return
            reader = self._reader_task = loop.create_task(self._read_loop())
            await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
            await settle(reader, 2.0)  # we closed first: give the peer a moment to answer the close frame
        finally:
            # Whatever ended the socket (the client, a close, a slow consumer dropped, a
            # bug), the connection is released and its session detached.
            rt.connections.discard(self)
            rt.metrics.sessions.dec()
            if reader is not None and not reader.done():
                reader.cancel()
            if self.host is not None:
                self.host.detach(self)
                self.host = None
            self.outbox.close(CloseCode.NORMAL, "")
            await settle(writer, 1.0)
            if self.seat is not None:
                await self.seat.close()

    async def _open(self, config: SessionConfig, **start: Any) -> bool:
        """A new session for this socket; False (the socket is closing) if the store is down."""
        host = await self._host_for(config)
        if host is None:
            return False
        self._begin(host, **start)
        return True

    async def _host_for(self, config: SessionConfig) -> SessionHost | None:
        try:
            return await self._new_session(config)
        except StoreError as exc:
            log.warning("cannot open a session: %s", exc)
            unavailable = ProtocolError(Code.STORE_UNAVAILABLE, "Session state is unavailable; try again shortly.")
            self.send_raw(self._error(unavailable))
            self.outbox.close(CloseCode.TRY_AGAIN_LATER, Code.STORE_UNAVAILABLE)
            return None

    def _begin(self, host: SessionHost, **start: Any) -> None:
        """Serve ``host``'s new session on this socket: attach, ``session.created``, direct reads."""
        log.info("session %s opened principal=%s dialect=%s binary=%s", host.id, self.principal,
                 host.session.dialect, self.binary)  # fmt: skip
        self.host = host
        self._opened = True
        host.attach(self)
        host.meter = self.seat
        host.session.start(resume_token=host.rotate_token(), **start)
        host.flush()
        if self.direct is not None:
            self.direct(self.on_message)  # messages now come as they are read (see on_message)

    async def _new_session(self, config: SessionConfig) -> SessionHost:
        return await self.runtime.open_session(config, principal=self.principal, beta=self.beta)

    async def _before_session(self, message: dict[str, Any]) -> bool:
        """A message on a socket that has no session yet (only a dialect that opens lazily
        has one); False ends the socket."""
        raise AssertionError("this socket opened its session at connect")

    async def _read_loop(self) -> None:
        handled = 0
        while True:
            message = await self._receive()
            kind = message["type"]
            if kind == "websocket.disconnect":
                return
            host = self.host
            if kind != "websocket.receive":
                continue
            self._busy = True
            try:
                if host is None:
                    if not self._opened and not await self._before_session(message):
                        return
                    continue  # (a replaced socket reads on until it closes, and ignores what comes)
                resume = self._handle(host, message, direct=False)
                while isinstance(resume, NeedBudget):  # this replica's share of a limit is spent
                    await resume.wait()  # lease more from the store, then the message is taken or refused
                    resume = self._handle(host, message, direct=False)
                if isinstance(resume, ce.SessionResume):
                    await self._resume_safely(resume, host)
            finally:
                self._busy = False
            handled += 1
            if handled % MESSAGES_PER_TURN == 0:
                await asyncio.sleep(0)  # as the server's direct path does: other sockets get their turn

    async def _resume_safely(self, event: ce.SessionResume, host: SessionHost | None) -> None:
        try:
            await self._resume(event)
        except ProtocolError as err:
            self._refuse(host, err)
        except Exception:  # a bug must cost one event, not the session
            log.exception("unexpected failure resuming %s", event.session_id)
            self._refuse(host, ProtocolError(Code.INTERNAL, "The gateway failed on this event.", type="server_error"))

    def on_message(self, message: dict[str, Any]) -> bool:
        """The direct path (``omni.websocket.direct``): the server protocol hands a
        received message here as it is read, with no task switch. False: not taken
        (the read loop is busy with one, or this one needs it), so the protocol
        queues it, and what follows, for the read loop: the order holds."""
        host = self.host
        if self._busy or host is None:
            return False
        return self._handle(host, message, direct=True) is None

    def _handle(
        self, host: SessionHost, message: dict[str, Any], *, direct: bool
    ) -> ce.SessionResume | NeedBudget | bool | None:
        """One client message, handled and flushed. Returns a ``session.resume`` or a
        ``NeedBudget`` for the read loop to carry out (they await the store; the
        message is handled again after a NeedBudget), or, on the direct path, False to
        hand that message to the read loop instead."""
        outcome = self._handle_message(host, message, direct=direct)
        if outcome is not False and not isinstance(outcome, NeedBudget):
            self._paid = False  # done with (else the same message comes again: it was paid for)
        return outcome

    def _handle_message(
        self, host: SessionHost, message: dict[str, Any], *, direct: bool
    ) -> ce.SessionResume | NeedBudget | bool | None:
        limit = self.runtime.settings.max_message_bytes
        text = message.get("text")
        seat = self.seat
        try:
            if seat is not None and not self._paid:
                seat.message()  # the events limit, before any work on the message
                self._paid = True
            if text is not None:
                # Bytes, not characters (é is 2): a text of n characters is at most 4n bytes.
                if len(text) * 4 > limit and (size := len(text.encode())) > limit:
                    raise ProtocolError(
                        Code.MESSAGE_TOO_LARGE,
                        f"A message may be at most {limit} bytes; this one has {size}. Send audio in smaller appends.",
                    )
                event = self._decode(text)
                if seat is not None and isinstance(event, ce.AudioAppend):
                    seat.audio_in(host.session.config.input_format.duration_ms(len(event.audio)), event.event_id)
                if isinstance(event, ce.SessionResume):
                    if direct:
                        return False
                    self._counter(ce.SessionResume).inc()
                    return event
                self._counter(type(event)).inc()
                if isinstance(event, ce.EventAck):
                    self._ack(host, event)
                    return None
                self._client_events += 1
                if not self._connection_event(host, event):
                    host.session.handle(event)
            else:
                data = message.get("bytes") or b""
                if len(data) > limit:
                    raise ProtocolError(
                        Code.MESSAGE_TOO_LARGE, f"A message may be at most {limit} bytes; got {len(data)}."
                    )
                audio = decode_input_frame(data)
                if seat is not None:
                    seat.audio_in(host.session.config.input_format.duration_ms(len(audio)), None)
                self._binary_counter.inc()
                self._client_events += 1
                host.session.append_audio(audio, None)
        except NeedBudget as need:
            return False if direct else need
        except ce.AckError as err:
            self.send_raw(self._error(err))  # never an event with a seq: it would be acked again
            return None
        except ProtocolError as err:
            host.session.error(err)
        except Exception:  # a bug must cost one event, not the session
            log.exception("session %s: unexpected failure handling a client message", host.id)
            host.session.error(ProtocolError(Code.INTERNAL, "The gateway failed on this event.", type="server_error"))
        host.flush()
        return None

    def _decode(self, text: str) -> Any:
        return ce.decode(text)

    def _connection_event(self, host: SessionHost, event: Any) -> bool:
        """Handle an event that belongs to the socket, not the session; False: not one."""
        return False

    def _counter(self, event_type: type) -> Any:
        return self.runtime.metrics.client_event_counter(_EVENT_NAMES.get(event_type, "other"))

    async def _resume(self, event: ce.SessionResume) -> None:
        self._resumed = True
        if self._client_events:
            raise ProtocolError(
                Code.RESUME_NOT_FIRST,
                "session.resume must be the first event on a connection; reconnect and send it first.",
                param="type",
                event_id=event.event_id,
            )
        provisional = self.host  # the session this socket opened at connect (None: it opened none)
        try:
            await self._take_over(event, provisional)
        except ProtocolError as err:
            err.event_id = event.event_id
            self._refuse(provisional, err)
        except StoreError as exc:
            log.warning("resume of %s failed: %s", event.session_id, exc)
            unavailable = ProtocolError(
                Code.STORE_UNAVAILABLE, "Session state is unavailable; try again shortly.", event_id=event.event_id
            )
            self._refuse(provisional, unavailable)

    def _refuse(self, host: SessionHost | None, err: ProtocolError) -> None:
        """A refused resume: an error on the socket's own session, or on the socket when it has none."""
        if host is None or host is not self.host:
            self.send_raw(self._error(err))
        else:
            host.session.error(err)
            host.flush()

    async def _take_over(self, event: ce.SessionResume, provisional: SessionHost | None) -> None:
        """Move ``event.session_id`` onto this connection and carry out the plan:
        replay what the client missed (or send the state to resync from), then live."""
        rt = self.runtime
        taken = await claim(rt.hosting, event, self.principal, provisional=provisional, restore=rt.restore_session)
        host, sid, last = taken.host, event.session_id, event.last_received_server_event_seq
        token = host.rotate_token()
        self.hold()  # live events from here on wait until the replay is out
        host.attach(self)
        host.meter = self.seat
        self.host = host
        self._opened = True
        self._attached(host)
        try:
            read = await taken.read()
        except StoreError:
            # Attached but cannot replay: let the client retry the resume shortly.
            self.release(host.session.seq)
            again = ProtocolError(Code.STORE_UNAVAILABLE, "Session state is unavailable; resume again shortly.")
            self.send_raw(self._error(again))
            self.close(CloseCode.TRY_AGAIN_LATER, Code.STORE_UNAVAILABLE)
            host.detach(self)
            if provisional is not None:
                await provisional.end(reason="resume failed", delete=True)
            return
        outcome = plan(taken.held, read, event, self.principal)
        if isinstance(outcome, Resync):
            self.send_raw(self._resync_message(host, token, outcome))
            self.release(host.session.seq)
        elif isinstance(outcome, Replay):
            self.send_raw(self._resumed_message(host, token, outcome))
            for _, data in outcome.events:
                self.replay(data)
            self.release(outcome.replay_to or 0)
        else:  # admitted before the claim, so a refusal cannot come now
            raise AssertionError(f"a refusal after the claim: {outcome}")
        rt.metrics.resumes.labels("resync" if isinstance(outcome, Resync) else "replayed").inc()
        log.info("session %s resumed (last seq %d, %d replayed, gap=%s)", sid, last, len(read.events), read.gap)
        if taken.recovered:
            host.session.recover("replica_lost")
        host.flush()  # also writes the snapshot with the rotated token
        if self.direct is not None:
            self.direct(self.on_message)
        if provisional is not None:
            await provisional.end(reason="replaced by a resumed session", delete=True)

    # --- what each dialect spells its own way (the duplex connection overrides these) ----

    def _attached(self, host: SessionHost) -> None:
        """This socket now carries ``host``'s session (after a resume)."""

    def _error(self, err: ProtocolError) -> bytes:
        return error_event(err.code, err.message, param=err.param, event_id=err.event_id)

    def _resync_message(self, host: SessionHost, token: str, outcome: Resync) -> bytes:
        s = host.session
        return resync_event(
            session_id=s.id,
            resume_token=token,
            reason=outcome.reason,
            message=outcome.message,
            session=s.render_config(),
            conversation=[it.render(s.beta) for it in s.conversation],
            last_server_event_seq=s.seq,
        )

    def _resumed_message(self, host: SessionHost, token: str, outcome: Replay) -> bytes:
        return resumed_event(
            session_id=host.id, resume_token=token, replay_from=outcome.replay_from, replay_to=outcome.replay_to
        )

    def _replaced_message(self, session_id: str) -> bytes:
        return replaced_event(session_id)

    def _ack(self, host: SessionHost, event: ce.EventAck) -> None:
        host.ack(min(event.last_received_server_event_seq, host.session.seq))

    # --- output ------------------------------------------------------------------

    def send(self, event: dict[str, Any], data: bytes) -> None:
        """One session event (already JSON-encoded in the client's dialect)."""
        if self._held is not None:
            self._held.append((event, data))
            return
        self._deliver(event, data)

    def committed(self, seq: int) -> None:
        if seq <= self._committed:
            return
        self._committed = seq
        gate = self._gate
        while gate and gate[0][0]["server_event_seq"] <= seq:
            self._write(*gate.popleft())
        if not gate and self._close_after_gate is not None:
            self.outbox.close(*self._close_after_gate)

    def _deliver(self, event: dict[str, Any], data: bytes) -> None:
        if self.gated and (self._gate or event["server_event_seq"] > self._committed):
            self._gate.append((event, data))  # order holds: nothing passes what waits
            return
        self._write(event, data)

    def _write(self, event: dict[str, Any], data: bytes) -> None:
        try:
            if self.binary and event["type"] == AUDIO_DELTA:
                self.outbox.put_bytes(encode_audio_frame(event))
            else:
                self.outbox.put_text(data)
        except SlowConsumer as exc:
            self._slow(exc)

    def send_raw(self, data: bytes) -> None:
        try:
            self.outbox.put_text(data)
        except SlowConsumer as exc:
            self._slow(exc)

    def _slow(self, exc: SlowConsumer) -> None:
        log.warning("slow consumer, closing: %s", exc)
        self.runtime.metrics.closes.labels(str(int(CloseCode.SLOW_CONSUMER))).inc()
        self.outbox.abort(CloseCode.SLOW_CONSUMER, Code.SLOW_CONSUMER)
        # The writer may be blocked on a socket the client never drains: give the
        # close frame a moment, then drop the connection without it.
        asyncio.get_running_loop().call_later(SLOW_CLOSE_GRACE_S, self._abandon)

    def _abandon(self) -> None:
        drop(self.abort, (self._writer_task, self._reader_task))

    def hold(self) -> None:
        """Hold live events (a replay is being read, or an answer's end is being
        committed); holds nest, and the events go out when the last is released."""
        self._holds += 1
        if self._held is None:
            self._held = []

    def release(self, after_seq: int) -> None:
        """End one hold; at the last, send the held events the replay (up to
        ``after_seq``) did not already carry."""
        self._holds = max(0, self._holds - 1)
        self._release_after = max(self._release_after, after_seq)
        if self._holds:
            return
        held, self._held = self._held or [], None
        after, self._release_after = self._release_after, 0
        for event, data in held:
            if event["server_event_seq"] > after:
                self._deliver(event, data)

    def replay(self, data: bytes) -> None:
        """One journaled event, sent again as it was first sent."""
        if self.binary and b'"response.output_audio.delta"' in data[:64]:
            event = orjson.loads(data)
            event["delta"] = base64.b64decode(event["delta"])
            self._write(event, data)  # replayed now (it is journaled): not held nor gated like live events
        else:
            self.send_raw(data)

    def replaced(self, session_id: str) -> None:
        """Another connection resumed our session: say so (to a client that knows
        the gateway's events: it resumed, or opted in) and close (4009)."""
        host, self.host = self.host, None
        if self._resumed or (host is not None and host.session.sends_gateway_events):
            self.send_raw(self._replaced_message(session_id))
        self.runtime.metrics.closes.labels(str(int(CloseCode.SESSION_REPLACED))).inc()
        self.outbox.close(CloseCode.SESSION_REPLACED, "session replaced")

    def close(self, code: int, reason: str) -> None:
        """Close from outside (drain, shutdown, expiry): queued events go out first, and
        on a commit-gated socket the events waiting for their commit too."""
        if self._gate:
            self._close_after_gate = (code, reason)
            # No commit in time (the session ended without one): what waits goes out anyway.
            last = self._gate[-1][0]["server_event_seq"]
            asyncio.get_running_loop().call_later(GATE_CLOSE_WAIT_S, self.committed, last)
            return
        self.outbox.close(code, reason)


_EVENT_NAMES: dict[type, str] = {
    ce.SessionUpdate: "session.update",
    ce.AudioAppend: "input_audio_buffer.append",
    ce.AudioCommit: "input_audio_buffer.commit",
    ce.AudioClear: "input_audio_buffer.clear",
    ce.ItemCreate: "conversation.item.create",
    ce.ItemRetrieve: "conversation.item.retrieve",
    ce.ItemTruncate: "conversation.item.truncate",
    ce.ItemDelete: "conversation.item.delete",
    ce.ResponseCreate: "response.create",
    ce.ResponseCancel: "response.cancel",
}
