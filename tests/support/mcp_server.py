"""A real MCP server for tests: the official ``mcp`` SDK's ``MCPServer`` over its
streamable HTTP transport, under uvicorn on 127.0.0.1 in a thread of its own
(its own event loop, so a test's loop and the gateway's never wait on it).

Its tools: ``forecast(city)`` (text), ``slow(seconds)`` (sleeps first),
``big(size)`` (a text of ``size`` bytes), ``fails()`` (an error result), and
``delete_city(city)`` (marked not read-only). ``requests`` records the headers,
and ``paths`` the path, of every HTTP request it received (to prove what the
gateway sent)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any, Literal

import uvicorn
from support.gateway import free_port


class McpTestServer:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.requests: list[dict[str, str]] = []  # each HTTP request's headers, lower-cased names
        self.paths: list[str] = []  # each HTTP request's path, as the server read it
        self.calls: list[tuple[str, dict[str, Any]]] = []  # each tool call: (name, arguments)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def _app(self) -> Any:
        from mcp.server.mcpserver import MCPServer
        from mcp.server.mcpserver.exceptions import ToolError
        from mcp.types import ToolAnnotations

        mcp = MCPServer("test-weather")
        calls = self.calls

        @mcp.tool(description="The forecast for a city")
        def forecast(city: Literal["Paris", "Oslo", "Lima"]) -> str:  # (an enum: a model's answer is short)
            calls.append(("forecast", {"city": city}))
            return f"sunny in {city}"

        @mcp.tool(description="Answers after a while")
        async def slow(seconds: float) -> str:
            calls.append(("slow", {"seconds": seconds}))
            await asyncio.sleep(seconds)
            return "late"

        @mcp.tool(description="A long text")
        def big(size: int) -> str:
            calls.append(("big", {"size": size}))
            return "x" * size

        @mcp.tool(description="Always fails")
        def fails() -> str:
            calls.append(("fails", {}))
            raise ToolError("the weather station is down")  # (its message reaches the client)

        @mcp.tool(description="Removes a city", annotations=ToolAnnotations(readOnlyHint=False))
        def delete_city(city: Literal["Paris", "Oslo", "Lima"]) -> str:
            calls.append(("delete_city", {"city": city}))
            return f"{city} deleted"

        app = mcp.streamable_http_app()
        requests, paths = self.requests, self.paths

        async def recorded(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                requests.append({k.decode().lower(): v.decode() for k, v in scope["headers"]})
                paths.append(scope["path"])
            await app(scope, receive, send)

        return recorded

    def start(self) -> None:
        config = uvicorn.Config(self._app(), host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self._server = server = uvicorn.Server(config)
        self._thread = threading.Thread(target=server.run, daemon=True, name="mcp-test-server")
        self._thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the MCP test server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)


@contextlib.contextmanager
def mcp_server() -> Iterator[McpTestServer]:
    server = McpTestServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
