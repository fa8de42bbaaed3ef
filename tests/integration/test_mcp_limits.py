"""What a session's MCP servers can cost the gateway (issue 33, findings 2, 6 and 7), against
real servers on 127.0.0.1: the official SDK's MCP server (tests/support/mcp_server.py), and
a server that takes connections and never answers (to hold listings open).

- one TLS context per process, none made per listing (a listing of an ``http://`` server
  makes none);
- listings run at most ``mcp_max_listings_per_session`` at once for a session and
  ``mcp_max_listings`` for the process; a label listed again cancels its listing under
  way; each listing is one client event of the tenant's;
- the allow-list is matched on the URL as it is requested (``/mcp/../admin`` is
  ``/admin``), and a tool's ``headers`` cannot steer the request (``Host``, hop-by-hop).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import orjson
import pytest
from support.gateway import Client, RunningGateway, connect, run_gateway
from support.two_tones import sha

from gateway.hosting.mcp import McpConnector, McpFailure, McpPolicy
from gateway.protocol.errors import Code
from gateway.settings import Settings

pytest.importorskip("mcp")
from support.mcp_server import McpTestServer, mcp_server

pytestmark = pytest.mark.timeout(120)

TENANT = "sk-mcp-limits-tenant"  # 3 client events a second
FREE = "sk-mcp-limits-free"  # no limits
AS_FREE = {"headers": {"Authorization": f"Bearer {FREE}"}}


@pytest.fixture(scope="module")
def server() -> Iterator[McpTestServer]:
    with mcp_server() as running:
        yield running


class Silent:
    """An HTTP server that reads requests and never answers: each MCP listing sent here holds
    its connection until the gateway gives up (or cancels it). Counts what it holds."""

    def __init__(self) -> None:
        self.open = 0
        self.most = 0
        self.accepted = 0
        self.closed_early = 0  # connections the client closed (a listing cancelled or failed)
        self.url = ""
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Silent:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/mcp"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        self.accepted += 1
        self.most = max(self.most, self.open)
        try:
            while await reader.read(65536):
                pass
            self.closed_early += 1
        except ConnectionError:
            self.closed_early += 1
        finally:
            self.open -= 1
            writer.close()


def mcp_tool(label: str, url: str, **extra: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": label, "server_url": url, "require_approval": "never", **extra}


async def until(predicate: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def gateway(allowed: tuple[str, ...], **kwargs: Any) -> Any:
    keys = orjson.dumps({"tenants": [{"name": "t", "key_sha256": sha(TENANT), "limits": {"events_per_s": 3}},
                                     {"name": "free", "key_sha256": sha(FREE)}]})  # fmt: skip
    settings = Settings(engine="passthrough", video_engine="none", keys_file=keys.decode(), mcp_allowed_urls=allowed,
                        metrics_public=True, **kwargs)  # fmt: skip
    return run_gateway(settings, vad_factory=None)


@pytest.fixture
async def silent() -> AsyncIterator[Silent]:
    async with Silent() as s:
        yield s


async def update(c: Client, tools: list[dict[str, Any]]) -> None:
    await c.send({"type": "session.update", "session": {"type": "realtime", "tools": tools}})


# --- TLS contexts ------------------------------------------------------------------


async def test_listings_make_no_tls_context_each(server: McpTestServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: a fresh TLS context (CA store loaded on the event loop: ~71 ms, 0.8 MiB) per
    listing, for http:// servers too."""
    made = []
    original = ssl.SSLContext.__new__

    def counting(cls: type, *args: Any, **kwargs: Any) -> Any:
        made.append(cls)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "__new__", counting)
    connector = McpConnector(McpPolicy(allowed_urls=(server.url,)))
    for i in range(12):
        assert await connector.list_tools(mcp_tool(f"s{i}", server.url))
    assert len(made) <= 1  # (one context, with no CA, for every http:// connection of the process)
    https = await connector.tls_context("https://mcp.example.com/mcp")
    assert https is await connector.tls_context("https://other.example.com/") and connector.tls_contexts_built == 1


# --- how many listings run ---------------------------------------------------------


async def test_listings_of_a_session_and_of_the_process_are_capped(silent: Silent) -> None:
    """12 servers in one update, two sessions: at most 4 listings of a session and 6 of the
    process hold a connection at once (was: all 24); the rest wait, then fail."""
    async with gateway((silent.url,), mcp_timeout_s=4, mcp_max_listings=6, mcp_max_listings_per_session=4) as gw:
        async with connect(gw.url, **AS_FREE) as a, connect(gw.url, **AS_FREE) as b:
            await update(a, [mcp_tool(f"a{i}", silent.url) for i in range(12)])
            await until(lambda: silent.open >= 4, "the first session's listings")
            await update(b, [mcp_tool(f"b{i}", silent.url) for i in range(12)])
            await until(lambda: silent.open >= 6, "the second session's")
            for c in (a, b):
                await c.wait_for(lambda e: e["type"] == "error" and e["error"]["code"] == Code.MCP_LIST_TOOLS_FAILED,
                                 timeout=30)  # fmt: skip
            assert silent.most == 6
            assert silent.accepted <= 12  # the others never connected: no place within the timeout


async def test_a_label_listed_again_cancels_its_listing_under_way(silent: Silent) -> None:
    async with gateway((silent.url,), mcp_timeout_s=60) as gw, connect(gw.url, **AS_FREE) as c:
        await update(c, [mcp_tool("x", silent.url)])
        await until(lambda: silent.open == 1, "the listing's connection")
        await update(c, [mcp_tool("x", silent.url + "/v2")])  # reached anew: listed again
        await until(lambda: silent.closed_early >= 1, "the superseded listing's connection to close")
        await until(lambda: silent.accepted == 2 and silent.open == 1, "the new listing alone")


async def test_each_listing_is_one_event_of_the_tenant(server: McpTestServer) -> None:
    async with gateway((server.url,)) as gw:
        async with connect(gw.url, headers={"Authorization": f"Bearer {TENANT}"}) as c:
            await c.wait_for("session.created")
            await update(c, [mcp_tool(f"s{i}", server.url) for i in range(6)])
            for _ in range(6):
                await c.wait_for(lambda e: e["type"] == "mcp_list_tools.completed", timeout=30)
                c.events.remove(next(e for e in c.events if e["type"] == "mcp_list_tools.completed"))
        metrics = (await gw_metrics(gw)).decode()
        line = next(x for x in metrics.splitlines() if x.startswith('omni_tenant_client_events_total{tenant="t"}'))
        assert float(line.split()[-1]) >= 7  # the update and its six listings (3 a second: two windows)


async def gw_metrics(gw: RunningGateway) -> bytes:
    import httpx

    async with httpx.AsyncClient(base_url=gw.http) as http:
        return (await http.get("/metrics")).content


# --- what a listing may reach and send ---------------------------------------------


@pytest.mark.parametrize("path", ["/mcp/../admin", "/mcp/./../admin", "/mcp/%2e%2e/admin", "/mcp/..%2Fadmin"])
async def test_dot_segments_do_not_escape_the_allow_list(server: McpTestServer, path: str) -> None:
    """Was: the prefix matched the URL as written, and the request went to /admin."""
    origin = server.url.removesuffix("/mcp")
    seen = len(server.paths)
    with pytest.raises(McpFailure, match=r"mcp_allowed_urls|percent-encoded"):
        await McpConnector(McpPolicy(allowed_urls=(server.url,))).list_tools(mcp_tool("x", origin + path))
    assert server.paths[seen:] == []  # nothing was requested at all
    listed = await McpConnector(McpPolicy(allowed_urls=(server.url,))).list_tools(mcp_tool("x", origin + "/x/../mcp"))
    assert listed and set(server.paths[seen:]) == {"/mcp"}  # a URL that resolves inside is listed, as resolved


@pytest.mark.parametrize("name", ["Host", "host", "Connection", "Transfer-Encoding", "X-Forwarded-For", "Forwarded",
                                  "Proxy-Authorization", "Content-Length", "bad name"])  # fmt: skip
async def test_a_tools_headers_may_not_steer_the_request(server: McpTestServer, name: str) -> None:
    from gateway.protocol.errors import ProtocolError
    from gateway.protocol.session_fields import mcp_tool as decode_mcp_tool

    with pytest.raises(ProtocolError) as info:  # refused when the session takes it
        decode_mcp_tool(mcp_tool("x", server.url, headers={name: "evil.example"}), "session.tools[0]")
    assert info.value.code == Code.INVALID_VALUE and info.value.param is not None
    assert info.value.param.startswith("session.tools[0].headers")
    seen = len(server.requests)
    with pytest.raises(McpFailure, match="may not set"):  # and never sent, whatever reaches the connector
        await McpConnector(McpPolicy(allowed_urls=(server.url,))).list_tools(
            mcp_tool("x", server.url, headers={name: "evil.example"})
        )
    assert server.requests[seen:] == []
    decode_mcp_tool(mcp_tool("x", server.url, headers={"X-Tenant-Key": "k", "Authorization": "Bearer t"}), "p")
