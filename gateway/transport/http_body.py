"""HTTP request bodies, read with a cap and parsed with the socket path's shape bounds.

Every HTTP endpoint that takes a body (client secrets, video interactions, WebRTC
offers) reads it through ``capped``: the ASGI ``receive`` is wrapped so that
reading stops, with ``BodyRefused`` (413), as soon as more than ``max_bytes``
arrived (or at once when ``Content-Length`` says so), whether the handler calls
``body()``, ``stream()`` or ``form()``. A 1 GiB body is never held: at most the
cap and one chunk. The 413 says ``Connection: close``, so uvicorn drops the
connection rather than read (and discard) the rest.

``json_body`` parses the bytes and applies ``protocol.bounds``' depth and size
bounds (what a client event gets): orjson reads 1,024 levels but writes only
254, so a deeper body would otherwise fail later, where it is stored.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Message

from gateway.protocol.bounds import shape_violation
from gateway.protocol.errors import Code


class BodyRefused(Exception):
    """The body cannot be taken: its HTTP status, code and message (the OpenAI error shape)."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param

    def response(self) -> JSONResponse:
        body = {"error": {"type": "invalid_request_error", "code": self.code, "message": self.message,
                          "param": self.param}}  # fmt: skip
        headers = {"Connection": "close"} if self.status == 413 else None  # the rest is not read
        return JSONResponse(body, status_code=self.status, headers=headers)


def _too_large(max_bytes: int) -> BodyRefused:
    return BodyRefused(413, Code.BODY_TOO_LARGE, f"The request body is larger than {max_bytes} bytes.")


def capped(request: Request, max_bytes: int) -> Request:
    """``request`` whose body reading raises ``BodyRefused`` (413) past ``max_bytes``."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)  # refused unread
    receive = request.receive
    received = 0

    async def limited() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > max_bytes:
                raise _too_large(max_bytes)
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
