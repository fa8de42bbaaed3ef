"""The Responses backend client (gateway/hosting/responses_backend.py) over real sockets on
127.0.0.1: what it sends, the framings it reads (chunked, Content-Length, closed-ended,
split anywhere), and every failure as its documented code. The servers here are raw
asyncio servers scripted per case (they answer what a real backend would, or fail as
one can); the real backend (``vllm serve``) is tests/vllm/test_vllm_live_delegation.py's."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import pytest

from gateway.hosting.responses_backend import (
    HTTP_ERROR,
    INVALID,
    TIMEOUT,
    UNREACHABLE,
    BackendPolicy,
    HttpResponse,
    ResponsesBackend,
    ResponsesFailure,
    SseDecoder,
)

pytestmark = pytest.mark.timeout(30)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, dict[str, Any]], Awaitable[None]]
EVENTS = [{"type": "response.created", "response": {"id": "r1"}}, {"type": "response.output_text.delta", "delta": "hé"},
          {"type": "response.completed", "response": {"id": "r1"}}]  # fmt: skip


def sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(b"event: " + e["type"].encode() + b"\r\ndata: " + orjson.dumps(e) + b"\r\n\r\n" for e in events)


def chunked(body: bytes, size: int = 7) -> bytes:
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(f"{len(p):x};ext=1\r\n".encode() + p + b"\r\n" for p in parts) + b"0\r\n\r\n"


@contextlib.asynccontextmanager
async def backend(handler: Handler) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A server on a free port answering each request with ``handler``; yields its base URL
    and the requests it read (request line, headers, JSON body)."""
    seen: list[dict[str, Any]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
        body = await reader.readexactly(int(headers["content-length"]))
        request = {"line": head[0], "headers": headers, "body": json.loads(body)}
        seen.append(request)
        try:
            await handler(reader, writer, request)
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1", seen
    finally:
        server.close()
        await server.wait_closed()


def answer(head: bytes, body: bytes, *, step: int = 0) -> Handler:
    """A handler that writes ``head`` then ``body`` (``step``: that many bytes at a time)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: dict[str, Any]) -> None:
        data = head + body
        for at in range(0, len(data), step or len(data)):
            writer.write(data[at : at + (step or len(data))])
            await writer.drain()

    return handle


async def collect(url: str, **policy: Any) -> list[dict[str, Any]]:
    client = ResponsesBackend(BackendPolicy(url, **policy))
    return [event async for event in client.stream({"model": "m", "input": [], "stream": True})]


async def failure(url: str, **policy: Any) -> ResponsesFailure:
    with pytest.raises(ResponsesFailure) as raised:
        await collect(url, **policy)
    assert raised.value.message
    return raised.value


SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"


async def test_it_posts_the_request_and_reads_a_chunked_stream_split_anywhere() -> None:
    body = b": keep-alive\r\n\r\n" + sse(EVENTS) + b"data: [DONE]\r\n\r\n"
    handler = answer(SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n", chunked(body), step=3)
    async with backend(handler) as (url, seen):
        events = await collect(url, api_key="sk-test")
    assert events == EVENTS
    (request,) = seen
    assert request["line"] == "POST /v1/responses HTTP/1.1"
    headers = request["headers"]
    assert headers["authorization"] == "Bearer sk-test" and headers["accept"] == "text/event-stream"
    assert headers["content-type"] == "application/json" and headers["host"].startswith("127.0.0.1:")
    assert request["body"] == {"model": "m", "input": [], "stream": True}


@pytest.mark.parametrize("framing", ["length", "close"])
async def test_it_reads_a_content_length_or_closed_ended_stream(framing: str) -> None:
    body = sse(EVENTS)
    length = f"Content-Length: {len(body)}\r\n".encode() if framing == "length" else b""
    async with backend(answer(SSE_HEAD + length + b"\r\n", body)) as (url, _):
        assert await collect(url) == EVENTS


async def test_an_http_error_names_its_status_and_the_backend_s_message() -> None:
    error = orjson.dumps({"error": {"message": "The model `x` does not exist.", "type": "NotFoundError"}})
    head = (
        b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\n"
        + f"content-length: {len(error)}\r\n\r\n".encode()
    )
    async with backend(answer(head, error)) as (url, _):
        failed = await failure(url)
    assert failed.code == HTTP_ERROR
    assert failed.message == "The Responses backend answered HTTP 404: The model `x` does not exist."


async def test_an_answer_that_is_no_event_stream_is_invalid() -> None:
    body = b'{"id": "r1", "output": []}'
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + f"content-length: {len(body)}\r\n\r\n".encode()
    async with backend(answer(head, body)) as (url, _):
        assert (await failure(url)).code == INVALID
    async with backend(answer(SSE_HEAD + b"\r\n", b"data: not json\n\n")) as (url, _):
        assert (await failure(url)).code == INVALID
    async with backend(answer(b"SMTP ready\r\n\r\n", b"")) as (url, _):
        assert (await failure(url)).code == INVALID


async def test_an_event_larger_than_the_limit_is_invalid() -> None:
    big = sse([{"type": "response.output_text.delta", "delta": "x" * 5000}])
    async with backend(answer(SSE_HEAD + b"\r\n", big, step=1000)) as (url, _):
        failed = await failure(url, max_event_bytes=4096)
    assert failed.code == INVALID and "live_responses_max_event_bytes" in failed.message


async def test_a_backend_that_goes_quiet_times_out() -> None:
    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: dict[str, Any]) -> None:
        writer.write(SSE_HEAD + b"\r\n" + sse(EVENTS[:1]))
        await writer.drain()
        await reader.read()  # until the client gives up

    async with backend(stall) as (url, _):
        client = ResponsesBackend(BackendPolicy(url, timeout_s=0.3))
        got: list[dict[str, Any]] = []
        with pytest.raises(ResponsesFailure) as raised:
            async for event in client.stream({}):
                got.append(event)
    assert raised.value.code == TIMEOUT and got == EVENTS[:1]  # what came before is delivered


async def test_no_backend_listening_is_unreachable() -> None:
    async with backend(answer(b"", b"")) as (url, _):
        pass  # closed: its port refuses connections now
    failed = await failure(url)
    assert failed.code == UNREACHABLE
    assert "127.0.0.1" not in failed.message  # (the backend's address is the operator's: logged, not told)


@pytest.mark.parametrize(
    "raw",
    [
        b"",  # closed without answering
        SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(sse(EVENTS))[:40],  # cut mid-body
        SSE_HEAD + b"Content-Length: 500\r\n\r\n" + sse(EVENTS[:1]),  # shorter than it said
    ],
)
async def test_a_connection_that_breaks_is_unreachable(raw: bytes) -> None:
    async with backend(answer(raw, b"")) as (url, _):
        assert (await failure(url)).code == UNREACHABLE


def test_an_ipv6_backend_is_named_in_brackets() -> None:
    for url, host in (("http://[::1]:8000/v1", "[::1]:8000"), ("https://[::1]/v1", "[::1]"), ("http://b/v1", "b")):
        request = ResponsesBackend(BackendPolicy(url))._request({})
        assert f"\r\nHost: {host}\r\n".encode() in request, request


def test_a_url_that_is_not_http_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="live_responses_url"):
        ResponsesBackend(BackendPolicy("ftp://example.invalid/v1"))


def test_the_parsers_take_any_split_and_an_interim_answer() -> None:
    raw = b"HTTP/1.1 100 Continue\r\n\r\n" + SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(sse(EVENTS), 5)
    answer_, events = HttpResponse(), SseDecoder(1 << 20)
    got: list[dict[str, Any]] = []
    for byte in range(len(raw)):
        got += events.feed(answer_.feed(raw[byte : byte + 1]))
    assert answer_.status == 200 and answer_.complete and got == EVENTS
    decoder = SseDecoder(1 << 20)
    assert decoder.feed(b'data: {"a":\ndata: 1}') == [] and decoder.end() == [{"a": 1}]  # multi-line data, no blank end
