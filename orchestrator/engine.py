"""The one engine protocol every backend implements.

An engine knows nothing of sessions, sockets or JSON. It serves two kinds of
request, both shaped like vLLM's streaming input: the caller passes an async
iterator of input chunks; the first chunk starts the request, later chunks
extend it, and the iterator *ending* is the final marker. Outputs come back
as an async iterator of deltas that ends with exactly one ``Finished``.

- ``transcribe``: speech in (PCM16 mono at ``info.input_sample_rate``),
  transcript deltas out, then ``Finished(text=<final transcript>)``.
- ``respond``: a conversation in (``ResponseRequest.messages``) plus optional
  streamed input, text and/or audio deltas out (PCM16 mono at
  ``info.output_sample_rate``), then ``Finished``.

Cancellation is first class: the orchestrator cancels the task that iterates
the outputs and then calls ``abort(request_id)``; an engine must release
everything it holds for that request in either case. An engine raises
``EngineError`` (with a stable ``code``) for failures a client should see.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

# --- inputs -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AudioChunk:
    """PCM16 little-endian mono at the engine's ``input_sample_rate``."""

    pcm: bytes


@dataclass(frozen=True, slots=True)
class TextChunk:
    text: str


EngineInput = AudioChunk | TextChunk


@dataclass(frozen=True, slots=True)
class Message:
    """One conversation turn as the engine sees it (audio already transcribed)."""

    role: Literal["system", "user", "assistant"]
    text: str


@dataclass(frozen=True, slots=True)
class ResponseRequest:
    request_id: str
    messages: tuple[Message, ...]
    instructions: str = ""
    modalities: tuple[Literal["text", "audio"], ...] = ("audio",)
    voice: str | None = None  # one of EngineInfo.voices; None: the engine's default
    max_output_tokens: int | None = None  # None: no limit beyond the engine's own
    temperature: float | None = None
    speed: float = 1.0


@dataclass(frozen=True, slots=True)
class TranscriptionRequest:
    request_id: str
    model: str | None = None  # one of EngineInfo.transcription_models
    language: str | None = None
    prompt: str | None = None


# --- outputs ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Text appended to the output. For an audio response this is the transcript
    of the audio; for a transcription request, the words recognised so far."""

    text: str


@dataclass(frozen=True, slots=True)
class AudioDelta:
    """PCM16 little-endian mono at the engine's ``output_sample_rate``."""

    pcm: bytes


@dataclass(frozen=True, slots=True)
class Usage:
    input_text_tokens: int = 0
    input_audio_tokens: int = 0
    output_text_tokens: int = 0
    output_audio_tokens: int = 0

    @property
    def input_tokens(self) -> int:
        return self.input_text_tokens + self.input_audio_tokens

    @property
    def output_tokens(self) -> int:
        return self.output_text_tokens + self.output_audio_tokens


@dataclass(frozen=True, slots=True)
class Finished:
    """The last output of every request.

    ``reason``: ``stop`` (done), ``length`` (``max_output_tokens`` reached).
    ``text``: for a transcription, the final transcript (which may revise
    partial deltas); for a response, the whole text output.
    """

    reason: Literal["stop", "length"] = "stop"
    text: str = ""
    usage: Usage = field(default_factory=Usage)


EngineOutput = TextDelta | AudioDelta | Finished


class EngineError(Exception):
    """A failure with a stable machine-readable code, safe to show a client."""

    def __init__(self, code: str, message: str, *, fatal: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.fatal = fatal  # True: the engine is dead; readiness turns red


# --- the protocol -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EngineInfo:
    name: str
    description: str  # what it really computes, shown in /v1/models
    input_sample_rate: int = 16000
    output_sample_rate: int = 24000
    voices: tuple[str, ...] = ()
    default_voice: str | None = None
    transcription_models: tuple[str, ...] = ()
    modalities: tuple[Literal["text", "audio"], ...] = ("text", "audio")
    # Session fields the engine ignores; the session reports them, never fails.
    ignored_fields: tuple[str, ...] = ()


@runtime_checkable
class Engine(Protocol):
    info: EngineInfo

    async def start(self) -> None:
        """Load models; called once before the first request."""

    async def close(self) -> None:
        """Release everything; no request is running any more."""

    def healthy(self) -> bool:
        """False once the engine cannot serve (readiness reports it)."""

    def transcribe(
        self, request: TranscriptionRequest, inputs: AsyncIterator[AudioChunk]
    ) -> AsyncIterator[EngineOutput]: ...

    def respond(self, request: ResponseRequest, inputs: AsyncIterator[EngineInput]) -> AsyncIterator[EngineOutput]: ...

    async def abort(self, request_id: str) -> None:
        """Stop a request and free its resources; a no-op for unknown ids."""
