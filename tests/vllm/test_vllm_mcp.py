"""MCP tools run by the gateway, with a vLLM thinker on the CPU and a real MCP server
(the official SDK's streamable HTTP server, tests/support/mcp_server.py), driven by
the official OpenAI SDK with every event validated against its models: the server's
tools are listed, the model's call (constrained by vLLM's structured outputs to the
tool's schema) runs on the server inside the response, and the same response goes
on with the result in the model's prompt; with ``require_approval`` the response
waits for the client's ``mcp_approval_response``, as OpenAI's own example client
(openai-ruby's examples/realtime/mcp_approval.rb) expects."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

import orjson
import pytest
import pytest_asyncio
from support.gateway import RunningGateway, run_gateway
from support.sdk_shapes import check_event
from vllm_support import prompts

from gateway.settings import Settings
from orchestrator.engines.vllm_engine import VllmEngine

pytest.importorskip("mcp")
from support.mcp_server import McpTestServer, mcp_server

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]

CITIES = ("Paris", "Oslo", "Lima")


@pytest.fixture(scope="module")
def server() -> Iterator[McpTestServer]:
    with mcp_server() as running:
        yield running


@pytest_asyncio.fixture(loop_scope="session")
async def gw(vllm_engine: VllmEngine, server: McpTestServer) -> AsyncIterator[RunningGateway]:
    engine = VllmEngine(vllm_engine.model, llm=vllm_engine.llm, sampling={"seed": 0})
    settings = Settings(engine="passthrough", model="tiny", video_engine="none", mcp_allowed_urls=(server.url,))
    async with run_gateway(replace(settings, detach_grace_s=0.2), engine=engine, vad_factory=None) as running:
        yield running


def tool(server: McpTestServer, approval: str) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "weather", "server_url": server.url, "require_approval": approval,
            "allowed_tools": ["forecast"], "authorization": "tok-e2e"}  # fmt: skip


async def until(conn: Any, seen: list[Any], done: str) -> Any:
    while True:
        raw = await conn.recv_bytes()
        check_event(orjson.loads(raw))  # strictly what the SDK's models accept
        event = conn.parse_event(raw)
        seen.append(event)
        assert event.type != "error", event
        if event.type == done:
            return event


async def open_session(conn: Any, server: McpTestServer, approval: str) -> None:
    await conn.session.update(session={"type": "realtime", "output_modalities": ["text"], "max_output_tokens": 48,
                                       "tools": [tool(server, approval)]})  # fmt: skip
    listed = await until(conn, [], "mcp_list_tools.completed")
    item = await until(conn, [], "conversation.item.done")
    assert item.item.type == "mcp_list_tools" and item.item.id == listed.item_id
    assert "forecast" in [t.name for t in item.item.tools]
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]}
    )
    await conn.response.create(response={"tool_choice": {"type": "mcp", "server_label": "weather",
                                                         "name": "forecast"}})  # fmt: skip


async def test_a_models_call_runs_on_the_server_and_the_response_speaks_the_result(
    gw: RunningGateway, vllm_engine: VllmEngine, server: McpTestServer
) -> None:
    openai = pytest.importorskip("openai")
    client = openai.AsyncOpenAI(api_key="sk-unused", websocket_base_url=f"ws://127.0.0.1:{gw.port}/v1")
    calls_before = len(server.calls)
    seen: list[Any] = []
    with prompts(vllm_engine) as sent:
        async with client.realtime.connect(model="tiny") as conn:
            await open_session(conn, server, "never")
            done = await until(conn, seen, "response.done")
    kinds = [e.type for e in seen]
    for a, b in [("response.output_item.added", "response.mcp_call_arguments.delta"),
                 ("response.mcp_call_arguments.delta", "response.mcp_call_arguments.done"),
                 ("response.mcp_call_arguments.done", "response.mcp_call.in_progress"),
                 ("response.mcp_call.in_progress", "response.mcp_call.completed")]:  # fmt: skip
        assert kinds.index(a) < kinds.index(b), kinds
    assert kinds.count("response.created") == 1  # one response: the call and what follows it
    assert done.response.status in ("completed", "incomplete")
    call, *after = done.response.output
    assert call.type == "mcp_call" and call.server_label == "weather" and call.name == "forecast"
    city = json.loads(call.arguments)["city"]
    assert city in CITIES and call.output == f"sunny in {city}" and call.error is None
    assert server.calls[calls_before:] == [("forecast", {"city": city})]  # the server ran it, once
    assert server.requests[-1].get("authorization") == "Bearer tok-e2e"
    assert after and after[0].type == "message"  # the same response went on
    assert len(sent) == 2 and f"sunny in {city}" in sent[1] and "sunny in" not in sent[0]


async def test_an_approved_call_runs_after_the_clients_answer(
    gw: RunningGateway, vllm_engine: VllmEngine, server: McpTestServer
) -> None:
    openai = pytest.importorskip("openai")
    client = openai.AsyncOpenAI(api_key="sk-unused", websocket_base_url=f"ws://127.0.0.1:{gw.port}/v1")
    calls_before = len(server.calls)
    seen: list[Any] = []
    async with client.realtime.connect(model="tiny") as conn:
        await open_session(conn, server, "always")
        while True:  # the approval request comes whole, as a finished item
            item = await until(conn, seen, "conversation.item.done")
            if item.item.type == "mcp_approval_request":
                break
        asked = item.item
        assert asked.name == "forecast" and json.loads(asked.arguments)["city"] in CITIES
        assert len(server.calls) == calls_before  # nothing ran before the answer
        assert "response.done" not in [e.type for e in seen]  # the response waits for it
        await conn.conversation.item.create(item={"type": "mcp_approval_response", "approval_request_id": asked.id,
                                                  "approve": True, "reason": "ok"})  # fmt: skip
        done = await until(conn, seen, "response.done")
    call = next(o for o in done.response.output if o.type == "mcp_call")
    assert call.approval_request_id == asked.id and call.arguments == asked.arguments
    assert call.output == f"sunny in {json.loads(asked.arguments)['city']}"
    assert [o.type for o in done.response.output][:2] == ["mcp_approval_request", "mcp_call"]
    assert len(server.calls) == calls_before + 1
