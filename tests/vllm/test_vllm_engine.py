"""VllmEngine against a real AsyncLLM (vLLM's CPU build) and a tiny random model."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from vllm_support import AddSpy, collect, fed, finished, idle, no_input, texts, user

from orchestrator.engine import (
    AudioChunk,
    Engine,
    EngineError,
    EngineInput,
    EngineOutput,
    Image,
    Message,
    ResponseRequest,
    TextChunk,
    TextDelta,
    TranscriptionRequest,
)
from orchestrator.engines.vllm_engine import VllmEngine, make_sampling, render_conversation, validate_sampling

# The default 300 s timeout: the first test of the session also starts vLLM.
pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]


@pytest_asyncio.fixture(loop_scope="session")
async def endless(vllm_engine: VllmEngine) -> AsyncIterator[VllmEngine]:
    """A view of the shared AsyncLLM that never stops by itself (EOS ignored)."""
    engine = VllmEngine(vllm_engine.model, llm=vllm_engine.llm, sampling={"seed": 0, "ignore_eos": True})
    await engine.start()
    yield engine
    await engine.close()


def request(rid: str, text: str = "Hello there, how are you?", **kwargs: object) -> ResponseRequest:
    kwargs.setdefault("modalities", ("text",))
    return ResponseRequest(rid, user(text), **kwargs)  # type: ignore[arg-type]


# --- the protocol -------------------------------------------------------------


async def test_engine_satisfies_the_protocol_and_is_text_only(vllm_engine: VllmEngine) -> None:
    assert isinstance(vllm_engine, Engine)
    assert vllm_engine.healthy()
    info = vllm_engine.info
    assert info.name == "vllm"
    assert info.modalities == ("text",)
    assert info.voices == () and info.transcription_models == ()
    assert vllm_engine.model in info.description
    assert not info.accepts_images and "text only" in info.description


async def test_a_conversation_streams_text_deltas_then_one_finished(vllm_engine: VllmEngine) -> None:
    outs = await collect(vllm_engine.respond(request("r-basic"), no_input()))
    done = finished(outs)
    deltas = [o for o in outs if isinstance(o, TextDelta)]
    # Streamed as it comes; vLLM merges the deltas a consumer has not read yet, so on a busy
    # machine the whole answer may come as one (streaming over time: the chunked test below).
    assert deltas and all(d.text for d in deltas)
    assert done.text == texts(outs) and done.text.strip()
    prompt = render_conversation(vllm_engine.tokenizer, user("Hello there, how are you?"), "")
    assert done.usage.input_text_tokens == len(prompt)
    assert done.usage.output_text_tokens > 0
    assert vllm_engine.active == set()
    await idle(vllm_engine)


async def test_three_text_chunks_fed_over_time_extend_one_vllm_request(endless: VllmEngine) -> None:
    """vLLM's streaming input: the conversation starts the request, each chunk
    extends it (vLLM generates after each), the iterator ending finishes it."""
    engine = VllmEngine(endless.model, llm=endless.llm, sampling={"seed": 0, "ignore_eos": True, "max_tokens": 6})
    await engine.start()
    chunks = [" The cat", " sat on the", " old red mat."]
    seen_before: list[int] = []  # outputs seen before each chunk was fed
    outs: list[EngineOutput] = []
    progress = asyncio.Condition()

    async def before(i: int) -> None:
        # Feed chunk i only once the part before it has produced output.
        async with progress:
            await progress.wait_for(lambda: sum(isinstance(o, TextDelta) for o in outs) >= 1 + i)
            seen_before.append(len(outs))
        await asyncio.sleep(0.05)

    with AddSpy(engine) as spy:
        async for out in engine.respond(request("r-stream"), fed(chunks, before=before)):
            async with progress:
                outs.append(out)
                progress.notify_all()
    done = finished(outs)
    # One vLLM request: the conversation and 3 chunks (resumable), then the final marker.
    ids = {rid for rid, _ in spy.sent}
    assert len(ids) == 1, spy.sent
    assert [resumable for _, resumable in spy.sent] == [True, True, True, True, False]
    assert all(out.text for out in outs[:-1])
    assert seen_before[0] >= 1 and seen_before == sorted(seen_before)  # output flowed before the input ended
    assert done.usage.output_text_tokens == 6 * 4  # max_tokens per part: conversation + 3 chunks
    tok = engine.tokenizer
    extra = sum(len(tok.encode(c, add_special_tokens=False)) for c in chunks)
    assert done.usage.input_text_tokens == len(render_conversation(tok, user("Hello there, how are you?"), "")) + extra
    assert done.reason == "length"  # the last part stopped at max_tokens
    await idle(engine)
    await engine.close()
    assert endless.healthy()  # a view closing leaves the shared AsyncLLM running


async def test_max_output_tokens_bounds_the_whole_response(endless: VllmEngine) -> None:
    gate = asyncio.Event()

    async def late_chunk() -> AsyncIterator[EngineInput]:
        await gate.wait()
        yield TextChunk(" and then some more")

    outs: list[EngineOutput] = []
    async for out in endless.respond(request("r-limit", max_output_tokens=5), late_chunk()):
        outs.append(out)
    done = finished(outs)
    assert done.reason == "length"
    assert done.usage.output_text_tokens == 5
    assert len(endless.tokenizer.encode(done.text, add_special_tokens=False)) <= 6
    # The request was still waiting for input in vLLM: it was aborted, not left behind.
    await idle(endless)


async def test_transcribe_is_refused_with_a_code(vllm_engine: VllmEngine) -> None:
    async def audio() -> AsyncIterator[AudioChunk]:
        yield AudioChunk(bytes(640))

    with pytest.raises(EngineError) as err:
        await collect(vllm_engine.transcribe(TranscriptionRequest("t1"), audio()))
    assert err.value.code == "unsupported"


async def test_audio_output_is_refused_before_reaching_vllm(vllm_engine: VllmEngine) -> None:
    with AddSpy(vllm_engine) as spy:
        with pytest.raises(EngineError) as err:
            await collect(vllm_engine.respond(request("r-audio", modalities=("audio",)), no_input()))
    assert err.value.code == "unsupported_modality"
    assert spy.sent == []


async def test_images_to_a_text_model_are_refused_before_reaching_vllm(vllm_engine: VllmEngine) -> None:
    """The session never sends them (accepts_images is False); an engine given them anyway says so."""
    from support.images import png

    picture = Image("image/png", png())
    req = ResponseRequest("r-image", (Message("user", "Look", images=(picture,)),), modalities=("text",))
    with AddSpy(vllm_engine) as spy:
        with pytest.raises(EngineError) as err:
            await collect(vllm_engine.respond(req, no_input()))
    assert err.value.code == "unsupported" and "takes no images" in err.value.message
    assert spy.sent == []


# --- vLLM's streaming-input restrictions ------------------------------------------


RESTRICTED = [
    pytest.param({"n": 2}, id="n>1"),
    pytest.param({"stop": ["."]}, id="stop-strings"),
    pytest.param({"output_kind": "FINAL_ONLY"}, id="final-only"),
]


def _params(fields: dict[str, object]) -> object:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    if fields.get("output_kind") == "FINAL_ONLY":
        fields = {**fields, "output_kind": RequestOutputKind.FINAL_ONLY}
    else:
        fields = {**fields, "output_kind": RequestOutputKind.DELTA}
    return SamplingParams(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("fields", RESTRICTED)
async def test_validate_sampling_refuses_what_vllm_streaming_input_refuses(fields: dict[str, object]) -> None:
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.engine.async_llm import AsyncLLM

    params = _params(fields)
    with pytest.raises(VLLMValidationError):  # vLLM's own check, as installed
        AsyncLLM._validate_streaming_input_sampling_params(params)
    with pytest.raises(EngineError) as err:
        validate_sampling(params)
    assert err.value.code == "unsupported_sampling_param"


async def test_validate_sampling_accepts_what_vllm_accepts() -> None:
    from vllm.v1.engine.async_llm import AsyncLLM

    params = _params({"stop_token_ids": [2], "temperature": 0.5})
    AsyncLLM._validate_streaming_input_sampling_params(params)
    validate_sampling(params)
    with pytest.raises(EngineError) as err:
        validate_sampling(object())  # e.g. pooling parameters
    assert err.value.code == "unsupported_sampling_param"


@pytest.mark.parametrize("fields", RESTRICTED)
async def test_restricted_engine_defaults_fail_at_construction_without_reaching_vllm(
    vllm_engine: VllmEngine, fields: dict[str, object]
) -> None:
    from vllm.sampling_params import RequestOutputKind

    sampling = dict(fields)
    if sampling.get("output_kind") == "FINAL_ONLY":
        sampling["output_kind"] = RequestOutputKind.FINAL_ONLY
    with AddSpy(vllm_engine) as spy:
        with pytest.raises(EngineError) as err:
            VllmEngine(vllm_engine.model, llm=vllm_engine.llm, sampling=sampling)
    assert err.value.code == "unsupported_sampling_param"
    assert spy.sent == []


async def test_invalid_sampling_values_are_coded_errors() -> None:
    with pytest.raises(EngineError) as err:
        make_sampling({"temperature": -1.0})
    assert err.value.code == "invalid_sampling_param"
    with pytest.raises(EngineError) as err:
        make_sampling({"no_such_field": 1})
    assert err.value.code == "invalid_sampling_param"


async def test_a_conversation_longer_than_max_model_len_is_a_coded_error(vllm_engine: VllmEngine) -> None:
    long = " ".join(["the cat sat on the mat"] * 400)
    with pytest.raises(EngineError) as err:
        await collect(vllm_engine.respond(request("r-long", long), no_input()))
    assert err.value.code == "invalid_request"
    assert vllm_engine.healthy()
    await idle(vllm_engine)


# --- cancellation -------------------------------------------------------------------


async def _first_deltas(outputs: AsyncIterator[EngineOutput], n: int = 3) -> None:
    got = 0
    async for out in outputs:
        if isinstance(out, TextDelta):
            got += 1
            if got >= n:
                break


async def test_cancelling_the_consumer_mid_generation_aborts_the_vllm_request(endless: VllmEngine) -> None:
    seen = asyncio.Event()

    async def consume() -> None:
        async for out in endless.respond(request("r-cancel"), no_input()):
            if isinstance(out, TextDelta):
                seen.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(seen.wait(), 30)
    assert endless.llm.get_num_unfinished_requests() == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await idle(endless)
    assert endless.active == set()


async def test_abort_by_id_mid_generation_ends_the_request(endless: VllmEngine) -> None:
    """The orchestrator's order: cancel the consumer, then ``abort(request_id)``;
    here ``abort`` alone, while the consumer still iterates, ends the outputs."""
    outs: list[EngineOutput] = []

    async def consume() -> None:
        async for out in endless.respond(request("r-abort"), no_input()):
            outs.append(out)
            if len(outs) == 3:
                await endless.abort("r-abort")

    await asyncio.wait_for(consume(), 30)
    finished(outs)
    await idle(endless)


async def test_closing_the_outputs_early_aborts_the_request(endless: VllmEngine) -> None:
    outputs = endless.respond(request("r-close"), no_input())
    await _first_deltas(outputs)
    await outputs.aclose()  # type: ignore[attr-defined]
    await idle(endless)
    assert endless.active == set()


async def test_abort_of_an_unknown_request_is_a_no_op(vllm_engine: VllmEngine) -> None:
    await vllm_engine.abort("never-seen")
    assert vllm_engine.healthy()


async def test_a_duplicate_request_id_is_refused(endless: VllmEngine) -> None:
    first = endless.respond(request("r-dup"), no_input())
    await _first_deltas(first, 1)
    with pytest.raises(EngineError) as err:
        await collect(endless.respond(request("r-dup"), no_input()))
    assert err.value.code == "duplicate_request"
    await first.aclose()  # type: ignore[attr-defined]
    await idle(endless)


# --- prompts -----------------------------------------------------------------------


async def test_the_conversation_renders_with_the_chat_template(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    messages = (Message("user", "Hi"), Message("assistant", "Hello."), Message("user", "Bye"))
    ids = render_conversation(tok, messages, "Be brief.")
    text = tok.decode(ids)
    assert text == "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\nHello.\n<|user|>\nBye\n<|assistant|>\n"


async def test_without_a_chat_template_the_conversation_is_a_transcript(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    tok.chat_template = None
    ids = render_conversation(tok, (Message("user", "Hi"),), "Be brief.")
    assert tok.decode(ids, skip_special_tokens=True) == "system: Be brief.\nuser: Hi\nassistant:"
