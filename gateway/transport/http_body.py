"""HTTP request bodies, read with a cap and parsed with the socket path's shape bounds.

Every HTTP endpoint that takes a body (client secrets, video interactions, WebRTC
offers) checks the request's credential first, and only then reads the body,
through ``capped``:

- the connection is admitted to read a body (``admit_body``: the server's
  ``omni.http.body`` extension, ``http_server``), or the request is refused
  with 503 ``server_busy``, unread, when ``max_request_bodies`` are being read;
- the ASGI ``receive`` is wrapped so that reading stops, with ``BodyRefused``
  (413), as soon as more than ``max_bytes`` arrived (or at once when
  ``Content-Length`` says so), whether the handler calls ``body()``,
  ``stream()`` or ``form()``. A 1 GiB body is never held: at most the cap and
  one chunk. The 413 says ``Connection: close``, and the server closes any
  connection answered before its body is in, so the rest is never read;
- a client that goes away mid-body (or whose request ran past
  ``request_timeout_s``: the server answered 408 and closed) ends the read with
  ``ClientGone``, logged at INFO: what the endpoint answers then goes nowhere.

``json_body`` parses the bytes and applies ``protocol.bounds``' depth and size
bounds (what a client event gets): orjson reads 1,024 levels but writes only
254, so a deeper body would otherwise fail later, where it is stored.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Message

from gateway.protocol.bounds import shape_violation
from gateway.protocol.errors import Code
from gateway.transport.http_server import BODY_EXTENSION

log = logging.getLogger("omni.transport")


class BodyRefused(Exception):
    """The body cannot be taken: its HTTP status, code and message (the OpenAI error shape)."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param

    def response(self) -> JSONResponse:
        body = {"error": {"type": "invalid_request_error", "code": self.code, "message": self.message,
                          "param": self.param}}  # fmt: skip
        headers = {"Connection": "close"} if self.status in (413, 503) else None  # the rest is not read
        return JSONResponse(body, status_code=self.status, headers=headers)


class ClientGone(BodyRefused):
    """The client went away before its body was in: nobody reads the answer."""

    def __init__(self) -> None:
        super().__init__(400, Code.REQUEST_TIMEOUT, "The client closed the connection before its body was in.")


def _too_large(max_bytes: int) -> BodyRefused:
    return BodyRefused(413, Code.BODY_TOO_LARGE, f"The request body is larger than {max_bytes} bytes.")


def capped(request: Request, max_bytes: int) -> Request:
    """``request`` whose body may be read now (call it once its credential was checked):
    admitted among the bodies being read (else ``BodyRefused`` 503), its reading raising
    ``BodyRefused`` (413) past ``max_bytes`` and ``ClientGone`` if the client goes away."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)  # refused unread
    admit = request.scope.get("extensions", {}).get(BODY_EXTENSION)
    if admit is not None and not admit():
        raise BodyRefused(503, Code.SERVER_BUSY, "Too many request bodies are being read here; try again shortly.")
    receive = request.receive
    received = 0

    async def limited() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > max_bytes:
                raise _too_large(max_bytes)
        elif message["type"] == "http.disconnect":
            log.info("%s %s: the client went away before its body was in", request.method, request.url.path)
            raise ClientGone
        return message

    return Request(request.scope, limited)


def json_body(raw: bytes, *, empty: Any = None) -> Any:
    """The parsed body (``empty`` when there is none), within the shape bounds; else ``BodyRefused`` (400)."""
    if not raw:
        return empty
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:  # (nesting past 1,024 levels too: "depth limit exceeded")
        raise BodyRefused(400, Code.INVALID_JSON, f"The body is not valid JSON ({exc.msg}).") from None
    return checked_shape(body, "body")


def checked_shape(value: Any, where: str) -> Any:
    """``value`` if within the shape bounds (depth, values), else ``BodyRefused`` (400 invalid_value)."""
    violation = shape_violation(value)
    if violation is not None:
        what, path = violation
        param = f"{where}.{path}" if path else where
        raise BodyRefused(400, Code.INVALID_VALUE, f"The {where} is {what} (at {param!r}).", param)
    return value
