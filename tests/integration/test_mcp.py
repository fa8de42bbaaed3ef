"""MCP servers reached by the gateway, against a real MCP server (the official SDK's
streamable HTTP server, tests/support/mcp_server.py): the connector lists and calls
tools, within the operator's allow-list, timeout and size limit, sending the
session's headers and authorization and logging neither; and over a real socket the
official OpenAI SDK sees a server's tools listed (every event validated against its
models), or refused with a coded error. Calls made by a model run in
tests/vllm/test_vllm_mcp.py (a vLLM thinker)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import orjson
import pytest
from support.gateway import run_gateway
from support.sdk_shapes import check_event

from gateway.hosting.mcp import McpConnector, McpFailure, McpPolicy, _under
from gateway.protocol.errors import Code
from gateway.settings import Settings

pytest.importorskip("mcp")
from support.mcp_server import McpTestServer, mcp_server

pytestmark = pytest.mark.asyncio

SECRET_TOKEN = "tok-8c1f-secret"
SECRET_HEADER = "hdr-77aa-secret"


@pytest.fixture(scope="module")
def server() -> Iterator[McpTestServer]:
    with mcp_server() as running:
        yield running


def spec(server: McpTestServer, **extra: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "weather", "server_url": server.url, **extra}


def connector(server: McpTestServer, **policy: Any) -> McpConnector:
    return McpConnector(McpPolicy(allowed_urls=(server.url,), **policy))


async def test_a_servers_tools_are_listed_as_the_realtime_item_holds_them(server: McpTestServer) -> None:
    tools = {t["name"]: t for t in await connector(server).list_tools(spec(server))}
    assert set(tools) == {"forecast", "slow", "big", "fails", "delete_city"}
    assert tools["forecast"]["description"] == "The forecast for a city"
    assert tools["forecast"]["input_schema"]["required"] == ["city"]
    assert tools["delete_city"]["annotations"] == {"readOnlyHint": False}


async def test_a_call_returns_the_tools_text_and_a_failure_its_error(server: McpTestServer) -> None:
    conn = connector(server)
    assert await conn.call_tool(spec(server), "forecast", '{"city": "Oslo"}') == "sunny in Oslo"
    with pytest.raises(McpFailure) as info:
        await conn.call_tool(spec(server), "fails", "{}")
    assert info.value.error["type"] == "tool_execution_error" and "station is down" in info.value.error["message"]
    with pytest.raises(McpFailure, match="not JSON"):
        await conn.call_tool(spec(server), "forecast", "{city")


async def test_the_sessions_headers_and_authorization_reach_the_server_and_no_log(
    server: McpTestServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    seen = len(server.requests)
    secret_spec = spec(server, authorization=SECRET_TOKEN, headers={"X-Tenant-Key": SECRET_HEADER})
    await connector(server).call_tool(secret_spec, "forecast", '{"city": "Oslo"}')
    sent = server.requests[seen:]
    assert sent and all(r.get("authorization") == f"Bearer {SECRET_TOKEN}" for r in sent)
    assert all(r.get("x-tenant-key") == SECRET_HEADER for r in sent)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert SECRET_TOKEN not in logged and SECRET_HEADER not in logged


async def test_a_slow_server_fails_at_the_timeout(server: McpTestServer) -> None:
    with pytest.raises(McpFailure, match="did not answer within 1 s"):
        await connector(server, timeout_s=1.0).call_tool(spec(server), "slow", '{"seconds": 30}')


async def test_a_result_past_the_size_limit_fails(server: McpTestServer) -> None:
    with pytest.raises(McpFailure, match="more than 65536 bytes"):
        await connector(server, max_result_bytes=65536).call_tool(spec(server), "big", '{"size": 2000000}')
    assert len(await connector(server).call_tool(spec(server), "big", '{"size": 60000}')) == 60000


async def test_internal_addresses_need_the_operators_allow_list(server: McpTestServer) -> None:
    anywhere = McpConnector(McpPolicy(allowed_urls=("*",)))
    with pytest.raises(McpFailure, match="non-public address"):
        await anywhere.list_tools(spec(server))
    for url in ("http://localhost:1/mcp", "http://10.1.2.3/mcp", "http://169.254.169.254/latest", "http://[::1]/"):
        with pytest.raises(McpFailure, match="non-public address"):
            await anywhere.check_url(url)
    elsewhere = McpConnector(McpPolicy(allowed_urls=("https://mcp.example.com/",)))
    with pytest.raises(McpFailure, match="not in this gateway's mcp_allowed_urls"):
        await elsewhere.list_tools(spec(server))
    with pytest.raises(McpFailure, match="MCP is off"):
        await McpConnector(McpPolicy(allowed_urls=())).list_tools(spec(server))
    assert _under("https://a.com/mcp", "https://a.com") and not _under("https://a.com.evil.net/", "https://a.com")
    assert _under(server.url, f"http://127.0.0.1:{server.port}/")


async def test_an_unreachable_server_fails_with_a_reason(server: McpTestServer) -> None:
    from support.gateway import free_port

    url = f"http://127.0.0.1:{free_port()}/mcp"
    with pytest.raises(McpFailure, match=r"could not be reached|connection failed"):
        await McpConnector(McpPolicy(allowed_urls=(url,), timeout_s=5)).list_tools({"server_url": url})


# --- over a real socket, with the official SDK ---------------------------------------------


async def events_until(conn: Any, last: str) -> list[Any]:
    seen = []
    while True:
        raw = await conn.recv_bytes()
        check_event(orjson.loads(raw))  # strictly what the SDK's models accept
        event = conn.parse_event(raw)
        seen.append(event)
        if event.type == last:
            return seen


def settings(**extra: Any) -> Settings:
    return replace(Settings(engine="passthrough", video_engine="none"), **extra)


async def test_the_official_sdk_sees_a_servers_tools_listed(server: McpTestServer) -> None:
    openai = pytest.importorskip("openai")
    async with run_gateway(settings(mcp_allowed_urls=(server.url,)), vad_factory=None) as gw:
        client = openai.AsyncOpenAI(api_key="sk-unused", websocket_base_url=f"ws://127.0.0.1:{gw.port}/v1")
        async with client.realtime.connect(model="omni-cascade") as conn:
            await conn.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                               "tools": [spec(server, authorization=SECRET_TOKEN)]})  # fmt: skip
            events = await events_until(conn, "mcp_list_tools.completed")
            updated = next(e for e in events if e.type == "session.updated")
            assert SECRET_TOKEN not in json.dumps(updated.model_dump())
            added = next(e for e in events if e.type == "conversation.item.added")
            assert added.item.type == "mcp_list_tools" and added.item.server_label == "weather"
            (done,) = [e for e in await events_until(conn, "conversation.item.done")]
            assert done.item.type == "mcp_list_tools" and done.item.id == added.item.id
            assert {t.name for t in done.item.tools} >= {"forecast", "delete_city"}


async def test_a_refused_server_is_answered_with_a_coded_error(server: McpTestServer) -> None:
    openai = pytest.importorskip("openai")
    async with run_gateway(settings(), vad_factory=None) as gw:  # default allow-list: public addresses only
        client = openai.AsyncOpenAI(api_key="sk-unused", websocket_base_url=f"ws://127.0.0.1:{gw.port}/v1")
        async with client.realtime.connect(model="omni-cascade") as conn:
            await conn.session.update(session={"type": "realtime", "tools": [spec(server)]})
            events = await events_until(conn, "conversation.item.done")
            kinds = [e.type for e in events]
            assert "mcp_list_tools.failed" in kinds and "mcp_list_tools.completed" not in kinds
            error = next(e for e in events if e.type == "error").error
            assert (error.code, error.param) == (Code.MCP_LIST_TOOLS_FAILED, "session.tools[0]")
            assert "mcp_allowed_urls" in error.message
            # the session goes on: a response is answered, offering no MCP tool
            await conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
            )
            await conn.response.create()
            done = (await events_until(conn, "response.done"))[-1]
            assert done.response.status == "completed"
