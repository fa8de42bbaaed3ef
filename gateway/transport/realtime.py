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
import logging
import secrets
from typing import TYPE_CHECKING, Any

import orjson

from gateway.protocol import client_events as ce
from gateway.protocol.errors import CloseCode, Code, ProtocolError
from gateway.protocol.server_events import (
    AUDIO_DELTA,
    BINARY_SUBPROTOCOL,
    decode_input_frame,
    encode_audio_frame,
    encode_json,
)
from gateway.protocol.session_config import ConfigLimits, SessionConfig, TurnDetection, apply_update
from gateway.session.effects import Cancel, Close, EndInput, Feed, StartResponse, StartTranscription
from gateway.session.session import RealtimeSession
from gateway.transport.outbox import Outbox, SlowConsumer
from orchestrator.engine import EngineOutput, Finished
from orchestrator.orchestrator import RequestHandle

if TYPE_CHECKING:
    from gateway.runtime import Runtime

log = logging.getLogger("omni.realtime")

BETA_SUBPROTOCOL = "openai-beta.realtime-v1"
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
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        rt = self.runtime
        offered: list[str] = list(scope.get("subprotocols") or [])
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        beta = "realtime=v1" in headers.get("openai-beta", "") or BETA_SUBPROTOCOL in offered
        await send({"type": "websocket.accept", "subprotocol": choose_subprotocol(offered)})

        grant = rt.auth.authenticate(headers, offered)
        refusal: tuple[str, str, int] | None = None
        if grant is None:
            rt.metrics.auth_failures.inc()
            refusal = (
                Code.UNAUTHORIZED,
                "Missing or invalid credentials: send 'Authorization: Bearer <API key>' or the "
                "subprotocol 'openai-insecure-api-key.<API key or client secret>'.",
                CloseCode.UNAUTHORIZED,
            )
        elif rt.draining:
            refusal = (Code.SERVER_BUSY, "This replica is shutting down; reconnect.", CloseCode.SERVICE_RESTART)
        elif len(rt.connections) >= rt.settings.max_sessions:
            refusal = (
                Code.SERVER_BUSY,
                f"This replica is at its limit of {rt.settings.max_sessions} sessions; try again later.",
                CloseCode.TRY_AGAIN_LATER,
            )
        if refusal is not None:
            code, text, close_code = refusal
            event = {"type": "error", "event_id": "event_" + secrets.token_hex(8), "server_event_seq": 0,
                     "error": {"type": "invalid_request_error", "code": code, "message": text,
                               "param": None, "event_id": None}}  # fmt: skip
            await send({"type": "websocket.send", "text": orjson.dumps(event).decode()})
            await send({"type": "websocket.close", "code": int(close_code), "reason": code})
            rt.metrics.closes.labels(str(int(close_code))).inc()
            return

        assert grant is not None
        query = scope.get("query_string", b"").decode("latin-1")
        model = _query_param(query, "model") or rt.settings.model
        config = SessionConfig(model=model, turn_detection=TurnDetection() if rt.vad_factory else None)
        if grant.session:
            try:
                config, _ = apply_update(
                    config, grant.session, beta=False, limits=ConfigLimits(voices=rt.engine.info.voices)
                )
            except ProtocolError:
                pass  # validated when minted; a stale shape falls back to the defaults
        conn = Connection(rt, config, beta=beta, binary=BINARY_SUBPROTOCOL in offered,
                          principal=grant.principal, receive=receive, send=send)  # fmt: skip
        await conn.run()


def _query_param(query: str, name: str) -> str | None:
    from urllib.parse import parse_qs

    values = parse_qs(query).get(name)
    return values[0] if values else None


class Connection:
    def __init__(
        self,
        runtime: Runtime,
        config: SessionConfig,
        *,
        beta: bool,
        binary: bool,
        principal: str,
        receive: Any,
        send: Any,
    ) -> None:
        rt = self.runtime = runtime
        s = rt.settings
        self.principal = principal
        self.binary = binary
        self.beta = beta
        self._receive = receive
        self.outbox = Outbox(send, s.outbound_queue_bytes)
        self.session = RealtimeSession(
            session_id="sess_" + secrets.token_hex(10),
            config=config,
            engine=rt.engine.info,
            beta=beta,
            limits=rt.session_limits,
            vad_factory=rt.vad_factory,
            rate_limits=rt.rate_limits,
        )
        self.handles: dict[str, RequestHandle] = {}
        self.closed = False
        self._turn_started: dict[str, float | None] = {}

    # --- main loop -----------------------------------------------------------

    async def run(self) -> None:
        rt = self.runtime
        rt.connections.add(self)
        rt.metrics.sessions.inc()
        rt.metrics.sessions_total.inc()
        writer = asyncio.get_running_loop().create_task(self.outbox.run())
        expiry = asyncio.get_running_loop().call_later(rt.settings.session_lifetime_s, self._expire)
        log.info("session %s opened principal=%s beta=%s binary=%s", self.session.id, self.principal,
                 self.beta, self.binary)  # fmt: skip
        reader = asyncio.get_running_loop().create_task(self._read_loop())
        try:
            self.session.start()
            self.flush()
            await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
            if not reader.done():
                # We closed first: give the peer a moment to answer the close frame.
                try:
                    await asyncio.wait_for(reader, timeout=2.0)
                except (TimeoutError, Exception):
                    reader.cancel()
        finally:
            if not reader.done():
                reader.cancel()
            expiry.cancel()
            self.closed = True
            self.session.shutdown()
            self._run_effects(self.session.take()[1])
            for handle in self.handles.values():
                handle.cancel()
            self.handles.clear()
            self.outbox.close(CloseCode.NORMAL, "")
            try:
                await asyncio.wait_for(writer, timeout=1.0)
            except (TimeoutError, Exception):
                writer.cancel()
            rt.connections.discard(self)
            rt.metrics.sessions.dec()
            log.info("session %s closed", self.session.id)

    async def _read_loop(self) -> None:
        limit = self.runtime.settings.max_message_bytes
        count = self.runtime.metrics.client_events
        session = self.session
        while True:
            message = await self._receive()
            kind = message["type"]
            if kind == "websocket.disconnect":
                return
            if kind != "websocket.receive":
                continue
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
                    count.labels(_EVENT_NAMES.get(type(event), "other")).inc()
                    session.handle(event)
                else:
                    data = message.get("bytes") or b""
                    if len(data) > limit:
                        raise ProtocolError(
                            Code.MESSAGE_TOO_LARGE, f"A message may be at most {limit} bytes; got {len(data)}."
                        )
                    count.labels("binary.append").inc()
                    session.append_audio(decode_input_frame(data), None)
            except ProtocolError as err:
                session.error(err)
            self.flush()

    def _expire(self) -> None:
        self.session.expire()
        self.flush()

    # --- session outputs -------------------------------------------------------

    def flush(self) -> None:
        events, effects = self.session.take()
        if events:
            self._send_events(events)
        if effects:
            self._run_effects(effects)

    def _send_events(self, events: list[dict[str, Any]]) -> None:
        outbox, beta, binary = self.outbox, self.beta, self.binary
        errors = self.runtime.metrics.errors
        try:
            for event in events:
                if binary and event["type"] == AUDIO_DELTA:
                    outbox.put_bytes(encode_audio_frame(event))
                    continue
                if event["type"] == "error":
                    errors.labels(event["error"]["code"]).inc()
                outbox.put_text(encode_json(event, beta=beta).decode())
        except SlowConsumer as exc:
            log.warning("session %s: slow consumer, closing: %s", self.session.id, exc)
            self.runtime.metrics.closes.labels(str(int(CloseCode.SLOW_CONSUMER))).inc()
            self.outbox.abort(CloseCode.SLOW_CONSUMER, Code.SLOW_CONSUMER)

    def _run_effects(self, effects: list[Any]) -> None:
        for effect in effects:
            match effect:
                case Feed():
                    handle = self.handles.get(effect.request_id)
                    if handle is not None:
                        handle.feed(effect.chunk)
                case EndInput():
                    handle = self.handles.get(effect.request_id)
                    if handle is not None:
                        handle.end()
                case StartTranscription() | StartResponse():
                    if not self.closed:
                        self._start(effect)
                case Cancel():
                    handle = self.handles.pop(effect.request_id, None)
                    if handle is not None:
                        handle.cancel()
                case Close():
                    self.runtime.metrics.closes.labels(str(effect.code)).inc()
                    self.outbox.close(effect.code, effect.reason)

    def _start(self, effect: StartTranscription | StartResponse) -> None:
        rid = effect.request.request_id
        transcription = isinstance(effect, StartTranscription)

        def on_output(output: EngineOutput) -> None:
            self._on_output(rid, output, transcription=transcription)

        def on_error(code: str, message: str) -> None:
            self._on_error(rid, code, message, transcription=transcription)

        self.handles[rid] = self.runtime.orchestrator.submit(
            "transcription" if transcription else "response",
            effect.request,
            on_output=on_output,
            on_error=on_error,
            turn_started_at=None if transcription else effect.turn_started_at,  # type: ignore[union-attr]
        )

    def _on_output(self, request_id: str, output: EngineOutput, *, transcription: bool) -> None:
        if isinstance(output, Finished):
            self.handles.pop(request_id, None)
        if transcription:
            self.session.on_transcription(request_id, output)
        else:
            self.session.on_response(request_id, output)
        self.flush()

    def _on_error(self, request_id: str, code: str, message: str, *, transcription: bool) -> None:
        self.handles.pop(request_id, None)
        if transcription:
            self.session.on_transcription_failed(request_id, code, message)
        else:
            self.session.on_response_failed(request_id, code, message)
        self.flush()

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
