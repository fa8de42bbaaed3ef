"""A model-free engine for benchmarks and protocol tests.

It computes nothing a person would call an answer, and says so:

- ``transcribe`` answers every input audio chunk at once with one text delta,
  ``"<n> "`` where n counts the chunks of the request, so a load generator can
  match each delta to the chunk that caused it and measure the gateway's added
  latency. ``Finished.text`` is all the deltas joined.
- ``respond`` streams ``audio_chunks`` chunks of ``chunk_ms`` ms of a quiet
  440 Hz tone, paced in real time (``chunk_ms`` apart), each preceded every
  ``words_every`` chunks by a transcript word (``w<i>``, or the next word of
  the request's ``say`` while it lasts), then finishes. It calls no
  function: ``tool_choice`` ``auto`` is answered as always, ``required`` or a
  named function fails with ``tools_unsupported``.

Both are offered stepped as well, the way the orchestrator runs them: a
transcription answers each fed chunk with a call (``transcriber``), and answers
are pushed (``responder``): one ``_Pacer`` per event loop steps every paced
answer from one timer, as a model server steps a batch of requests at once,
instead of a task and a sleep per chunk per answer.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import weakref
from collections.abc import AsyncIterator, Callable

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
# Paced answers due within this of each other are stepped in one timer of the pacer:
# a chunk may go out up to this early (never late on its account), and the pace does
# not drift (chunk i is due at start + i * chunk_ms whatever came before).
PACER_GRAIN_S = 0.002


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
        self._pacers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pacer] = weakref.WeakKeyDictionary()

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

    def transcriber(self, request: TranscriptionRequest) -> _Numbering | None:
        """``transcribe``, stepped in place (the orchestrator's fast path: a chunk's delta
        costs a call, not a task step through three async generators). None (so iterated)
        for a subclass that transcribes its own way (overrides ``transcribe``)."""
        if type(self).transcribe is not PassthroughEngine.transcribe:
            return None
        return _Numbering(self, request.request_id)

    async def respond(
        self, request: ResponseRequest, inputs: AsyncIterator[EngineInput]
    ) -> AsyncIterator[EngineOutput]:
        script = _Script(self, request)
        try:
            async for chunk in inputs:  # the streamed transcript, if any
                script.hear(chunk)
            loop = asyncio.get_running_loop()
            start = loop.time()
            while True:
                for output in script.step():
                    yield output
                if script.done:
                    return
                if self.paced:
                    await asyncio.sleep(max(0.0, start + script.due_s - loop.time()))
        finally:
            script.close()

    def responder(
        self,
        request: ResponseRequest,
        emit: Callable[[EngineOutput], None],
        fail: Callable[[BaseException], None],
    ) -> _Answer | None:
        """``respond``, pushed: the same outputs at the same pace, stepped by the loop's
        pacer (the orchestrator's fast path: no task step or sleep per chunk). None (so
        iterated) for a subclass that answers its own way (overrides ``respond``)."""
        if type(self).respond is not PassthroughEngine.respond:
            return None
        return _Answer(_Script(self, request), self.pacer() if self.paced else None, emit, fail)

    def pacer(self) -> _Pacer:
        """The pacer of the running loop's answers."""
        loop = asyncio.get_running_loop()
        pacer = self._pacers.get(loop)
        if pacer is None:
            pacer = self._pacers[loop] = _Pacer()
        return pacer

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


class _Script:
    """What one passthrough answer says, step by step (``respond`` and ``responder`` share
    it): step i says a word (every ``words_every``) and a chunk of tone, the last step
    says ``Finished``; step i is due ``i * chunk_ms`` after the answer starts."""

    def __init__(self, engine: PassthroughEngine, request: ResponseRequest) -> None:
        if request.calls_tools and request.tool_choice.mode in ("required", "function"):
            raise EngineError("tools_unsupported", "the passthrough engine calls no function (it has no model)")
        self._engine = engine
        self._request_id = request.request_id
        self.heard = " ".join(m.text for m in request.messages if m.role == "user")
        self._limit = request.max_output_tokens
        self._audio = "audio" in request.modalities
        self._say = request.say.split() if request.say else []
        self._i = 0
        self._words = 0
        self.done = False
        engine.active.add(request.request_id)

    def hear(self, chunk: EngineInput) -> None:
        if isinstance(chunk, TextChunk):
            self.heard = f"{self.heard} {chunk.text}".strip()

    @property
    def due_s(self) -> float:
        """When the next step is due, from the answer's start."""
        return self._i * self._engine.chunk_ms / 1000

    def step(self) -> list[EngineOutput]:
        engine, i = self._engine, self._i
        self._i += 1
        if i == engine.audio_chunks:
            self.done = True
            return [Finished(text=self.heard, usage=Usage(
                input_text_tokens=len(self.heard.split()), output_text_tokens=self._words,
                output_audio_tokens=engine.audio_chunks if self._audio else 0,
            ))]  # fmt: skip
        if self._limit is not None and self._words >= self._limit:
            self.done = True
            return [Finished("length", usage=Usage(output_text_tokens=self._words))]
        outputs: list[EngineOutput] = []
        if i % engine.words_every == 0:
            outputs.append(TextDelta(f"{self._say[self._words]} " if self._words < len(self._say) else f"w{i} "))
            self._words += 1
        if self._audio:
            outputs.append(AudioDelta(engine._chunk))
        return outputs

    def close(self) -> None:
        self._engine.active.discard(self._request_id)


class _Answer:
    """One pushed passthrough answer (``orchestrator.engine.Responder``): it hears the
    streamed input, starts at the final marker, and is stepped by the pacer (unpaced: all
    at once, on the next loop turn)."""

    def __init__(self, script: _Script, pacer: _Pacer | None,
                 emit: Callable[[EngineOutput], None], fail: Callable[[BaseException], None]) -> None:  # fmt: skip
        self._script, self._pacer, self._emit, self._fail = script, pacer, emit, fail
        self._start = 0.0
        self.closed = False

    def feed(self, chunk: EngineInput) -> None:
        self._script.hear(chunk)

    def end(self) -> None:
        loop = asyncio.get_running_loop()
        self._start = loop.time()
        if self._pacer is None:
            loop.call_soon(self._run_through)
        else:
            self._pacer.add(self, self._start)  # (its first step on the pacer's next timer)

    def step(self) -> float | None:
        """Say the next step; the loop time the one after it is due (None: no more)."""
        script = self._script
        if self.closed:
            return None
        try:
            for output in script.step():
                self._emit(output)
        except Exception as exc:  # a bug fails this answer, not the pacer's others
            self._fail(exc)
            return None
        return None if script.done else self._start + script.due_s

    def _run_through(self) -> None:
        while self.step() is not None:
            pass

    def close(self) -> None:
        self.closed = True  # (the pacer drops it at its next step)
        self._script.close()


class _Pacer:
    """Steps every paced passthrough answer of one event loop from one timer, armed at
    the earliest due answer: each firing steps every answer due by then (within
    ``PACER_GRAIN_S``), each at most once, so an answer that fell behind catches up one
    chunk per firing rather than in a burst."""

    def __init__(self) -> None:
        # (No reference to its loop: the engine keeps a pacer per loop in a weak mapping.)
        self._due: list[tuple[float, int, _Answer]] = []  # a heap of (due, tie-break, answer)
        self._n = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self.firings = 0  # timers fired (each steps every answer then due)
        self.steps = 0  # answer steps made

    @property
    def waiting(self) -> int:
        """Answers in the schedule (a closed one leaves at its next due step)."""
        return len(self._due)

    def add(self, answer: _Answer, at: float) -> None:
        self._n += 1
        heapq.heappush(self._due, (at, self._n, answer))
        if at < self._timer_at:
            self._arm(at)

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = asyncio.get_running_loop().call_at(at, self._fire)

    def _fire(self) -> None:
        self._timer, self._timer_at = None, math.inf
        self.firings += 1
        due = self._due
        horizon = asyncio.get_running_loop().time() + PACER_GRAIN_S
        again: list[tuple[float, _Answer]] = []
        while due and due[0][0] <= horizon:
            answer = heapq.heappop(due)[2]
            self.steps += 1
            at = answer.step()
            if at is not None:
                again.append((at, answer))
        for at, answer in again:
            self._n += 1
            heapq.heappush(due, (at, self._n, answer))
        if due:
            self._arm(due[0][0])
