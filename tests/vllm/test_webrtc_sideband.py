"""A WebRTC call whose function call a backend's sideband socket answers (OpenAI's pattern:
the browser holds the media, the backend holds the tools), through vLLM on the CPU: the
tiny random-weight model, constrained by vLLM's structured outputs, makes the call; the
sideband (``/v1/realtime?call_id=``) sees it, sends ``function_call_output`` and asks for
the next answer, which the model is given with the call's output; the browser's data
channel carries every event of both turns."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import orjson
import pytest
import websockets
from support.gateway import RunningGateway
from support.sdk_shapes import check_event
from test_vllm_tools import SDK_TOOL, prompts, valid_weather

from orchestrator.engines.vllm_engine import VllmEngine

if os.environ.get("CI"):
    import aiortc  # noqa: F401  (CI installs the webrtc extra: a missing one fails, never skips)
else:
    pytest.importorskip("aiortc")

import httpx
from aiortc import RTCSessionDescription
from webrtc.rtc_support import make_browser, wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(300)]


async def test_a_sideband_answers_the_calls_function_call(gw: RunningGateway, vllm_engine: VllmEngine) -> None:
    session = {"type": "realtime", "output_modalities": ["text"], "tools": [SDK_TOOL],
               "tool_choice": {"type": "function", "name": "get_weather"}, "max_output_tokens": 64}  # fmt: skip
    browser, offer = await make_browser()
    events: list[dict[str, Any]] = []
    try:
        with prompts(vllm_engine) as sent:
            async with httpx.AsyncClient(timeout=60) as http:  # the unified form: a backend starts the call
                r = await http.post(f"{gw.http}/v1/realtime/calls", headers={"Authorization": "Bearer sk-backend"},
                                    files={"sdp": (None, offer, "application/sdp"),
                                           "session": (None, orjson.dumps(session), "application/json")})  # fmt: skip
            assert r.status_code == 201, r.text
            call_id = r.headers["location"].rsplit("/", 1)[1]
            assert browser.channel is not None

            def received(message: str) -> None:
                event = orjson.loads(message)
                check_event(event)
                events.append(event)

            browser.channel.on("message", received)
            await browser.pc.setRemoteDescription(RTCSessionDescription(sdp=r.text, type="answer"))
            await wait_for(lambda: any(e["type"] == "session.created" for e in events), "session.created")
            backend = {"Authorization": "Bearer sk-backend"}
            async with websockets.connect(f"{gw.url}?call_id={call_id}", additional_headers=backend) as side:
                # The browser speaks (here: types) and asks for the answer.
                browser.channel.send(orjson.dumps({"type": "conversation.item.create", "item": {
                    "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                }).decode())  # fmt: skip
                browser.channel.send(orjson.dumps({"type": "response.create"}).decode())
                done = await side_until(side, "response.done")
                call = done["response"]["output"][0]
                assert call["type"] == "function_call" and call["name"] == "get_weather"
                args = valid_weather(call["arguments"])
                result = json.dumps({"city": args["city"], "forecast": "sunny"})
                output = {"type": "function_call_output", "call_id": call["call_id"], "output": result}
                await side.send(orjson.dumps({"type": "conversation.item.create", "item": output}).decode())
                await side.send(orjson.dumps({"type": "response.create", "response": {"tool_choice": "none"}}).decode())
                second = await side_until(side, "response.done")
            assert second["response"]["status"] in ("completed", "incomplete")
            assert second["response"]["output"][0]["type"] == "message"
            await wait_for(lambda: sum(e["type"] == "response.done" for e in events) == 2, "both answers on the call")
        # The second prompt holds the call and the output the sideband gave.
        assert len(sent) == 2 and '"forecast": "sunny"' in sent[1] and '"forecast"' not in sent[0]
        kinds = [e["type"] for e in events]
        assert "response.function_call_arguments.done" in kinds and kinds.count("conversation.item.added") >= 4
    finally:
        await browser.close()


async def side_until(side: Any, kind: str) -> dict[str, Any]:
    while True:
        event = orjson.loads(await asyncio.wait_for(side.recv(), 120))
        check_event(event)
        assert event["type"] != "error", event
        if event["type"] == kind:
            return dict(event)
