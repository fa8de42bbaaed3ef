"""MCP servers, reached for the sessions of this replica: list their tools, call them.

The session decides (gateway/session/mcp.py and responses.py); this is the
I/O it asks for (effects ``ListMcpTools`` and ``CallMcpTool``), with the
official ``mcp`` SDK's streamable HTTP client (the ``mcp`` extra). Each
listing and each call is one MCP connection (initialize, the request, close):
nothing is held between calls, so nothing leaks between sessions.

What bounds an outbound call, each an operator setting (docs/tools.md, "MCP tools"):

- ``mcp_allowed_urls``: the URLs the gateway may connect to, as prefixes
  (``https://mcp.example.com/``), or ``*`` for any URL whose host resolves
  only to public addresses. A host that resolves to a loopback, private,
  link-local or otherwise non-public address is refused unless a prefix names
  its URL. Empty: MCP is off. Checked before every connection, on the URL as
  it will be requested (``normalized``: scheme and host lower-cased, the
  default port dropped, dot-segments resolved; a URL with credentials, a
  backslash or a percent-encoded dot, slash or backslash in its path is
  refused, since servers disagree on what those mean), and that normalized
  URL is the one connected to.
- ``mcp_timeout_s``: one listing or call, connect to answer; past it, failed.
- ``mcp_max_result_bytes``: what the gateway reads from a server for one
  listing or call (the HTTP bodies, counted as they arrive); past it the
  connection is dropped and the listing or call fails.
- ``mcp_max_listings`` (per process) and ``mcp_max_listings_per_session``:
  listings running at once; one more waits for a place, at most
  ``mcp_timeout_s``, then fails (``the gateway's MCP listings are busy``). A
  session holds at most four times its share running or waiting; past that a
  listing fails at once (the host's ``_list_anew``). Each listing is charged to
  the session's tenant as one client event (``events_per_s``), waiting for its
  budget within the same bound.

The SDK (and the pydantic models it builds: seconds of CPU) is imported on the
first listing or call, in a worker thread, never on the event loop.

One TLS context serves every ``https://`` connection of the process (built once,
in a worker thread: loading the CA store takes tens of milliseconds and most of
a megabyte); a ``http://`` connection gets a context with no CA loaded, made
once (never used: nothing is encrypted, and a redirect to ``https://`` could not
be verified with it).

A server's ``authorization`` goes as ``Authorization: Bearer``, its
``headers`` as given, but never one that steers the request (``Host``,
hop-by-hop and forwarding headers, the body's framing: ``forbidden_header``);
neither is logged (this module logs the server's label only, and quiets the
HTTP client's per-request log lines, which carry URLs).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import re
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

from gateway.protocol.session_fields import forbidden_header

log = logging.getLogger("omni.mcp")

MAX_LISTED_TOOLS = 256  # tools one server may list; more: the listing fails (narrow it on the server)

# The HTTP client logs every request's URL at INFO (a URL may carry a token): not ours to log.
for _name in ("httpx2", "httpx", "mcp.client.streamable_http"):
    logging.getLogger(_name).setLevel(logging.WARNING)


class McpFailure(Exception):
    """A listing or call that did not happen: ``error`` is the SDK's error object
    (``protocol_error``, ``tool_execution_error`` or ``http_error``), ``str()`` a
    sentence a person can act on."""

    def __init__(self, message: str, error: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.error = error or {"type": "tool_execution_error", "message": message}


@dataclass(frozen=True, slots=True)
class McpPolicy:
    """What outbound MCP connections may do (the settings of the same names)."""

    allowed_urls: tuple[str, ...] = ("*",)
    timeout_s: float = 30.0
    max_result_bytes: int = 1 << 20
    max_listings: int = 32  # listings running at once in the process
    max_listings_per_session: int = 4  # ... and for one session


_ENCODED_SEPARATOR = re.compile(r"%(2e|2f|5c)", re.IGNORECASE)


def normalized(url: str) -> str:
    """``url`` as it will be requested: scheme and host lower-cased, the default port
    dropped, the path's dot-segments resolved (RFC 3986, 5.2.4), the fragment dropped.
    Raises ``McpFailure`` for what servers read differently (credentials in the URL, a
    backslash, a percent-encoded dot, slash or backslash in the path) or is not a URL."""
    if "\\" in url or any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in url):
        raise McpFailure("its server_url holds a backslash, a space or a control character")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise McpFailure("its server_url is not a URL") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise McpFailure("its server_url is not an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise McpFailure("its server_url carries credentials (user:password@): send them as authorization")
    if _ENCODED_SEPARATOR.search(parts.path):
        raise McpFailure("its server_url's path holds a percent-encoded '.', '/' or '\\'")
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    if port is not None and port != (443 if scheme == "https" else 80):
        host = f"{host}:{port}"
    return urlunsplit((scheme, host, _remove_dot_segments(parts.path) or "/", parts.query, ""))


def _remove_dot_segments(path: str) -> str:
    out: list[str] = []
    segments = path.split("/")
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment == "..":
            if len(out) > 1:
                out.pop()
            if last:
                out.append("")
        elif segment == ".":
            if last:
                out.append("")
        else:
            out.append(segment)
    return "/".join(out)


def _under(url: str, prefix: str) -> bool:
    """``url`` is ``prefix`` or below it (a prefix ends at a path boundary: ``https://a.com``
    does not cover ``https://a.com.evil.net``)."""
    if not url.startswith(prefix):
        return False
    rest = url[len(prefix) :]
    return not rest or prefix.endswith("/") or rest[0] in "/?#"


class McpConnector:
    """See the module docstring. ``available``: the SDK is installed (else every listing
    fails, saying which extra to install)."""

    def __init__(self, policy: McpPolicy) -> None:
        self.policy = policy
        self._prefixes = tuple(_prefix(p) for p in policy.allowed_urls if p != "*")
        # Whether the SDK is installed, found without importing it (it imports OpenTelemetry,
        # which a gateway with tracing off never loads): imported on the first listing.
        import importlib.util

        self.available = all(importlib.util.find_spec(m) is not None for m in ("mcp", "httpx2"))
        self._sse_limit: bool | None = None
        self._imported: asyncio.Future[None] | None = None  # the SDK, imported once in a worker thread
        self._tls: asyncio.Future[ssl.SSLContext] | None = None  # https://: one per process, built once
        self._plain: ssl.SSLContext | None = None  # http://: no CA loaded, never used
        self._slots: asyncio.Semaphore | None = None  # listings running in the process
        self.tls_contexts_built = 0  # (what the tests count: once per process at most)

    async def imported(self) -> None:
        """The SDK imported (once per process, in a worker thread: it builds hundreds of
        pydantic models, seconds of CPU that must not stop every session)."""
        if self._imported is None:
            self._imported = asyncio.ensure_future(asyncio.to_thread(_import_sdk))
        await asyncio.shield(self._imported)

    async def tls_context(self, url: str) -> ssl.SSLContext:
        """The TLS context for ``url``'s connection (see the module docstring)."""
        if not url.startswith("https:"):
            if self._plain is None:
                self._plain = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # (verifies, with no CA: nothing passes)
            return self._plain
        if self._tls is None:
            import httpx2

            self._tls = asyncio.ensure_future(asyncio.to_thread(httpx2.create_ssl_context))
            self.tls_contexts_built += 1
        return await asyncio.shield(self._tls)

    @property
    def sse_limit(self) -> bool:
        """Whether the SDK bounds an SSE event itself (``max_sse_event_size``: mcp 2.3 on),
        checked once."""
        if self._sse_limit is None:
            import inspect

            from mcp.client.streamable_http import streamable_http_client

            self._sse_limit = "max_sse_event_size" in inspect.signature(streamable_http_client).parameters
        return self._sse_limit

    # --- what the host asks ------------------------------------------------------------

    @property
    def max_outstanding_per_session(self) -> int:
        """Listings a session may have running or waiting; more fail at once."""
        return 4 * self.policy.max_listings_per_session

    async def list_tools(
        self,
        server: dict[str, Any],
        *,
        session_slots: asyncio.Semaphore | None = None,
        charge: Callable[[], Awaitable[None]] | None = None,
    ) -> list[dict[str, Any]]:
        """The server's tools, as the Realtime API's ``mcp_list_tools`` item holds them.
        ``session_slots``: the session's places for listings; ``charge``: what the listing
        costs its tenant (awaited before it connects). Waiting for either and for a place in
        the process takes at most the timeout; then it fails, having connected nowhere."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.policy.max_listings)
        async with contextlib.AsyncExitStack() as held:
            try:
                async with asyncio.timeout(self.policy.timeout_s):
                    if session_slots is not None:
                        await held.enter_async_context(session_slots)
                    await held.enter_async_context(self._slots)
                    if charge is not None:
                        await charge()
            except TimeoutError:
                raise McpFailure(
                    f"the gateway's MCP listings are busy (no place within {self.policy.timeout_s:g} s: "
                    "mcp_max_listings, mcp_max_listings_per_session, or the tenant's events_per_s)"
                ) from None
            return await self._list(server)

    async def _list(self, server: dict[str, Any]) -> list[dict[str, Any]]:
        async with self._session(server) as session:
            tools: list[dict[str, Any]] = []
            cursor: str | None = None
            while True:
                from mcp.types import PaginatedRequestParams

                page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
                for tool in page.tools:
                    entry: dict[str, Any] = {"name": tool.name, "input_schema": tool.input_schema}
                    if tool.description:
                        entry["description"] = tool.description
                    if tool.annotations is not None:
                        entry["annotations"] = tool.annotations.model_dump(by_alias=True, exclude_none=True)
                    tools.append(entry)
                if len(tools) > MAX_LISTED_TOOLS:
                    raise McpFailure(f"the server lists more than {MAX_LISTED_TOOLS} tools")
                cursor = page.next_cursor
                if not cursor:
                    return tools

    async def call_tool(self, server: dict[str, Any], name: str, arguments: str) -> str:
        """The tool's output as text (its text contents joined; other contents, and
        structured content with no text, as JSON). Raises ``McpFailure``."""
        try:
            args = json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            raise McpFailure(f"the model's arguments are not JSON ({exc})") from None
        if not isinstance(args, dict):
            raise McpFailure("the model's arguments are not a JSON object")
        async with self._session(server) as session:
            result = await session.call_tool(name, args)
        content = getattr(result, "content", None) or []
        texts = [c.text if getattr(c, "type", None) == "text" else json.dumps(c.model_dump(mode="json"))
                 for c in content]  # fmt: skip
        structured = getattr(result, "structured_content", None)
        text = "\n".join(texts) if texts else json.dumps(structured) if structured is not None else ""
        if getattr(result, "is_error", False):
            raise McpFailure(text or "the tool failed", {"type": "tool_execution_error", "message": text})
        return text

    # --- one connection -------------------------------------------------------------------

    def _session(self, server: dict[str, Any]) -> Any:
        return _Connection(self, server)

    async def check_url(self, url: str) -> str:
        """The URL to connect to (``normalized``), if the operator's allow-list covers it;
        else ``McpFailure``."""
        allowed = self.policy.allowed_urls
        if not allowed:
            raise McpFailure("MCP is off on this gateway (mcp_allowed_urls is empty)")
        url = normalized(url)
        if any(_under(url, prefix) for prefix in self._prefixes):
            return url
        if "*" not in allowed:
            raise McpFailure("its server_url is not in this gateway's mcp_allowed_urls")
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port)
        except OSError:
            raise McpFailure(f"its host {host!r} does not resolve") from None
        for info in infos:
            address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
            if not address.is_global or address.is_multicast:
                raise McpFailure(
                    f"its host {host!r} resolves to a non-public address, which this gateway reaches only "
                    "where mcp_allowed_urls lists the URL"
                )
        return url


def _import_sdk() -> None:
    import httpx2  # noqa: F401
    import mcp.client.streamable_http
    import mcp.types  # noqa: F401


def _prefix(prefix: str) -> str:
    """An allow-list entry as URLs are compared with it (``normalized``, keeping a bare
    origin's missing slash: ``https://a.com`` still ends at the host)."""
    try:
        out = normalized(prefix)
    except McpFailure:
        return prefix  # (not a URL: it covers nothing normalized URLs start with, as before)
    return out[:-1] if out.endswith("/") and not prefix.endswith("/") else out


class _Connection:
    """``async with``: an initialized MCP client session to one server, within the
    policy's timeout and byte limit; failures come out as ``McpFailure``."""

    def __init__(self, connector: McpConnector, server: dict[str, Any]) -> None:
        self._connector = connector
        self._server = server
        self._url: str = server["server_url"]  # normalized once checked
        self._stack: Any = None
        self._bounded: _Bounded | None = None

    async def __aenter__(self) -> Any:
        connector = self._connector
        if not connector.available:
            raise McpFailure("the gateway has no MCP client (install omni-realtime-gateway[mcp])")
        self._url = await connector.check_url(self._server["server_url"])
        await connector.imported()
        self._stack = stack = contextlib.AsyncExitStack()
        try:
            async with asyncio.timeout(connector.policy.timeout_s):  # (in this task: anyio's scopes need it)
                return await self._open(stack)
        except BaseException as exc:
            error = exc
            try:
                await stack.aclose()
            except BaseException as closing:  # anyio's task group: what failed in it comes out here
                error = closing
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # cancelled from outside (the response ended): not a failure to report
            raise _failure(error, connector.policy, self._bounded) from None

    async def _open(self, stack: Any) -> Any:
        import httpx2
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        policy = self._connector.policy
        headers = dict(self._server.get("headers") or {})
        steering = next((name for name in headers if forbidden_header(name)), None)
        if steering is not None:  # (refused when the session took it: this is a second guard)
            raise McpFailure(f"its headers may not set {steering!r}")
        if self._server.get("authorization"):
            headers["Authorization"] = f"Bearer {self._server['authorization']}"
        tls = await self._connector.tls_context(self._url)
        self._bounded = bounded = _Bounded(httpx2.AsyncHTTPTransport(verify=tls), policy.max_result_bytes)
        http = await stack.enter_async_context(
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(policy.timeout_s), transport=cast(Any, bounded))
        )
        # (the byte bound is the transport's; the SDK's own per-event bound, where it has one, too)
        extra: dict[str, Any] = {"max_sse_event_size": policy.max_result_bytes} if self._connector.sse_limit else {}
        streams = await stack.enter_async_context(streamable_http_client(self._url, http_client=http, **extra))
        session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
        await session.initialize()
        return _Timed(session, policy, bounded)

    async def __aexit__(self, *exc: object) -> None:
        if self._stack is not None:
            try:
                async with asyncio.timeout(5.0):
                    await self._stack.aclose()
            except Exception:  # closing a connection that failed: nothing more to say
                log.debug("MCP server %s: close failed", self._server.get("server_label"), exc_info=True)


class _Timed:
    """The client session's requests, each within the timeout, failures as ``McpFailure``."""

    def __init__(self, session: Any, policy: McpPolicy, bounded: _Bounded) -> None:
        self._session = session
        self._policy = policy
        self._bounded = bounded

    async def list_tools(self, **kwargs: Any) -> Any:
        return await self._call(self._session.list_tools(**kwargs))

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        return await self._call(self._session.call_tool(name, arguments))

    async def _call(self, request: Any) -> Any:
        try:
            async with asyncio.timeout(self._policy.timeout_s):
                return await request
        except McpFailure:
            raise
        except Exception as exc:
            raise _failure(exc, self._policy, self._bounded) from None


class _TooLarge(Exception):
    pass


class _Bounded:
    """An HTTP transport whose response bodies may hold ``limit`` bytes in all, for the
    whole connection (a listing or call): past it, the body stops with ``_TooLarge``."""

    def __init__(self, inner: Any, limit: int) -> None:
        self._inner = inner
        self._left = limit
        self.exceeded = False  # (the SDK reports a body cut short as its own error: this says why)

    async def handle_async_request(self, request: Any) -> Any:
        import httpx2

        response = await self._inner.handle_async_request(request)
        owner, body = self, response.stream

        class Counted(httpx2.AsyncByteStream):
            async def __aiter__(self) -> AsyncIterator[bytes]:
                async for chunk in body:
                    owner._left -= len(chunk)
                    if owner._left < 0:
                        owner.exceeded = True
                        raise _TooLarge
                    yield chunk

            async def aclose(self) -> None:
                await body.aclose()

        return httpx2.Response(response.status_code, headers=response.headers, stream=Counted(),
                               extensions=response.extensions, request=request)  # fmt: skip

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _Bounded:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._inner.__aexit__(*exc)


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside (anyio's task groups wrap them in groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _failure(exc: BaseException, policy: McpPolicy, bounded: _Bounded | None) -> McpFailure:
    """What a person reads of why a connection, listing or call failed (never a header)."""
    exc = _leaf(exc)
    if isinstance(exc, McpFailure):
        return exc
    if isinstance(exc, asyncio.CancelledError):  # (a task group cancelled itself: its cause is lost)
        return McpFailure("the connection was cancelled")
    if isinstance(exc, TimeoutError):
        return McpFailure(f"the server did not answer within {policy.timeout_s:g} s")
    if isinstance(exc, _TooLarge) or (bounded is not None and bounded.exceeded):
        return McpFailure(f"the server sent more than {policy.max_result_bytes} bytes")
    try:
        import httpx2
        from mcp.shared.exceptions import MCPError
    except ImportError:  # (not installed: nothing of theirs can have been raised)
        return McpFailure(f"the connection failed ({type(exc).__name__})")
    if isinstance(exc, MCPError):
        code = getattr(getattr(exc, "error", None), "code", 0)
        message = str(exc) or "protocol error"
        return McpFailure(f"the server answered an MCP error: {message}",
                          {"type": "protocol_error", "code": int(code or 0), "message": message})  # fmt: skip
    if isinstance(exc, httpx2.HTTPStatusError):
        status = exc.response.status_code
        return McpFailure(f"the server answered HTTP {status}",
                          {"type": "http_error", "code": status, "message": f"HTTP {status}"})  # fmt: skip
    if isinstance(exc, httpx2.TransportError):
        return McpFailure(f"the server could not be reached ({type(exc).__name__})")
    log.debug("MCP failure", exc_info=exc)
    return McpFailure(f"the connection failed ({type(exc).__name__})")
