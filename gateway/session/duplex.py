"""The duplex session (Sans-I/O): a ``RealtimeSession`` that speaks vLLM-Omni's
duplex dialect (``docs/serving/realtime_duplex_api.md``, revision 2e9bf1cb).

It is the same session (conversation, responses, streaming input, seq, epoch,
snapshot, journal, resume) with what the duplex catalogue adds on top:

- **Lifecycle**: ``session.heartbeat_ack`` and ``session.closed`` are the
  session's events (each with its seq, as every event of the document);
  ``session.closed`` {session_id, epoch, reason, event} is its last.
- **Playback truth** (``playback.ack``): each answer has a ``Ledger``
  (generated / played / committed ms, and its playout schedule). A barge-in or
  a cancel cuts the assistant item back to the committed ms (to the
  millisecond, with the text whose audio had started by then) once the client
  has acknowledged any playback; ``playback_commit_policy: ack_only`` keeps
  every answer in the history only as far as acknowledged; a truncating ack
  sets it exactly. An answer that has ended but still plays on the client
  is stopped by a barge-in too.
- **Turn-taking**: ``response.speak`` before an answer's first audio delta,
  ``response.listen`` for a silence commit (``is_speech: false``),
  ``barge_in`` / ``turn.signal`` (answered with ``turn.event``),
  ``input.cancel``, ``output_audio_buffer.clear``, and the overlap policy
  (``overlap.decision``): speech over an answer either barges in
  (``barge_in_on_speech``, the default under server VAD) or is listened to and
  answered after the current answer (``listen_only``; a remark shorter than
  ``overlap_short_ack_ms`` is dropped). Every cancel, clear and barge-in
  advances ``epoch``.
- **Commits**: a commit creates the response unless
  ``extra_body.auto_response`` is false (``response_create: false`` leaves the
  decision to this server, which answers speech); a commit while an answer
  runs is answered after it (``response_create_deferred``); its fan-out is the
  document's (speech_started/stopped on manual turns too; added, created,
  committed, transcription.completed, done).
- **Input clock** (``extra_body.clock: "input"``, the document's newest sibling
  revision): every append, commit and ``response.create`` is acknowledged with one
  ``input_audio_buffer.processed`` once all it caused is out (input_clock.py, kept by
  ``DuplexTurns``); fixed when the session is created.
- The duplex spellings: ``conversation.item.created`` after every
  ``conversation.item.added`` (its own seq), one transcript delta per audio
  delta, the duplex ``session`` object, ``event`` echoes, audio and response
  ``metadata`` (``duplex_turns.DuplexTurns.spell``; the wire form is
  ``protocol/duplex_events.encode``).

``DuplexSession`` is the facade: it dispatches the duplex client events,
keeps the duplex lifecycle and snapshot, and composes ``DuplexTurns``
(duplex_turns.py) as the session's turn-taking, which owns all of the above.
It extends ``RealtimeSession`` only through its public methods.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from gateway.protocol import client_events as ce
from gateway.protocol import duplex_events as de
from gateway.protocol.dialects import DUPLEX, Dialect
from gateway.protocol.duplex_config import DuplexConfig, apply_duplex_update, duplex_from_dict, duplex_to_dict
from gateway.protocol.duplex_config import render_session as render_duplex
from gateway.protocol.errors import CloseCode, Code, ProtocolError
from gateway.session.duplex_turns import DuplexTurns
from gateway.session.effects import CloseSocket, Effect
from gateway.session.input_clock import InputClock
from gateway.session.playback import Ledger
from gateway.session.session import RealtimeSession
from orchestrator.engine import EngineInfo

# The client events this dialect handles itself (the rest are the Realtime API's).
_OWN_EVENTS = (
    de.Heartbeat,
    de.Close,
    de.Append,
    de.Commit,
    de.InputCancel,
    de.TextAppend,
    de.OutputAudioClear,
    de.BargeIn,
    de.TurnSignal,
    de.PlaybackAck,
    ce.SessionUpdate,
    ce.ResponseCancel,
    ce.AudioClear,
)


# The client events an input-clocked session acknowledges, by their decoded type.
_TRIGGERS: dict[type, str] = {
    de.Append: "input_audio_buffer.append",
    de.Commit: "input_audio_buffer.commit",
    ce.ResponseCreate: "response.create",
}


class DuplexSession(RealtimeSession):
    """See the module docstring."""

    passes_engine_turns = False  # (its turns are the dialect's own: units, the overlap policy)

    def __init__(
        self,
        *,
        session_id: str,
        duplex: DuplexConfig | None = None,
        wall_clock: Callable[[], float] = time.time,
        **kwargs: Any,
    ) -> None:
        """``wall_clock``: the clock of the playback ledgers' playout schedule (in the
        snapshot: it must mean the same on every replica)."""
        self._duplex = DuplexTurns(session_id, duplex or DuplexConfig(), clock=wall_clock)
        if self._duplex.duplex.input_clocked:
            self._duplex.input_clock = InputClock()
        super().__init__(session_id=session_id, turn_taking=self._duplex, **kwargs)

    @property
    def dialect(self) -> Dialect:
        return DUPLEX

    @property
    def idle_timeout_s(self) -> float | None:
        return float(self.duplex.idle_timeout_s)

    @property
    def duplex(self) -> DuplexConfig:
        """The session's ``extra_body`` settings."""
        return self._duplex.duplex

    @duplex.setter
    def duplex(self, value: DuplexConfig) -> None:
        self._duplex.duplex = value

    @property
    def ledgers(self) -> dict[str, Ledger]:
        """The playback ledgers, by response id, oldest first."""
        return self._duplex.playback.ledgers

    @property
    def turn_id(self) -> int:
        return self._duplex.turn_id

    @property
    def turn_state(self) -> str:
        return self._duplex.turn_state

    # --- lifecycle and config ------------------------------------------------------

    def configure(self, update: Any, *, media: bool = False) -> list[tuple[str, str]]:
        """The ``session.update`` that opens the session, applied before ``session.created``
        (nothing is emitted; a refusal raises and leaves the defaults)."""
        new, duplex, warnings = apply_duplex_update(self.config, self.duplex, update, limits=self._config_limits)
        self._check_config(new)
        self.config, self.duplex = new, duplex
        self._duplex.input_clock = InputClock() if duplex.input_clocked else None  # made with the session
        return warnings

    def start(
        self,
        resume_token: str | None = None,
        *,
        configured: bool = False,
        warnings: Sequence[tuple[str, str]] = (),
        event_id: str | None = None,
    ) -> None:
        """``session.created`` (and, when a session.update opened the session (``configured``),
        ``session.updated`` with the same object and the update's warnings)."""
        fields: dict[str, Any] = {"attachment_generation": self.attachment_generation}
        if resume_token is not None:
            fields["resume_token"] = resume_token
        self._emit("session.created", **fields, session=self.render_config())
        if configured:
            self._emit("session.updated", session=self.render_config())
        if not self.sends_gateway_events:
            return  # session.warning is the gateway's: only for clients that opted in (gateway_events)
        for param, message in warnings:
            self._warned.add(param)
            self._emit("session.warning", code="unsupported_field", message=message, param=param)

    def render_config(self) -> dict[str, Any]:
        state = self._duplex.session_state()
        return render_duplex(self.config, self.duplex, session_id=self.id, expires_at=self.expires_at, state=state)

    def expire(self) -> None:
        """The session lifetime is over: ``session.expired``, then close 4008."""
        self._expired("lifetime_expired")

    def expire_idle(self) -> None:
        """No client event for ``idle_timeout_s`` (the transport keeps the clock)."""
        self._expired("idle_ttl_expired")

    def close(self, reason: de.CloseReason) -> None:
        """The client ends the session for good (``session.close`` and its aliases, reason
        ``client_close``; ``turn.signal`` ``close`` too, ``timeout`` with that reason): every
        request stops, then ``session.closed``, the session's last event ("Session
        lifecycle": ``session_id``, ``epoch``, ``reason``, ``event``), with its seq. The
        connection closes once it is out (``hosting.door``)."""
        self.shutdown()
        self._duplex.input_clock_closed(reason)
        self._emit("session.closed", **de.closed_fields(self.id, self.epoch, reason))

    def _expired(self, reason: str) -> None:
        self._duplex.input_clock_closed(reason)
        self._emit("session.expired", session_id=self.id, reason=reason)
        self.shutdown()
        self.effects.append(CloseSocket(CloseCode.SESSION_EXPIRED, "session expired"))

    # --- client events -------------------------------------------------------------

    def handle(self, event: de.ClientEvent) -> None:
        turns = self._duplex
        ack = turns.input_arrived(_TRIGGERS.get(type(event), ""))
        if ack is not None:
            self.dirty = True  # an acknowledgement is owed: in the next snapshot, sent or not
        audio_before, refused = self.audio_ms, None
        if not isinstance(event, _OWN_EVENTS):
            super().handle(event)  # (its errors are its own: only an append is ever "rejected")
        else:
            try:
                self._handle_own(event)
            except ProtocolError as err:
                if err.event_id is None:
                    err.event_id = event.event_id
                refused = de.ERROR_CODES.get(err.code, err.code)  # (as the client reads it in the error)
                self.error(err)
        turns.input_handled(ack, audio_before, refused)

    def take(self) -> tuple[list[dict[str, Any]], list[Effect]]:
        """What the session produced; an input-clocked session's acknowledgements that came
        due in the step go out after everything the step made (input_clock.py)."""
        self._duplex.flush_acks()
        return super().take()

    def recover(self, reason: str) -> None:
        super().recover(reason)
        clock = self._duplex.input_clock
        if clock is not None:
            clock.lost(reason)  # answers owed on the old replica that will not be made here

    def _handle_own(self, event: de.DuplexEvent | ce.SessionUpdate | ce.ResponseCancel | ce.AudioClear) -> None:
        turns = self._duplex
        match event:
            case de.Heartbeat():
                self._emit("session.heartbeat_ack", session_id=self.id)
            case de.Close():
                self.close("client_close")
            case de.TurnSignal(event="close" | "timeout"):
                self.close("client_close" if event.event == "close" else "timeout")
            case de.Append():
                turns.append(event)
            case de.Commit():
                turns.commit(event)
            case de.InputCancel():
                turns.cancel_input()
            case de.TextAppend():
                turns.append_text(event.text)
            case de.OutputAudioClear():
                turns.clear_output()
            case de.BargeIn():
                turns.barge_in("barge_in")
                turns.turn_event("barge_in")
            case de.TurnSignal():
                turns.turn_signal(event)
            case de.PlaybackAck():
                turns.playback_ack(event)
            case ce.SessionUpdate():
                self._update(event)
            case ce.ResponseCancel():
                turns.cancel_response(event.response_id)
            case ce.AudioClear():
                turns.clear_input()

    def _update(self, event: ce.SessionUpdate) -> None:
        """``session.update``: the model cannot change; ``extra_body`` sets the duplex settings."""
        model = event.session.get("model")
        if isinstance(model, str) and model and model != self.config.model:
            raise ProtocolError(
                Code.INVALID_VALUE, "The model of a session cannot change; open a new session.", param="session.model"
            )
        new, duplex, warnings = apply_duplex_update(self.config, self.duplex, event.session, limits=self._config_limits)
        if duplex.clock_settings() != self.duplex.clock_settings():
            raise ProtocolError(
                Code.INPUT_CLOCK_UPDATE_UNSUPPORTED,
                "extra_body.clock and its timeouts are fixed when the session is created (its opening "
                "session.update); open a new session to change them.",
                param="session.extra_body.clock",
            )
        previous, self.duplex = self.duplex, duplex
        try:
            self._apply_config(new, warnings)
        except ProtocolError:
            self.duplex = previous
            raise

    # --- snapshots -------------------------------------------------------------------------

    def snapshot_state(self, *, with_items: bool = True) -> dict[str, Any]:
        state = super().snapshot_state(with_items=with_items)
        state["duplex"] = duplex_to_dict(self.duplex)
        state["turn_id"] = self._duplex.turn_id
        state["turn_state"] = self._duplex.turn_state
        state["attachment_generation"] = self.attachment_generation
        state["ledgers"] = self._duplex.playback.to_list()
        state["held_done"] = list(self._duplex.held_done)
        clock = self._duplex.input_clock
        state["input_clock"] = None if clock is None else clock.to_dict()
        return state

    @classmethod
    def restore(cls, state: dict[str, Any], *, engine: EngineInfo, conversation: bool = True,
                **kwargs: Any) -> DuplexSession:  # fmt: skip
        session = super().restore(state, engine=engine, conversation=conversation, **kwargs)
        assert isinstance(session, DuplexSession)
        turns = session._duplex
        turns.duplex = duplex_from_dict(state["duplex"])
        turns.turn_id = state["turn_id"]
        turns.turn_state = state["turn_state"]
        session.attachment_generation = state["attachment_generation"]
        turns.playback.restore(state["ledgers"])
        turns.held_done = list(state.get("held_done", ()))
        clock = state.get("input_clock")
        turns.input_clock = None if clock is None else InputClock.from_dict(clock)
        session.dirty = False
        return session
