"""uvicorn's httptools protocol with bounds on the request head: no socket held without a word.

Stock uvicorn waits for a request head as long as the client takes (a connection
that sends nothing, or a header a byte at a time, is held until the peer's TCP
gives up) and buffers a head of any size. Every connection is in this class
until it is upgraded to a WebSocket (then ``ws_server`` has it) or closed:

- **Head timeout** (``HeadLimits.timeout_s``, the ``header_timeout_s`` setting):
  from the connection's start, and from the first byte of each later request,
  to the end of its head. Past it: ``408`` (on a connection's first request;
  after one, the connection is just closed) and the socket closes. The time a
  keep-alive connection waits between requests is uvicorn's ``timeout_keep_alive``.
- **Head size** (``max_head_bytes``): a head still incomplete after that many
  bytes gets ``431`` and the socket closes; at most that much (and one read) is held.
- **Whole-request deadline** (``request_timeout_s``): from the first byte of a
  request to the last byte of its body. Past it: ``408`` (when no response has
  begun; else the connection is just closed) and the socket closes, so a body
  dripped a byte at a time holds a socket for that long at most.
- **Connections not yet upgraded** (``max_pending``, the ``max_pending_connections``
  setting): counted per process from the accept to the upgrade or the close. A
  connection accepted past it gets ``503`` ``server_busy`` at once and is closed,
  without a byte read; those already in (a probe's keep-alive connection) go on.
- **Bodies** (``max_bodies``, the ``max_request_bodies`` setting): an endpoint reads
  a body only once it has checked the request's credential, and calls the ASGI
  extension ``omni.http.body`` first (``admit_body`` in ``http_body``): the
  connection then leaves the count above for this one (nothing that did not
  prove itself holds one of those places), until its body is in. Past the cap
  the extension says no, and the endpoint answers ``503`` unread. A response
  sent before its request's body is in (a refusal: 401, 413, 503) closes the
  connection once written: the rest of the body is never read.

Each refusal is a JSON body in the OpenAI error shape with ``Connection: close``.
A head line too long for a WebSocket upgrade (websockets' 8 KiB) is answered by
``ws_server`` (431 and close) once the upgrade is handed over.

What this takes from uvicorn's class beyond asyncio's documented ``Protocol``
methods is httptools' parser callbacks ``on_message_begin``,
``on_headers_complete`` and ``on_message_complete``, its ``on_response_complete``
and its request cycle's ``response_started`` and ``scope``; ``http_protocol()``
checks they are there once and falls back to uvicorn's stock ``httptools`` (with
a warning) if not.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson

from gateway.protocol.errors import Code
from gateway.settings import Settings

log = logging.getLogger("omni.transport")

STOCK_HTTP = "httptools"
MAX_HEAD_BYTES = 64 << 10  # a request head (request line and headers): larger, 431
_REASONS = {408: "Request Timeout", 431: "Request Header Fields Too Large", 503: "Service Unavailable"}
BODY_EXTENSION = "omni.http.body"  # ASGI scope extension: a function () -> bool, see admit_body


@dataclass(frozen=True, slots=True)
class HeadLimits:
    timeout_s: float = 10.0  # the head must be in within this; 0: no timeout
    max_pending: int = 512  # connections not yet upgraded, per process; 0: no limit
    max_head_bytes: int = MAX_HEAD_BYTES
    request_timeout_s: float = 30.0  # a whole request (head and body) must be in within this; 0: none
    max_bodies: int = 64  # request bodies being read at once (admitted), per process; 0: no limit


class PendingCount:
    """Connections of one server not yet upgraded (one event loop: no lock)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


def refusal(status: int, code: str, message: str) -> bytes:
    body = orjson.dumps({"error": {"type": "invalid_request_error", "code": code, "message": message, "param": None}})
    head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")  # fmt: skip
    return head.encode() + body


def _base() -> type | None:
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools not installed
        return None
    callbacks = ("on_message_begin", "on_headers_complete", "on_message_complete", "on_response_complete")
    if not all(callable(getattr(HttpToolsProtocol, name, None)) for name in callbacks):
        return None
    try:
        from uvicorn.protocols.http.httptools_impl import RequestResponseCycle
    except ImportError:
        return None
    cycle = inspect.signature(RequestResponseCycle.__init__).parameters
    if "scope" not in cycle or "on_response" not in cycle:
        return None
    return HttpToolsProtocol


_BASE: Any = _base() or object


class BoundedHttpProtocol(_BASE):
    """Pass ``http_protocol(limits)`` (a subclass with its limits bound) as uvicorn's ``http``."""

    limits: ClassVar[HeadLimits] = HeadLimits()
    pending: ClassVar[PendingCount] = PendingCount()
    bodies: ClassVar[PendingCount] = PendingCount()  # connections reading an admitted body

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._counted = False  # this connection is in ``pending``
        self._in_head = True  # a request head is being read (from the accept: the first one)
        self._head_bytes = 0  # bytes read while in the head (whole reads: at most one read over)
        self._heads = 0  # request heads completed on this connection
        self._timer: asyncio.TimerHandle | None = None
        self._deadline: asyncio.TimerHandle | None = None  # the whole request's (request_timeout_s)
        self._in_body = False  # a request's head is in, its body is not
        self._body_admitted = False  # this connection holds a place in ``bodies``
        self._tcp: asyncio.Transport | None = None

    # --- asyncio's Protocol ---

    def connection_made(self, transport: Any) -> None:
        self._tcp = transport
        super().connection_made(transport)
        limits = self.limits
        if limits.max_pending and self.pending.n >= limits.max_pending:
            message = "Too many connections are opening at once; try again shortly."
            self._refuse(refusal(503, Code.SERVER_BUSY, message))
            return
        self.pending.n += 1
        self._counted = True
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._leave()
        self._end_request()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        tcp = self._tcp
        if tcp is None or tcp.get_protocol() is not self:  # upgraded: the WebSocket protocol has it
            self._leave()
            self._end_request()
            return
        if self._in_head:
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_head_bytes and not tcp.is_closing():
                message = f"The request head is larger than {self.limits.max_head_bytes} bytes."
                self._refuse(refusal(431, Code.HEADERS_TOO_LARGE, message))

    # --- httptools' parser callbacks ---

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._in_head:
            self._in_head, self._head_bytes = True, 0
            self._arm()
        timeout = self.limits.request_timeout_s
        if timeout > 0 and self._deadline is None:
            self._deadline = asyncio.get_running_loop().call_later(timeout, self._request_timeout)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._heads += 1
        self._disarm()
        super().on_headers_complete()
        cycle = getattr(self, "cycle", None)
        if cycle is None or cycle.scope is not self.scope:
            return  # an upgrade: the WebSocket protocol takes the connection
        self._in_body = True
        # (the app has not run yet: its task waits for the next loop turn)
        self.scope.setdefault("extensions", {})[BODY_EXTENSION] = self._admit_body

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._end_request()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        tcp = self._tcp
        if self._in_body and tcp is not None and not tcp.is_closing():
            # Answered before its body was in (a refusal): the rest is never read.
            tcp.close()

    # ---

    def _arm(self) -> None:
        if self._timer is None and self.limits.timeout_s > 0:
            self._timer = asyncio.get_running_loop().call_later(self.limits.timeout_s, self._head_timeout)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _admit_body(self) -> bool:
        """The ``omni.http.body`` extension: the endpoint checked the credential and reads
        the body now. False: too many bodies are being read (answer 503 unread)."""
        if self._body_admitted or not self._in_body:
            return True
        limit = self.limits.max_bodies
        if limit and self.bodies.n >= limit:
            return False
        self._leave()  # (its place among connections not yet upgraded is free for the next)
        self._body_admitted = True
        self.bodies.n += 1
        return True

    def _end_request(self) -> None:
        """The request's body is in (or the connection is gone): its deadline and its place
        among bodies end; a keep-alive connection counts as pending again until its next use."""
        self._in_body = False
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self._body_admitted:
            self._body_admitted = False
            self.bodies.n -= 1
            tcp = self._tcp
            if tcp is not None and not tcp.is_closing() and tcp.get_protocol() is self:
                self.pending.n += 1
                self._counted = True

    def _request_timeout(self) -> None:
        self._deadline = None
        tcp = self._tcp
        if tcp is None or tcp.is_closing() or tcp.get_protocol() is not self:
            return
        timeout = self.limits.request_timeout_s
        log.info("a request not in within %g s (request_timeout_s): 408, closed", timeout)
        cycle = getattr(self, "cycle", None)
        started = cycle is not None and cycle.scope is self.scope and getattr(cycle, "response_started", True)
        message = f"The request (its head and body) did not arrive within {timeout:g} s."
        self._refuse(b"" if started else refusal(408, Code.REQUEST_TIMEOUT, message))
        self._end_request()

    def _head_timeout(self) -> None:
        self._timer = None
        if self._tcp is None or self._tcp.is_closing():
            return
        message = f"The request head did not arrive within {self.limits.timeout_s:g} s."
        # After a first request a response may be under way: then the socket just closes.
        self._refuse(refusal(408, Code.REQUEST_TIMEOUT, message) if not self._heads else b"")

    def _refuse(self, response: bytes) -> None:
        self._leave()
        tcp = self._tcp
        if tcp is not None and not tcp.is_closing():
            if response:
                tcp.write(response)
            tcp.close()

    def _leave(self) -> None:
        self._disarm()
        if self._counted:
            self._counted = False
            self.pending.n -= 1


def limits_of(settings: Settings) -> HeadLimits:
    return HeadLimits(
        timeout_s=settings.header_timeout_s,
        max_pending=settings.max_pending_connections,
        request_timeout_s=settings.request_timeout_s,
        max_bodies=settings.max_request_bodies,
    )


def http_protocol(limits: HeadLimits) -> Any:
    """What to pass as uvicorn's ``http``: ``BoundedHttpProtocol`` with ``limits`` and a
    count of its own, or uvicorn's stock ``httptools`` if its callbacks are not there."""
    if _BASE is object:
        log.warning("request head bounds off (uvicorn's httptools protocol not found as expected); "
                    "uvicorn's %s serves HTTP", STOCK_HTTP)  # fmt: skip
        return STOCK_HTTP
    counts = {"pending": PendingCount(), "bodies": PendingCount()}
    return type("BoundedHttp", (BoundedHttpProtocol,), {"limits": limits, **counts})
