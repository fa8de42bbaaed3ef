"""``CascadeEngine``: the embedded CPU voice pipeline behind the Engine protocol.

transcribe: PCM16 16 kHz -> pocketsphinx (pooled decoders, worker threads).
respond:    conversation -> a ``Thinker`` (``EchoThinker`` by default) ->
            sentences -> eSpeak NG, each sentence's text then its audio,
            streamed as synthesised.

Token accounting is approximate and documented: a word is one text token,
100 ms of audio is one audio token.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast

from orchestrator.engine import (
    AudioChunk,
    AudioDelta,
    EngineError,
    EngineInfo,
    EngineInput,
    EngineOutput,
    Finished,
    Message,
    ResponseRequest,
    TextChunk,
    TextDelta,
    ToolCallDelta,
    TranscriptionRequest,
    Usage,
)
from orchestrator.engines.cascade.control import ABORTED, END, RequestControl, consume
from orchestrator.engines.cascade.segment import (
    Rechunker,
    SentenceSplitter,
    WordBudget,
    join_words,
    new_stable_words,
)
from orchestrator.engines.cascade.stt import SAMPLE_RATE, PocketsphinxRecognizer, Utterance
from orchestrator.engines.cascade.thinker import EchoThinker, Thinker, ToolThinker
from orchestrator.engines.cascade.tts import DEFAULT_VOICE, EspeakSynthesizer, TtsError
from orchestrator.engines.streams import failing

T = TypeVar("T")
AUDIO_TOKENS_PER_SECOND = 10

IGNORED_FIELDS = (
    "temperature",
    "noise_reduction",
    "include",  # pocketsphinx gives no token log probabilities
    "transcription.language",  # the bundled model is en-us only
    "transcription.languages",
    "transcription.prompt",
    "transcription.keywords",
)
TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls")  # ignored unless the thinker calls tools


def _words(text: str) -> int:
    return len(text.split())


class CascadeEngine:
    """Embedded CPU voice cascade: pocketsphinx STT, a pluggable thinker, eSpeak NG TTS.

    ``thinker``: turns the conversation into text (default ``EchoThinker``,
    which only repeats what it heard). ``stt_pool_size``: pocketsphinx
    decoders, hence concurrent transcriptions (15-40 MB each); a transcription
    beyond it waits for a free decoder (abort or cancellation ends the
    wait). ``warm_decoders``: decoders built by ``start`` (0.4 s each) so the
    first transcription does not pay for it. ``audio_chunk_ms``: duration of
    each ``AudioDelta`` (the last piece of a sentence may be shorter).
    """

    def __init__(
        self,
        thinker: Thinker | None = None,
        *,
        stt_pool_size: int = 4,
        warm_decoders: int = 1,
        audio_chunk_ms: int = 40,
    ) -> None:
        self._thinker: Thinker = thinker if thinker is not None else EchoThinker()
        self._calls_tools = bool(getattr(self._thinker, "calls_tools", False))
        self._stt = PocketsphinxRecognizer(stt_pool_size)
        self._warm = min(warm_decoders, stt_pool_size)
        self._tts = EspeakSynthesizer()
        self._tts.start()  # ~2 ms; gives the true output rate for ``info``
        rate = self._tts.sample_rate
        self._chunk_bytes = max(1, rate * audio_chunk_ms // 1000) * 2
        thinker_desc = getattr(self._thinker, "description", type(self._thinker).__name__)
        self.info = EngineInfo(
            name="cascade",
            description=(
                "Embedded CPU voice cascade: CMU pocketsphinx speech-to-text (en-us), "
                f"thinker: {thinker_desc}, eSpeak NG formant text-to-speech."
            ),
            input_sample_rate=SAMPLE_RATE,
            output_sample_rate=rate,
            voices=self._tts.voices(),
            default_voice=DEFAULT_VOICE,
            transcription_models=("pocketsphinx",),
            revises_transcripts=True,  # the final decode may differ from the partial hypotheses
            modalities=("text", "audio"),
            ignored_fields=IGNORED_FIELDS
            + (() if self._calls_tools else TOOL_FIELDS)
            + (() if getattr(self._thinker, "follows_instructions", True) else ("instructions",)),
        )
        # At most one worker per decoder: each utterance runs one call at a time.
        self._stt_executor: ThreadPoolExecutor | None = None
        self._stt_slots = asyncio.Semaphore(stt_pool_size)
        self._requests: dict[str, RequestControl] = {}
        self._started = False
        self._closed = False
        self._failed = False

    # --- lifecycle ----------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        start = getattr(self._thinker, "start", None)
        if start is not None:  # e.g. VllmThinker loads its model now, not on the first answer
            await start()
        self._stt_executor = ThreadPoolExecutor(max_workers=self._stt.pool_size, thread_name_prefix="pocketsphinx")
        try:
            await asyncio.get_running_loop().run_in_executor(self._stt_executor, self._stt.warm, self._warm)
        except Exception as exc:
            self._failed = True
            raise EngineError("stt_unavailable", f"pocketsphinx failed: {exc}", fatal=True) from exc
        self._started = True

    async def close(self) -> None:
        self._closed = True
        for req in list(self._requests.values()):
            req.abort()
        close = getattr(self._thinker, "close", None)
        if close is not None:
            await close()
        self._stt.close()
        if self._stt_executor is not None:
            self._stt_executor.shutdown(wait=False, cancel_futures=True)

    def healthy(self) -> bool:
        thinker_ok = getattr(self._thinker, "healthy", lambda: True)()
        return self._started and not self._closed and not self._failed and thinker_ok

    async def abort(self, request_id: str) -> None:
        # Popped here too, so a request whose outputs were never iterated does
        # not stay registered; a running one still holds its control and stops.
        req = self._requests.pop(request_id, None)
        if req is not None:
            req.abort()

    def _register(self, request_id: str) -> RequestControl:
        if not self._started or self._closed:
            raise EngineError("engine_not_ready", "the cascade engine is not running")
        if request_id in self._requests:
            raise EngineError("duplicate_request", f"request {request_id!r} is already running")
        req = RequestControl(request_id)
        self._requests[request_id] = req
        return req

    def _unregister(self, req: RequestControl) -> None:
        req.release()
        if self._requests.get(req.request_id) is req:
            del self._requests[req.request_id]

    # --- transcription ------------------------------------------------------

    def transcribe(
        self, request: TranscriptionRequest, inputs: AsyncIterator[AudioChunk]
    ) -> AsyncIterator[EngineOutput]:
        # Registered now, not at first iteration, so an early abort is not lost.
        # Errors are raised where the outputs are consumed.
        try:
            req = self._register(request.request_id)
        except EngineError as exc:
            return failing(exc)
        return self._transcribe(req, inputs)

    async def _transcribe(self, req: RequestControl, inputs: AsyncIterator[AudioChunk]) -> AsyncIterator[EngineOutput]:
        utt: Utterance | None = None
        try:
            utt = await self._open_utterance(req)
            emitted: list[str] = []
            while utt is not None:
                chunk = await req.pull(inputs)
                if chunk is END or chunk is ABORTED:
                    break
                if not isinstance(chunk, AudioChunk) or not chunk.pcm:
                    continue
                partial = await self._in_thread(req, utt.feed, chunk.pcm)
                if partial is ABORTED:
                    break
                assert isinstance(partial, str)
                words = new_stable_words(emitted, partial)
                if words:
                    yield TextDelta(join_words(len(emitted), words))
                    emitted += words
            final = ""
            seconds = 0.0
            if utt is not None:
                seconds = utt.audio_seconds
                if req.aborted.is_set():
                    final = utt.partial()
                else:
                    result = await self._in_thread(req, utt.finish)
                    final = result if isinstance(result, str) else utt.partial()
                self._close_utterance(utt)  # free the decoder before the last yield
                utt = None
            self._unregister(req)
            rest = new_stable_words(emitted, final, final=True)
            if rest:
                yield TextDelta(join_words(len(emitted), rest))
            yield Finished(
                text=final,
                usage=Usage(
                    input_audio_tokens=round(seconds * AUDIO_TOKENS_PER_SECOND),
                    output_text_tokens=_words(final),
                ),
            )
        finally:
            if utt is not None:
                self._close_utterance(utt)
            self._unregister(req)

    async def _in_thread(self, req: RequestControl, fn: Callable[..., T], *args: Any) -> T | object:
        """Run a blocking decoder call on the STT executor; ``ABORTED`` if aborted first."""
        assert self._stt_executor is not None
        fut = asyncio.get_running_loop().run_in_executor(self._stt_executor, fn, *args)
        if not await req.until_abort(fut):
            fut.add_done_callback(consume)
            return ABORTED
        return fut.result()

    async def _open_utterance(self, req: RequestControl) -> Utterance | None:
        """A started utterance holding a pool slot, or None if aborted while waiting.

        Whatever way this exits, a slot or decoder obtained but not returned
        is given back when its pending operation lands."""
        acquire = asyncio.ensure_future(self._stt_slots.acquire())
        try:
            got = await req.until_abort(acquire)
        except BaseException:
            self._drop_acquire(acquire)
            raise
        if not got:
            self._drop_acquire(acquire)
            return None
        assert self._stt_executor is not None
        opening = asyncio.get_running_loop().run_in_executor(self._stt_executor, self._stt.open)
        try:
            done = await req.until_abort(opening)
        except BaseException:
            opening.add_done_callback(self._drop_opening)
            raise
        if not done:
            opening.add_done_callback(self._drop_opening)
            return None
        try:
            return opening.result()
        except Exception as exc:
            self._stt_slots.release()
            raise EngineError("stt_failed", f"pocketsphinx failed: {exc}") from exc

    def _drop_acquire(self, acquire: asyncio.Future[Any]) -> None:
        def done(f: asyncio.Future[Any]) -> None:
            if not f.cancelled() and f.exception() is None:
                self._stt_slots.release()

        acquire.cancel()  # may be too late: the callback then gives the slot back
        acquire.add_done_callback(done)

    def _drop_opening(self, opening: asyncio.Future[Utterance]) -> None:
        if opening.cancelled() or opening.exception() is not None:
            self._stt_slots.release()
        else:
            self._close_utterance(opening.result())

    def _close_utterance(self, utt: Utterance) -> None:
        """Give the decoder back (off the loop) and then the pool slot; never blocks."""
        if utt.closed:
            self._stt_slots.release()
            return
        try:
            assert self._stt_executor is not None
            fut = asyncio.get_running_loop().run_in_executor(self._stt_executor, utt.close)
        except RuntimeError:  # executor shut down (engine closing): close inline
            utt.close()
            self._stt_slots.release()
            return
        fut.add_done_callback(lambda _: self._stt_slots.release())

    # --- responses ----------------------------------------------------------

    def respond(self, request: ResponseRequest, inputs: AsyncIterator[EngineInput]) -> AsyncIterator[EngineOutput]:
        voice = request.voice or DEFAULT_VOICE
        if voice not in self.info.voices:
            msg = f"unknown voice {voice!r}; one of {', '.join(self.info.voices)}"
            return failing(EngineError("invalid_voice", msg))
        if request.calls_tools and request.tool_choice.mode in ("required", "function") and not self._calls_tools:
            thinker = getattr(self._thinker, "description", type(self._thinker).__name__)
            return failing(
                EngineError(
                    "tools_unsupported",
                    f"this cascade's thinker cannot call tools ({thinker}), so tool_choice "
                    f"{request.tool_choice.mode!r} cannot be met; use a route whose thinker can (thinker: vllm)",
                )
            )
        try:
            req = self._register(request.request_id)
        except EngineError as exc:
            return failing(exc)
        return self._respond(req, request, voice, inputs)

    async def _respond(
        self,
        req: RequestControl,
        request: ResponseRequest,
        voice: str,
        inputs: AsyncIterator[EngineInput],
    ) -> AsyncIterator[EngineOutput]:
        try:
            messages = await self._read_inputs(req, request, inputs)
            speak = "audio" in request.modalities
            budget = WordBudget(request.max_output_tokens)
            splitter = SentenceSplitter()
            text: list[str] = []
            samples = [0]
            if request.say is not None and not getattr(self._thinker, "follows_instructions", True):
                thoughts = _said(request.say)  # a thinker that follows no instructions: say it as it is
            elif self._calls_tools:
                thoughts = cast(ToolThinker, self._thinker).think(
                    messages,
                    request.instructions,
                    tools=request.tools if request.calls_tools else (),
                    tool_choice=request.tool_choice,
                    parallel_tool_calls=request.parallel_tool_calls,
                )
            else:
                thoughts = self._thinker.think(messages, request.instructions)
            try:
                while not req.aborted.is_set() and not budget.exhausted:
                    try:
                        delta = await req.pull(thoughts)
                    except EngineError:
                        raise
                    except Exception as exc:
                        raise EngineError("thinker_failed", f"thinker failed: {exc}") from exc
                    if delta is END or delta is ABORTED:
                        break
                    if isinstance(delta, ToolCallDelta):
                        yield delta  # a function call: nothing to speak
                        continue
                    assert isinstance(delta, str)
                    piece = budget.take(delta)
                    if not piece:
                        continue
                    text.append(piece)
                    if not speak:
                        yield TextDelta(piece)
                        continue
                    for sentence in splitter.push(piece):
                        async with contextlib.aclosing(self._speak(req, sentence, voice, request.speed, samples)) as s:
                            async for out in s:
                                yield out
                if speak and not req.aborted.is_set():
                    tail = splitter.flush()
                    async with contextlib.aclosing(self._speak(req, tail, voice, request.speed, samples)) as s:
                        async for out in s:
                            yield out
            finally:
                aclose = getattr(thoughts, "aclose", None)
                if aclose is not None:
                    with contextlib.suppress(Exception):
                        await aclose()
            self._unregister(req)
            answer = "".join(text)
            prompt_words = _words(request.instructions) + sum(_words(m.text) for m in messages)
            yield Finished(
                reason="length" if budget.exhausted else "stop",
                text=answer,
                usage=Usage(
                    input_text_tokens=prompt_words,
                    output_text_tokens=budget.words,
                    output_audio_tokens=round(samples[0] / self.info.output_sample_rate * AUDIO_TOKENS_PER_SECOND),
                ),
            )
        finally:
            self._unregister(req)

    async def _read_inputs(
        self, req: RequestControl, request: ResponseRequest, inputs: AsyncIterator[EngineInput]
    ) -> tuple[Message, ...]:
        """Drain the streamed input; text extends the last user turn, audio is ignored
        (speech reaches a response already transcribed, as a message)."""
        messages = list(request.messages)
        while True:
            item = await req.pull(inputs)
            if item is END or item is ABORTED:
                return tuple(messages)
            if isinstance(item, TextChunk) and item.text:
                if messages and messages[-1].role == "user":
                    last = messages[-1]
                    messages[-1] = Message(role="user", text=last.text + item.text)
                else:
                    messages.append(Message(role="user", text=item.text))

    async def _speak(
        self, req: RequestControl, sentence: str, voice: str, speed: float, samples: list[int]
    ) -> AsyncGenerator[EngineOutput, None]:
        """The sentence's text, then its audio in ``audio_chunk_ms`` pieces as made."""
        if not sentence:
            return
        yield TextDelta(sentence)
        spoken = sentence.strip()
        if not spoken or req.aborted.is_set():
            return
        chunks = Rechunker(self._chunk_bytes)
        try:
            async with contextlib.aclosing(self._tts.stream(spoken, voice, speed, req.tts_cancel)) as stream:
                async for pcm in stream:
                    if req.aborted.is_set():
                        return
                    for piece in chunks.push(pcm):
                        samples[0] += len(piece) // 2
                        yield AudioDelta(piece)
        except (TtsError, ValueError) as exc:
            raise EngineError("tts_failed", f"speech synthesis failed: {exc}") from exc
        if req.aborted.is_set():
            return
        tail = chunks.flush()
        if tail:
            samples[0] += len(tail) // 2
            yield AudioDelta(tail)


async def _said(text: str) -> AsyncIterator[str | ToolCallDelta]:
    """``ResponseRequest.say``, word by word (as a thinker streams)."""
    for i, word in enumerate(text.split()):
        yield word if i == 0 else " " + word
