"""The duplex dialect's turn-taking (Sans-I/O): the ``TurnTaking`` of ``DuplexSession``.

``DuplexTurns`` owns the duplex state the Realtime API's session does not
have: the turn counter and state, the playback ledgers (``Playback``), the
overlap decision over the running answer (or one that still plays), a manual
turn's speech onset, the epoch fence of every cancel, clear and barge-in, the
answer owed once the current one ends, and the pending ``input.text.append``
text. The duplex spelling of its events is ``DuplexSpelling``
(duplex_spelling.py), which tells it the moments it must know
(``TurnMoments``: a turn committed, an answer opened or speaking, speech
started).

It steers the session's parts only through their public methods (``bind``):
the event log, the history, the input audio and the responses. It knows
nothing of the facade (duplex.py) that dispatches the client's events to it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from gateway.audio.codecs import decode_to_pcm16
from gateway.protocol import client_events as ce
from gateway.protocol import duplex_events as de
from gateway.protocol.duplex_config import CODECS, DuplexConfig
from gateway.protocol.errors import Code, ProtocolError
from gateway.protocol.session_config import SessionConfig, beta_format
from gateway.session.conversation import Item, Part
from gateway.session.duplex_spelling import DuplexSpelling
from gateway.session.events import Spelling
from gateway.session.input_clock import TRIGGERS, Ack, InputClock, Unit
from gateway.session.playback import Ledger, Playback
from gateway.session.response import Response
from gateway.session.turn_taking import Parts

MAX_PENDING_TEXT = 100_000  # characters of input.text.append awaiting a commit; more: input_text_too_large


class DuplexTurns:
    """See the module docstring."""

    lazy_message = False  # a response's message exists from response.created (its playback ledger)
    message_named_by_response = True  # "response_id (item id item_<response_id>)": a client may build it
    reports_transcripts = True  # the commit fan-out has ...transcription.completed, always

    def __init__(self, session_id: str, duplex: DuplexConfig, *, clock: Callable[[], float] = time.time) -> None:
        """``clock``: the wall clock (s) of the playback ledgers' playout schedule."""
        self.duplex = duplex  # the session's extra_body settings, set again on every update
        self.clock = clock
        self.turn_id = 0  # committed turns
        self.turn_state = "idle"
        self.playback = Playback()
        self.response_turn: int | None = None  # the turn the last answer created answers
        self._ledgers = self.playback.ledgers  # (the hot path reads it per audio delta)
        self._session_id = session_id
        self._ending: tuple[str, str] | None = None  # (response id, status) of the answer ending now
        self._speech_item: str | None = None  # a manual turn's item whose speech_started was said
        self._deferred: ce.ResponseParams | None = None  # an answer owed once the current one ends
        self._respond_next = True  # whether the commit under way creates an answer
        self._vad_commit = False
        self._text: list[str] = []
        self._text_len = 0
        self._overlap_ms = 0.0
        self._overlap_decided = False
        self._video_warned = False
        # extra_body.clock "input": the input clock (input_clock.py), made with the session.
        self.input_clock: InputClock | None = None

    def bind(self, parts: Parts, config: SessionConfig) -> None:
        self.config = config
        self._log = parts.log
        self._emit = parts.log.emit
        self._history = parts.history
        self._input = parts.input
        self._responses = parts.responses
        self._spelling = DuplexSpelling(self._session_id, self, parts)

    @property
    def spelling(self) -> Spelling:
        return self._spelling.spell

    @property
    def held_done(self) -> list[str]:
        """Committed items whose ``conversation.item.done`` awaits the transcript (the snapshot's)."""
        return self._spelling.held_done

    @held_done.setter
    def held_done(self, value: list[str]) -> None:
        self._spelling.held_done = value

    def session_state(self) -> dict[str, Any]:
        """The ``state`` of the duplex session object."""
        resp = self._responses.current
        clock = {} if self.input_clock is None else {"input_index": self.input_clock.inputs}
        return {
            **clock,  # an input-clocked session: the latest input's input_index (what a resume resends after)
            "turn_state": self.turn_state,
            "epoch": self._log.epoch,
            "turn_id": self.turn_id,
            "active_request_id": resp.id if resp else None,
            "active_response_id": resp.id if resp else None,
            "active_response_turn_id": self.response_turn if resp else None,
            "playback": self.playback.view(),
        }

    # --- what the parts ask (TurnTaking) ------------------------------------------------

    def commit_turn(self, event_id: str | None) -> bool:
        self._respond_next = self.duplex.auto_response
        # Read by the next answer() (a VAD turn is answered only with auto_response); a VAD
        # commit that no answer follows (a full buffer) leaves it set for the next one.
        self._vad_commit = True
        item_id, committed_ms = self._input.open_item_id, self._input.buffered_ms
        done = self._input.commit(event_id, manual=False)
        if not done:
            self._vad_commit = False
        else:
            self._turn_committed(item_id, committed_ms)
        return done

    def answer(self, params: ce.ResponseParams, event_id: str | None, turn_started_at: float | None = None) -> None:
        if self._vad_commit:
            self._vad_commit = False
            if not self._respond_next:
                return
        clock = self.input_clock
        unit = clock.for_answer() if clock is not None else None
        if self._responses.current is not None and event_id is None:
            self._deferred = params  # a turn committed while an answer runs: answered after it
            if clock is not None and unit is not None:
                clock.defer(unit)
            return
        self._create(params, event_id, turn_started_at, unit)

    def _create(
        self, params: ce.ResponseParams, event_id: str | None, turn_started_at: float | None, unit: Unit | None
    ) -> None:
        """The answer, created now (``unit``: the input clock's unit it answers)."""
        clock = self.input_clock
        if clock is not None:
            clock.answering = unit
        try:
            self._responses.create(params, event_id, turn_started_at)
        except ProtocolError:
            if clock is not None and unit is not None:
                clock.not_answered(unit)
            raise
        finally:
            if clock is not None:
                clock.answering = None
        self.response_turn = self.turn_id

    def speech_during_response(self) -> None:
        if self.duplex.policy(self.config) == "barge_in_on_speech":
            self._decide("barge_in", "server_vad_utterance_active")
            self.barge_in("barge_in")
        else:
            self._decide(
                "listen", "long_overlap_speech", buffer_audio=True, defer_runtime_append=True, force_listen=True
            )

    def answer_ending(self, resp: Response, status: str) -> None:
        assert resp.part is not None  # the duplex dialect opens a response's message at once
        self._ending = (resp.id, status)
        if status == "cancelled":
            # Every cancel of the answer (barge-in, response.cancel, output_audio_buffer.clear, a
            # truncating ack or truncate, speech over it) advances the fence, before its last events.
            self._log.epoch += 1
        self.playback.answer_ending(resp.id, resp.part, status, self.duplex.playback_commit_policy)

    def answer_ended(self, resp: Response, status: str) -> None:
        assert resp.part is not None
        self.playback.answer_ended(resp.id, resp.part, status, self.duplex.playback_commit_policy)
        self._ending = None
        self.turn_state = "idle"
        if self._deferred is not None:
            params, self._deferred = self._deferred, None
            clock = self.input_clock
            unit = clock.take_deferred() if clock is not None else None
            self.flush_acks()  # what the answer that ended completed is acknowledged before the next begins
            self._create(params, None, None, unit)

    # --- input ---------------------------------------------------------------------

    def append(self, event: de.Append) -> None:
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
        if event.video_frames and not self._video_warned and self.config.gateway_events:
            self._video_warned = True
            self._emit(
                "session.warning",
                code="unsupported_field",
                param="video_frames",
                message="'video_frames' are accepted but not used: this engine takes no camera input.",
            )
        inp = self._input
        if self._speech_item is not None and inp.open_item_id != self._speech_item:
            self._speech_item = None  # (the buffer it began in is gone)
        overlapping = self._overlapping()
        speech = None
        if inp.manual and event.audio and (overlapping or self._speech_item is None):
            speech = self._is_speech(event)
        start_ms = inp.audio_ms
        inp.append(event.audio, event.event_id)
        if speech and self._speech_item is None and inp.open_item_id is not None:
            # A manual turn's speech onset ("client hint, or RMS heuristic"), in its item.
            self._speech_item = inp.open_item_id
            self._emit("input_audio_buffer.speech_started", audio_start_ms=round(start_ms), item_id=self._speech_item)
        if overlapping and speech is not None:
            self._overlap(event, speech)

    def append_text(self, text: str) -> None:
        if self._text_len + len(text) > MAX_PENDING_TEXT:
            raise ProtocolError(
                "input_text_too_large",
                f"At most {MAX_PENDING_TEXT} characters of input.text.append may wait for a commit; commit first.",
                param="text",
            )
        self._text.append(text)
        self._text_len += len(text)

    def cancel_input(self) -> None:
        """``input.cancel``: the buffer and the pending text dropped; it advances the fence."""
        self._text, self._text_len = [], 0
        self.clear_input()

    def clear_input(self) -> None:
        """``input_audio_buffer.clear``: a clear advances the fence too (the document's epoch
        "advances on every cancel, clear, or barge-in")."""
        self._log.epoch += 1
        self._speech_item = None
        self._input.clear()

    def _is_speech(self, event: de.Append) -> bool:
        """The append's ``is_speech`` hint, else its RMS above ``overlap_silence_rms``."""
        if event.is_speech is not None:
            return event.is_speech
        pcm = np.frombuffer(decode_to_pcm16(self.config.input_format, event.audio), dtype="<i2")
        level = pcm.astype(np.float32) / 32768.0
        return bool(level.size) and float(np.sqrt(np.mean(level * level))) > self.duplex.overlap_silence_rms

    def _overlapping(self) -> bool:
        """A manual turn's appends overlap a running answer, or one that still plays
        (``Playback.playing``), until the overlap is decided (server VAD decides by
        itself: ``speech_during_response``)."""
        if not self._input.manual or self._overlap_decided:
            return False
        return self._responses.current is not None or self.playback.playing(self.clock()) is not None

    def _speech_stopped(self) -> None:
        """The end of a manual turn's speech (before its commit, or a dropped remark's)."""
        item_id, self._speech_item = self._speech_item, None
        if item_id is not None:
            self._emit("input_audio_buffer.speech_stopped", audio_end_ms=round(self._input.audio_ms), item_id=item_id)

    def _overlap(self, event: de.Append, speech: bool) -> None:
        """Speech over an answer (``_overlapping``): decided by the overlap policy."""
        fmt = self.config.input_format
        d = self.duplex
        if speech:
            self._overlap_ms += fmt.duration_ms(len(event.audio))
            policy = d.policy(self.config)
            if policy == "barge_in_on_speech" and self._overlap_ms >= d.overlap_barge_in_ms:
                self._decide("barge_in", "overlap_speech")
                self.barge_in("barge_in")
            elif policy == "listen_only" and self._overlap_ms >= d.overlap_short_ack_ms:
                self._decide(
                    "listen", "long_overlap_speech", buffer_audio=True, defer_runtime_append=True, force_listen=True
                )
        elif self._overlap_ms:
            if self._overlap_ms < d.overlap_short_ack_ms:
                self._decide("drop", "short_overlap_speech", buffer_audio=False)
                self._speech_stopped()
                self._input.drop()
                self._overlap_decided = False  # another remark may follow
            self._overlap_ms = 0.0

    def _decide(self, action: str, reason: str, **extra: Any) -> None:
        self._overlap_decided = True
        # "Overlap and barge-in": the details under metadata (none for a barge-in).
        fields = {"metadata": {"overlap_ms": round(self._overlap_ms), **extra}} if extra else {}
        self._emit(
            "overlap.decision",
            session_id=self._session_id,
            epoch=self._log.epoch,
            policy=self.duplex.policy(self.config),
            action=action,
            reason=reason,
            **fields,
        )

    def commit(self, event: de.Commit) -> None:
        if event.is_speech is False:  # a silence declaration: nothing to answer
            self._speech_item = None
            self._input.drop()
            self._listen("no_speech")
            return
        auto = self.duplex.auto_response
        self._respond_next = auto or event.response_create is True
        text = "".join(self._text)
        if text:
            self._text, self._text_len = [], 0
            item = Item(self._log.new_id("item"), "user", [Part("input_text", text=text)])
            prev = self._history.insert(item, None)
            self._emit("conversation.item.added", previous_item_id=prev, item=item.render(False))
            self._emit("conversation.item.done", previous_item_id=prev, item=item.render(False))
        has_audio = self._input.can_commit
        if has_audio:
            self._speech_stopped()  # "speech_started -> speech_stopped -> committed"
        item_id, committed_ms = self._input.open_item_id, self._input.buffered_ms
        if has_audio or not text:
            self._input.commit(event.event_id, manual=True)  # raises commit_empty without text or audio
        elif self._input.is_open:
            self._input.drop()  # under the minimum, next to text: dropped
        if has_audio:
            self._turn_committed(item_id, committed_ms)
        else:
            self._turn_committed(None, 0.0)  # a text turn
        self._speech_item = None
        if not has_audio:
            self.turn_id += 1
            self.turn_state = "user_committed"
        if self._respond_next:
            self.answer(ce.ResponseParams(), None)

    def _listen(self, reason: str) -> None:
        sid, epoch = self._session_id, self._log.epoch
        self._emit(
            "response.listen",
            session_id=sid,
            epoch=epoch,
            response={
                "object": "realtime.response",
                "status": "listening",
                "metadata": {"type": "response.listen", "session_id": sid, "epoch": epoch, "reason": reason},
            },
        )

    # --- interruption ----------------------------------------------------------------

    def cancel_response(self, response_id: str | None) -> None:
        """``response.cancel``: as the Realtime API's, and it advances the fence (for the
        conversation's answer ``answer_ending`` does, before its last events)."""
        responses = self._responses
        if response_id is None:
            target = responses.current or next(reversed(responses.out_of_band), None)
        else:
            target = responses.find(response_id)
        if target is not None and target is not responses.current:
            self._log.epoch += 1  # an out-of-band answer: no answer_ending
        responses.cancel(response_id)  # (refused, untouched, when nothing runs)

    def barge_in(self, reason: str) -> None:
        """Stop the running answer where the user stopped hearing it, or the last answer if
        it still plays on the client (``Playback.playing``). Every barge-in advances the
        fence, whether or not anything was interrupted."""
        self._deferred = None  # the next commit's answer covers the whole conversation
        if self.input_clock is not None:
            self.input_clock.drop_deferred(reason)
        if self._responses.current is not None:
            self._responses.end_current("cancelled", {"type": "cancelled", "reason": reason}, cancel=True)
            self.turn_state = "barge_in"
            return
        self._log.epoch += 1
        ledger = self.playback.playing(self.clock())
        if ledger is not None:
            self._emit("output_audio_buffer.cleared", response_id=ledger.response_id)
            self._stop_playback(ledger)
            self.turn_state = "barge_in"

    def _stop_playback(self, ledger: Ledger) -> None:
        """An answer that had ended stops playing: its item keeps what was heard (once any
        ack reached it; ``ack_only``: always), said with ``conversation.item.truncated``."""
        ledger.interrupted = True
        item = self._history.get(ledger.item_id)
        policy = self.duplex.playback_commit_policy
        if item is None or not item.content or item.content[0].type != "output_audio":
            return
        if ledger.acked or policy == "ack_only":
            ledger.cut(item.content[0])
            self._emit(
                "conversation.item.truncated",
                item_id=item.id,
                content_index=0,
                audio_end_ms=round(ledger.committed_ms),
            )

    def clear_output(self) -> None:
        """``output_audio_buffer.clear``: the running answer is cancelled, or the last one
        stops playing; it advances the fence either way."""
        resp = self._responses.current
        last = next(reversed(self._ledgers), None)
        playing = None if resp is not None else self.playback.playing(self.clock())
        if resp is None:
            self._log.epoch += 1  # (answer_ending does, for a running answer)
        self._emit("output_audio_buffer.cleared", response_id=resp.id if resp else last)
        if resp is not None:
            self._responses.end_current(
                "cancelled", {"type": "cancelled", "reason": "output_audio_buffer_clear"}, cancel=True
            )
        elif playing is not None:
            self._stop_playback(playing)

    def turn_signal(self, event: de.TurnSignal) -> None:
        kind = event.event
        if kind == "barge_in":
            self.barge_in("barge_in")
        elif kind == "user_started":
            self.turn_state = "user_speaking"
        elif kind == "user_committed":
            self.commit(de.Commit(event.event_id))
        elif kind == "assistant_started":
            self.turn_state = "assistant_generating"
        elif kind == "assistant_done":
            self.turn_state = "idle"
        elif kind == "playback_ack":
            p = event.payload
            self.playback_ack(
                de.PlaybackAck(
                    event.event_id,
                    _ms(p.get("played_ms")),
                    _ms(p.get("committed_ms"), None),
                    p.get("response_id"),
                    p.get("item_id"),
                    p.get("truncate") is True,
                )
            )
        self.turn_event(kind)

    def turn_event(self, kind: str) -> None:
        self._emit(
            "turn.event", session_id=self._session_id, event=kind, turn_state=self.turn_state, epoch=self._log.epoch
        )

    # --- playback truth ---------------------------------------------------------------

    def playback_ack(self, event: de.PlaybackAck) -> None:
        ledger = self.playback.find(event.response_id, event.item_id)
        current = self._responses.current
        resp = current if current is not None and current.id == ledger.response_id else None
        if resp is not None and resp.part is not None:
            ledger.capture(resp.part)
        ledger.ack(event.played_ms, event.committed_ms, truncate=event.truncate)
        if event.truncate:
            ledger.interrupted = True  # the client stopped playing it
        item = self._history.get(ledger.item_id)
        policy = self.duplex.playback_commit_policy
        if event.truncate and resp is not None:
            # The client stopped playing this answer: stop generating it too (the end cuts it).
            self._responses.end_current("cancelled", {"type": "cancelled", "reason": "client_cancelled"}, cancel=True)
        elif (
            item is not None
            and item.content
            and item.content[0].type == "output_audio"
            and ledger.done
            and (event.truncate or policy == "ack_only")
        ):
            ledger.cut(item.content[0])
            self._log.touch(item)  # its record (the history) follows what was heard
        committed = ledger.done and (policy == "commit_all_on_done" or ledger.committed_ms >= ledger.generated_ms)
        self._emit(
            "playback.acknowledged",
            event={
                "type": "playback.acknowledged",
                "session_id": self._session_id,
                "epoch": self._log.epoch,
                "item_id": ledger.item_id,
                "response_id": ledger.response_id,
                "played_ms": round(ledger.played_ms),
                "committed_ms": round(ledger.committed_ms),
                "truncate": event.truncate,
                "playback": ledger.view(),
                "history_committed": committed,
            },
        )

    # --- the input clock (input_clock.py) -----------------------------------------------

    def input_arrived(self, trigger: str) -> Ack | None:
        """A client event reached the session: its acknowledgement, if it is owed one."""
        clock = self.input_clock
        return clock.begin(trigger) if clock is not None and trigger in TRIGGERS else None

    def input_handled(self, ack: Ack | None, audio_before_ms: float, refused: str | None) -> None:
        """The client event is handled (``refused``: the code of its error). An append refused
        before its audio was taken is ``rejected``; the acknowledgements due go out."""
        clock = self.input_clock
        if clock is None:
            return
        if ack is not None:
            audio_ms = self._input.audio_ms
            rejected = refused if ack.trigger == TRIGGERS[0] and audio_ms == audio_before_ms else None
            clock.end(ack, audio_ms, rejected)
        clock.step_over()
        self.flush_acks()

    def flush_acks(self) -> None:
        """The acknowledgements now due (after every event the step made)."""
        clock = self.input_clock
        if clock is None:
            return
        for fields in clock.flush():
            self._emit("input_audio_buffer.processed", **fields)

    def input_clock_closed(self, reason: str) -> None:
        """Teardown: every owed input acknowledged at once, before the session's last event."""
        clock = self.input_clock
        fields = clock.close(reason, self._input.audio_ms) if clock is not None else None
        if fields is not None:
            self._emit("input_audio_buffer.processed", **fields)

    def _turn_committed(self, item_id: str | None, committed_ms: float) -> None:
        clock = self.input_clock
        if clock is None:
            return
        item = self._history.get(item_id) if item_id is not None else None
        clock.turn(committed_ms, item_id if item is not None and item.pending_transcription else None)

    # --- what the spelling tells (duplex_spelling.TurnMoments) ------------------------------

    def response_created(self, response_id: str) -> None:
        if self.input_clock is not None:
            self.input_clock.response_created(response_id)

    def response_done(self, response_id: str, status: str, details: dict[str, Any] | None) -> None:
        """A response ended: its unit's answer with it (one lost with a replica is made again)."""
        clock = self.input_clock
        if clock is None:
            return
        details = details or {}
        lost = details.get("gateway_reason")  # (only a takeover ends a response with it: recover)
        reissue = lost is not None and self.config.reissue_interrupted_responses
        error = details.get("error")
        if lost is not None:
            decision, reason = "aborted", lost
        elif status in ("cancelled", "failed"):
            decision, reason = status, details.get("reason") or (error.get("code") if isinstance(error, dict) else None)
        else:
            decision, reason = "speak", None  # (completed, or incomplete at max_output_tokens)
        clock.response_done(response_id, decision, reason, reissue=reissue)

    def transcript_final(self, item_id: str) -> None:
        if self.input_clock is not None:
            self.input_clock.transcript_final(item_id)

    @property
    def ending(self) -> tuple[str, str] | None:
        return self._ending

    def committed(self, item_id: str | None, resp: Response | None) -> dict[str, Any]:
        self.turn_id += 1
        self.turn_state = "user_committed"
        return {
            "type": "input.committed",
            "session_id": self._session_id,
            "turn_id": self.turn_id,
            "epoch": self._log.epoch,
            "history_len": len(self._history),
            "realtime_item_id": item_id,
            "message": {
                "role": "user",
                "content": [{"type": "audio_url", "audio_url": {"url": "native-duplex:input-audio"}}],
            },
            "response_create_deferred": self._respond_next and resp is not None,
        }

    def answer_opened(self, resp: Response) -> None:
        self.turn_state = "assistant_generating"
        self._overlap_ms, self._overlap_decided = 0.0, False
        assert resp.message is not None
        self.playback.open(resp.id, resp.message.id)

    def speaking(self) -> None:
        self.turn_state = "assistant_playing"

    def speech_started(self) -> None:
        self.turn_state = "user_speaking"
        if self._responses.current is None and not self._input.manual and self.playback.playing(self.clock()):
            self.speech_during_response()  # server VAD over an answer that still plays


def de_codec(encoding: str) -> str:
    return CODECS.get(encoding, encoding)


def _ms(value: Any, default: int | None = 0) -> Any:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0 else default
