"""The turns of a duplex session (Sans-I/O): input, commits, overlap, interruption
and playback truth, the part of ``DuplexSession`` (duplex.py) that decides them.

See duplex.py for the whole; this part owns the duplex state the session model
does not have: the turn counter and state, the playback ledgers, the overlap
decision of the running answer, the answer owed after it, the pending text.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gateway.audio.codecs import decode_to_pcm16
from gateway.protocol import client_events as ce
from gateway.protocol import duplex_events as de
from gateway.protocol.duplex_config import DuplexConfig
from gateway.protocol.errors import Code, ProtocolError
from gateway.protocol.session_config import beta_format
from gateway.session.conversation import Item, Part
from gateway.session.playback import MAX_LEDGERS, Ledger
from gateway.session.session import RealtimeSession

MAX_PENDING_TEXT = 100_000  # characters of input.text.append awaiting a commit; more: input_text_too_large


class DuplexCore(RealtimeSession):
    """The duplex session's turns; ``DuplexSession`` adds the wire and the lifecycle."""

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
        if resp is not None and resp.part is not None:
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
            self._touch(item)  # its record (the history) follows what was heard
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
        part = resp.part
        assert part is not None  # the duplex dialect opens a response's message at once
        audio = part.type == "output_audio"
        if ledger is not None:
            ledger.capture(part)
            if audio and status == "cancelled" and (ledger.acked or self.duplex.playback_commit_policy == "ack_only"):
                ledger.cut(part)  # history holds what the user heard
        super()._end_response(status, details, cancel=cancel)
        if ledger is not None:
            ledger.done = True
            if audio and status != "cancelled" and self.duplex.playback_commit_policy == "ack_only":
                ledger.cut(part)  # only what is acknowledged enters the history
        self.turn_state = "idle"
        if self._deferred is not None:
            params, self._deferred = self._deferred, None
            self.create_response(params, None)


def de_codec(encoding: str) -> str:
    return {"pcm16": "pcm16", "pcm": "pcm16", "pcm_s16le": "pcm16", "g711_ulaw": "pcmu", "g711_alaw": "pcma"}.get(
        encoding, encoding
    )


def _ms(value: Any, default: int | None = 0) -> Any:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0 else default
