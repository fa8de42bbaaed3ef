"""A model-free engine for benchmarks and protocol tests.

It computes nothing a person would call an answer, and says so:

- ``transcribe`` answers every input audio chunk at once with one text delta,
  ``"<n> "`` where n counts the chunks of the request, so a load generator can
  match each delta to the chunk that caused it and measure the gateway's added
  latency. ``Finished.text`` is all the deltas joined.
- ``respond`` streams ``audio_chunks`` chunks of ``chunk_ms`` ms of a quiet
  440 Hz tone, paced in real time (``chunk_ms`` apart), each preceded every
  ``words_every`` chunks by a transcript word, then finishes. It calls no
  function: ``tool_choice`` ``auto`` is answered as always, ``required`` or a
  named function fails with ``tools_unsupported``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np

from orchestrator.engine import (
    AudioChunk,
    AudioDelta,
    EngineError,
    EngineInfo,
    EngineInput,
    EngineOutput,
    Finished,
    ResponseRequest,
    TextChunk,
    TextDelta,
    TranscriptionRequest,
    Usage,
)

RATE = 24000


class PassthroughEngine:
    def __init__(self, *, audio_chunks: int = 50, chunk_ms: int = 20, paced: bool = True, words_every: int = 1) -> None:
        if words_every < 1:
            raise ValueError("words_every must be >= 1 (a transcript word every that many audio chunks)")
        self.info = EngineInfo(
            name="passthrough",
            description="No model: numbers each input chunk as a transcript delta and streams a paced tone "
            "as the answer. For benchmarks and protocol tests.",
            input_sample_rate=RATE,
            output_sample_rate=RATE,
            voices=("tone",),
            default_voice="tone",
            transcription_models=("passthrough",),
            ignored_fields=(
                "instructions",  # no model: nothing follows them
                "temperature",
                "tools",
                "tool_choice",
                "parallel_tool_calls",
                "speed",
                "include",
                "transcription.language",
                "transcription.prompt",
                "transcription.keywords",
            ),
        )
        self.audio_chunks = audio_chunks
        self.chunk_ms = chunk_ms
        self.paced = paced
        self.words_every = words_every
        n = RATE * chunk_ms // 1000
        tone = 0.05 * np.sin(2 * np.pi * 440 * np.arange(n) / RATE)
        self._chunk = (tone * 32767).astype("<i2").tobytes()
        self.active: set[str] = set()  # request ids the engine is serving (tests check for leaks)
        self.aborted: list[str] = []

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def healthy(self) -> bool:
        return True

    async def transcribe(
        self, request: TranscriptionRequest, inputs: AsyncIterator[AudioChunk]
    ) -> AsyncIterator[EngineOutput]:
        self.active.add(request.request_id)
        try:
            n = 0
            samples = 0
            async for chunk in inputs:
                n += 1
                samples += len(chunk.pcm) // 2
                yield TextDelta(f" {n}" if n > 1 else "1")  # the deltas add up to the final transcript
            text = " ".join(str(i) for i in range(1, n + 1))
            yield Finished(text=text, usage=Usage(input_audio_tokens=samples * 10 // RATE))
        finally:
            self.active.discard(request.request_id)

    def transcriber(self, request: TranscriptionRequest) -> _Numbering:
        """``transcribe``, stepped in place (the orchestrator's fast path: a chunk's delta
        costs a call, not a task step through three async generators)."""
        return _Numbering(self, request.request_id)

    async def respond(
        self, request: ResponseRequest, inputs: AsyncIterator[EngineInput]
    ) -> AsyncIterator[EngineOutput]:
        if request.calls_tools and request.tool_choice.mode in ("required", "function"):
            raise EngineError("tools_unsupported", "the passthrough engine calls no function (it has no model)")
        self.active.add(request.request_id)
        try:
            heard = " ".join(m.text for m in request.messages if m.role == "user")
            async for chunk in inputs:  # the streamed transcript, if any
                if isinstance(chunk, TextChunk):
                    heard = f"{heard} {chunk.text}".strip()
            limit = request.max_output_tokens
            words = 0
            audio = "audio" in request.modalities
            loop = asyncio.get_running_loop()
            start = loop.time()
            for i in range(self.audio_chunks):
                if limit is not None and words >= limit:
                    yield Finished("length", usage=Usage(output_text_tokens=words))
                    return
                if i % self.words_every == 0:
                    yield TextDelta(f"w{i} ")
                    words += 1
                if audio:
                    yield AudioDelta(self._chunk)
                if self.paced:
                    delay = start + (i + 1) * self.chunk_ms / 1000 - loop.time()
                    await asyncio.sleep(max(0.0, delay))
            yield Finished(
                text=heard,
                usage=Usage(input_text_tokens=len(heard.split()), output_text_tokens=words,
                            output_audio_tokens=self.audio_chunks if audio else 0),
            )  # fmt: skip
        finally:
            self.active.discard(request.request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


class _Numbering:
    """One passthrough transcription, stepped: the same deltas and final text as ``transcribe``."""

    def __init__(self, engine: PassthroughEngine, request_id: str) -> None:
        self._engine, self._request_id = engine, request_id
        self._n = 0
        self._samples = 0
        engine.active.add(request_id)

    def feed(self, chunk: AudioChunk) -> tuple[EngineOutput, ...]:
        self._n += 1
        self._samples += len(chunk.pcm) // 2
        return (TextDelta(f" {self._n}" if self._n > 1 else "1"),)

    def finish(self) -> tuple[EngineOutput, ...]:
        text = " ".join(str(i) for i in range(1, self._n + 1))
        return (Finished(text=text, usage=Usage(input_audio_tokens=self._samples * 10 // RATE)),)

    def close(self) -> None:
        self._engine.active.discard(self._request_id)
