"""``/v1/realtime?duplex=1``: a socket in vLLM-Omni's duplex dialect.

The same ``Connection`` (outbox, hold/release, replay, takeover through
``gateway/hosting``) with what the duplex handshake and its connection
events add (vLLM-Omni's ``realtime_duplex_api.md``, "Endpoint and transport"):

- **Opening.** With ``?model=`` and without ``?autostart=0`` / ``?resume=1``
  the session opens at connect (``session.created`` first). Otherwise the
  first client event decides: ``session.update`` opens the session with its
  ``session`` object (``session.created`` then ``session.updated``, the same
  object; a refused update opens nothing and the client may send another),
  ``session.resume`` resumes with no throwaway session; any other event opens
  the default session and is then handled, except on a resume-only socket
  (``autostart=0``, ``resume=1``), where it is refused (``session_not_open``).
- **Connection events** carry no ``server_event_seq`` and are never
  journaled: ``session.resumed`` (``session``, ``attachment_generation``,
  ``incarnation``, the rotated ``resume_token``), ``session.replaced``,
  ``session.resync_required``, ``session.heartbeat_ack``,
  ``session.closed``, and errors that are not the session's (refused resumes,
  malformed acks).
- ``session.heartbeat`` is answered with ``session.heartbeat_ack`` and keeps
  the session from idling out; ``session.close`` (and its aliases, and
  ``turn.signal`` ``close`` / ``timeout``) ends the session for good:
  ``session.closed`` is the last event, then close 1000.
- **Idle**: a session that gets no client event for its ``idle_timeout_s``
  (300 s; ``session.update`` sets it) ends with ``session.expired``
  (``idle_ttl_expired``) and close 4008.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.hosting.host import SessionHost
from gateway.hosting.takeover import Replay, Resync
from gateway.protocol import client_events as ce
from gateway.protocol import duplex_events as de
from gateway.protocol.duplex_config import DuplexConfig, default_session_config
from gateway.protocol.errors import CloseCode, Code, ProtocolError
from gateway.protocol.session_config import SessionConfig
from gateway.session.duplex import DuplexSession
from gateway.transport.realtime import Connection, RealtimeServices, log

SESSION_NOT_OPEN = "session_not_open"


class DuplexConnection(Connection):
    def __init__(
        self, runtime: RealtimeServices, receive: Any, send: Any, *, principal: str, model: str, resume_only: bool
    ) -> None:
        super().__init__(runtime, receive, send, beta=False, binary=False, principal=principal)
        self.model = model  # the default model (``?model=`` or the gateway's)
        self.resume_only = resume_only
        self.generation = 0  # the attachment generation of the session on this socket
        self.gated = True  # upstream's client ends its session on a resync: never be ahead of the store
        self._last_event = 0.0
        self._idle: asyncio.TimerHandle | None = None

    async def run(self, config: SessionConfig | None) -> None:
        self._last_event = asyncio.get_running_loop().time()
        try:
            await super().run(config)
        finally:
            if self._idle is not None:
                self._idle.cancel()

    async def _new_session(self, config: SessionConfig, duplex: DuplexConfig | None = None) -> SessionHost:
        return await self.runtime.open_session(
            config, principal=self.principal, beta=False, duplex=duplex or DuplexConfig()
        )

    # --- before the session ---------------------------------------------------------

    async def _before_session(self, message: dict[str, Any]) -> bool:
        text = message.get("text")
        try:
            if text is None:
                raise ProtocolError(
                    SESSION_NOT_OPEN, "Binary audio before the session is open; send session.update first."
                )
            event = de.decode(text)
        except ProtocolError as err:
            self.send_raw(self._error(err))
            return True
        match event:
            case ce.SessionUpdate():
                return await self._open_with(event)
            case ce.SessionResume():
                await self._resume_safely(event, None)
                return True
            case de.Heartbeat():
                self.send_raw(de.heartbeat_ack(None))
                return True
            case de.Close():
                self.send_raw(de.closed_event(None))
                self.outbox.close(CloseCode.NORMAL, "session closed")
                return False
            case ce.EventAck():
                return True  # nothing to acknowledge yet
        if self.resume_only:
            self.send_raw(
                self._error(
                    ProtocolError(
                        SESSION_NOT_OPEN,
                        "This socket was opened with autostart=0 (or resume=1): send session.update to "
                        "open a session or session.resume to resume one first.",
                        param="type",
                        event_id=event.event_id,
                    )
                )
            )
            return True
        # Upstream's first-message rule: the default session opens, then the event is handled.
        if not await self._open(default_session_config(self.model)):
            return False
        assert self.host is not None
        self._handle(self.host, message, direct=False)
        return True

    async def _open_with(self, event: ce.SessionUpdate) -> bool:
        """The first ``session.update`` opens the session with its ``session`` object."""
        model = event.session.get("model")
        model = model if isinstance(model, str) and model else self.model
        if self.runtime.route(model) is None:
            self.send_raw(
                self._error(
                    ProtocolError(
                        Code.MODEL_NOT_FOUND,
                        f"No model {model!r} is served here; GET /v1/models lists them.",
                        param="session.model",
                        event_id=event.event_id,
                    )
                )
            )
            self.outbox.close(CloseCode.UNKNOWN_MODEL, Code.MODEL_NOT_FOUND)
            return False
        host = await self._host_for(default_session_config(model))
        if host is None:
            return False
        session = host.session
        assert isinstance(session, DuplexSession)
        try:
            warnings = session.configure(event.session)
        except ProtocolError as err:
            err.event_id = event.event_id
            self.send_raw(self._error(err))
            await host.end(reason="its first session.update was refused", delete=True)
            return True
        self._begin(host, updated=True, warnings=warnings)
        return True

    def _begin(self, host: SessionHost, **start: Any) -> None:
        super()._begin(host, **start)
        self.generation = getattr(host.session, "attachment_generation", 1)
        self._arm_idle()

    # --- connection events --------------------------------------------------------------

    def _decode(self, text: str) -> Any:
        return de.decode(text)

    def _handle(self, host: SessionHost, message: dict[str, Any], *, direct: bool) -> Any:
        self._last_event = asyncio.get_running_loop().time()
        return super()._handle(host, message, direct=direct)

    def _connection_event(self, host: SessionHost, event: Any) -> bool:
        if isinstance(event, de.Heartbeat):
            self.send_raw(de.heartbeat_ack(host.id))
            return True
        if isinstance(event, de.Close):
            self._close_session(host, "session_close")
            return True
        if isinstance(event, de.TurnSignal) and event.event in ("close", "timeout"):
            self._close_session(host, "session_close" if event.event == "close" else "timeout")
            return True
        return False

    def _close_session(self, host: SessionHost, reason: de.CloseReason) -> None:
        """The client ends the session for good: ``session.closed`` is the last event."""
        log.info("session %s closed by the client (%s)", host.id, reason)
        self.send_raw(de.closed_event(host.id, reason))
        self.host = None
        self.outbox.close(CloseCode.NORMAL, "session closed")
        self.runtime.hosting.spawn(host.end(reason="closed by the client", delete=True))

    def _arm_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        host = self.host
        if host is None or not isinstance(host.session, DuplexSession):
            return
        loop = asyncio.get_running_loop()
        left = self._last_event + host.session.duplex.idle_timeout_s - loop.time()
        self._idle = loop.call_later(max(0.0, left), self._idle_check)

    def _idle_check(self) -> None:
        host = self.host
        if host is None or host.ended or not isinstance(host.session, DuplexSession):
            return
        loop = asyncio.get_running_loop()
        if loop.time() - self._last_event < host.session.duplex.idle_timeout_s:
            self._arm_idle()  # an event came (or the timeout grew): look again later
            return
        log.info("session %s idle for %.0f s: expired", host.id, host.session.duplex.idle_timeout_s)
        host.session.expire_idle()
        host.flush()

    # --- the dialect's spellings -------------------------------------------------------

    def _attached(self, host: SessionHost) -> None:
        session = host.session
        if isinstance(session, DuplexSession):
            session.attachment_generation += 1  # a new socket: its generation (in the snapshot too)
            session.dirty = True
            self.generation = session.attachment_generation
        self._last_event = asyncio.get_running_loop().time()
        self._arm_idle()

    def _error(self, err: ProtocolError) -> bytes:
        return de.error_event(err)

    def _resumed_message(self, host: SessionHost, token: str, outcome: Replay) -> bytes:
        return de.resumed_event(
            session_id=host.id,
            resume_token=token,
            attachment_generation=self.generation,
            session=host.session.render_config(),
            replay_from=outcome.replay_from,
            replay_to=outcome.replay_to,
        )

    def _resync_message(self, host: SessionHost, token: str, outcome: Resync) -> bytes:
        s = host.session
        return de.resync_event(
            session_id=s.id,
            resume_token=token,
            reason=outcome.reason,
            message=outcome.message,
            session=s.render_config(),
            conversation=[it.render(False) for it in s.conversation],
            last_server_event_seq=s.seq,
            attachment_generation=self.generation,
        )

    def _replaced_message(self, session_id: str) -> bytes:
        return de.replaced_event(session_id, self.generation)

    def _counter(self, event_type: type) -> Any:
        name = _NAMES.get(event_type)
        return self.runtime.metrics.client_event_counter(name) if name else super()._counter(event_type)


_NAMES: dict[type, str] = {
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

__all__ = ["DuplexConnection"]
