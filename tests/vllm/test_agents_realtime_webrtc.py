"""@openai/agents-realtime's ``OpenAIRealtimeWebRTC`` (npm, unchanged) in Chromium, with a
function tool, and a model that decides: the cascade with vLLM as its thinker (the tiny
random-weight model). The agent's session asks for a call (``tool_choice: required``, which
vLLM's structured outputs make the model meet); the tool, as it runs in the page, sets
``tool_choice: auto``, and the next answer, spoken on the call's track, is generated from a
prompt holding the call and its result. The page and its flow: tests/browser/agents_support.py.

Needs Chromium and the npm package (scripts/install_browser.sh): skipped without them,
except under CI, where that fails.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from support.gateway import RunningGateway, run_gateway
from test_vllm_tools import prompts

from gateway.settings import Settings
from orchestrator.engines.cascade import CascadeEngine
from orchestrator.engines.vllm_engine import VllmEngine, VllmThinker

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "browser"))
from agents_support import KEY, RESULT, bundle, converse, question_wav, serving
from browser_support import browser, missing_browser, screenshot

pytestmark = [pytest.mark.vllm, pytest.mark.browser, pytest.mark.asyncio(loop_scope="session")]


@pytest_asyncio.fixture(loop_scope="session")
async def voice_gw(vllm_engine: VllmEngine) -> AsyncIterator[RunningGateway]:
    reason = missing_browser()
    if reason is not None:
        if os.environ.get("CI"):
            raise AssertionError(reason)
        pytest.skip(reason)
    folder = bundle()
    thinker = VllmThinker(VllmEngine(vllm_engine.model, llm=vllm_engine.llm, sampling={"seed": 0}), max_tokens=12)
    settings = Settings(engine="cascade", video_engine="none", api_keys=(KEY,), detach_grace_s=0.2)
    async with run_gateway(settings, engine=CascadeEngine(thinker=thinker), wrap=serving(folder)) as gw:
        yield gw


async def test_the_agents_sdk_webrtc_transport_calls_a_tool_chosen_by_a_vllm_model(
    voice_gw: RunningGateway, vllm_engine: VllmEngine, tmp_path: Path
) -> None:
    wav = await question_wav(tmp_path / "speech.wav")
    async with browser(wav) as context:
        with prompts(vllm_engine) as sent:
            page, log, seen = await converse(voice_gw, context, toolChoice="required", autoAfterTool=True)
        # The first call (a slow machine may let the fake microphone, which loops its file, ask again).
        ran = seen["tool"][0]
        assert ran["args"]["city"] in ("Paris", "Oslo", "Lima"), ran  # the schema's enum, the model's choice
        # The answer after the tool was generated from a prompt holding its result.
        result = RESULT.format(city=ran["args"]["city"])
        assert any(result in prompt for prompt in sent), sent[-1:]
        types = [e["type"] for e in seen["events"]]
        assert "response.output_audio.delta" not in types  # the audio is on the track
        inbound = await page.evaluate("() => window.inbound()")
        assert inbound["packets"] > 0 and inbound["energy"] > 0.001, inbound
        assert seen["errors"] == [], seen["errors"]
        await screenshot(page, "agents_realtime_webrtc.png")
        assert not log.errors, log
