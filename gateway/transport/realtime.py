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
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson

from gateway.protocol import client_events as ce
from gateway.protocol.errors import CloseCode, Code, ProtocolError
from gateway.protocol.server_events import (
    AUDIO_DELTA,
    BINARY_SUBPROTOCOL,
    decode_input_frame,
    encode_audio_frame,
)
from gateway.protocol.session_config import ConfigLimits, SessionConfig, TurnDetection, apply_update
from gateway.store.base import StoreError
from gateway.transport.handshake import accept, common_refusal, refuse
from gateway.transport.host import SessionHost, connection_event, error_event
from gateway.transport.outbox import Outbox, SlowConsumer
from gateway.transport.ws_server import DIRECT_EXTENSION

if TYPE_CHECKING:
    from gateway.runtime import Runtime

log = logging.getLogger("omni.realtime")

BETA_SUBPROTOCOL = "openai-beta.realtime-v1"
SLOW_CLOSE_GRACE_S = 5.0  # after the 4010 decision, how long the close frame may wait behind a full
#   socket before the connection is dropped without it
_ECHO_ORDER = (BINARY_SUBPROTOCOL, "realtime", BETA_SUBPROTOCOL)


def choose_subprotocol(offered: list[str]) -> str | None:
    for name in _ECHO_ORDER:
        if name in offered:
            return name
    return None


class RealtimeEndpoint:
    """ASGI app for the realtime WebSocket."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        rt = self.runtime
        hs = await accept(rt, scope, receive, send, choose_subprotocol)
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
        if refusal is not None:
            await refuse(rt, send, refusal, error_event(refusal[0], refusal[1]))
            return
        assert hs.grant is not None
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
        conn.direct = scope.get("extensions", {}).get(DIRECT_EXTENSION)
        await conn.run(config)


class Connection:
    """One client socket. The session it serves lives in a ``SessionHost``."""

    def __init__(self, runtime: Runtime, receive: Any, send: Any, *, beta: bool, binary: bool, principal: str) -> None:
        self.runtime = runtime
        self.principal = principal
        self.binary = binary
        self.beta = beta
        self._receive = receive
        self.outbox = Outbox(send, runtime.settings.outbound_queue_bytes)
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
        self._binary_counter = runtime.metrics.client_event_counter("binary.append")

    # --- main loop -----------------------------------------------------------

    async def run(self, config: SessionConfig) -> None:
        rt = self.runtime
        loop = asyncio.get_running_loop()
        writer = self._writer_task = loop.create_task(self.outbox.run())
        rt.connections.add(self)
        rt.metrics.sessions.inc()
        rt.metrics.sessions_total.inc()
        reader: asyncio.Task[None] | None = None
        try:
            try:
                self.host = await rt.open_session(config, principal=self.principal, beta=self.beta)
            except StoreError as exc:
                log.warning("cannot open a session: %s", exc)
                self.send_raw(error_event(Code.STORE_UNAVAILABLE, "Session state is unavailable; try again shortly."))
                self.outbox.close(CloseCode.TRY_AGAIN_LATER, Code.STORE_UNAVAILABLE)
                await writer
                return
            log.info(
                "session %s opened principal=%s beta=%s binary=%s", self.host.id, self.principal, self.beta, self.binary
            )
            self.host.attach(self)
            self.host.session.start(resume_token=self.host.rotate_token())
            self.host.flush()
            if self.direct is not None:
                self.direct(self.on_message)  # messages now come as they are read (see on_message)
            reader = self._reader_task = loop.create_task(self._read_loop())
            await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
            if not reader.done():
                # We closed first: give the peer a moment to answer the close frame.
                try:
                    await asyncio.wait_for(reader, timeout=2.0)
                except (TimeoutError, Exception):
                    reader.cancel()
        finally:
            if reader is not None and not reader.done():
                reader.cancel()
            if reader is not None and reader.done() and not reader.cancelled() and reader.exception():
                log.debug("reader ended with %r", reader.exception())
            if self.host is not None:
                self.host.detach(self)
                self.host = None
            self.outbox.close(CloseCode.NORMAL, "")
            try:
                await asyncio.wait_for(writer, timeout=1.0)
            except (TimeoutError, Exception):
                writer.cancel()
            rt.connections.discard(self)
            rt.metrics.sessions.dec()

    async def _read_loop(self) -> None:
        while True:
            message = await self._receive()
            kind = message["type"]
            if kind == "websocket.disconnect":
                return
            host = self.host
            if kind != "websocket.receive" or host is None:
                continue
            self._busy = True
            try:
                resume = self._handle(host, message, direct=False)
                if isinstance(resume, ce.SessionResume):
                    try:
                        await self._resume(resume)
                    except ProtocolError as err:
                        host.session.error(err)
                        host.flush()
                    except Exception:  # a bug must cost one event, not the session
                        log.exception("session %s: unexpected failure resuming", host.id)
                        host.session.error(
                            ProtocolError(Code.INTERNAL, "The gateway failed on this event.", type="server_error")
                        )
                        host.flush()
            finally:
                self._busy = False

    def on_message(self, message: dict[str, Any]) -> bool:
        """The direct path (``omni.websocket.direct``): the server protocol hands a
        received message here as it is read, with no task switch. False: not taken
        (the read loop is busy with one, or this one needs it), so the protocol
        queues it, and what follows, for the read loop: the order holds."""
        host = self.host
        if self._busy or host is None:
            return False
        return self._handle(host, message, direct=True) is None

    def _handle(self, host: SessionHost, message: dict[str, Any], *, direct: bool) -> ce.SessionResume | bool | None:
        """One client message, handled and flushed. Returns a ``session.resume`` for
        the read loop to carry out (it awaits the store), or, on the direct path,
        False to hand that message to the read loop instead."""
        limit = self.runtime.settings.max_message_bytes
        text = message.get("text")
        try:
            if text is not None:
                if len(text) > limit:
                    raise ProtocolError(
                        Code.MESSAGE_TOO_LARGE,
                        f"A message may be at most {limit} bytes; this one has {len(text)}. "
                        "Send audio in smaller appends.",
                    )
                event = ce.decode(text)
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
                host.session.handle(event)
            else:
                data = message.get("bytes") or b""
                if len(data) > limit:
                    raise ProtocolError(
                        Code.MESSAGE_TOO_LARGE, f"A message may be at most {limit} bytes; got {len(data)}."
                    )
                self._binary_counter.inc()
                self._client_events += 1
                host.session.append_audio(decode_input_frame(data), None)
        except ProtocolError as err:
            host.session.error(err)
        except Exception:  # a bug must cost one event, not the session
            log.exception("session %s: unexpected failure handling a client message", host.id)
            host.session.error(ProtocolError(Code.INTERNAL, "The gateway failed on this event.", type="server_error"))
        host.flush()
        return None

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
        await self.runtime.resume(self, event)

    def _ack(self, host: SessionHost, event: ce.EventAck) -> None:
        host.ack(min(event.last_received_server_event_seq, host.session.seq))

    # --- output ------------------------------------------------------------------

    def send_event(self, event: dict[str, Any], data: bytes) -> None:
        """One session event (already JSON-encoded in the client's dialect)."""
        if self._held is not None:
            self._held.append((event, data))
            return
        self._deliver(event, data)

    def _deliver(self, event: dict[str, Any], data: bytes) -> None:
        try:
            if self.binary and event["type"] == AUDIO_DELTA:
                self.outbox.put_bytes(encode_audio_frame(event))
            else:
                self.outbox.put_text(data.decode())
        except SlowConsumer as exc:
            self._slow(exc)

    def send_raw(self, data: bytes) -> None:
        try:
            self.outbox.put_text(data.decode())
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
        for task in (self._writer_task, self._reader_task):
            if task is not None and not task.done():
                task.cancel()

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
            self._deliver(event, data)  # replayed now, not held like live events
        else:
            self.send_raw(data)

    def replaced(self, session_id: str) -> None:
        """Another connection resumed our session: say so (to a client that knows
        the gateway's events: it resumed, or opted in) and close (4009)."""
        host, self.host = self.host, None
        if self._resumed or (host is not None and host.session.config.gateway_events):
            self.send_raw(connection_event("session.replaced", session_id=session_id))
        self.runtime.metrics.closes.labels(str(int(CloseCode.SESSION_REPLACED))).inc()
        self.outbox.close(CloseCode.SESSION_REPLACED, "session replaced")

    def close(self, code: int, reason: str) -> None:
        """Close from outside (drain, shutdown): queued events go out first."""
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
