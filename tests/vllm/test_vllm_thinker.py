"""The CPU voice cascade speaking a vLLM model's text (``VllmThinker``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from vllm_support import collect, finished, idle, no_input, texts, user

from orchestrator.engine import AudioDelta, EngineError, EngineOutput, Message, ResponseRequest, TextDelta
from orchestrator.engines.cascade.engine import CascadeEngine
from orchestrator.engines.vllm_engine import VllmEngine, VllmThinker

# The default 300 s timeout: the first test of the session also starts vLLM.
pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]


class Timed:
    """Wraps a thinker and notes when each of its deltas was handed over."""

    def __init__(self, thinker: VllmThinker) -> None:
        self.thinker = thinker
        self.times: list[float] = []

    async def think(self, messages: tuple[Message, ...], instructions: str) -> AsyncIterator[str]:
        async for delta in self.thinker.think(messages, instructions):
            self.times.append(time.monotonic())
            yield delta


@pytest_asyncio.fixture(loop_scope="session")
async def view(vllm_engine: VllmEngine) -> AsyncIterator[VllmEngine]:
    engine = VllmEngine(vllm_engine.model, llm=vllm_engine.llm)
    await engine.start()
    yield engine
    await engine.close()


async def cascade(thinker: object) -> CascadeEngine:
    engine = CascadeEngine(thinker, warm_decoders=0)  # type: ignore[arg-type]
    await engine.start()
    return engine


async def test_the_cascade_speaks_the_models_text_sentence_by_sentence(view: VllmEngine) -> None:
    no_eos = {view.tokenizer.eos_token_id: -100.0}  # a long answer, with sentences
    timed = Timed(VllmThinker(view, max_tokens=150, logit_bias=no_eos, seed=1))
    engine = await cascade(timed)
    try:
        outs: list[tuple[float, EngineOutput]] = []
        request = ResponseRequest("c-speak", user("Hello there, tell me about the river."), modalities=("audio",))
        async for out in engine.respond(request, no_input()):
            outs.append((time.monotonic(), out))
    finally:
        await engine.close()
    outputs = [o for _, o in outs]
    done = finished(outputs)
    audio = [(t, o) for t, o in outs if isinstance(o, AudioDelta)]
    assert audio and sum(len(o.pcm) for _, o in audio) > 22050  # more than a second of speech
    assert done.usage.output_text_tokens > 100  # words of the model's answer
    assert done.text == texts(outputs) and done.text.count(".") > 1
    # The first sentence was spoken before the model's last token was handed over.
    assert audio[0][0] < timed.times[-1]
    first_audio = outputs.index(audio[0][1])
    last_text = max(i for i, o in enumerate(outputs) if isinstance(o, TextDelta))
    assert first_audio < last_text
    await idle(view)


async def test_a_text_response_through_the_cascade_is_the_models_text(view: VllmEngine) -> None:
    thinker = VllmThinker(view, max_tokens=40, seed=2)
    engine = await cascade(thinker)
    try:
        request = ResponseRequest("c-text", user("Hello."), modalities=("text",))
        outputs = await collect(engine.respond(request, no_input()))
        # The same answer straight from the thinker (seeded sampling), before the
        # cascade closes it (the cascade owns its thinker).
        again = "".join([d async for d in thinker.think(user("Hello."), "")])
    finally:
        await engine.close()
    done = finished(outputs)
    assert done.text.strip()
    assert not any(isinstance(o, AudioDelta) for o in outputs)
    assert " ".join(again.split()) == " ".join(done.text.split())


async def test_aborting_the_cascade_response_aborts_the_thinkers_vllm_request(view: VllmEngine) -> None:
    engine = await cascade(VllmThinker(view, max_tokens=900, ignore_eos=True))
    try:
        request = ResponseRequest("c-abort", user("Talk."), modalities=("audio",))
        outputs = engine.respond(request, no_input())
        async for out in outputs:
            if isinstance(out, AudioDelta):
                break
        assert view.llm.get_num_unfinished_requests() == 1
        await engine.abort("c-abort")
        await outputs.aclose()  # type: ignore[attr-defined]
        await idle(view)
    finally:
        await engine.close()


async def test_a_thinker_on_a_closed_engine_fails_with_a_code(vllm_engine: VllmEngine) -> None:
    closed = VllmEngine(vllm_engine.model, llm=vllm_engine.llm)
    await closed.close()
    with pytest.raises(EngineError) as err:
        await asyncio.wait_for(collect_text(VllmThinker(closed)), 10)
    assert err.value.code == "engine_closed"
    assert vllm_engine.healthy()


async def collect_text(thinker: VllmThinker) -> str:
    return "".join([d async for d in thinker.think(user("Hi."), "")])


async def test_the_thinker_may_use_stop_strings(view: VllmEngine) -> None:
    """Only streaming input refuses stop strings; a thinker's request is a plain one."""
    no_eos = {view.tokenizer.eos_token_id: -100.0}
    thinker = VllmThinker(view, max_tokens=200, stop=["."], logit_bias=no_eos, seed=1)
    text = await asyncio.wait_for(collect_text(thinker), 30)
    assert text.strip() and "." not in text
    assert len(text.split()) < 200  # stopped at the first sentence's end
