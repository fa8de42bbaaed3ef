"""Input audio: the uncommitted buffer, server VAD turns, and transcription.

Audio flows as it arrives: decoded from the session format, resampled to the
engine's rate and streamed into a transcription request (vLLM's
streaming-input shape: the first chunk starts it, commit ends it). With server
VAD the request opens when speech starts (with ``prefix_padding_ms`` of audio
before it) and is committed when speech stops.
"""

from __future__ import annotations

from typing import Any

from gateway.audio.codecs import decode_to_pcm16
from gateway.audio.resample import StreamResampler
from gateway.protocol import client_events as ce
from gateway.protocol.errors import Code, ProtocolError
from gateway.protocol.session_config import TurnDetection
from gateway.protocol.session_fields import LOGPROBS_INCLUDE
from gateway.session.conversation import Item, Part
from gateway.session.core import VAD_RATE, SessionCore, VadStream, _OpenInput
from gateway.session.effects import Cancel, EndInput, Feed, StartTranscription
from gateway.session.turns import SpeechStarted, TurnDetector, make_detector, semantic_silence_ms
from orchestrator.engine import (
    AudioChunk,
    EngineOutput,
    Finished,
    TextChunk,
    TextDelta,
    Usage,
)


class InputAudio(SessionCore):
    # --- input audio --------------------------------------------------------

    def _setup_input(self) -> None:
        # What streaming input needs (resamplers, the VAD stream, the turn detector)
        # is built by the first append, so an idle session holds none of it.
        self._engine_resampler: StreamResampler | None = None
        self._vad_resampler: StreamResampler | None = None
        self._vad: VadStream | None = None
        self._turns: TurnDetector | None = None
        self._manual = self.config.turn_detection is None or self._vad_factory is None

    def _prepare_input(self) -> StreamResampler:
        fmt = self.config.input_format
        resampler = self._engine_resampler = StreamResampler(fmt.rate, self.engine.input_sample_rate)
        td = self.config.turn_detection
        if self._vad is None and not self._manual and td is not None and self._vad_factory is not None:
            if self.engine.input_sample_rate != VAD_RATE:
                self._vad_resampler = StreamResampler(fmt.rate, VAD_RATE)
            self._vad = self._vad_factory()
            self._turns = make_detector(td, origin_ms=self.audio_ms)
        return resampler

    def append_audio(self, audio: bytes, event_id: str | None) -> None:
        fmt = self.config.input_format
        if len(audio) % fmt.bytes_per_sample:
            raise ProtocolError(
                Code.INVALID_AUDIO,
                f"Audio length {len(audio)} is not a whole number of {fmt.codec} samples.",
                param="audio",
            )
        duration = fmt.duration_ms(len(audio))
        if duration > self.limits.max_append_ms:
            raise ProtocolError(
                Code.APPEND_TOO_LARGE,
                f"One append may carry at most {self.limits.max_append_ms} ms of audio; "
                f"this one has {duration:.0f} ms. Send smaller chunks.",
                param="audio",
            )
        manual = self._manual
        if manual and self._buffer_ms + duration > self.limits.max_buffer_ms:
            raise ProtocolError(
                Code.BUFFER_FULL,
                f"The input audio buffer holds at most {self.limits.max_buffer_ms} ms; "
                "commit or clear it before appending more.",
                param="audio",
            )
        if not audio:
            return
        pcm = decode_to_pcm16(fmt, audio)
        engine_pcm = (self._engine_resampler or self._prepare_input()).process(pcm)
        start_ms = self.audio_ms
        self.audio_ms += duration
        if manual:
            self._buffer_ms += duration
            self._feed_input(engine_pcm)
            return
        self._append_with_vad(pcm, engine_pcm, start_ms, duration, event_id)

    def _append_with_vad(
        self, pcm: bytes, engine_pcm: bytes, start_ms: float, duration: float, event_id: str | None
    ) -> None:
        assert self._vad is not None and self._turns is not None
        td = self.config.turn_detection
        assert td is not None
        vad_pcm = engine_pcm if self._vad_resampler is None else self._vad_resampler.process(pcm)
        events = self._turns.process(self._vad.process(vad_pcm))
        if self._input is None:
            self._prefix.append((duration, engine_pcm))
            self._prefix_ms += duration
            keep = td.prefix_padding_ms + 2 * 32 + duration  # the padding plus detection lag
            while self._prefix and self._prefix_ms - self._prefix[0][0] >= keep:
                self._prefix_ms -= self._prefix.pop(0)[0]
        else:
            self._buffer_ms += duration
            self._feed_input(engine_pcm)
        for ev in events:
            if isinstance(ev, SpeechStarted):
                self._speech_started(ev.audio_start_ms)
            else:
                item_id = self._input.item_id if self._input else None
                self._emit("input_audio_buffer.speech_stopped", audio_end_ms=ev.audio_end_ms, item_id=item_id)
                self._turn_stopped_at = self._clock()
                if self._commit(event_id, manual=False) and self._answers_turns(td):
                    self.create_response(ce.ResponseParams(), None, turn_started_at=self._turn_stopped_at)
        if self._input is not None and self._buffer_ms >= self.limits.max_buffer_ms:
            # A turn that never pauses is committed at the limit rather than refused.
            self._commit(event_id, manual=False)
        self._check_idle(td)

    def _answers_turns(self, td: TurnDetection) -> bool:
        """A VAD turn gets a response (never in a transcription session)."""
        return td.create_response and self.config.type == "realtime"

    def _check_idle(self, td: TurnDetection) -> None:
        """``idle_timeout_ms`` (server VAD): when the user has said nothing for that long
        after the last answer's audio played out, measured on the input audio stream
        (a client that stops sending audio stops this clock), the turn is taken
        as an empty one: ``input_audio_buffer.timeout_triggered``, an empty user
        item, and a response that prompts the user (with ``create_response``)."""
        start = self._idle_from_ms
        if td.type != "server_vad" or td.idle_timeout_ms is None or start is None:
            return
        if self._input is not None or self._response is not None or self.audio_ms - start < td.idle_timeout_ms:
            return
        self._idle_from_ms = None  # armed again when the next answer ends
        item = Item(self._new_id("item"), "user", [Part("input_audio", transcript="")])
        self._emit(
            "input_audio_buffer.timeout_triggered",
            audio_start_ms=int(start),
            audio_end_ms=int(self.audio_ms),
            item_id=item.id,
        )
        self._prefix.clear()
        self._prefix_ms = 0.0
        prev = self._insert(item, None)
        self._emit("input_audio_buffer.committed", previous_item_id=prev, item_id=item.id)
        self._emit("conversation.item.added", previous_item_id=prev, item=item.render(self.beta))
        self._emit("conversation.item.done", previous_item_id=prev, item=item.render(self.beta))
        if self._answers_turns(td):
            self.create_response(ce.ResponseParams(), None, turn_started_at=self._clock())

    def _speech_started(self, audio_start_ms: int) -> None:
        self._idle_from_ms = None  # the user spoke: no idle timeout until the next answer ends
        self._open_input(announced=True)
        assert self._input is not None
        self._emit("input_audio_buffer.speech_started", audio_start_ms=audio_start_ms, item_id=self._input.item_id)
        if self._response is not None:
            self._speech_during_response()
        for ms, chunk in self._prefix:
            self._buffer_ms += ms
            self._feed_input(chunk)
        self._prefix.clear()
        self._prefix_ms = 0.0

    def _speech_during_response(self) -> None:
        """Server VAD heard speech while an answer runs: barge in when ``interrupt_response``."""
        td = self.config.turn_detection
        if td is not None and td.interrupt_response:
            # Barge-in: the answer stops where it is; the client truncates what it played.
            self.epoch += 1
            self._end_response("cancelled", {"type": "cancelled", "reason": "turn_detected"}, cancel=True)

    def _open_input(self, announced: bool) -> None:
        item_id = self._new_id("item")
        request_id = f"input_{item_id}"
        self._input = _OpenInput(item_id, request_id, announced)
        self.effects.append(StartTranscription(self._transcription_request(request_id)))

    def _feed_input(self, engine_pcm: bytes) -> None:
        if self._input is None:
            self._open_input(announced=False)
        assert self._input is not None
        if engine_pcm:
            self.effects.append(Feed(self._input.request_id, AudioChunk(engine_pcm)))

    def _commit(self, event_id: str | None, *, manual: bool) -> bool:
        inp = self._input
        if inp is None or self._buffer_ms < self.limits.min_commit_ms:
            if manual:
                raise ProtocolError(
                    Code.BUFFER_TOO_SMALL,
                    f"Buffer too small to commit: at least {self.limits.min_commit_ms} ms of audio is "
                    f"needed, the buffer holds {self._buffer_ms:.0f} ms.",
                    event_id=event_id,
                )
            if inp is not None:
                self._drop_input()
            return False
        tail = self._engine_resampler.flush() if self._engine_resampler else b""
        if tail:
            self.effects.append(Feed(inp.request_id, AudioChunk(tail)))
        self.effects.append(EndInput(inp.request_id))
        self._input = None
        self._buffer_ms = 0.0
        item = Item(inp.item_id, "user", [Part("input_audio")], pending_transcription=not inp.failed)
        prev = self._insert(item, None)
        self._emit("input_audio_buffer.committed", previous_item_id=prev, item_id=item.id)
        self._emit("conversation.item.added", previous_item_id=prev, item=item.render(self.beta))
        self._emit("conversation.item.done", previous_item_id=prev, item=item.render(self.beta))
        if inp.failed:
            item.content[0].transcript = ""
        else:
            self._committed[inp.request_id] = item.id
            if inp.held and self.config.transcription is not None:
                self._transcription_delta(item.id, "".join(inp.held))
        self._engine_resampler = None  # the next append starts a fresh stream
        return True

    def _drop_input(self) -> None:
        if self._input is not None:
            self.effects.append(Cancel(self._input.request_id))
            self._input = None
        self._buffer_ms = 0.0
        self._prefix.clear()
        self._prefix_ms = 0.0

    def _clear(self) -> None:
        self._drop_input()
        if self._turns is not None:
            self._turns.reset()
        self._emit("input_audio_buffer.cleared")

    # --- transcription outputs ---------------------------------------------

    def _transcription_delta(self, item_id: str, delta: str, logprobs: list[dict[str, Any]] | None = None) -> None:
        fields: dict[str, Any] = {"item_id": item_id, "content_index": 0, "delta": delta}
        if logprobs is not None:
            fields["logprobs"] = logprobs
        self._emit("conversation.item.input_audio_transcription.delta", **fields)

    def on_transcription(self, request_id: str, output: EngineOutput) -> None:
        inp = self._input if self._input and self._input.request_id == request_id else None
        item_id = inp.item_id if inp else self._committed.get(request_id)
        if item_id is None:
            return  # cancelled or deleted: late output is dropped
        if isinstance(output, TextDelta):
            if not output.text:
                return
            if inp is not None:
                inp.text += output.text
                td = self.config.turn_detection
                if td is not None and td.type == "semantic_vad" and self._turns is not None:
                    self._turns.silence_duration_ms = semantic_silence_ms(inp.text, td.eagerness)
            if self.config.transcription is None:
                return
            logprobs = None
            if output.logprobs is not None and LOGPROBS_INCLUDE in self.config.include:
                logprobs = [
                    {"token": lp.token, "logprob": lp.logprob, "bytes": list(lp.bytes)} for lp in output.logprobs
                ]
                self._logprobs.setdefault(item_id, []).extend(logprobs)
            if inp is not None and not inp.announced:
                inp.held.append(output.text)
            else:
                self._transcription_delta(item_id, output.text, logprobs)
        elif isinstance(output, Finished):
            self._committed.pop(request_id, None)
            self._transcribed(item_id, output.text, output.usage, None)

    def on_transcription_failed(self, request_id: str, code: str, message: str) -> None:
        if self._input is not None and self._input.request_id == request_id:
            self._input.failed = True  # the commit will carry an empty transcript
            self._report_transcription_failure(self._input.item_id, code, message)
            return
        item_id = self._committed.pop(request_id, None)
        if item_id is not None:
            self._transcribed(item_id, "", None, (code, message))

    def _report_transcription_failure(self, item_id: str, code: str, message: str) -> None:
        if self.config.transcription is not None:
            self._emit(
                "conversation.item.input_audio_transcription.failed",
                item_id=item_id,
                content_index=0,
                error={"type": "transcription_error", "code": code, "message": message, "param": None},
            )
        else:
            self._fail(code, f"Speech recognition failed: {message}", None)

    def _transcribed(self, item_id: str, text: str, usage: Usage | None, failure: tuple[str, str] | None) -> None:
        item = self.conversation.get(item_id)
        if item is not None:
            item.content[0].transcript = text
            item.pending_transcription = False
            self._touch(item)  # no event may announce it (transcription off)
        if failure is not None:
            self._report_transcription_failure(item_id, *failure)
        elif self.config.transcription is not None:
            u = usage or Usage()
            logprobs = self._logprobs.pop(item_id, None)
            self._emit(
                "conversation.item.input_audio_transcription.completed",
                item_id=item_id,
                content_index=0,
                transcript=text,
                **({} if logprobs is None else {"logprobs": logprobs}),
                usage={
                    "type": "tokens",
                    "total_tokens": u.input_tokens + u.output_tokens,
                    "input_tokens": u.input_tokens,
                    "output_tokens": u.output_tokens,
                    "input_token_details": {"text_tokens": u.input_text_tokens, "audio_tokens": u.input_audio_tokens},
                },
            )
        for resp in (self._response, *self._oob.values()):
            if resp is not None and item_id in resp.awaiting:
                resp.awaiting.discard(item_id)
                if text:
                    self.effects.append(Feed(resp.id, TextChunk(text)))
                if not resp.awaiting:
                    self.effects.append(EndInput(resp.id))
