"""``OmniEngine``: the voice ``Engine`` on an in-process ``AsyncOmni`` (see the package docstring)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
from orchestrator.engines.images import conversation_images, decode_image
from orchestrator.engines.omni.client import OmniClient, OmniClientUser, RequestState, aclose_quietly
from orchestrator.engines.omni.video import OmniVideoEngine
from orchestrator.engines.streams import InputReader, failing

log = logging.getLogger("omni.engines.omni")

AUDIO_TOKENS_PER_SECOND = 10  # as the cascade: 100 ms of audio is one token
DEFAULT_OUTPUT_RATE = 24000  # Qwen2.5/3-Omni's code2wav
ASR_RATE = 16000  # what the audio encoders of omni models take
QWEN_AUDIO_PLACEHOLDER = "<|audio_bos|><|AUDIO|><|audio_eos|>"
QWEN_IMAGE_PLACEHOLDER = "<|vision_bos|><|IMAGE|><|vision_eos|>"  # one per image, before the turn's text
_PENDING = "\x00pending-user-turn\x00"  # split point of a streamed user turn in a rendered prompt


@dataclass(frozen=True, slots=True)
class _StreamingInput:
    """vLLM's ``StreamingInput`` shape; used only when vLLM is not importable."""

    prompt: Any
    sampling_params: Any = None


def _first(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return value[-1] if value else None
    return value


def _to_float32(value: Any) -> np.ndarray | None:
    """A waveform (tensor, ndarray, list) as a 1-D float32 array."""
    if value is None:
        return None
    if hasattr(value, "detach"):  # torch, without importing it
        value = value.detach().float().cpu().numpy()
    arr = np.asarray(value, dtype=np.float32)
    return arr.reshape(-1) if arr.size else None


def pcm16(samples: np.ndarray) -> bytes:
    """float32 in [-1, 1] -> PCM16 little-endian."""
    return (np.clip(samples, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


class _AudioIncrements:
    """Reduce a stream of audio outputs to the samples not yet emitted.

    DELTA outputs give per-step increments; some engine paths give a growing
    cumulative waveform, or a growing list of chunk tensors. The second
    waveform decides: if it starts with everything emitted so far the stream
    is cumulative (only the new tail is emitted from then on), otherwise it
    is incremental. Lists that grow are read from where they were left.
    """

    def __init__(self) -> None:
        self.emitted = 0  # samples emitted
        self._cumulative: bool | None = None
        self._first: np.ndarray | None = None  # kept until the mode is known
        self._list_len = 0

    def feed(self, raw: Any) -> list[np.ndarray]:
        if isinstance(raw, list | tuple):
            if len(raw) > self._list_len > 0:
                parts, self._list_len = list(raw[self._list_len :]), len(raw)
            else:
                parts, self._list_len = list(raw), len(raw)
            self._cumulative = False
            out: list[np.ndarray] = []
            for part in parts:
                out.extend(self._one(_to_float32(part)))
            return out
        return self._one(_to_float32(raw))

    def _one(self, arr: np.ndarray | None) -> list[np.ndarray]:
        if arr is None or arr.size == 0:
            return []
        n = self.emitted
        if self._cumulative is None and n:
            first, self._first = self._first, None
            self._cumulative = bool(
                first is not None and arr.size > n and np.allclose(arr[:n], first, rtol=1e-3, atol=2e-4)
            )
        if self._cumulative:
            if arr.size <= n:
                return []
            arr = arr[n:]
        elif self._cumulative is None:
            self._first = arr.copy()
        self.emitted += arr.size
        return [arr]


class _OutputMapper:
    """``OmniRequestOutput`` -> engine outputs, with the usage counted."""

    def __init__(self, rate: int, *, audio: bool) -> None:
        self.rate = rate
        self.audio = audio
        self.text = ""
        self.prompt_tokens = 0
        self.text_tokens = 0
        self.audio_samples = 0  # at self.rate
        self.finish_reason: str | None = None
        self._increments = _AudioIncrements()
        self._resampler: Any = None
        self._resample_from = 0

    def feed(self, out: Any) -> list[EngineOutput]:
        error = getattr(out, "error", None)
        if error:
            raise EngineError("generation_failed", f"the model failed: {error}")
        inner = getattr(out, "request_output", None)  # older OmniRequestOutput wraps a RequestOutput
        prompt_ids = getattr(out, "prompt_token_ids", None) or getattr(inner, "prompt_token_ids", None)
        if prompt_ids:
            self.prompt_tokens = max(self.prompt_tokens, len(prompt_ids))
        completions = getattr(out, "outputs", None) or getattr(inner, "outputs", None) or []
        completion = completions[0] if completions else None
        kind = getattr(out, "final_output_type", "text")
        result: list[EngineOutput] = []
        if kind == "text" and completion is not None:
            delta = getattr(completion, "text", "") or ""
            self.text_tokens += len(getattr(completion, "token_ids", ()) or ())
            if getattr(completion, "finish_reason", None):
                self.finish_reason = completion.finish_reason
            if delta:
                self.text += delta
                result.append(TextDelta(delta))
        mm = getattr(out, "multimodal_output", None)
        if not isinstance(mm, dict) or not mm:
            mm = getattr(completion, "multimodal_output", None) or getattr(inner, "multimodal_output", None)
        if self.audio and isinstance(mm, dict):
            key = "audio" if mm.get("audio") is not None else "model_outputs"
            raw = mm.get(key)
            if raw is not None and kind != "text":
                sr = _first(mm.get("sr") or mm.get("sample_rate") or mm.get("audio_sample_rate"))
                sr = int(sr.item() if hasattr(sr, "item") else sr) if sr else self.rate
                for samples in self._increments.feed(raw):
                    pcm = self._at_rate(samples, sr)
                    if pcm.size:
                        self.audio_samples += pcm.size
                        result.append(AudioDelta(pcm16(pcm)))
        return result

    def _at_rate(self, samples: np.ndarray, sr: int) -> np.ndarray:
        if sr == self.rate:
            return samples
        if self._resampler is None or self._resample_from != sr:
            import soxr

            self._resampler = soxr.ResampleStream(sr, self.rate, 1, dtype="float32", quality="HQ")
            self._resample_from = sr
        return np.asarray(self._resampler.resample_chunk(samples), dtype=np.float32).reshape(-1)

    def flush(self) -> list[EngineOutput]:
        if self._resampler is None:
            return []
        rest = np.asarray(self._resampler.resample_chunk(np.zeros(0, np.float32), last=True), np.float32)
        self._resampler = None
        if not rest.size:
            return []
        self.audio_samples += rest.size
        return [AudioDelta(pcm16(rest.reshape(-1)))]

    def finished(self) -> Finished:
        return Finished(
            reason="length" if self.finish_reason == "length" else "stop",
            text=self.text,
            usage=Usage(
                input_text_tokens=self.prompt_tokens,
                output_text_tokens=self.text_tokens,
                output_audio_tokens=round(self.audio_samples / self.rate * AUDIO_TOKENS_PER_SECOND),
            ),
        )


def chatml(messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """ChatML, the template of the Qwen family (the fallback renderer)."""
    out = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")


class OmniEngine(OmniClientUser):
    """An omni model (thinker + talker, e.g. Qwen2.5-Omni) served in-process by ``AsyncOmni``.

    ``model``: name or path given to ``AsyncOmni(model=...)``; ``engine_kwargs``
    its other arguments (``deploy_config``, ``stage_init_timeout``, ...).
    ``client``: an already built ``AsyncOmni`` (or anything with its methods),
    used as is and not shut down by ``close``. ``output_sample_rate``: the
    model's native output rate, declared to the gateway (which resamples).
    ``voices``/``default_voice``: the speakers the model knows; the voice is
    passed as ``prompt["additional_information"][voice_field]``.
    ``system_prompt``: used when a request has no instructions (Qwen-Omni
    speaks only under its own system prompt). ``transcription_prompt``:
    enables ``transcribe`` (see the module docstring). ``image_placeholder``: what
    stands for each image of a user turn in the prompt (the images go as
    ``multi_modal_data["image"]``, in order, decoded in a worker thread); None: the
    model takes no images.
    ``streaming_input_cls``: vLLM's ``StreamingInput`` (imported from vLLM when
    None and importable).
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        client: Any = None,
        engine_kwargs: Mapping[str, Any] | None = None,
        shared: OmniClient | None = None,
        output_sample_rate: int = DEFAULT_OUTPUT_RATE,
        voices: Sequence[str] = (),
        default_voice: str | None = None,
        voice_field: str | None = "speaker",
        system_prompt: str | None = None,
        transcription_prompt: str | None = None,
        audio_placeholder: str = QWEN_AUDIO_PLACEHOLDER,
        image_placeholder: str | None = QWEN_IMAGE_PLACEHOLDER,
        streaming_input_cls: Callable[..., Any] | None = None,
        description: str | None = None,
    ) -> None:
        super().__init__(shared or OmniClient(model, client, engine_kwargs))
        name = model or getattr(client, "model", None) or "omni"
        self.info = EngineInfo(
            name="omni",
            description=description or f"vLLM-Omni AsyncOmni in-process: {name} (thinker text, talker speech).",
            input_sample_rate=ASR_RATE,
            output_sample_rate=output_sample_rate,
            voices=tuple(voices),
            default_voice=default_voice or (voices[0] if voices else None),
            transcription_models=(str(name),) if transcription_prompt else (),
            modalities=("text", "audio"),
            ignored_fields=("tools", "tool_choice", "noise_reduction", "speed"),
            accepts_images=image_placeholder is not None,
        )
        self.image_placeholder = image_placeholder
        self.voice_field = voice_field
        self.system_prompt = system_prompt
        self.transcription_prompt = transcription_prompt
        self.audio_placeholder = audio_placeholder
        self._streaming_input_cls = streaming_input_cls
        self._render: Callable[[list[dict[str, str]], bool], str] = chatml

    def video_engine(self, **kwargs: Any) -> OmniVideoEngine:
        """The ``VideoEngine`` view of the same AsyncOmni (a diffusion video model)."""
        return OmniVideoEngine(self.shared, **kwargs)

    # --- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        client = await self.shared.start()
        if self._streaming_input_cls is None:
            try:
                from vllm.engine.protocol import StreamingInput

                self._streaming_input_cls = StreamingInput
            except ImportError:
                self._streaming_input_cls = _StreamingInput
        tokenizer = None
        with contextlib.suppress(Exception):
            tokenizer = await client.get_tokenizer()
        if tokenizer is not None and getattr(tokenizer, "chat_template", None):

            def render(messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
                return str(
                    tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
                )

            self._render = render

    # --- admin passthroughs ---------------------------------------------------

    async def pause(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        await self.shared.pause(mode=mode, clear_cache=clear_cache)

    async def resume(self) -> None:
        await self.shared.resume()

    async def sleep(self, level: int = 1) -> None:
        await self.shared.sleep(level)

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        await self.shared.wake_up(tags)

    # --- requests ---------------------------------------------------------------

    def _registered(
        self, request_id: str, run: Callable[[RequestState], AsyncIterator[EngineOutput]]
    ) -> AsyncIterator[EngineOutput]:
        """``run`` on the request, registered now (an abort before the first
        iteration is not lost); a refusal fails where the outputs are consumed."""
        try:
            entry = self._register(request_id)
        except EngineError as exc:
            return failing(exc)
        return run(entry)

    def _register(self, request_id: str) -> RequestState:
        self.shared.get()
        if self._closed:
            raise EngineError("engine_not_started", "the omni engine is closed")
        if request_id in self._active:
            raise EngineError("request_id_conflict", f"request {request_id!r} is already running")
        entry = RequestState()
        self._active[request_id] = entry
        return entry

    def _sampling_params(self, client: Any, *, max_tokens: int | None, temperature: float | None) -> list[Any]:
        """The stage defaults with the thinker's (stage 0) limits applied and
        delta outputs (required for streaming input, and what we map)."""
        defaults = list(getattr(client, "default_sampling_params_list", None) or [])
        if not defaults:
            return defaults
        first = defaults[0]
        clone = getattr(first, "clone", None)
        params = clone() if callable(clone) else copy.deepcopy(first)
        if max_tokens is not None and hasattr(params, "max_tokens"):
            params.max_tokens = max_tokens
        if temperature is not None and hasattr(params, "temperature"):
            params.temperature = temperature
        kind = getattr(params, "output_kind", None)
        if kind is not None and hasattr(type(kind), "DELTA"):
            params.output_kind = type(kind).DELTA
        defaults[0] = params
        return defaults

    def _messages(self, request: ResponseRequest, streamed: str | None) -> list[dict[str, str]]:
        """The chat; the last empty user turn (a transcript still coming) holds
        ``streamed`` (or is added at the end when there is none)."""
        system = request.instructions or self.system_prompt
        out = [{"role": "system", "content": system}] if system else []
        pending = max((i for i, m in enumerate(request.messages) if m.role == "user" and not m.text), default=-1)
        for i, m in enumerate(request.messages):
            if i == pending:
                if streamed is not None:
                    out.append({"role": "user", "content": streamed})
            elif m.images and self.image_placeholder:
                out.append({"role": m.role, "content": self.image_placeholder * len(m.images) + m.text})
            elif m.text:
                out.append({"role": m.role, "content": m.text})
        if pending < 0 and streamed:
            out.append({"role": "user", "content": streamed})
        return out

    def _prompt(self, text: str, request: ResponseRequest, images: list[Any]) -> dict[str, Any]:
        """The prompt of ``text``, with ``images`` (decoded: ``_decoded``) and the voice."""
        prompt: dict[str, Any] = {"prompt": text}
        if images:
            prompt["multi_modal_data"] = {"image": images}
        voice = request.voice or self.info.default_voice
        if voice and self.voice_field:
            prompt["additional_information"] = {self.voice_field: [voice]}
        return prompt

    def respond(self, request: ResponseRequest, inputs: AsyncIterator[EngineInput]) -> AsyncIterator[EngineOutput]:
        if request.calls_tools and request.tool_choice.mode in ("required", "function"):
            # Not wired to vLLM-Omni's tool calling: auto answers as always (the fields are reported).
            return failing(EngineError("tools_unsupported", "the omni engine does not call functions"))
        return self._registered(request.request_id, lambda entry: self._respond(request, inputs, entry))

    async def _decoded(self, request: ResponseRequest) -> list[Any]:
        """The conversation's images, decoded in a worker thread (a large one takes a while,
        and the session bounds how many pixels its conversation holds), one after another;
        none when the model takes no images."""
        images = conversation_images(request.messages)
        if not images or not self.image_placeholder:
            return []
        return await asyncio.to_thread(lambda: [decode_image(image) for image in images])

    async def _respond(
        self, request: ResponseRequest, inputs: AsyncIterator[EngineInput], entry: RequestState
    ) -> AsyncIterator[EngineOutput]:
        reader = InputReader(inputs)
        try:
            client = self.shared.get()
            await reader.settle()
            if entry.aborted:
                return
            images = await self._decoded(request)
            if entry.aborted:
                return
            params = self._sampling_params(
                client, max_tokens=request.max_output_tokens, temperature=request.temperature
            )
            audio = "audio" in request.modalities
            prompt: Any
            if reader.ended:  # every input is here: one plain request
                streamed = " ".join(c.text for c in reader.items if isinstance(c, TextChunk) and c.text)
                prompt = self._prompt(self._render(self._messages(request, streamed or None), True), request, images)
            else:
                prompt = self._streaming_prompt(request, reader, params[0] if params else None, images)
            mapper = _OutputMapper(self.info.output_sample_rate, audio=audio)
            stream = client.generate(
                prompt,
                request_id=request.request_id,
                sampling_params_list=params or None,
                output_modalities=["text", "audio"] if audio else ["text"],
            )
            async for delta in self._deltas(stream, entry, mapper):
                yield delta
            if entry.aborted:
                return
            for delta in mapper.flush():
                yield delta
            yield mapper.finished()
        finally:
            reader.stop()
            self._active.pop(request.request_id, None)

    async def _streaming_prompt(
        self, request: ResponseRequest, reader: InputReader[EngineInput], params: Any, images: list[Any]
    ) -> AsyncIterator[Any]:
        """vLLM streaming input: the conversation up to the open user turn, each
        streamed transcript, then the turn's end and the assistant header."""
        assert self._streaming_input_cls is not None
        make = self._streaming_input_cls
        rendered = self._render(self._messages(request, _PENDING), True)
        head, _, tail = rendered.partition(_PENDING)
        yield make(prompt=self._prompt(head, request, images), sampling_params=params)
        first = True
        async for chunk in reader.stream():
            if isinstance(chunk, TextChunk) and chunk.text:
                yield make(prompt={"prompt": chunk.text if first else " " + chunk.text}, sampling_params=params)
                first = False
            # AudioChunk: respond takes transcripts; the session never streams audio here.
        yield make(prompt={"prompt": tail}, sampling_params=params)

    async def _deltas(self, stream: Any, entry: RequestState, mapper: _OutputMapper) -> AsyncIterator[EngineOutput]:
        """Map one ``generate`` stream to deltas; ends quietly once the request is aborted."""
        try:
            async for out in stream:
                if entry.aborted:
                    return
                for delta in mapper.feed(out):
                    yield delta
        except (EngineError, asyncio.CancelledError):
            raise
        except Exception as exc:
            if entry.aborted:
                return
            raise self.shared.failure(exc) from exc
        finally:
            await aclose_quietly(stream)

    def transcribe(
        self, request: TranscriptionRequest, inputs: AsyncIterator[AudioChunk]
    ) -> AsyncIterator[EngineOutput]:
        if not self.transcription_prompt:
            return failing(
                EngineError("unsupported", "this omni model has no speech-to-text (no transcription_prompt set)")
            )
        return self._registered(request.request_id, lambda entry: self._transcribe(request, inputs, entry))

    async def _transcribe(
        self, request: TranscriptionRequest, inputs: AsyncIterator[AudioChunk], entry: RequestState
    ) -> AsyncIterator[EngineOutput]:
        try:
            client = self.shared.get()
            pcm = bytearray()
            async for chunk in inputs:
                if entry.aborted:
                    return
                if isinstance(chunk, AudioChunk):
                    pcm += chunk.pcm
            if entry.aborted:
                return
            seconds = len(pcm) / 2 / ASR_RATE
            if len(pcm) < 2:
                yield Finished(text="")
                return
            waveform = np.frombuffer(bytes(pcm[: len(pcm) // 2 * 2]), dtype="<i2").astype(np.float32) / 32768.0
            instruction = str(self.transcription_prompt)
            if request.language:
                instruction += f" The language is {request.language}."
            if request.prompt:
                instruction += f" Context: {request.prompt}"
            messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
            messages.append({"role": "user", "content": self.audio_placeholder + instruction})
            prompt = {"prompt": self._render(messages, True), "multi_modal_data": {"audio": (waveform, ASR_RATE)}}
            params = self._sampling_params(client, max_tokens=None, temperature=0.0)
            mapper = _OutputMapper(self.info.output_sample_rate, audio=False)
            stream = client.generate(
                prompt, request_id=request.request_id, sampling_params_list=params or None, output_modalities=["text"]
            )
            async for delta in self._deltas(stream, entry, mapper):
                yield delta
            if entry.aborted:
                return
            text = mapper.text.strip()
            yield Finished(
                text=text,
                usage=Usage(
                    input_audio_tokens=round(seconds * AUDIO_TOKENS_PER_SECOND), output_text_tokens=mapper.text_tokens
                ),
            )
        finally:
            self._active.pop(request.request_id, None)
