"""openai-agents' realtime runner (``agents.realtime``, unmodified, over its
WebSocket model with the gateway's URL) holds a voice conversation through the
gateway with a function tool whose result the model's next answer is given.

The route: the CPU cascade (pocketsphinx, eSpeak NG) with vLLM as its thinker
(the tiny random-weight model). A call really happens: the agent's session
asks for one (``tool_choice: required``) and vLLM's structured outputs make
the model return it; the tool then sets ``tool_choice: auto`` and the model's
next answer, spoken, is generated from a prompt holding the call and its result.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from support.gateway import RunningGateway, run_gateway
from support.speech import silence, speak
from test_vllm_tools import prompts

from gateway.settings import Settings
from orchestrator.engines.cascade import CascadeEngine
from orchestrator.engines.vllm_engine import VllmEngine, VllmThinker

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients"))
from clients_support import run_client

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]


@pytest_asyncio.fixture(loop_scope="session")
async def voice_gw(vllm_engine: VllmEngine) -> AsyncIterator[RunningGateway]:
    thinker = VllmThinker(VllmEngine(vllm_engine.model, llm=vllm_engine.llm, sampling={"seed": 0}), max_tokens=12)
    settings = Settings(engine="cascade", video_engine="none", detach_grace_s=0.2, drain_window_s=0.5)
    async with run_gateway(settings, engine=CascadeEngine(thinker=thinker)) as gw:
        yield gw


async def test_openai_agents_runs_a_voice_turn_with_a_function_tool(
    voice_gw: RunningGateway, vllm_engine: VllmEngine, tmp_path: Path
) -> None:
    speech = silence(300) + await speak("what is the weather in paris") + silence(200)
    with prompts(vllm_engine) as sent:
        report = await run_client(
            "agents_voice.py", tmp_path, url=voice_gw.url + "?model=gpt-realtime-2.1", speech=speech
        )
    assert report["errors"] == [] and report["log_errors"] == [], report
    assert len(report["tool_calls"]) == 1 and report["tool_calls"][0] in ("Paris", "Oslo", "Lima"), report
    events = report["events"]
    assert "tool_start" in events and "tool_end" in events and "audio" in events, events
    assert events.index("tool_end") < len(events) - 1 - events[::-1].index("audio")  # spoke after the tool
    assert report["audio_bytes"] > 24000  # half a second of speech
    # The answer after the tool was generated from a prompt holding its result.
    assert any(report["tool_results"][0] in prompt for prompt in sent), sent[-1:]
