"""An engine core that dies: the response fails fatally, health turns red, nothing hangs.

Marked ``vllm_last``: it kills the session's shared AsyncLLM, so the conftest
runs it after every other test."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from vllm_support import collect, no_input, user

from orchestrator.engine import EngineError, EngineOutput, ResponseRequest
from orchestrator.engines.vllm_engine import VllmEngine, VllmThinker

# The default 300 s timeout: the first test of the session also starts vLLM.
pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]


def kill_engine_core(engine: VllmEngine) -> None:
    for proc in engine.llm.engine_core.resources.engine_manager.processes:
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)


@pytest.mark.vllm_last
async def test_a_dead_engine_core_fails_the_response_with_engine_dead(vllm_engine: VllmEngine) -> None:
    engine = VllmEngine(vllm_engine.model, llm=vllm_engine.llm, sampling={"ignore_eos": True})
    await engine.start()
    outs: list[EngineOutput] = []

    async def consume() -> None:
        request = ResponseRequest("d-1", user("Keep talking."), modalities=("text",))
        async for out in engine.respond(request, no_input()):
            outs.append(out)
            if len(outs) == 3:
                kill_engine_core(engine)

    with pytest.raises(EngineError) as err:
        await asyncio.wait_for(consume(), 30)  # never hangs
    assert err.value.code == "engine_dead"
    assert err.value.fatal
    assert not engine.healthy()
    assert not vllm_engine.healthy()  # the owner sees it too
    assert engine.active == set()

    # Later requests fail at once, with the same code; abort stays a no-op.
    with pytest.raises(EngineError) as err:
        request = ResponseRequest("d-2", user("Hi."), modalities=("text",))
        await asyncio.wait_for(collect(vllm_engine.respond(request, no_input())), 10)
    assert err.value.code == "engine_dead" and err.value.fatal
    with pytest.raises(EngineError) as err:
        await asyncio.wait_for(collect_thought(VllmThinker(vllm_engine)), 10)
    assert err.value.code == "engine_dead"
    await vllm_engine.abort("d-1")


async def collect_thought(thinker: VllmThinker) -> str:
    return "".join([d async for d in thinker.think(user("Hi."), "")])
