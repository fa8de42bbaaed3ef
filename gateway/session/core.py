"""The shared core of the realtime session: its state and how it emits.

``RealtimeSession`` (session.py) is assembled from this core and two parts
that each own one topic: ``InputAudio`` (input.py: the audio buffer, server
VAD, transcription) and ``Responses`` (responses.py). They share the state
set up here and call across only through the methods declared here.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from gateway.audio.codecs import AudioFormat
from gateway.audio.resample import StreamResampler
from gateway.protocol import client_events as ce
from gateway.protocol.errors import ProtocolError
from gateway.protocol.session_config import (
    ConfigLimits,
    SessionConfig,
)
from gateway.protocol.session_fields import LOGPROBS_INCLUDE
from gateway.session.conversation import Conversation, Item, Part
from gateway.session.effects import Effect
from orchestrator.engine import (
    EngineInfo,
    TranscriptionRequest,
    Usage,
)

VAD_RATE = 16000

# Events that announce a change of session state a replica taking the session over
# must know: each marks the session for a snapshot, and the host sends it only once
# the store holds that snapshot (write-ahead; tests/unit/test_state_events.py).
# session.created is one: its resume token must resume the session anywhere.
STATE_EVENTS = frozenset(
    {
        "session.created",
        "session.updated",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
        "conversation.item.deleted",
        "conversation.item.truncated",
        "response.created",
        "response.done",
    }
)


# Events that name an item without changing it.
READ_ONLY_EVENTS = frozenset({"conversation.item.retrieved"})


class VadStream(Protocol):
    """A speech detector's stream (silero's: ``audio.vad.SileroStream``): one speech
    probability per 32 ms frame of 16 kHz PCM16."""

    def process(self, pcm16_16k: bytes) -> list[float]: ...
    def reset(self) -> None: ...


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """Per-session limits; each is enforced here with the error named beside it."""

    max_append_ms: int = 300_000  # one append longer than this: audio_append_too_large, dropped
    max_buffer_ms: int = 300_000  # uncommitted audio beyond this: input_audio_buffer_full (manual
    #   turns; the append is refused) or an automatic commit (server VAD)
    min_commit_ms: int = 100  # a commit of less audio: input_audio_buffer_commit_empty
    max_items: int = 1_000  # conversation longer than this: the oldest items are deleted
    #   (conversation.item.deleted is sent for each)
    max_conversation_bytes: int = 4 << 20  # the conversation's text (each item counted as it was
    #   added, in UTF-8 bytes) beyond this: the oldest items are deleted the same way
    lifetime_s: float = 3_600.0  # then error session_expired and close 4008 (enforced by the shell)
    max_out_of_band: int = 4  # out-of-band responses (conversation "none") running at once, beside the
    #   conversation's one; another: conversation_already_has_active_response


@dataclass(slots=True)
class _OpenInput:
    """The transcription request of the audio buffer not yet committed."""

    item_id: str
    request_id: str
    announced: bool  # the client has seen item_id (speech_started)
    held: list[str] = field(default_factory=list)  # deltas not yet sendable
    failed: bool = False
    text: str = ""  # the transcript so far (semantic VAD reads it)


@dataclass(slots=True)
class _Response:
    """A running response. Its outputs, in ``output_index`` order, are at most one
    assistant message (``message``, with its one content ``part``) and the
    function calls the engine makes (``calls``, by the engine's call index). A
    response that may call tools opens its message on the first text or audio;
    one that cannot, at once (its first delta then needs no announcement)."""

    id: str
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
    outputs: list[Item] = field(default_factory=list)
    message: Item | None = None
    part: Part | None = None
    calls: dict[int, Item] = field(default_factory=dict)
    # The response.create's own tools, tool_choice, parallel_tool_calls (kept to re-issue it).
    overrides: dict[str, Any] = field(default_factory=dict)

    def index_of(self, item: Item) -> int:
        outputs = self.outputs
        if outputs and outputs[-1] is item:  # every delta of the item being written (the hot path)
            return len(outputs) - 1
        return next(i for i, out in enumerate(outputs) if out is item)


class SessionCore:
    """State and output helpers; see the module docstring."""

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
        rate_limits: Callable[[], dict[str, Any]] | None = None,  # the fields of rate_limits.updated
        created_at: float | None = None,
    ) -> None:
        self.id = session_id
        self.config = config
        self.engine = engine
        self.beta = beta
        self.limits = limits or SessionLimits()
        self.events: list[dict[str, Any]] = []  # server events not yet taken
        self.effects: list[Effect] = []
        self.seq = 0
        self.epoch = 0  # bumped on barge-in and on takeover by another replica
        self.dirty = True  # state changed since the last snapshot
        # Conversation items changed or deleted since the last snapshot: the store keeps one
        # record per item, so a snapshot writes these and not the whole conversation.
        self.changed_items: set[str] = set()
        self.dropped_items: set[str] = set()
        self.conversation = Conversation()
        self._item_bytes: dict[str, int] = {}  # each item's text as it was added (max_conversation_bytes)
        self._conversation_bytes = 0
        self.conversation_id = "conv_" + secrets.token_hex(8)
        self._clock = clock
        self._rate_limits = rate_limits
        self._vad_factory = vad_factory
        self._id_base = secrets.token_hex(6)
        self._id_counter = 0
        self.created_at = created_at if created_at is not None else time.time()
        self.expires_at = int(self.created_at + self.limits.lifetime_s)
        self._config_limits = ConfigLimits(voices=engine.voices, ignored_fields=engine.ignored_fields)
        self._warned: set[str] = set()  # ignored fields already reported (session.warning)
        # input audio state
        self.audio_ms = 0.0  # all audio ever appended: the clock of audio_start/end_ms
        self._buffer_ms = 0.0
        self._input: _OpenInput | None = None
        self._committed: dict[str, str] = {}  # transcription request id -> item id
        # (ms, engine-rate pcm) before speech: a few entries, a list is smaller than a deque
        self._prefix: list[tuple[float, bytes]] = []
        self._prefix_ms = 0.0
        self._response: _Response | None = None  # the conversation's (conversation "auto")
        self._oob: dict[str, _Response] = {}  # out-of-band responses (conversation "none"), by id
        self._turn_stopped_at: float | None = None
        # idle_timeout_ms: session audio time from which silence counts (when the last
        # answer's audio has played out); None: not armed.
        self._idle_from_ms: float | None = None
        self._logprobs: dict[str, list[dict[str, Any]]] = {}  # item id -> transcription logprobs so far
        self.audio_out_ms = 0.0  # output audio made on this replica (the host meters it per tenant)
        self._setup_input()

    # --- output helpers ---------------------------------------------------

    def _emit(self, type_: str, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        event = {"type": type_, "event_id": f"event_{self._id_base}{self.seq:x}", **fields}
        event["server_event_seq"] = self.seq
        self.events.append(event)
        if not type_.endswith(".delta") and type_ != "error":
            self.dirty = True  # every other event reflects a state change worth a snapshot
            self._note_items(type_, fields)
        return event

    def _note_items(self, type_: str, fields: dict[str, Any]) -> None:
        """The items an event says changed: every change of an item is announced by an
        event naming it (added, done, truncated, transcribed, deleted, a response's end)."""
        item = fields.get("item")
        item_id = fields.get("item_id") or (item.get("id") if isinstance(item, dict) else None)
        if not isinstance(item_id, str) or type_ in READ_ONLY_EVENTS:
            pass
        elif type_ == "conversation.item.deleted":
            self.changed_items.discard(item_id)
            self.dropped_items.add(item_id)
        else:
            self._changed(item_id)
        response = fields.get("response")
        if type_ == "response.done" and isinstance(response, dict):
            for output in response.get("output") or ():
                if isinstance(output, dict) and isinstance(output.get("id"), str):
                    self._changed(output["id"])

    def _changed(self, item_id: str) -> None:
        self.changed_items.add(item_id)
        item = self.conversation.get(item_id)
        if item is not None:
            item.forget()

    def _touch(self, item: Item) -> None:
        """An item changed with no event naming it: its record must be written again."""
        self._changed(item.id)
        item.forget()  # (it may not be in the conversation: an out-of-band answer's)
        self.dirty = True

    def take_item_changes(self) -> tuple[set[str], set[str]]:
        """(changed, dropped) item ids since the last call: the next snapshot's item records."""
        changed, dropped = self.changed_items, self.dropped_items
        self.changed_items, self.dropped_items = set(), set()
        return changed, dropped

    def _transcription_request(self, request_id: str) -> TranscriptionRequest:
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
        out, eff = self.events, self.effects
        self.events, self.effects = [], []
        return out, eff

    def _insert(self, item: Item, previous_item_id: str | None) -> str | None:
        prev = self.conversation.insert(item, previous_item_id)
        size = self._item_bytes[item.id] = item.text_bytes()
        self._conversation_bytes += size
        limits = self.limits
        while len(self.conversation) > limits.max_items or self._conversation_bytes > limits.max_conversation_bytes:
            oldest = self.conversation.oldest()
            assert oldest is not None
            if oldest is item or (self._response is not None and any(oldest is out for out in self._response.outputs)):
                break
            self._remove(oldest.id)
            self._emit("conversation.item.deleted", item_id=oldest.id)
        return prev

    def _remove(self, item_id: str) -> Item:
        """Out of the conversation (the caller announces it)."""
        self._conversation_bytes -= self._item_bytes.pop(item_id, 0)
        return self.conversation.remove(item_id)

    # --- implemented by the parts ------------------------------------------------

    def _setup_input(self) -> None:
        raise NotImplementedError

    def create_response(
        self, params: ce.ResponseParams, event_id: str | None, turn_started_at: float | None = None
    ) -> None:
        raise NotImplementedError

    def _end_response(self, status: str, details: dict[str, Any] | None, *, cancel: bool = False) -> None:
        raise NotImplementedError

    def _report_transcription_failure(self, item_id: str, code: str, message: str) -> None:
        raise NotImplementedError

    def _item_from_spec(self, spec: ce.ItemSpec, param: str) -> Item:
        raise NotImplementedError
