"""Function calling through vLLM on the CPU: the tiny random-weight model,
constrained by vLLM's structured outputs, returns calls whose arguments
validate against the function's schema; vLLM's tool parsers read ``auto``
answers; and the official OpenAI SDK drives the whole loop through the
gateway (call, function_call_output, the answer that sees both)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from support.gateway import RunningGateway
from support.sdk_shapes import check_event
from vllm_support import collect, finished, no_input, prompts, user

from orchestrator.engine import (
    FunctionTool,
    Message,
    ResponseRequest,
    TextDelta,
    ToolCallDelta,
    ToolChoice,
)
from orchestrator.engines.cascade import CascadeEngine
from orchestrator.engines.vllm_engine import VllmEngine, VllmThinker

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]

CITIES = ["Paris", "Oslo", "Lima"]
WEATHER = FunctionTool(
    "get_weather",
    "The weather in a city",
    {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": CITIES}, "days": {"type": "integer", "enum": [1, 2, 3]}},
        "required": ["city", "days"],
        "additionalProperties": False,
    },
)
TIME = FunctionTool(
    "get_time",
    "The time in a city",
    {"type": "object", "properties": {"city": {"type": "string", "enum": CITIES}}, "required": ["city"],
     "additionalProperties": False},
)  # fmt: skip


def valid_weather(arguments: str) -> dict[str, Any]:
    args = json.loads(arguments)
    assert set(args) == {"city", "days"} and args["city"] in CITIES and args["days"] in (1, 2, 3), args
    return args


def calls(outs: list[Any]) -> dict[int, dict[str, Any]]:
    """The calls in ``outs``, by index: call_id, name and the joined arguments."""
    found: dict[int, dict[str, Any]] = {}
    for o in outs:
        if isinstance(o, ToolCallDelta):
            call = found.setdefault(o.index, {"call_id": o.call_id, "name": o.name, "arguments": ""})
            call["arguments"] += o.arguments
    return found


def request(choice: ToolChoice, **kwargs: Any) -> ResponseRequest:
    kwargs.setdefault("max_output_tokens", 64)
    return ResponseRequest(
        "tools-" + choice.mode, user("What is the weather in Paris?"), modalities=("text",), tools=(WEATHER, TIME),
        tool_choice=choice, **kwargs,
    )  # fmt: skip


async def test_a_named_function_returns_one_call_whose_arguments_validate(vllm_engine: VllmEngine) -> None:
    outs = await collect(vllm_engine.respond(request(ToolChoice("function", "get_weather")), no_input()))
    assert finished(outs).reason == "stop"
    found = calls(outs)
    assert list(found) == [0] and found[0]["name"] == "get_weather" and found[0]["call_id"]
    valid_weather(found[0]["arguments"])
    assert not [o for o in outs if isinstance(o, TextDelta)]


async def test_required_returns_a_call_of_one_of_the_tools(vllm_engine: VllmEngine) -> None:
    outs = await collect(vllm_engine.respond(request(ToolChoice("required"), parallel_tool_calls=False), no_input()))
    finished(outs)
    found = calls(outs)
    assert list(found) == [0], found
    call = found[0]
    assert call["name"] in ("get_weather", "get_time")
    args = json.loads(call["arguments"])
    assert args["city"] in CITIES


async def test_auto_without_a_tool_parser_answers_in_text_and_offers_no_tools(vllm_engine: VllmEngine) -> None:
    with prompts(vllm_engine) as seen:
        outs = await collect(vllm_engine.respond(request(ToolChoice("auto")), no_input()))
    assert not calls(outs)
    assert "".join(o.text for o in outs if isinstance(o, TextDelta)).strip()
    assert "get_weather" not in seen[-1]


async def test_auto_with_vllms_hermes_parser_renders_the_tools_into_the_prompt(vllm_engine: VllmEngine) -> None:
    engine = VllmEngine(vllm_engine.model, llm=vllm_engine.llm, tool_parser="hermes", sampling={"seed": 0})
    await engine.start()
    with prompts(vllm_engine) as seen:
        outs = await collect(engine.respond(request(ToolChoice("auto")), no_input()))
    finished(outs)
    assert '"name": "get_weather"' in seen[-1] and "You may call these functions" in seen[-1]
    # The random model does not call: its text passes through the parser as content.
    assert "".join(o.text for o in outs if isinstance(o, TextDelta)).strip()


async def test_the_cascade_passes_tools_to_a_vllm_thinker(vllm_engine: VllmEngine) -> None:
    engine = CascadeEngine(thinker=VllmThinker(VllmEngine(vllm_engine.model, llm=vllm_engine.llm), max_tokens=64))
    await engine.start()
    try:
        assert "tools" not in engine.info.ignored_fields
        outs = await collect(engine.respond(request(ToolChoice("function", "get_weather"), voice=None), no_input()))
    finally:
        await engine.close()
    finished(outs)
    valid_weather(calls(outs)[0]["arguments"])


SDK_TOOL = {
    "type": "function",
    "name": WEATHER.name,
    "description": WEATHER.description,
    "parameters": dict(WEATHER.parameters),
}


async def test_the_official_sdk_drives_a_whole_tool_loop(gw: RunningGateway, vllm_engine: VllmEngine) -> None:
    openai = pytest.importorskip("openai")
    client = openai.AsyncOpenAI(api_key="sk-unused", websocket_base_url=f"ws://127.0.0.1:{gw.port}/v1")
    seen: list[str] = []

    async def until_done(conn: Any) -> Any:
        while True:
            raw = await conn.recv_bytes()
            check_event(orjson.loads(raw))  # strictly what the SDK's models accept
            event = conn.parse_event(raw)
            seen.append(event.type)
            assert event.type != "error", event
            if event.type == "response.done":
                return event

    with prompts(vllm_engine) as sent:
        async with client.realtime.connect(model="tiny") as conn:
            await conn.session.update(
                session={"type": "realtime", "output_modalities": ["text"], "tools": [SDK_TOOL],
                         "tool_choice": {"type": "function", "name": "get_weather"}, "max_output_tokens": 64}
            )  # fmt: skip
            await conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]}
            )
            await conn.response.create()
            first = await until_done(conn)
            assert first.response.status == "completed"
            call = first.response.output[0]
            assert call.type == "function_call" and call.name == "get_weather"
            args = valid_weather(call.arguments)
            assert seen.index("response.output_item.added") < seen.index("response.function_call_arguments.delta")
            assert "response.function_call_arguments.done" in seen
            result = json.dumps({"city": args["city"], "forecast": "sunny"})
            await conn.conversation.item.create(
                item={"type": "function_call_output", "call_id": call.call_id, "output": result}
            )
            await conn.response.create(response={"tool_choice": "none"})
            second = await until_done(conn)
    assert second.response.status in ("completed", "incomplete")
    answer = second.response.output[0]
    assert answer.type == "message" and answer.content[0].text
    # The second prompt holds the call and its output.
    assert len(sent) == 2
    assert '"arguments": ' + json.dumps(args) in sent[1]
    assert '"forecast": "sunny"' in sent[1] and '"forecast"' not in sent[0]


async def test_messages_with_calls_render_through_the_chat_template(vllm_engine: VllmEngine) -> None:
    from orchestrator.engine import ToolCall
    from orchestrator.engines.vllm_engine import render_conversation

    conversation = (
        Message("user", "Weather?"),
        Message("assistant", "", tool_calls=(ToolCall("c1", "get_weather", '{"city": "Oslo", "days": 1}'),)),
        Message("tool", "rain", tool_call_id="c1"),
    )
    text = vllm_engine.tokenizer.decode(render_conversation(vllm_engine.tokenizer, conversation, ""))
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "days": 1}}</tool_call>' in text
    assert "rain" in text


async def test_the_remote_engine_reads_an_upstreams_calls_and_sends_calls_back(
    gw: RunningGateway, vllm_engine: VllmEngine
) -> None:
    """A remote engine on an upstream gateway that serves vLLM: the upstream's
    function_call events become ToolCallDeltas; a conversation holding a call and
    its output reaches the upstream model's prompt."""
    from orchestrator.engine import ToolCall
    from orchestrator.engines.remote import RemoteEngine

    remote = RemoteEngine([gw.http])
    await remote.start()
    try:
        outs = await collect(remote.respond(request(ToolChoice("function", "get_weather")), no_input()))
        found = calls(outs)
        assert found[0]["name"] == "get_weather" and found[0]["call_id"]
        valid_weather(found[0]["arguments"])
        history = (
            *user("Weather?"),
            Message("assistant", "", tool_calls=(ToolCall("call_7", "get_weather", '{"city": "Lima", "days": 2}'),)),
            Message("tool", "cloudy all day", tool_call_id="call_7"),
        )
        with prompts(vllm_engine) as sent:
            outs = await collect(remote.respond(ResponseRequest("after", history, modalities=("text",),
                                                                max_output_tokens=16), no_input()))  # fmt: skip
        finished(outs)
        assert "cloudy all day" in sent[-1] and '"city": "Lima"' in sent[-1]
    finally:
        await remote.close()
