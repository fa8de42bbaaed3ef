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
  ``info.output_sample_rate``), and function calls (``ToolCallDelta``) when the
  request offers ``tools``, then ``Finished``.

Function calling: ``ResponseRequest.tools`` are the functions the model may
call and ``tool_choice`` says whether it must (``required``: at least one
call; ``function``: that one; ``none``: never; ``auto``: the model decides).
An engine that cannot call functions answers ``auto`` with text and fails
``required``/``function`` with ``EngineError("tools_unsupported")``. A call
streams as ``ToolCallDelta``s of one ``index``: the first carries its
``call_id`` and ``name``, each carries more of its JSON ``arguments``. The
conversation carries calls back as an assistant ``Message`` with
``tool_calls`` and their results as ``Message(role="tool", tool_call_id=...)``.

Turns the engine takes itself (``converse``, optional, with ``info.takes_turns``): a model
that listens and decides when to speak (a full-duplex omni model behind an upstream
that runs its own speech detection) is given the caller's audio for a whole session,
as it comes, and says what it decides as ``TurnOutput``s: the caller began or stopped
speaking (``SpeechStarted``, ``SpeechStopped``; a speech start over an answer is the
engine's barge-in: it stops that answer), what it heard (``Heard``), and each answer
it starts by itself (``AnswerStarted``, then that answer's ``TextDelta``/``AudioDelta``
outputs, ending with its ``Finished``). The outputs end when the inputs do (the session
is over); an ``EngineError`` ends the conversation (the session may start another). A
``TextChunk`` among its inputs is context appended to the conversation (a system message
the engine's later answers follow).

Cancellation is first class: the orchestrator cancels the task that iterates
the outputs and then calls ``abort(request_id)``; an engine must release
everything it holds for that request in either case. An engine raises
``EngineError`` (with a stable ``code``) for failures a client should see.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

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
class ToolCall:
    """A function call the assistant made: ``arguments`` is JSON text."""

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Image:
    """An image a user sent (an ``input_image`` part): the encoded file, checked to be
    the format ``mime`` names. ``detail``: the client's ``low``/``high``/``auto`` (an
    engine may use it to pick a resolution)."""

    mime: Literal["image/png", "image/jpeg"]
    data: bytes
    detail: Literal["auto", "low", "high"] = "auto"

    def data_url(self) -> str:
        """As the Realtime API's ``image_url`` carries it."""
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}"


@dataclass(frozen=True, slots=True)
class Message:
    """One conversation turn as the engine sees it (audio already transcribed).

    An assistant turn may carry the function calls it made (``tool_calls``);
    a ``tool`` turn is the output of the call ``tool_call_id``. A user turn may
    carry images (only to an engine whose ``info.accepts_images``); ``text`` is then
    the turn's text around them."""

    role: Literal["system", "user", "assistant", "tool"]
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    images: tuple[Image, ...] = ()


@dataclass(frozen=True, slots=True)
class FunctionTool:
    """A function the model may call; ``parameters`` is its JSON schema (an object)."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """``auto``: the model decides; ``none``: no call; ``required``: at least one
    call; ``function``: a call of the function ``name``."""

    mode: Literal["auto", "none", "required", "function"] = "auto"
    name: str | None = None


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
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    parallel_tool_calls: bool = True  # False: at most one call per response
    # Text this answer must communicate to the user (a result delegated work returned). The
    # instructions ask a model that follows them to say it in its own words; an engine whose
    # model follows no instructions (``ignored_fields`` has "instructions") says it as it is.
    say: str | None = None

    @property
    def calls_tools(self) -> bool:
        """Whether this response may call a function."""
        return bool(self.tools) and self.tool_choice.mode != "none"


@dataclass(frozen=True, slots=True)
class TranscriptionRequest:
    request_id: str
    model: str | None = None  # the name the client gave (a route may map it); None: the engine's own
    language: str | None = None
    prompt: str | None = None
    keywords: tuple[str, ...] = ()  # words to expect (a bias the engine may apply)
    languages: tuple[str, ...] = ()  # languages the speech may be in
    logprobs: bool = False  # the client asked for them: TextDelta.logprobs where the engine has them


# --- outputs ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token: str
    logprob: float  # natural log
    bytes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Text appended to the output. For an audio response this is the transcript
    of the audio; for a transcription request, the words recognised so far
    (with their log probabilities where the engine has them and was asked)."""

    text: str
    logprobs: tuple[TokenLogprob, ...] | None = None


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """Part of function call ``index`` of this response (see the module docstring)."""

    index: int
    arguments: str = ""
    call_id: str | None = None  # on the first delta of a call
    name: str | None = None  # on the first delta of a call


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
    input_image_tokens: int = 0  # what a multimodal model's images became in its prompt

    @property
    def input_tokens(self) -> int:
        return self.input_text_tokens + self.input_audio_tokens + self.input_image_tokens

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


EngineOutput = TextDelta | AudioDelta | ToolCallDelta | Finished


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    """The engine heard the caller begin to speak (``converse``): an answer of the engine's
    that was under way stops (its barge-in); ``audio_ms``: where, in the conversation's
    input audio (None: not said)."""

    audio_ms: float | None = None


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    """The caller stopped speaking (``converse``); ``audio_ms`` as ``SpeechStarted``'s."""

    audio_ms: float | None = None


@dataclass(frozen=True, slots=True)
class Heard:
    """What the engine heard the caller say (``converse``): more of the turn's transcript
    (``final``: the turn's whole transcript, which may revise the pieces before it)."""

    text: str
    final: bool = False


@dataclass(frozen=True, slots=True)
class AnswerStarted:
    """The engine began an answer by itself (``converse``): the text and audio deltas that
    follow are this answer's, up to its ``Finished``."""


TurnOutput = EngineOutput | SpeechStarted | SpeechStopped | Heard | AnswerStarted


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
    # Session fields the engine ignores (keys of gateway.protocol.session_config.WARN_PATHS,
    # e.g. "temperature", "tools", "transcription.keywords"); the session reports them, never fails.
    ignored_fields: tuple[str, ...] = ()
    # The context the engine's model holds, in tokens (None: unknown). The session's
    # ``truncation`` keeps a response's conversation within it.
    max_context_tokens: int | None = None
    # Whether a transcription's Finished.text may revise its TextDeltas (a decoder's
    # partial hypotheses, as pocketsphinx's). The session then sends the client one
    # delta, the final transcript, so the deltas always add up to ``.completed``.
    revises_transcripts: bool = False
    # Whether user turns may carry images (Message.images). Otherwise the session refuses
    # an input_image part with a coded error naming it; the engine never sees one.
    accepts_images: bool = False
    # Whether the engine's model takes its own turns (``Engine.converse``): a session then
    # streams it the caller's audio for the whole session and runs no speech detector of
    # its own for turns; the engine's turn events become the dialect's.
    takes_turns: bool = False


@dataclass(frozen=True, slots=True)
class ConversationRequest:
    """A conversation the engine takes its turns in (``converse``): its context so far,
    and the settings of the answers it will make (as ``ResponseRequest``'s)."""

    request_id: str
    messages: tuple[Message, ...] = ()
    instructions: str = ""
    modalities: tuple[Literal["text", "audio"], ...] = ("audio",)
    voice: str | None = None
    temperature: float | None = None
    speed: float = 1.0


class Transcriber(Protocol):
    """A transcription stepped in place, for an engine whose work per chunk is quick and
    runs on the loop's thread (``Engine.transcriber``, optional): each fed chunk is
    answered by a plain call, with no task step and no async-generator hop per chunk.
    ``close`` is called once in every case (finished, failed, cancelled)."""

    def feed(self, chunk: AudioChunk) -> Sequence[EngineOutput]: ...

    def finish(self) -> Sequence[EngineOutput]:
        """The outputs of the final marker: they end with the one ``Finished``."""
        ...

    def close(self) -> None: ...


class Responder(Protocol):
    """A response the engine pushes, for an engine on the loop's thread that makes the
    outputs of many requests at once (``Engine.responder``, optional): it calls the
    ``emit`` it was given with each output as it comes, from a callback of its own (never
    from within ``feed`` or ``end``), ending with the one ``Finished``, or ``fail`` with an
    exception; no task step and no async-generator hop per output. ``feed`` and ``end``
    are the streamed input and its final marker; ``close`` is called once in every case
    (finished, failed, cancelled), and nothing may be emitted after it."""

    def feed(self, chunk: EngineInput) -> None: ...

    def end(self) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class Engine(Protocol):
    """Besides these, an engine may offer ``transcriber(request) -> Transcriber | None``:
    the orchestrator then steps a transcription in place instead of iterating
    ``transcribe`` (None: this request goes through ``transcribe``); and
    ``responder(request, emit, fail) -> Responder | None``: the engine pushes a
    response's outputs instead of the orchestrator iterating ``respond`` (None: this
    request goes through ``respond``); and, where ``info.takes_turns``,
    ``converse(request: ConversationRequest, inputs: AsyncIterator[EngineInput]) ->
    AsyncIterator[TurnOutput]`` (see the module docstring)."""

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
