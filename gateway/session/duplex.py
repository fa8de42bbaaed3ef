"""The duplex session (Sans-I/O): a ``RealtimeSession`` that speaks vLLM-Omni's
duplex dialect (``docs/serving/realtime_duplex_api.md``).

It is the same session (conversation, responses, streaming input, seq, epoch,
snapshot, journal, resume) with what the duplex catalogue adds on top:

- **Playback truth** (``playback.ack``): each answer has a ``Ledger``
  (generated / played / committed ms). A barge-in or a cancel cuts the
  assistant item back to the committed ms (to the millisecond, with the text
  whose audio had started by then) once the client has acknowledged any
  playback; ``playback_commit_policy: ack_only`` keeps every answer in the
  history only as far as acknowledged; a truncating ack sets it exactly.
- **Turn-taking**: ``response.speak`` before an answer's first audio,
  ``response.listen`` for a silence commit (``is_speech: false``),
  ``barge_in`` / ``turn.signal`` (answered with ``turn.event``),
  ``input.cancel``, ``output_audio_buffer.clear``, and the overlap policy
  (``overlap.decision``): speech over an answer either barges in
  (``barge_in_on_speech``, the default under server VAD) or is listened to and
  answered after the current answer (``listen_only``; a remark shorter than
  ``overlap_short_ack_ms`` is dropped). Every interruption advances ``epoch``.
- **Commit answers**: a commit creates the response unless
  ``extra_body.auto_response`` is false (``response_create: false`` leaves the
  decision to this server, which answers speech); a commit while an answer
  runs is answered after it (``response_create_deferred``).
- The duplex spellings: ``conversation.item.created`` after every
  ``conversation.item.added`` (its own seq), the duplex ``session`` object,
  ``event`` echoes and audio ``metadata``; names are the encoder's
  (``protocol/duplex_events.encode``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.protocol import client_events as ce
from gateway.protocol import duplex_events as de
from gateway.protocol.duplex_config import apply_duplex_update, duplex_from_dict, duplex_to_dict
from gateway.protocol.duplex_config import render_session as render_duplex
from gateway.protocol.errors import CloseCode, Code, ProtocolError
from gateway.protocol.session_config import beta_format
from gateway.session.duplex_turns import MAX_PENDING_TEXT, DuplexCore
from gateway.session.effects import CloseSocket
from gateway.session.playback import EMPTY_VIEW, MAX_LEDGERS, Ledger
from orchestrator.engine import EngineInfo

_FIRST_OUTPUT = frozenset(
    {"response.output_audio.delta", "response.output_audio_transcript.delta", "response.output_text.delta"}
)
_DUPLEX_EVENTS = (
    de.Append,
    de.Commit,
    de.InputCancel,
    de.TextAppend,
    de.OutputAudioClear,
    de.BargeIn,
    de.TurnSignal,
    de.PlaybackAck,
)


class DuplexSession(DuplexCore):
    """See the module docstring."""

    @property
    def dialect(self) -> str:
        return "duplex"

    @property
    def sends_gateway_events(self) -> bool:
        return True  # the duplex dialect's clients get session.warning (no opt-in there)

    lazy_message = False  # a response's message exists from response.created (its playback ledger)

    # --- lifecycle and config ------------------------------------------------------

    def configure(self, update: Any) -> list[tuple[str, str]]:
        """The ``session.update`` that opens the session, applied before ``session.created``
        (nothing is emitted; a refusal raises and leaves the defaults)."""
        new, duplex, warnings = apply_duplex_update(self.config, self.duplex, update, limits=self._config_limits)
        self._check_config(new)
        self.config, self.duplex = new, duplex
        self._setup_input()
        return warnings

    def start(
        self,
        resume_token: str | None = None,
        *,
        updated: bool = False,
        warnings: Sequence[tuple[str, str]] = (),
    ) -> None:
        """``session.created`` (and, when a session.update opened the session, ``session.updated``
        with the same object and the update's warnings)."""
        fields: dict[str, Any] = {"incarnation": 0, "attachment_generation": self.attachment_generation}
        if resume_token is not None:
            fields["resume_token"] = resume_token
        self._emit("session.created", **fields, session=self.render_config())
        if updated:
            self._emit("session.updated", session=self.render_config())
        for param, message in warnings:
            self._emit("session.warning", code="unsupported_field", message=message, param=param)

    def render_config(self) -> dict[str, Any]:
        resp = self._response
        latest = next(reversed(self.ledgers.values()), None)
        state = {
            "turn_state": self.turn_state,
            "epoch": self.epoch,
            "turn_id": self.turn_id,
            "active_request_id": resp.id if resp else None,
            "active_response_id": resp.id if resp else None,
            "active_response_turn_id": self._response_turn if resp else None,
            "playback": latest.view() if latest else dict(EMPTY_VIEW),
        }
        return render_duplex(self.config, self.duplex, session_id=self.id, expires_at=self.expires_at, state=state)

    def _session_update(self, event: ce.SessionUpdate) -> None:
        model = event.session.get("model")
        if isinstance(model, str) and model and model != self.config.model:
            raise ProtocolError(
                Code.INVALID_VALUE, "The model of a session cannot change; open a new session.", param="session.model"
            )
        new, duplex, warnings = apply_duplex_update(self.config, self.duplex, event.session, limits=self._config_limits)
        previous, self.duplex = self.duplex, duplex
        try:
            self._apply_config(new, warnings)
        except ProtocolError:
            self.duplex = previous
            raise

    def expire(self) -> None:
        """The session lifetime is over: ``session.expired``, then close 4008."""
        self._expired("lifetime_expired")

    def expire_idle(self) -> None:
        """No client event for ``idle_timeout_s`` (the transport keeps the clock)."""
        self._expired("idle_ttl_expired")

    def _expired(self, reason: str) -> None:
        self._emit("session.expired", session_id=self.id, incarnation=0, reason=reason)
        self.shutdown()
        self.effects.append(CloseSocket(CloseCode.SESSION_EXPIRED, "session expired"))

    # --- client events -------------------------------------------------------------

    def handle(self, event: de.ClientEvent) -> None:
        if not isinstance(event, _DUPLEX_EVENTS):
            super().handle(event)  # type: ignore[arg-type]
            return
        try:
            self._handle_duplex(event)
        except ProtocolError as err:
            if err.event_id is None:
                err.event_id = event.event_id
            self.error(err)

    def _handle_duplex(self, event: de.DuplexEvent) -> None:
        match event:
            case de.Append():
                self._append(event)
            case de.Commit():
                self._duplex_commit(event)
            case de.InputCancel():
                self._text, self._text_len = [], 0
                self.epoch += 1
                self._clear()
            case de.TextAppend():
                if self._text_len + len(event.text) > MAX_PENDING_TEXT:
                    raise ProtocolError(
                        "input_text_too_large",
                        f"At most {MAX_PENDING_TEXT} characters of "
                        "input.text.append may wait for a commit; commit first.",
                        param="text",
                    )
                self._text.append(event.text)
                self._text_len += len(event.text)
            case de.OutputAudioClear():
                self._clear_output()
            case de.BargeIn():
                self._barge_in("barge_in")
                self._turn_event("barge_in")
            case de.TurnSignal():
                self._turn_signal(event)
            case de.PlaybackAck():
                self._playback_ack(event)

    # --- what goes out -------------------------------------------------------------------

    def _emit(self, type_: str, **fields: Any) -> dict[str, Any]:
        resp = self._response
        if resp is not None and type_ in _FIRST_OUTPUT and self._spoken != resp.id:
            self._spoken = resp.id  # the answer speaks: said once, before its first delta
            self.turn_state = "assistant_playing"
            meta = {"session_id": self.id, "epoch": self.epoch, "model_speak": True}
            assert resp.message is not None
            where = {"response_id": resp.id, "item_id": resp.message.id, "output_index": 0, "content_index": 0}
            super()._emit("response.speak", **where, metadata=meta)
        if type_ == "response.output_audio.delta" and resp is not None:
            self._audio_metadata(resp, fields)
        elif type_ == "input_audio_buffer.committed":
            # Upstream's commit fan-out is added, created, committed, done: held until the item is added.
            self._held_commit = fields
            return fields
        elif type_ in ("conversation.item.deleted", "conversation.item.truncated"):
            fields["event"] = {"type": type_, **fields}
        event = super()._emit(type_, **fields)
        if type_ == "conversation.item.added":
            super()._emit("conversation.item.created", **fields)  # upstream sends both spellings
            held, self._held_commit = self._held_commit, None
            if held is not None:
                self._committed_event(held, resp)
        elif type_ == "input_audio_buffer.speech_started":
            self.turn_state = "user_speaking"
        elif type_ == "response.created" and resp is not None:
            self.turn_state = "assistant_generating"
            self._overlap_ms, self._overlap_decided = 0.0, False
            assert resp.message is not None
            self.ledgers[resp.id] = Ledger(resp.id, resp.message.id)
            while len(self.ledgers) > MAX_LEDGERS:
                del self.ledgers[next(iter(self.ledgers))]
        return event

    def _committed_event(self, fields: dict[str, Any], resp: Any) -> None:
        self.turn_id += 1
        self.turn_state = "user_committed"
        fields["event"] = {
            "type": "input.committed",
            "session_id": self.id,
            "turn_id": self.turn_id,
            "epoch": self.epoch,
            "history_len": len(self.conversation),
            "realtime_item_id": fields.get("item_id"),
            "message": {"role": "user", "content": [{"type": "input_audio"}]},
            "response_create_deferred": self._respond_next and resp is not None,
        }
        super()._emit("input_audio_buffer.committed", **fields)

    def _audio_metadata(self, resp: Any, fields: dict[str, Any]) -> None:
        """Upstream's audio delta extensions: format, rate, and the metadata of the answer so far."""
        assert resp.part is not None
        ledger = self.ledgers.get(resp.id)
        if ledger is not None:
            ledger.generated_ms = resp.part.audio_ms
        fields["format"] = beta_format(resp.output_format)
        fields["sample_rate_hz"] = resp.output_format.rate
        audio_ms = round(resp.part.audio_ms)
        fields["metadata"] = {
            "session_id": self.id,
            "epoch": self.epoch,
            "model_speak": True,
            "end_of_turn": False,
            "audio_duration_ms": audio_ms,  # cumulative, as upstream's
            "audio_text_marks": [{"text_chars": len(resp.part.transcript or ""), "audio_end_ms": audio_ms}],
            "playback": ledger.view() if ledger is not None else dict(EMPTY_VIEW),
        }

    # --- snapshots -------------------------------------------------------------------------

    def snapshot_state(self, *, with_items: bool = True) -> dict[str, Any]:
        state = super().snapshot_state(with_items=with_items)
        state["dialect"] = "duplex"
        state["duplex"] = duplex_to_dict(self.duplex)
        state["turn_id"] = self.turn_id
        state["turn_state"] = self.turn_state
        state["attachment_generation"] = self.attachment_generation
        state["ledgers"] = [ledger.to_dict() for ledger in self.ledgers.values()]
        return state

    @classmethod
    def restore(cls, state: dict[str, Any], *, engine: EngineInfo, **kwargs: Any) -> DuplexSession:
        session = super().restore(state, engine=engine, **kwargs)
        assert isinstance(session, DuplexSession)
        session.duplex = duplex_from_dict(state["duplex"])
        session.turn_id = state["turn_id"]
        session.turn_state = state["turn_state"]
        session.attachment_generation = state["attachment_generation"]
        for entry in state["ledgers"]:
            ledger = Ledger.from_dict(entry)
            session.ledgers[ledger.response_id] = ledger
        session.dirty = False
        return session
