"""Input audio (Sans-I/O): the uncommitted buffer, server VAD turns, and transcription.

Audio flows as it arrives: converted once (``audio.convert.Converter``) from the
format it came in (the session's input format for a client's appends, the transport's
own for a media transport's audio) to the engine's, and streamed into a transcription
request (vLLM's
streaming-input shape: the first chunk starts it, commit ends it). With server
VAD the request opens when speech starts (with ``prefix_padding_ms`` of audio
before it) and is committed when speech stops.

``InputAudio`` owns the buffer (its audio and the transcription request it
feeds), the session's input clock (``audio_ms``), the server VAD stream and
turn detector, the transcriptions of committed items still running, and the
``idle_timeout_ms`` clock. It knows the event log, the history (to add the
user items it commits) and, through ``InputTurns`` and two callbacks, what it
may not decide itself: whether an answer runs, what speech over it does,
how a VAD turn is committed and answered, and who waits for a transcript.
It knows nothing of responses.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.audio.codecs import AudioFormat
from gateway.audio.convert import Converter, engine_format
from gateway.protocol import client_events as ce
from gateway.protocol.errors import Code, ProtocolError
from gateway.protocol.session_config import SessionConfig, TurnDetection
from gateway.protocol.session_fields import LOGPROBS_INCLUDE
from gateway.session.conversation import Item, Part
from gateway.session.effects import Cancel, EndInput, Feed, StartTranscription
from gateway.session.events import EventLog
from gateway.session.history import History
from gateway.session.limits import SessionLimits
from gateway.session.turns import SpeechStarted, TurnDetector, make_detector, semantic_silence_ms
from orchestrator.engine import (
    AudioChunk,
    EngineInfo,
    EngineOutput,
    Finished,
    TextDelta,
    TranscriptionRequest,
    Usage,
)

VAD_RATE = 16000
log = logging.getLogger(__name__)


class VadStream(Protocol):
    """A speech detector's stream (silero's: ``audio.vad.SileroStream``): one speech
    probability per 32 ms frame of 16 kHz PCM16."""

    def process(self, pcm16_16k: bytes) -> list[float]: ...
    def reset(self) -> None: ...


class InputTurns(Protocol):
    """The turn decisions input audio leaves to the dialect's turn-taking
    (``turn_taking.TurnTaking``)."""

    def speech_during_response(self) -> None:
        """Server VAD heard speech start while the conversation's answer runs."""

    def commit_turn(self, event_id: str | None) -> bool:
        """Server VAD ends a turn (or the buffer is full): commit it (``InputAudio.commit``)."""

    def answer(self, params: ce.ResponseParams, event_id: str | None, turn_started_at: float | None = None) -> None:
        """A turn the session answers by itself (a VAD turn, an idle timeout) is committed."""

    @property
    def reports_transcripts(self) -> bool:
        """Whether every committed item's transcript is reported (``...transcription.completed``
        or ``.failed``) even with no ``input_audio_transcription`` asked for (the duplex
        dialect's commit fan-out); False: only when asked for."""


@dataclass(slots=True)
class _OpenInput:
    """The transcription request of the audio buffer not yet committed."""

    item_id: str
    request_id: str
    announced: bool  # the client has seen item_id (speech_started)
    held: list[str] = field(default_factory=list)  # deltas not yet sendable
    failed: bool = False
    text: str = ""  # the transcript so far (semantic VAD reads it)


class InputAudio:
    """See the module docstring."""

    wake_threshold: float | None = None  # speech starts at this (set_wake_threshold); None: the turn detection's

    def __init__(
        self,
        log: EventLog,
        history: History,
        turns: InputTurns,
        *,
        engine: EngineInfo,
        limits: SessionLimits,
        beta: bool,
        config: SessionConfig,
        responding: Callable[[], bool],
        transcribed: Callable[[str, str], None],
        vad_factory: Callable[[], VadStream] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``responding()``: whether the conversation's answer runs; ``transcribed(item_id,
        text)``: an item's transcript is final (a response may wait for it)."""
        self.config = config  # the session's; set by configure()
        self.audio_ms = 0.0  # all audio ever appended: the clock of audio_start/end_ms
        self._log = log
        self._emit = log.emit
        self._effects = log.effects  # (the same list for the session's life)
        self._new_id = log.new_id
        self._history = history
        self._turns = turns
        self._engine = engine
        self._limits = limits
        self._beta = beta
        self._responding = responding
        self._on_transcribed = transcribed
        self._vad_factory = vad_factory
        self._clock = clock
        self._buffer_ms = 0.0
        self._input: _OpenInput | None = None
        self._committed: dict[str, str] = {}  # transcription request id -> item id
        # (ms, engine-rate pcm) before speech: a few entries, a list is smaller than a deque
        self._prefix: list[tuple[float, bytes]] = []
        self._prefix_ms = 0.0
        self._turn_stopped_at: float | None = None
        # idle_timeout_ms: session audio time from which silence counts (when the last
        # answer's audio has played out); None: not armed.
        self._idle_from_ms: float | None = None
        self._logprobs: dict[str, list[dict[str, Any]]] = {}  # item id -> transcription logprobs so far
        # item id -> the transcript deltas the client was sent: the completed transcript is
        # their sum (the rest goes out as a last delta before .completed).
        self._sent: dict[str, str] = {}
        self._reset_stream()

    # --- what the session asks ---------------------------------------------------

    @property
    def manual(self) -> bool:
        """Whether the client commits turns (no server VAD)."""
        return self._manual

    @property
    def is_open(self) -> bool:
        """Whether uncommitted audio is buffered (its transcription request runs)."""
        return self._input is not None

    @property
    def open_item_id(self) -> str | None:
        """The id the uncommitted audio's item will have, while audio is buffered."""
        return self._input.item_id if self._input is not None else None

    @property
    def buffered_ms(self) -> float:
        """The uncommitted audio: what a commit now would commit."""
        return self._buffer_ms

    @property
    def can_commit(self) -> bool:
        """Whether a commit now would make an item (enough audio is buffered)."""
        return self._input is not None and self._buffer_ms >= self._limits.min_commit_ms

    def configure(self, config: SessionConfig) -> None:
        """A new session configuration; a new input format or turn detection starts a new stream."""
        old, self.config = self.config, config
        if config.input_format != old.input_format or config.turn_detection != old.turn_detection:
            self._reset_stream()

    def arm_idle(self, played_ms: float) -> None:
        """The conversation's answer ended with ``played_ms`` of audio still to play: the
        idle timeout counts from when it has played."""
        self._idle_from_ms = self.audio_ms + played_ms

    def transcribe_item(self, item: Item, audio: bytes) -> None:
        """Transcribe ``audio`` (in the session's input format) of an item the client
        created, as one request (the item's transcript follows)."""
        request_id = f"input_{item.id}"
        converter = Converter(self.config.input_format, engine_format(self._engine.input_sample_rate))
        effects = self._effects
        effects.append(StartTranscription(self.transcription_request(request_id)))
        effects.append(Feed(request_id, AudioChunk(converter.process(audio) + converter.flush())))
        effects.append(EndInput(request_id))
        self._committed[request_id] = item.id
        item.pending_transcription = True

    def transcription_request(self, request_id: str) -> TranscriptionRequest:
        """What the session's ``transcription`` asks of the engine's speech-to-text."""
        tr = self.config.transcription
        if tr is None:
            return TranscriptionRequest(request_id)
        return TranscriptionRequest(
            request_id,
            model=tr.model,
            language=tr.language,
            prompt=tr.prompt,
            keywords=tr.keywords or (),
            languages=tr.languages or (),
            logprobs=LOGPROBS_INCLUDE in self.config.include,
        )

    def shutdown(self) -> None:
        """Cancel every transcription request (client gone or session over)."""
        effects = self._effects
        if self._input is not None:
            effects.append(Cancel(self._input.request_id))
            self._input = None
        for request_id in self._committed:
            effects.append(Cancel(request_id))
        self._committed.clear()

    # --- input audio --------------------------------------------------------

    def _reset_stream(self) -> None:
        # What streaming input needs (converters, the VAD stream, the turn detector)
        # is built by the first append, so an idle session holds none of it.
        self._engine_converter: Converter | None = None
        self._vad_converter: Converter | None = None
        self._vad: VadStream | None = None
        self._detector: TurnDetector | None = None
        self._manual = self.config.turn_detection is None or self._vad_factory is None

    def _prepare_input(self, fmt: AudioFormat) -> Converter:
        """The one conversion of audio in ``fmt`` to the engine's format (and, beside it, not
        after it, to the speech detector's, when the engine takes another rate)."""
        old = self._engine_converter
        if old is not None and self._input is not None:
            self._feed_input(old.flush())  # (the audio changed format mid-turn: nothing held is lost)
        converter = self._engine_converter = Converter(fmt, engine_format(self._engine.input_sample_rate))
        td = self.config.turn_detection
        if not self._manual and td is not None and self._vad_factory is not None:
            vad = self._vad_converter
            if self._engine.input_sample_rate == VAD_RATE:
                self._vad_converter = None  # the detector hears what the engine takes
            elif vad is None or vad.src != fmt:  # (else the detector's stream goes on, turn after turn)
                self._vad_converter = Converter(fmt, engine_format(VAD_RATE))
            if self._vad is None:
                self._vad = self._vad_factory()
                self._detector = make_detector(td, origin_ms=self.audio_ms)
                if self.wake_threshold is not None:
                    self._detector.threshold = self.wake_threshold
        return converter

    def set_wake_threshold(self, threshold: float | None) -> None:
        """Speech starts at ``threshold`` (a paused GPT-Live session's wake policy), or, None, at the
        turn detection's again."""
        self.wake_threshold = threshold
        td = self.config.turn_detection
        if self._detector is not None and td is not None:
            self._detector.threshold = threshold if threshold is not None else make_detector(td, 0.0).threshold

    def append(self, audio: bytes, event_id: str | None, fmt: AudioFormat | None = None) -> None:
        """``input_audio_buffer.append`` (the hot path): refused with a ProtocolError, or
        buffered. ``fmt``: the audio's format when it is not the session's input format (a
        media transport's own: converted from it to the engine's, once)."""
        fmt = fmt or self.config.input_format
        if len(audio) % fmt.bytes_per_sample:
            raise ProtocolError(
                Code.INVALID_AUDIO,
                f"Audio length {len(audio)} is not a whole number of {fmt.codec} samples.",
                param="audio",
            )
        duration = fmt.duration_ms(len(audio))
        if duration > self._limits.max_append_ms:
            raise ProtocolError(
                Code.APPEND_TOO_LARGE,
                f"One append may carry at most {self._limits.max_append_ms} ms of audio; "
                f"this one has {duration:.0f} ms. Send smaller chunks.",
                param="audio",
            )
        manual = self._manual
        if manual and self._buffer_ms + duration > self._limits.max_buffer_ms:
            raise ProtocolError(
                Code.BUFFER_FULL,
                f"The input audio buffer holds at most {self._limits.max_buffer_ms} ms; "
                "commit or clear it before appending more.",
                param="audio",
            )
        if not audio:
            return
        converter = self._engine_converter
        if converter is None or converter.src != fmt:
            converter = self._prepare_input(fmt)
        engine_pcm = converter.process(audio)
        start_ms = self.audio_ms
        self.audio_ms += duration
        if manual:
            self._buffer_ms += duration
            self._feed_input(engine_pcm)
            return
        self._append_with_vad(audio, engine_pcm, start_ms, duration, event_id)

    def _append_with_vad(
        self, audio: bytes, engine_pcm: bytes, start_ms: float, duration: float, event_id: str | None
    ) -> None:
        assert self._vad is not None and self._detector is not None
        td = self.config.turn_detection
        assert td is not None
        vad_pcm = engine_pcm if self._vad_converter is None else self._vad_converter.process(audio)
        events = self._detector.process(self._vad.process(vad_pcm))
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
                if self._turns.commit_turn(event_id) and self._answers_turns(td):
                    self._turns.answer(ce.ResponseParams(), None, self._turn_stopped_at)
        if self._input is not None and self._buffer_ms >= self._limits.max_buffer_ms:
            # A turn that never pauses is committed at the limit rather than refused.
            self._turns.commit_turn(event_id)
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
        if self._input is not None or self._responding() or self.audio_ms - start < td.idle_timeout_ms:
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
        prev = self._history.insert(item, None)
        self._emit("input_audio_buffer.committed", previous_item_id=prev, item_id=item.id)
        self._emit("conversation.item.added", previous_item_id=prev, item=item.render(self._beta))
        self._emit("conversation.item.done", previous_item_id=prev, item=item.render(self._beta))
        if self._answers_turns(td):
            self._turns.answer(ce.ResponseParams(), None, self._clock())

    def _speech_started(self, audio_start_ms: int) -> None:
        self._idle_from_ms = None  # the user spoke: no idle timeout until the next answer ends
        self._open_input(announced=True)
        assert self._input is not None
        self._emit("input_audio_buffer.speech_started", audio_start_ms=audio_start_ms, item_id=self._input.item_id)
        if self._responding():
            self._turns.speech_during_response()
        for ms, chunk in self._prefix:
            self._buffer_ms += ms
            self._feed_input(chunk)
        self._prefix.clear()
        self._prefix_ms = 0.0

    def _open_input(self, announced: bool) -> None:
        item_id = self._new_id("item")
        request_id = f"input_{item_id}"
        self._input = _OpenInput(item_id, request_id, announced)
        self._effects.append(StartTranscription(self.transcription_request(request_id)))

    def _feed_input(self, engine_pcm: bytes) -> None:
        if self._input is None:
            self._open_input(announced=False)
        assert self._input is not None
        if engine_pcm:
            self._effects.append(Feed(self._input.request_id, AudioChunk(engine_pcm)))

    def commit(self, event_id: str | None, *, manual: bool) -> bool:
        """Commit the buffer as a user item; False if there was too little audio (then a
        ``manual`` commit, the client's, raises input_audio_buffer_commit_empty)."""
        inp = self._input
        if inp is None or self._buffer_ms < self._limits.min_commit_ms:
            if manual:
                raise ProtocolError(
                    Code.BUFFER_TOO_SMALL,
                    f"Buffer too small to commit: at least {self._limits.min_commit_ms} ms of audio is "
                    f"needed, the buffer holds {self._buffer_ms:.0f} ms.",
                    event_id=event_id,
                )
            if inp is not None:
                self.drop()
            return False
        tail = self._engine_converter.flush() if self._engine_converter else b""
        if tail:
            self._effects.append(Feed(inp.request_id, AudioChunk(tail)))
        self._effects.append(EndInput(inp.request_id))
        self._input = None
        self._buffer_ms = 0.0
        item = Item(inp.item_id, "user", [Part("input_audio")], pending_transcription=not inp.failed)
        prev = self._history.insert(item, None)
        self._emit("input_audio_buffer.committed", previous_item_id=prev, item_id=item.id)
        self._emit("conversation.item.added", previous_item_id=prev, item=item.render(self._beta))
        self._emit("conversation.item.done", previous_item_id=prev, item=item.render(self._beta))
        if inp.failed:
            item.content[0].transcript = ""
        else:
            self._committed[inp.request_id] = item.id
            if inp.held and self.config.transcription is not None and not self._engine.revises_transcripts:
                self._transcription_delta(item.id, "".join(inp.held))
        self._engine_converter = None  # the next append starts a fresh stream
        return True

    def commit_heard(self, item_id: str) -> None:
        """A turn an engine that takes its own turns ended (engine_turns.py): its user item,
        committed as a server VAD turn is, its transcript to come (``heard``)."""
        item = Item(item_id, "user", [Part("input_audio")], pending_transcription=True)
        prev = self._history.insert(item, None)
        self._emit("input_audio_buffer.committed", previous_item_id=prev, item_id=item.id)
        self._emit("conversation.item.added", previous_item_id=prev, item=item.render(self._beta))
        self._emit("conversation.item.done", previous_item_id=prev, item=item.render(self._beta))

    def heard(self, item_id: str, text: str, *, final: bool) -> None:
        """The engine's transcript of a turn ``commit_heard`` committed: more of it, or (``final``)
        all of it, which completes the item as a transcription would."""
        if final:
            self._transcribed(item_id, text, None, None)
        elif text and (self.config.transcription is not None or self._turns.reports_transcripts):
            self._transcription_delta(item_id, text)

    def drop(self) -> None:
        """Forget the uncommitted audio (its transcription is cancelled), silently."""
        if self._input is not None:
            self._effects.append(Cancel(self._input.request_id))
            self._input = None
        self._buffer_ms = 0.0
        self._prefix.clear()
        self._prefix_ms = 0.0

    def clear(self) -> None:
        """``input_audio_buffer.clear``."""
        self.drop()
        if self._detector is not None:
            self._detector.reset()
        self._emit("input_audio_buffer.cleared")

    # --- transcription outputs ---------------------------------------------

    def _transcription_delta(
        self, item_id: str, delta: str, logprobs: list[dict[str, Any]] | None = None, *, record: bool = True
    ) -> None:
        fields: dict[str, Any] = {"item_id": item_id, "content_index": 0, "delta": delta}
        if logprobs is not None:
            fields["logprobs"] = logprobs
        self._emit("conversation.item.input_audio_transcription.delta", **fields)
        if record:  # what the client holds, until the transcript is final
            self._sent[item_id] = self._sent.get(item_id, "") + delta

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
                if td is not None and td.type == "semantic_vad" and self._detector is not None:
                    self._detector.silence_duration_ms = semantic_silence_ms(inp.text, td.eagerness)
            if self.config.transcription is None or self._engine.revises_transcripts:
                return  # (a revising engine's transcript goes out whole, when final)
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
            self.report_failure(self._input.item_id, code, message)
            return
        item_id = self._committed.pop(request_id, None)
        if item_id is not None:
            self._transcribed(item_id, "", None, (code, message))

    def report_failure(self, item_id: str, code: str, message: str) -> None:
        """The transcription of ``item_id`` failed: ``...transcription.failed``, or an
        error when the client asked for no transcripts."""
        if self.config.transcription is not None or self._turns.reports_transcripts:
            self._emit(
                "conversation.item.input_audio_transcription.failed",
                item_id=item_id,
                content_index=0,
                error={"type": "transcription_error", "code": code, "message": message, "param": None},
            )
        else:
            self._log.fail(code, f"Speech recognition failed: {message}", None)

    def _transcribed(self, item_id: str, text: str, usage: Usage | None, failure: tuple[str, str] | None) -> None:
        item = self._history.get(item_id)
        if item is not None:
            item.content[0].transcript = text
            item.pending_transcription = False
            self._log.touch(item)  # no event may announce it (transcription off)
        sent = self._sent.pop(item_id, "")  # (the last delta below records nothing: it is the last)
        if failure is not None:
            self.report_failure(item_id, *failure)
        elif self.config.transcription is not None or self._turns.reports_transcripts:
            if text.startswith(sent):
                if len(text) > len(sent):
                    self._transcription_delta(item_id, text[len(sent) :], record=False)
            else:
                # The engine revised what it had streamed although it said it would not:
                # the client's deltas and this transcript differ (engine bug, logged).
                log.warning("transcription of %s revised its deltas: %r -> %r", item_id, sent, text)
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
        self._on_transcribed(item_id, text)
