"""The Responses backend GPT-Live sessions delegate to: one streamed request per ``RunResponses`` (I/O).

An OpenAI-compatible Responses API (``vllm serve`` answers ``POST
/v1/responses``; so does OpenAI): the gateway POSTs the session's request to
``{live_responses_url}/responses`` with ``stream: true`` and reads the
server-sent events it answers with, one JSON object each, until the stream
ends. A small HTTP/1.1 client on asyncio's streams, with no dependency: one
connection per request (``Connection: close``), ``http`` or ``https`` (the
system's certificate store), a ``Content-Length``, chunked or closed-ended
body. The parsing is pure (``HttpResponse``, ``SseDecoder``); the shell only
reads and writes.

A request that does not give a stream of events fails with a stable code
(``ResponsesFailure``), which the session sends its client as an ``error``:

- ``responses_backend_unconfigured``: the gateway has no backend
  (``live_responses_url`` unset);
- ``responses_backend_unreachable``: no connection (refused, no route, the
  name does not resolve, TLS failed), or it broke before the stream ended;
- ``responses_backend_error``: an HTTP status other than 200 (the message
  names it, with the backend's own message where it sent one);
- ``responses_backend_timeout``: no connection, or no byte of the answer, for
  ``live_responses_timeout_s``;
- ``responses_backend_invalid``: the answer is not an event stream, an
  event's data is not a JSON object, or one event is larger than
  ``live_responses_max_event_bytes``.

The API key goes as ``Authorization: Bearer`` and is never logged (the app
registers it with the log redactor).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

log = logging.getLogger("omni.responses")

UNCONFIGURED = "responses_backend_unconfigured"
UNREACHABLE = "responses_backend_unreachable"
HTTP_ERROR = "responses_backend_error"
TIMEOUT = "responses_backend_timeout"
INVALID = "responses_backend_invalid"

MAX_HEAD_BYTES = 64 << 10  # the status line and headers of an answer; more: invalid
MAX_ERROR_BYTES = 64 << 10  # what is read of an error answer's body (for its message)
READ_BYTES = 64 << 10  # one read from the socket


class ResponsesFailure(Exception):
    """A request that did not stream: ``code`` (the module docstring's), ``message`` for a person."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class BackendPolicy:
    """The ``live_responses_*`` settings."""

    url: str  # the API's base URL (http://host:8000/v1)
    api_key: str | None = None
    timeout_s: float = 60.0
    max_event_bytes: int = 1 << 20


class ResponsesBackend:
    """See the module docstring."""

    def __init__(self, policy: BackendPolicy) -> None:
        url = policy.url.rstrip("/") + "/responses"
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"live_responses_url must be an http(s) URL, not {policy.url!r}")
        self.policy = policy
        self._tls = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._tls else 80)
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname  # (an IPv6 address)
        self._authority = host if parts.port is None else f"{host}:{parts.port}"

    async def stream(self, body: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
        """The events of the request's stream, as they arrive. Raises ``ResponsesFailure``."""
        timeout = self.policy.timeout_s
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(
                    self._host, self._port, ssl=ssl.create_default_context() if self._tls else None,
                    limit=READ_BYTES,
                )  # fmt: skip
        except TimeoutError:
            raise ResponsesFailure(TIMEOUT, f"No connection to the Responses backend within {timeout:g} s.") from None
        except (OSError, ssl.SSLError) as exc:
            log.warning("the Responses backend is unreachable: %s", exc)  # (its address is the operator's)
            raise ResponsesFailure(UNREACHABLE, "The Responses backend is unreachable.") from None
        try:
            writer.write(self._request(body))
            try:
                async with asyncio.timeout(timeout):
                    await writer.drain()
            except TimeoutError:
                raise ResponsesFailure(TIMEOUT, f"The Responses backend took no request for {timeout:g} s.") from None
            except (OSError, ssl.SSLError) as exc:
                log.warning("the connection to the Responses backend broke: %s", exc)
                raise ResponsesFailure(UNREACHABLE, "The connection to the Responses backend broke.") from None
            answer = HttpResponse()
            sse = SseDecoder(self.policy.max_event_bytes)
            head_done = False
            while True:
                try:
                    async with asyncio.timeout(timeout):
                        data = await reader.read(READ_BYTES)
                except TimeoutError:
                    raise ResponsesFailure(TIMEOUT, f"The Responses backend sent nothing for {timeout:g} s.") from None
                except (OSError, ssl.SSLError) as exc:
                    log.warning("the connection to the Responses backend broke: %s", exc)
                    raise ResponsesFailure(UNREACHABLE, "The connection to the Responses backend broke.") from None
                if not data and answer.status is None:
                    raise ResponsesFailure(
                        UNREACHABLE, "The Responses backend closed the connection without answering."
                    )
                try:
                    payload = answer.feed(data) if data else answer.end()
                except ValueError as exc:
                    raise ResponsesFailure(
                        INVALID, f"The Responses backend's answer is not HTTP/1.1 ({exc})."
                    ) from None
                if not head_done and answer.status is not None:
                    head_done = True
                    self._check_head(answer)
                if answer.status != 200:
                    if answer.complete or len(answer.error_body) >= MAX_ERROR_BYTES or not data:
                        raise _status_failure(answer)
                    continue
                for event in sse.feed(payload):
                    yield event
                if answer.complete or not data:
                    if not answer.complete:
                        raise ResponsesFailure(UNREACHABLE, "The Responses backend closed the connection mid-answer.")
                    for event in sse.end():
                        yield event
                    return
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.shield(writer.wait_closed())

    def _request(self, body: dict[str, Any]) -> bytes:
        data = orjson.dumps(body)
        lines = [
            f"POST {self._target} HTTP/1.1",
            f"Host: {self._authority}",
            "Content-Type: application/json",
            "Accept: text/event-stream",
            f"Content-Length: {len(data)}",
            "Connection: close",
            "User-Agent: omni-realtime-gateway",
        ]
        if self.policy.api_key:
            lines.append(f"Authorization: Bearer {self.policy.api_key}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data

    @staticmethod
    def _check_head(answer: HttpResponse) -> None:
        if answer.status == 200:
            kind = answer.headers.get("content-type", "")
            if not kind.split(";")[0].strip().lower() == "text/event-stream":
                raise ResponsesFailure(INVALID, f"The Responses backend answered {kind or 'no content type'!r}, "
                                       "not an event stream (text/event-stream).")  # fmt: skip


def _status_failure(answer: HttpResponse) -> ResponsesFailure:
    """An error answer as a failure naming its status and the backend's message (OpenAI's
    ``{"error": {"message"}}``, or the start of its body)."""
    status = answer.status
    body = bytes(answer.error_body[:MAX_ERROR_BYTES])
    try:
        parsed: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    detail = body.decode("utf-8", "replace").strip()
    if isinstance(parsed, dict):
        error = parsed.get("error")
        message = error.get("message") if isinstance(error, dict) else error
        message = message or parsed.get("message") or parsed.get("detail")
        if message:
            detail = str(message)
    detail = detail[:500]
    return ResponsesFailure(
        HTTP_ERROR, f"The Responses backend answered HTTP {status}" + (f": {detail}" if detail else ".")
    )


class HttpResponse:
    """An HTTP/1.1 answer fed as it arrives (pure): its head, then its body's payload, whatever
    its framing (``Content-Length``, chunked, or until the connection closes). A non-200
    answer's body is kept in ``error_body``. Raises ValueError on what is not HTTP/1.1."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.complete = False
        self.error_body = bytearray()
        self._buf = bytearray()
        self._length: int | None = None  # Content-Length left; None: chunked or until close
        self._chunked = False
        self._chunk_left = 0  # of the current chunk's data
        self._state = "head"  # head, body, size, data, data_end, trailer, done

    def feed(self, data: bytes) -> bytes:
        """The body's payload in ``data`` (after the head)."""
        self._buf += data
        out = bytearray()
        while self._step(out):
            pass
        if self.status is not None and self.status != 200:
            self.error_body += out
            return b""
        return bytes(out)

    def end(self) -> bytes:
        """The connection closed: what is left. A body that ends with the connection completes."""
        if self._state == "head":
            raise ValueError("the connection closed before the answer's head")
        if self._state == "body" and self._length is None:
            self.complete = True
        return b""

    def _step(self, out: bytearray) -> bool:
        buf = self._buf
        state = self._state
        if state == "head":
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise ValueError("its head is too large")
                return False
            self._head(bytes(buf[:end]).decode("latin-1"))
            del buf[: end + 4]
            return True
        if state == "body":
            if self._length is None:
                out += buf
                buf.clear()
                return False
            take = min(self._length, len(buf))
            out += buf[:take]
            del buf[:take]
            self._length -= take
            if self._length == 0:
                self._finish()
            return False
        if state in ("size", "data_end", "trailer"):
            end = buf.find(b"\r\n")
            if end < 0:
                if len(buf) > 4096:
                    raise ValueError("a chunk's framing line is too long")
                return False
            line = bytes(buf[:end])
            del buf[: end + 2]
            if state == "size":
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise ValueError(f"bad chunk size {line[:20]!r}") from None
                if size == 0:
                    self._state = "trailer"
                else:
                    self._chunk_left, self._state = size, "data"
            elif state == "data_end":
                if line:
                    raise ValueError("a chunk does not end with CRLF")
                self._state = "size"
            elif not line:  # the (empty) trailer's end
                self._finish()
                return False
            return True
        if state == "data":
            take = min(self._chunk_left, len(buf))
            if not take:
                return False
            out += buf[:take]
            del buf[:take]
            self._chunk_left -= take
            if self._chunk_left == 0:
                self._state = "data_end"
            return True
        return False  # done: whatever follows is ignored

    def _head(self, head: str) -> None:
        status_line, *lines = head.split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ValueError(f"bad status line {status_line[:60]!r}")
        status = int(parts[1])
        for line in lines:
            name, sep, value = line.partition(":")
            if not sep:
                raise ValueError(f"bad header line {line[:60]!r}")
            self.headers[name.strip().lower()] = value.strip()
        if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
            self.headers.clear()
            return
        self.status = status
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            self._chunked, self._state = True, "size"
        elif "content-length" in self.headers:
            try:
                self._length = int(self.headers["content-length"])
            except ValueError:
                raise ValueError("bad Content-Length") from None
            self._state = "body"
            if self._length == 0:
                self._finish()
        else:
            self._state = "body"

    def _finish(self) -> None:
        self._state = "done"
        self.complete = True


class SseDecoder:
    """Server-sent events (pure): bytes in, each event's data out as a JSON object (an
    ``event:`` name is ignored: a Responses event names its ``type`` in its data). A data of
    ``[DONE]`` is skipped. Raises ``ResponsesFailure`` (``INVALID``) for an event larger than
    ``max_event_bytes`` or whose data is not a JSON object."""

    def __init__(self, max_event_bytes: int) -> None:
        self._max = max_event_bytes
        self._buf = bytearray()
        self._data: list[bytes] = []
        self._size = 0

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buf += data
        events: list[dict[str, Any]] = []
        while True:
            end = self._buf.find(b"\n")
            if end < 0:
                if len(self._buf) + self._size > self._max:
                    raise ResponsesFailure(INVALID, f"An event of the Responses backend is larger than {self._max} "
                                           "bytes (live_responses_max_event_bytes).")  # fmt: skip
                return events
            line = bytes(self._buf[:end]).rstrip(b"\r")
            del self._buf[: end + 1]
            self._line(line, events)

    def end(self) -> list[dict[str, Any]]:
        """The stream ended: an event not yet closed by a blank line still counts."""
        events: list[dict[str, Any]] = []
        if self._buf:
            self._line(bytes(self._buf).rstrip(b"\r"), events)
            self._buf.clear()
        self._line(b"", events)
        return events

    def _line(self, line: bytes, events: list[dict[str, Any]]) -> None:
        if not line:
            if self._data:
                data = b"\n".join(self._data)
                self._data, self._size = [], 0
                if data.strip() != b"[DONE]":
                    events.append(_json_object(data))
            return
        if line.startswith(b":"):
            return  # a comment (a keep-alive)
        name, _, value = line.partition(b":")
        if name == b"data":
            value = value[1:] if value.startswith(b" ") else value
            self._size += len(value)
            if self._size > self._max:
                raise ResponsesFailure(INVALID, f"An event of the Responses backend is larger than {self._max} bytes "
                                       "(live_responses_max_event_bytes).")  # fmt: skip
            self._data.append(value)


def _json_object(data: bytes) -> dict[str, Any]:
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError:
        event = None
    if not isinstance(event, dict):
        raise ResponsesFailure(INVALID, f"An event of the Responses backend is not a JSON object: {data[:80]!r}.")
    return event
