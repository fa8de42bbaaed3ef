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

import numpy as np

from gateway.audio.codecs import decode_to_pcm16
from gateway.protocol import client_events as ce
from gateway.protocol import duplex_events as de
from gateway.protocol.duplex_config import DuplexConfig, apply_duplex_update, duplex_from_dict, duplex_to_dict
from gateway.protocol.duplex_config import render_session as render_duplex
from gateway.protocol.errors import CloseCode, Code, ProtocolError
from gateway.protocol.session_config import beta_format
from gateway.session.conversation import Item, Part
from gateway.session.effects import Close
from gateway.session.playback import EMPTY_VIEW, MAX_LEDGERS, Ledger
from gateway.session.session import RealtimeSession
from orchestrator.engine import EngineInfo

MAX_PENDING_TEXT = 100_000  # characters of input.text.append awaiting a commit; more: input_text_too_large

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


class DuplexSession(RealtimeSession):
    """See the module docstring."""

    def __init__(self, *, duplex: DuplexConfig | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.duplex = duplex or DuplexConfig()
        self.turn_id = 0  # committed turns
        self.turn_state = "idle"
        self.attachment_generation = 1  # the sockets this session had: the transport counts resumes
        self.ledgers: dict[str, Ledger] = {}  # by response id, oldest first
        self._spoken: str | None = None  # the answer that has sent response.speak
        self._response_turn: int | None = None
        self._deferred: ce.ResponseParams | None = None  # an answer owed once the current one ends
        self._respond_next = True  # whether the commit under way creates an answer
        self._vad_commit = False
        self._text: list[str] = []
        self._text_len = 0
        self._overlap_ms = 0.0
        self._overlap_decided = False
        self._video_warned = False
        self._held_commit: dict[str, Any] | None = None  # input_audio_buffer.committed, until its item is added

    @property
    def dialect(self) -> str:
        return "duplex"

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
        self.effects.append(Close(CloseCode.SESSION_EXPIRED, "session expired"))

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

    def _cancel(self, event: ce.ResponseCancel) -> None:
        super()._cancel(event)
        self.epoch += 1  # every interruption advances the fence (upstream's epoch)

    # --- input ---------------------------------------------------------------------

    def _append(self, event: de.Append) -> None:
        fmt = self.config.input_format
        if event.sample_rate_hz is not None and event.sample_rate_hz != fmt.rate:
            raise ProtocolError(
                Code.UNSUPPORTED_FORMAT,
                f"This session's input is {fmt.rate} Hz; an append cannot change it "
                f"(got sample_rate_hz {event.sample_rate_hz}). Set it with session.update.",
                param="sample_rate_hz",
            )
        if event.encoding is not None and de_codec(event.encoding) != fmt.codec:
            raise ProtocolError(
                Code.UNSUPPORTED_FORMAT,
                f"This session's input is {beta_format(fmt)}, not {event.encoding!r}; set it with session.update.",
                param="format",
            )
        if event.video_frames and not self._video_warned:
            self._video_warned = True
            self._emit(
                "session.warning",
                code="unsupported_field",
                param="video_frames",
                message="'video_frames' are accepted but not used: this engine takes no camera input.",
            )
        self._overlap(event)
        self.append_audio(event.audio, event.event_id)

    def _overlap(self, event: de.Append) -> None:
        """Speech (client hint, else RMS) over a running answer, on manual turns (server
        VAD decides by itself: ``_speech_during_response``)."""
        if self._response is None or not self._manual or self._overlap_decided or not event.audio:
            return
        fmt = self.config.input_format
        speech = event.is_speech
        if speech is None:
            pcm = np.frombuffer(decode_to_pcm16(fmt, event.audio), dtype="<i2").astype(np.float32) / 32768.0
            speech = bool(pcm.size) and float(np.sqrt(np.mean(pcm * pcm))) > self.duplex.overlap_silence_rms
        d = self.duplex
        if speech:
            self._overlap_ms += fmt.duration_ms(len(event.audio))
            policy = d.policy(self.config)
            if policy == "barge_in_on_speech" and self._overlap_ms >= d.overlap_barge_in_ms:
                self._decide("barge_in", "overlap_speech")
                self._barge_in("barge_in")
            elif policy == "listen_only" and self._overlap_ms >= d.overlap_short_ack_ms:
                self._decide(
                    "listen", "long_overlap_speech", buffer_audio=True, defer_runtime_append=True, force_listen=True
                )
        elif self._overlap_ms:
            if self._overlap_ms < d.overlap_short_ack_ms:
                self._decide("drop", "short_overlap_speech", buffer_audio=False)
                self._drop_input()
                self._overlap_decided = False  # another remark may follow
            self._overlap_ms = 0.0

    def _speech_during_response(self) -> None:
        if self.duplex.policy(self.config) == "barge_in_on_speech":
            self._decide("barge_in", "server_vad_utterance_active")
            self._barge_in("barge_in")
        else:
            self._decide(
                "listen", "long_overlap_speech", buffer_audio=True, defer_runtime_append=True, force_listen=True
            )

    def _decide(self, action: str, reason: str, **extra: Any) -> None:
        self._overlap_decided = True
        fields = {"overlap_ms": round(self._overlap_ms), **extra} if extra else {}
        self._emit(
            "overlap.decision",
            session_id=self.id,
            epoch=self.epoch,
            policy=self.duplex.policy(self.config),
            action=action,
            reason=reason,
            **fields,
        )

    def _duplex_commit(self, event: de.Commit) -> None:
        if event.is_speech is False:  # a silence declaration: nothing to answer
            self._drop_input()
            self._listen("no_speech")
            return
        auto = self.duplex.auto_response
        self._respond_next = auto or event.response_create is True
        text = "".join(self._text)
        if text:
            self._text, self._text_len = [], 0
            item = Item(self._new_id("item"), "user", [Part("input_text", text=text)])
            prev = self._insert(item, None)
            self._emit("conversation.item.added", previous_item_id=prev, item=item.render(False))
            self._emit("conversation.item.done", previous_item_id=prev, item=item.render(False))
        has_audio = self._input is not None and self._buffer_ms >= self.limits.min_commit_ms
        if has_audio or not text:
            self._commit(event.event_id, manual=True)  # raises commit_empty without text or audio
        elif self._input is not None:
            self._drop_input()  # under the minimum, next to text: dropped
        if not has_audio:
            self.turn_id += 1
            self.turn_state = "user_committed"
        if self._respond_next:
            self.create_response(ce.ResponseParams(), None)

    def _commit(self, event_id: str | None, *, manual: bool) -> bool:
        if not manual:
            self._respond_next = self.duplex.auto_response
            self._vad_commit = True
        done = super()._commit(event_id, manual=manual)
        if not done:
            self._vad_commit = False
        return done

    def create_response(
        self, params: ce.ResponseParams, event_id: str | None, turn_started_at: float | None = None
    ) -> None:
        if self._vad_commit:
            self._vad_commit = False
            if not self._respond_next:
                return
        if self._response is not None and event_id is None:
            self._deferred = params  # a turn committed while an answer runs: answered after it
            return
        super().create_response(params, event_id, turn_started_at)
        self._response_turn = self.turn_id

    def _listen(self, reason: str) -> None:
        self._emit(
            "response.listen",
            session_id=self.id,
            epoch=self.epoch,
            response={
                "object": "realtime.response",
                "status": "listening",
                "metadata": {"type": "response.listen", "session_id": self.id, "epoch": self.epoch, "reason": reason},
            },
        )

    # --- interruption ----------------------------------------------------------------

    def _barge_in(self, reason: str) -> bool:
        """Stop the running answer where the user stopped hearing it; True if one ran."""
        self._deferred = None  # the next commit's answer covers the whole conversation
        if self._response is None:
            return False
        self.epoch += 1
        self._end_response("cancelled", {"type": "cancelled", "reason": reason}, cancel=True)
        self.turn_state = "barge_in"
        return True

    def _clear_output(self) -> None:
        resp = self._response
        last = next(reversed(self.ledgers), None)
        self.epoch += 1
        self._emit("output_audio_buffer.cleared", response_id=resp.id if resp else last)
        if resp is not None:
            self._end_response("cancelled", {"type": "cancelled", "reason": "output_audio_buffer_clear"}, cancel=True)

    def _turn_signal(self, event: de.TurnSignal) -> None:
        kind = event.event
        if kind == "barge_in":
            self._barge_in("barge_in")
        elif kind == "user_started":
            self.turn_state = "user_speaking"
        elif kind == "user_committed":
            self._duplex_commit(de.Commit(event.event_id))
        elif kind == "assistant_started":
            self.turn_state = "assistant_generating"
        elif kind == "assistant_done":
            self.turn_state = "idle"
        elif kind == "playback_ack":
            p = event.payload
            self._playback_ack(
                de.PlaybackAck(
                    event.event_id,
                    _ms(p.get("played_ms")),
                    _ms(p.get("committed_ms"), None),
                    p.get("response_id"),
                    p.get("item_id"),
                    p.get("truncate") is True,
                )
            )
        self._turn_event(kind)

    def _turn_event(self, kind: str) -> None:
        self._emit("turn.event", session_id=self.id, event=kind, turn_state=self.turn_state, epoch=self.epoch)

    # --- playback truth ---------------------------------------------------------------

    def _ledger(self, event: de.PlaybackAck) -> Ledger:
        if event.response_id is not None:
            ledger = self.ledgers.get(event.response_id)
        elif event.item_id is not None:
            ledger = next((x for x in self.ledgers.values() if x.item_id == event.item_id), None)
        else:
            ledger = next(reversed(self.ledgers.values()), None)
        if ledger is None:
            named = event.response_id or event.item_id
            raise ProtocolError(
                Code.ITEM_NOT_FOUND,
                f"No answer {named!r} to acknowledge (the last {MAX_LEDGERS} answers are kept)."
                if named
                else "No answer has played yet.",
                param="response_id" if event.response_id else "item_id" if event.item_id else None,
            )
        return ledger

    def _playback_ack(self, event: de.PlaybackAck) -> None:
        ledger = self._ledger(event)
        resp = self._response if self._response is not None and self._response.id == ledger.response_id else None
        if resp is not None:
            ledger.capture(resp.part)
        ledger.ack(event.played_ms, event.committed_ms, truncate=event.truncate)
        item = self.conversation.get(ledger.item_id)
        if event.truncate and resp is not None:
            # The client stopped playing this answer: stop generating it too (the end cuts it).
            self._end_response("cancelled", {"type": "cancelled", "reason": "client_cancelled"}, cancel=True)
        elif (
            item is not None
            and item.content
            and item.content[0].type == "output_audio"
            and ledger.done
            and (event.truncate or self.duplex.playback_commit_policy == "ack_only")
        ):
            ledger.cut(item.content[0])
        committed = ledger.done and (
            self.duplex.playback_commit_policy == "commit_all_on_done" or ledger.committed_ms >= ledger.generated_ms
        )
        self._emit(
            "playback.acknowledged",
            event={
                "type": "playback.acknowledged",
                "session_id": self.id,
                "epoch": self.epoch,
                "item_id": ledger.item_id,
                "response_id": ledger.response_id,
                "played_ms": round(ledger.played_ms),
                "committed_ms": round(ledger.committed_ms),
                "truncate": event.truncate,
                "playback": ledger.view(),
                "history_committed": committed,
            },
        )

    def _end_response(self, status: str, details: dict[str, Any] | None, *, cancel: bool = False) -> None:
        resp = self._response
        assert resp is not None
        ledger = self.ledgers.get(resp.id)
        audio = resp.part.type == "output_audio"
        if ledger is not None:
            ledger.capture(resp.part)
            if audio and status == "cancelled" and (ledger.acked or self.duplex.playback_commit_policy == "ack_only"):
                ledger.cut(resp.part)  # history holds what the user heard
        super()._end_response(status, details, cancel=cancel)
        if ledger is not None:
            ledger.done = True
            if audio and status != "cancelled" and self.duplex.playback_commit_policy == "ack_only":
                ledger.cut(resp.part)  # only what is acknowledged enters the history
        self.turn_state = "idle"
        if self._deferred is not None:
            params, self._deferred = self._deferred, None
            self.create_response(params, None)

    # --- what goes out -------------------------------------------------------------------

    def _emit(self, type_: str, **fields: Any) -> dict[str, Any]:
        resp = self._response
        if resp is not None and type_ in _FIRST_OUTPUT and self._spoken != resp.id:
            self._spoken = resp.id  # the answer speaks: said once, before its first delta
            self.turn_state = "assistant_playing"
            meta = {"session_id": self.id, "epoch": self.epoch, "model_speak": True}
            where = {"response_id": resp.id, "item_id": resp.item.id, "output_index": 0, "content_index": 0}
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
            self.ledgers[resp.id] = Ledger(resp.id, resp.item.id)
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

    def snapshot_state(self) -> dict[str, Any]:
        state = super().snapshot_state()
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


def de_codec(encoding: str) -> str:
    return {"pcm16": "pcm16", "pcm": "pcm16", "pcm_s16le": "pcm16", "g711_ulaw": "pcmu", "g711_alaw": "pcma"}.get(
        encoding, encoding
    )


def _ms(value: Any, default: int | None = 0) -> Any:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0 else default
