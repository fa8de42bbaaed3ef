"""The realtime session state machine (Sans-I/O).

Inputs: decoded client events, input audio, and engine outputs delivered by
the shell. Outputs: server events appended to ``outbox`` (GA-shaped dicts,
each with ``event_id`` and a monotonic ``server_event_seq``) and effects
appended to ``effects`` for the shell to carry out. Nothing here awaits,
sleeps or touches a socket, so every rule below is unit-testable.

Input audio flows as it arrives: it is decoded from the session format,
resampled to the engine's rate and streamed into a transcription request
(vLLM's streaming-input shape: first chunk starts it, commit ends it). With
server VAD the request opens when speech starts (with ``prefix_padding_ms``
of audio before it) and is committed when speech stops. A response that
needs a transcript still being finished starts at once and receives the
transcript as a streamed input chunk, so the engine is never idle waiting for
the whole pipeline.
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from gateway.audio.codecs import AudioFormat, decode_to_pcm16, encode_from_pcm16
from gateway.audio.resample import StreamResampler
from gateway.protocol import client_events as ce
from gateway.protocol.errors import CloseCode, Code, ProtocolError
from gateway.protocol.session_config import (
    OPENAI_TRANSCRIPTION_MODELS,
    OPENAI_VOICES,
    ConfigLimits,
    SessionConfig,
    apply_update,
    beta_format,
    engine_voice,
    ga_format,
    parse_beta_format,
    parse_ga_format,
    render,
)
from gateway.session import snapshot
from gateway.session.conversation import Conversation, Item, Part
from gateway.session.effects import Cancel, Close, Effect, EndInput, Feed, StartResponse, StartTranscription
from gateway.session.turns import SpeechStarted, TurnDetector
from orchestrator.engine import (
    AudioChunk,
    AudioDelta,
    EngineInfo,
    EngineOutput,
    Finished,
    Message,
    ResponseRequest,
    TextChunk,
    TextDelta,
    TranscriptionRequest,
    Usage,
)

VAD_RATE = 16000


class VadStream(Protocol):
    def process(self, pcm16_16k: bytes) -> list[float]: ...
    def reset(self) -> None: ...


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """Per-session limits; each is enforced here with the error named beside it."""

    max_append_ms: int = 10_000  # one append longer than this: audio_append_too_large, dropped
    max_buffer_ms: int = 300_000  # uncommitted audio beyond this: input_audio_buffer_full (manual
    #   turns; the append is refused) or an automatic commit (server VAD)
    min_commit_ms: int = 100  # a commit of less audio: input_audio_buffer_commit_empty
    max_items: int = 1_000  # conversation longer than this: the oldest items are deleted
    #   (conversation.item.deleted is sent for each)
    lifetime_s: float = 3_600.0  # then error session_expired and close 4008 (enforced by the shell)


@dataclass(slots=True)
class _OpenInput:
    """The transcription request of the audio buffer not yet committed."""

    item_id: str
    request_id: str
    announced: bool  # the client has seen item_id (speech_started)
    held: list[str] = field(default_factory=list)  # deltas not yet sendable
    failed: bool = False


@dataclass(slots=True)
class _Response:
    id: str
    item: Item
    part: Part
    in_conversation: bool
    modalities: tuple[Literal["text", "audio"], ...]
    output_format: AudioFormat
    voice: str
    max_output_tokens: int | None
    metadata: dict[str, Any] | None
    resampler: StreamResampler
    awaiting: set[str]  # items whose transcript the engine still waits for
    instructions: str | None = None  # the response's own override, kept to re-issue it
    event_id: str | None = None  # the response.create that asked for it (echoed in its errors)
    usage: Usage | None = None


class RealtimeSession:
    def __init__(
        self,
        *,
        session_id: str,
        config: SessionConfig,
        engine: EngineInfo,
        beta: bool = False,
        limits: SessionLimits | None = None,
        vad_factory: Callable[[], VadStream] | None = None,
        clock: Callable[[], float] = time.monotonic,
        rate_limits: Callable[[], list[dict[str, Any]]] | None = None,
        created_at: float | None = None,
    ) -> None:
        self.id = session_id
        self.config = config
        self.engine = engine
        self.beta = beta
        self.limits = limits or SessionLimits()
        self.outbox: list[dict[str, Any]] = []
        self.effects: list[Effect] = []
        self.seq = 0
        self.epoch = 0  # bumped on barge-in and on takeover by another replica
        self.dirty = True  # state changed since the last snapshot
        self.conversation = Conversation()
        self.conversation_id = "conv_" + secrets.token_hex(8)
        self._clock = clock
        self._rate_limits = rate_limits
        self._vad_factory = vad_factory
        self._id_base = secrets.token_hex(6)
        self._id_counter = 0
        self.created_at = created_at if created_at is not None else time.time()
        self.expires_at = int(self.created_at + self.limits.lifetime_s)
        self._config_limits = ConfigLimits(voices=engine.voices, ignored_fields=engine.ignored_fields)
        # input audio state
        self.audio_ms = 0.0  # all audio ever appended: the clock of audio_start/end_ms
        self._buffer_ms = 0.0
        self._input: _OpenInput | None = None
        self._committed: dict[str, str] = {}  # transcription request id -> item id
        self._prefix: deque[tuple[float, bytes]] = deque()  # (ms, engine-rate pcm) before speech
        self._prefix_ms = 0.0
        self._response: _Response | None = None
        self._turn_stopped_at: float | None = None
        self._setup_input()

    # --- output helpers ---------------------------------------------------

    def _emit(self, type_: str, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        event = {"type": type_, "event_id": f"event_{self._id_base}{self.seq:x}", **fields}
        event["server_event_seq"] = self.seq
        self.outbox.append(event)
        if not type_.endswith(".delta"):
            self.dirty = True  # every non-delta event reflects a state change worth a snapshot
        return event

    def _new_id(self, prefix: str) -> str:
        self._id_counter += 1
        return f"{prefix}_{self._id_base}{self._id_counter:04x}"

    def error(self, err: ProtocolError) -> None:
        self._emit(
            "error",
            error={
                "type": err.type,
                "code": err.code,
                "message": err.message,
                "param": err.param,
                "event_id": err.event_id,
            },
        )

    def _fail(self, code: str, message: str, event_id: str | None, param: str | None = None) -> None:
        self.error(ProtocolError(code, message, param=param, event_id=event_id))

    def take(self) -> tuple[list[dict[str, Any]], list[Effect]]:
        """Hand the pending events and effects to the shell."""
        out, eff = self.outbox, self.effects
        self.outbox, self.effects = [], []
        return out, eff

    # --- lifecycle ----------------------------------------------------------

    def start(self, resume_token: str | None = None) -> None:
        """``resume_token`` (gateway extension) lets the client resume the session later."""
        if resume_token is None:
            self._emit("session.created", session=self.render_config())
        else:
            self._emit("session.created", session=self.render_config(), resume_token=resume_token)

    def render_config(self) -> dict[str, Any]:
        return render(self.config, session_id=self.id, expires_at=self.expires_at, beta=self.beta)

    def expire(self) -> None:
        self._fail(
            Code.SESSION_EXPIRED,
            f"The session reached its maximum lifetime of {self.limits.lifetime_s:.0f} s; open a new session.",
            None,
        )
        self.shutdown()
        self.effects.append(Close(CloseCode.SESSION_EXPIRED, "session expired"))

    def shutdown(self) -> None:
        """Cancel every running request (client gone or session over)."""
        if self._response is not None:
            self.effects.append(Cancel(self._response.id))
            self._response = None
        if self._input is not None:
            self.effects.append(Cancel(self._input.request_id))
            self._input = None
        for request_id in self._committed:
            self.effects.append(Cancel(request_id))
        self._committed.clear()

    # --- client events ------------------------------------------------------

    def handle(self, event: ce.ClientEvent) -> None:
        try:
            match event:
                case ce.AudioAppend():
                    self.append_audio(event.audio, event.event_id)
                case ce.SessionUpdate():
                    self._session_update(event)
                case ce.AudioCommit():
                    self._commit(event.event_id, manual=True)
                case ce.AudioClear():
                    self._clear()
                case ce.ItemCreate():
                    self._item_create(event)
                case ce.ItemRetrieve():
                    self._emit("conversation.item.retrieved", item=self._item(event).render(self.beta))
                case ce.ItemTruncate():
                    self._truncate(event)
                case ce.ItemDelete():
                    self._delete(event)
                case ce.ResponseCreate():
                    self.create_response(event.response, event.event_id)
                case ce.ResponseCancel():
                    self._cancel(event)
        except ProtocolError as err:
            if err.event_id is None:
                err.event_id = event.event_id
            self.error(err)

    def _session_update(self, event: ce.SessionUpdate) -> None:
        old_td = self.config.turn_detection
        new, warnings = apply_update(self.config, event.session, beta=self.beta, limits=self._config_limits)
        tr = new.transcription
        known = OPENAI_TRANSCRIPTION_MODELS + self.engine.transcription_models
        if tr is not None and tr.model not in known:
            raise ProtocolError(
                Code.INVALID_VALUE,
                f"Unknown transcription model {tr.model!r}; use one of: {', '.join(known)}.",
                param="session.audio.input.transcription.model",
            )
        if new.turn_detection is not None and new.turn_detection != old_td and self._vad_factory is None:
            raise ProtocolError(
                Code.INVALID_VALUE,
                "Server VAD is not available on this gateway (no speech detector); "
                "set turn_detection to null and commit turns yourself.",
                param="session.audio.input.turn_detection",
            )
        old = self.config
        self.config = new
        if new.input_format != old.input_format or new.turn_detection != old.turn_detection:
            self._setup_input()
        self._emit("session.updated", session=self.render_config())
        for param, message in warnings:
            # Not an error: the update applied; the client learns what has no effect here.
            self._emit("session.warning", code="unsupported_field", message=message, param=param)

    # --- input audio --------------------------------------------------------

    def _setup_input(self) -> None:
        fmt = self.config.input_format
        self._engine_resampler = StreamResampler(fmt.rate, self.engine.input_sample_rate)
        td = self.config.turn_detection
        if td is not None and self._vad_factory is not None:
            self._vad_resampler = (
                None if self.engine.input_sample_rate == VAD_RATE else StreamResampler(fmt.rate, VAD_RATE)
            )
            self._vad: VadStream | None = self._vad_factory()
            self._turns: TurnDetector | None = TurnDetector(
                td.threshold, td.prefix_padding_ms, td.silence_duration_ms, origin_ms=self.audio_ms
            )
        else:
            self._vad = None
            self._turns = None

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
        manual = self._turns is None
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
        engine_pcm = self._engine_resampler.process(pcm)
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
                self._prefix_ms -= self._prefix.popleft()[0]
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
                if self._commit(event_id, manual=False) and td.create_response:
                    self.create_response(ce.ResponseParams(), None, turn_started_at=self._turn_stopped_at)
        if self._input is not None and self._buffer_ms >= self.limits.max_buffer_ms:
            # A turn that never pauses is committed at the limit rather than refused.
            self._commit(event_id, manual=False)

    def _speech_started(self, audio_start_ms: int) -> None:
        td = self.config.turn_detection
        self._open_input(announced=True)
        assert self._input is not None
        self._emit("input_audio_buffer.speech_started", audio_start_ms=audio_start_ms, item_id=self._input.item_id)
        if self._response is not None and td is not None and td.interrupt_response:
            # Barge-in: the answer stops where it is; the client truncates what it played.
            self.epoch += 1
            self._end_response("cancelled", {"type": "cancelled", "reason": "turn_detected"}, cancel=True)
        for ms, chunk in self._prefix:
            self._buffer_ms += ms
            self._feed_input(chunk)
        self._prefix.clear()
        self._prefix_ms = 0.0

    def _open_input(self, announced: bool) -> None:
        item_id = self._new_id("item")
        request_id = f"input_{item_id}"
        self._input = _OpenInput(item_id, request_id, announced)
        tr = self.config.transcription
        self.effects.append(
            StartTranscription(
                TranscriptionRequest(
                    request_id,
                    model=None,
                    language=tr.language if tr else None,
                    prompt=tr.prompt if tr else None,
                )
            )
        )

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
        tail = self._engine_resampler.flush()
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
        self._engine_resampler = StreamResampler(self.config.input_format.rate, self.engine.input_sample_rate)
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

    def _transcription_delta(self, item_id: str, delta: str) -> None:
        self._emit("conversation.item.input_audio_transcription.delta", item_id=item_id, content_index=0, delta=delta)

    def on_transcription(self, request_id: str, output: EngineOutput) -> None:
        inp = self._input if self._input and self._input.request_id == request_id else None
        item_id = inp.item_id if inp else self._committed.get(request_id)
        if item_id is None:
            return  # cancelled or deleted: late output is dropped
        if isinstance(output, TextDelta):
            if self.config.transcription is None or not output.text:
                return
            if inp is not None and not inp.announced:
                inp.held.append(output.text)
            else:
                self._transcription_delta(item_id, output.text)
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
        if failure is not None:
            self._report_transcription_failure(item_id, *failure)
        elif self.config.transcription is not None:
            u = usage or Usage()
            self._emit(
                "conversation.item.input_audio_transcription.completed",
                item_id=item_id,
                content_index=0,
                transcript=text,
                usage={
                    "type": "tokens",
                    "total_tokens": u.input_tokens + u.output_tokens,
                    "input_tokens": u.input_tokens,
                    "output_tokens": u.output_tokens,
                    "input_token_details": {"text_tokens": u.input_text_tokens, "audio_tokens": u.input_audio_tokens},
                },
            )
        resp = self._response
        if resp is not None and item_id in resp.awaiting:
            resp.awaiting.discard(item_id)
            if text:
                self.effects.append(Feed(resp.id, TextChunk(text)))
            if not resp.awaiting:
                self.effects.append(EndInput(resp.id))

    # --- conversation items -------------------------------------------------

    def _item(self, event: ce.ItemRetrieve | ce.ItemTruncate | ce.ItemDelete) -> Item:
        item = self.conversation.get(event.item_id)
        if item is None:
            raise ProtocolError(Code.ITEM_NOT_FOUND, f"Item with item_id {event.item_id!r} not found.", param="item_id")
        return item

    def _insert(self, item: Item, previous_item_id: str | None) -> str | None:
        prev = self.conversation.insert(item, previous_item_id)
        while len(self.conversation) > self.limits.max_items:
            oldest = self.conversation.oldest()
            assert oldest is not None
            if self._response is not None and oldest is self._response.item:
                break
            self.conversation.remove(oldest.id)
            self._emit("conversation.item.deleted", item_id=oldest.id)
        return prev

    def _item_create(self, event: ce.ItemCreate) -> None:
        spec = event.item
        if spec.id is not None and self.conversation.get(spec.id) is not None:
            raise ProtocolError(Code.ITEM_EXISTS, f"An item with id {spec.id!r} already exists.", param="item.id")
        prev_id = event.previous_item_id
        if prev_id is not None and prev_id != "root" and self.conversation.get(prev_id) is None:
            raise ProtocolError(
                Code.ITEM_NOT_FOUND, f"previous_item_id {prev_id!r} not found.", param="previous_item_id"
            )
        item = self._item_from_spec(spec, "item")
        prev = self._insert(item, prev_id)
        self._emit("conversation.item.added", previous_item_id=prev, item=item.render(self.beta))
        self._emit("conversation.item.done", previous_item_id=prev, item=item.render(self.beta))

    def _item_from_spec(self, spec: ce.ItemSpec, param: str) -> Item:
        """Build an item; validates every part before asking for any work."""
        item = Item(spec.id or self._new_id("item"), spec.role, [])
        fmt = self.config.input_format
        audio: bytes | None = None
        for i, p in enumerate(spec.content):
            if p.audio is not None and p.transcript is None:
                if len(p.audio) % fmt.bytes_per_sample:
                    raise ProtocolError(
                        Code.INVALID_AUDIO,
                        f"Audio length {len(p.audio)} is not a whole number of {fmt.codec} samples.",
                        param=f"{param}.content[{i}].audio",
                    )
                if audio is not None:
                    raise ProtocolError(
                        Code.INVALID_VALUE, "Only one input_audio part per item.", param=f"{param}.content"
                    )
                audio = p.audio
            item.content.append(Part(p.type, text=p.text, transcript=p.transcript))
        if audio is not None:
            request_id = f"input_{item.id}"
            pcm = decode_to_pcm16(fmt, audio)
            resampler = StreamResampler(fmt.rate, self.engine.input_sample_rate)
            self.effects.append(StartTranscription(TranscriptionRequest(request_id)))
            self.effects.append(Feed(request_id, AudioChunk(resampler.process(pcm) + resampler.flush())))
            self.effects.append(EndInput(request_id))
            self._committed[request_id] = item.id
            item.pending_transcription = True
        return item

    def _truncate(self, event: ce.ItemTruncate) -> None:
        item = self._item(event)
        if item.role != "assistant":
            raise ProtocolError(Code.INVALID_TRUNCATE, "Only assistant audio items can be truncated.", param="item_id")
        if event.content_index >= len(item.content) or item.content[event.content_index].type != "output_audio":
            raise ProtocolError(
                Code.INVALID_TRUNCATE,
                f"content_index {event.content_index} is not an audio part of item {item.id!r}.",
                param="content_index",
            )
        part = item.content[event.content_index]
        if event.audio_end_ms > part.audio_ms + 1:
            raise ProtocolError(
                Code.INVALID_TRUNCATE,
                f"audio_end_ms {event.audio_end_ms} is beyond the item's audio ({part.audio_ms:.0f} ms).",
                param="audio_end_ms",
            )
        resp = self._response
        if resp is not None and resp.item is item:
            # The client stopped playing this answer: stop generating it too.
            self._end_response("cancelled", {"type": "cancelled", "reason": "client_cancelled"}, cancel=True)
        kept = 0
        for offset_ms, length in part.marks:
            if offset_ms < event.audio_end_ms:
                kept = length
        part.transcript = (part.transcript or "")[:kept]
        part.marks = [m for m in part.marks if m[1] <= kept]
        part.audio_ms = float(event.audio_end_ms)
        self._emit(
            "conversation.item.truncated",
            item_id=item.id,
            content_index=event.content_index,
            audio_end_ms=event.audio_end_ms,
        )

    def _delete(self, event: ce.ItemDelete) -> None:
        item = self._item(event)
        if self._response is not None and self._response.item is item:
            self._end_response("cancelled", {"type": "cancelled", "reason": "client_cancelled"}, cancel=True)
        self.conversation.remove(item.id)
        self._emit("conversation.item.deleted", item_id=item.id)

    # --- responses ----------------------------------------------------------

    def create_response(
        self, params: ce.ResponseParams, event_id: str | None, turn_started_at: float | None = None
    ) -> None:
        if self._response is not None:
            raise ProtocolError(
                Code.RESPONSE_ACTIVE,
                f"Conversation already has an active response {self._response.id!r}; "
                "cancel it or wait for response.done.",
                event_id=event_id,
            )
        cfg = self.config
        modalities = params.output_modalities or cfg.output_modalities
        voice = params.voice if params.voice is not None else cfg.voice
        if voice not in OPENAI_VOICES and voice not in self.engine.voices:
            raise ProtocolError(Code.INVALID_VALUE, f"Unknown voice {voice!r}.", param="response.audio.output.voice")
        out_fmt = cfg.output_format
        if isinstance(params.output_format, dict):
            out_fmt = parse_ga_format(params.output_format, "response.audio.output.format")
        elif isinstance(params.output_format, str):
            out_fmt = parse_beta_format(params.output_format, "response.output_audio_format")
        max_tokens = cfg.max_output_tokens if params.max_output_tokens == "unset" else params.max_output_tokens
        context, awaiting = self._context(params)
        in_conversation = params.conversation == "auto"
        resp_id = self._new_id("resp")
        part = Part("output_audio", transcript="") if "audio" in modalities else Part("output_text", text="")
        item = Item(self._new_id("item"), "assistant", [], status="in_progress")
        resp = _Response(
            id=resp_id,
            item=item,
            part=part,
            in_conversation=in_conversation,
            modalities=modalities,
            output_format=out_fmt,
            voice=voice,
            max_output_tokens=max_tokens,
            metadata=params.metadata,
            resampler=StreamResampler(self.engine.output_sample_rate, out_fmt.rate),
            awaiting=awaiting,
            instructions=params.instructions,
            event_id=event_id,
        )
        self._response = resp
        self._emit("response.created", response=self._render_response(resp, "in_progress", None))
        self._emit("response.output_item.added", response_id=resp_id, output_index=0, item=item.render(self.beta))
        if in_conversation:
            prev = self._insert(item, None)
            self._emit("conversation.item.added", previous_item_id=prev, item=item.render(self.beta))
        item.content.append(part)
        self._emit(
            "response.content_part.added",
            response_id=resp_id,
            item_id=item.id,
            output_index=0,
            content_index=0,
            part=part.render(self.beta),
        )
        request = ResponseRequest(
            request_id=resp_id,
            messages=tuple(context),
            instructions=cfg.instructions if params.instructions is None else params.instructions,
            modalities=modalities,
            voice=engine_voice(voice, self.engine.voices, self.engine.default_voice),
            max_output_tokens=max_tokens,
            temperature=cfg.temperature if params.temperature is None else params.temperature,
            speed=cfg.speed,
        )
        self.effects.append(StartResponse(request, turn_started_at))
        if not awaiting:
            self.effects.append(EndInput(resp_id))

    def _context(self, params: ce.ResponseParams) -> tuple[list[Message], set[str]]:
        if params.input is None:
            items = list(self.conversation)
        else:
            items = []
            for i, entry in enumerate(params.input):
                if isinstance(entry, str):
                    ref = self.conversation.get(entry)
                    if ref is None:
                        raise ProtocolError(
                            Code.ITEM_NOT_FOUND, f"Item with item_id {entry!r} not found.", param=f"response.input[{i}]"
                        )
                    items.append(ref)
                else:
                    items.append(self._item_from_spec(entry, f"response.input[{i}]"))
        awaiting = {it.id for it in items if it.pending_transcription}
        # A pending item is sent with empty text; its transcript follows as a streamed input chunk.
        return [it.as_message() for it in items], awaiting

    def _render_response(self, resp: _Response, status: str, details: dict[str, Any] | None) -> dict[str, Any]:
        usage = None
        if resp.usage is not None:
            u = resp.usage
            usage = {
                "total_tokens": u.input_tokens + u.output_tokens,
                "input_tokens": u.input_tokens,
                "output_tokens": u.output_tokens,
                "input_token_details": {
                    "text_tokens": u.input_text_tokens,
                    "audio_tokens": u.input_audio_tokens,
                    "cached_tokens": 0,
                },
                "output_token_details": {"text_tokens": u.output_text_tokens, "audio_tokens": u.output_audio_tokens},
            }
        out: dict[str, Any] = {
            "object": "realtime.response",
            "id": resp.id,
            "status": status,
            "status_details": details,
            "output": [resp.item.render(self.beta)] if status != "in_progress" else [],
            "conversation_id": self.conversation_id if resp.in_conversation else None,
            "max_output_tokens": "inf" if resp.max_output_tokens is None else resp.max_output_tokens,
            "usage": usage,
            "metadata": resp.metadata,
        }
        if self.beta:
            out["modalities"] = ["audio", "text"] if "audio" in resp.modalities else ["text"]
            out["voice"] = resp.voice
            out["output_audio_format"] = beta_format(resp.output_format)
        else:
            out["output_modalities"] = list(resp.modalities)
            out["audio"] = {"output": {"format": ga_format(resp.output_format), "voice": resp.voice}}
        return out

    def on_response(self, request_id: str, output: EngineOutput) -> None:
        resp = self._response
        if resp is None or resp.id != request_id:
            return  # output that raced a cancel
        part = resp.part
        where = {"response_id": resp.id, "item_id": resp.item.id, "output_index": 0, "content_index": 0}
        if isinstance(output, AudioDelta):
            if "audio" in resp.modalities:
                self._audio_delta(resp, resp.resampler.process(output.pcm), where)
        elif isinstance(output, TextDelta):
            if not output.text:
                return
            if part.type == "output_audio":
                part.transcript = (part.transcript or "") + output.text
                part.marks.append((part.audio_ms, len(part.transcript)))
                self._emit("response.output_audio_transcript.delta", **where, delta=output.text)
            else:
                part.text = (part.text or "") + output.text
                self._emit("response.output_text.delta", **where, delta=output.text)
        elif isinstance(output, Finished):
            if "audio" in resp.modalities:
                self._audio_delta(resp, resp.resampler.flush(), where)
            resp.usage = output.usage
            if output.reason == "length":
                self._end_response("incomplete", {"type": "incomplete", "reason": "max_output_tokens"})
            else:
                self._end_response("completed", None)

    def _audio_delta(self, resp: _Response, pcm: bytes, where: dict[str, Any]) -> None:
        if not pcm:
            return
        data = encode_from_pcm16(resp.output_format, pcm)
        resp.part.audio_ms += resp.output_format.duration_ms(len(data))
        self._emit("response.output_audio.delta", **where, delta=data)

    def on_response_failed(self, request_id: str, code: str, message: str) -> None:
        resp = self._response
        if resp is None or resp.id != request_id:
            return
        self._fail(code, message, resp.event_id)
        self._end_response(
            "failed", {"type": "failed", "error": {"type": "server_error", "code": code, "message": message}}
        )

    def _cancel(self, event: ce.ResponseCancel) -> None:
        resp = self._response
        if resp is None or (event.response_id is not None and event.response_id != resp.id):
            raise ProtocolError(
                Code.RESPONSE_NOT_ACTIVE,
                "There is no active response to cancel"
                + (f" with id {event.response_id!r}." if event.response_id else "."),
                param="response_id" if event.response_id else None,
            )
        self._end_response("cancelled", {"type": "cancelled", "reason": "client_cancelled"}, cancel=True)

    def _end_response(self, status: str, details: dict[str, Any] | None, *, cancel: bool = False) -> None:
        resp = self._response
        assert resp is not None
        if cancel:
            self.effects.append(Cancel(resp.id))
        where = {"response_id": resp.id, "item_id": resp.item.id, "output_index": 0, "content_index": 0}
        part = resp.part
        if part.type == "output_audio":
            self._emit("response.output_audio.done", **where)
            self._emit("response.output_audio_transcript.done", **where, transcript=part.transcript or "")
        else:
            self._emit("response.output_text.done", **where, text=part.text or "")
        self._emit("response.content_part.done", **where, part=part.render(self.beta))
        resp.item.status = "completed" if status == "completed" else "incomplete"
        self._emit("response.output_item.done", response_id=resp.id, output_index=0, item=resp.item.render(self.beta))
        if resp.in_conversation and self.conversation.get(resp.item.id) is not None:
            self._emit("conversation.item.done", previous_item_id=None, item=resp.item.render(self.beta))
        self._response = None
        self._emit("response.done", response=self._render_response(resp, status, details))
        if self._rate_limits is not None:
            self._emit("rate_limits.updated", rate_limits=self._rate_limits())

    @property
    def active_response_id(self) -> str | None:
        return self._response.id if self._response else None

    # --- snapshots (resume) --------------------------------------------------

    def snapshot_state(self) -> dict[str, Any]:
        """Everything another replica needs to carry the session on."""
        resp = self._response
        return {
            "id": self.id,
            "beta": self.beta,
            "config": snapshot.config_to_dict(self.config),
            "created_at": self.created_at,
            "seq": self.seq,
            "epoch": self.epoch,
            "conversation_id": self.conversation_id,
            "id_base": self._id_base,
            "id_counter": self._id_counter,
            "audio_ms": self.audio_ms,
            "items": [snapshot.item_to_dict(it) for it in self.conversation],
            "response": None
            if resp is None
            else {
                "id": resp.id,
                "item": snapshot.item_to_dict(resp.item),
                "in_conversation": resp.in_conversation,
                "modalities": list(resp.modalities),
                "output_format": [resp.output_format.codec, resp.output_format.rate],
                "voice": resp.voice,
                "max_output_tokens": resp.max_output_tokens,
                "metadata": resp.metadata,
                "instructions": resp.instructions,
            },
        }

    @classmethod
    def restore(cls, state: dict[str, Any], *, engine: EngineInfo, **kwargs: Any) -> RealtimeSession:
        """Rebuild a session from ``snapshot_state`` output (on any replica)."""
        session = cls(
            session_id=state["id"],
            config=snapshot.config_from_dict(state["config"]),
            engine=engine,
            beta=state["beta"],
            created_at=state["created_at"],
            **kwargs,
        )
        session.seq = state["seq"]
        session.epoch = state["epoch"]
        session.conversation_id = state["conversation_id"]
        session._id_base = state["id_base"]
        session._id_counter = state["id_counter"]
        session.audio_ms = state["audio_ms"]
        session._setup_input()
        for entry in state["items"]:
            session.conversation.insert(snapshot.item_from_dict(entry))
        r = state["response"]
        if r is not None:
            item = session.conversation.get(r["item"]["id"]) or snapshot.item_from_dict(r["item"])
            codec, rate = r["output_format"]
            fmt = AudioFormat(codec, rate)
            session._response = _Response(
                id=r["id"],
                item=item,
                part=item.content[0] if item.content else Part("output_audio", transcript=""),
                in_conversation=r["in_conversation"],
                modalities=tuple(r["modalities"]),
                output_format=fmt,
                voice=r["voice"],
                max_output_tokens=r["max_output_tokens"],
                metadata=r["metadata"],
                resampler=StreamResampler(engine.output_sample_rate, fmt.rate),
                awaiting=set(),
                instructions=r["instructions"],
            )
        session.dirty = False
        return session

    def recover(self, reason: str) -> None:
        """After a takeover: end what died with the old replica, explicitly.

        A running response ends with status ``incomplete`` and ``reason`` and,
        unless ``reissue_interrupted_responses`` is off, is created again from
        the conversation. A transcription that was running is reported failed.
        """
        self.epoch += 1
        for item in self.conversation:
            if item.pending_transcription:
                item.pending_transcription = False
                item.content[0].transcript = ""
                self._report_transcription_failure(
                    item.id, "replica_lost", "The replica transcribing this audio was lost."
                )
        resp = self._response
        if resp is None:
            return
        self._end_response("incomplete", {"type": "incomplete", "reason": reason})
        if self.config.reissue_interrupted_responses:
            self.create_response(
                ce.ResponseParams(
                    output_modalities=resp.modalities,
                    instructions=resp.instructions,
                    voice=resp.voice,
                    max_output_tokens=resp.max_output_tokens,
                    conversation="auto" if resp.in_conversation else "none",
                    metadata=resp.metadata,
                ),
                None,
            )
