"""HTTP bodies over real sockets: read with a cap as they stream in (413, the rest never
read), and JSON bodies held to the socket path's depth bound (400, never a 500)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from support.gateway import RunningGateway, run_gateway

from gateway.protocol.errors import Code
from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(60)

KEY = "sk-test-bodies-4f1e2d"
CAP = 64 << 10
BEARER = {"Authorization": f"Bearer {KEY}"}
ENDPOINTS = ["/v1/realtime/client_secrets", "/v1/realtime/video/sess_x/interactions", "/v1/realtime/calls"]


@pytest.fixture
async def gw() -> AsyncIterator[RunningGateway]:
    settings = Settings(engine="passthrough", api_keys=(KEY,), video_engine="none", max_http_body_bytes=CAP)
    async with run_gateway(settings, engine=PassthroughEngine(paced=False), vad_factory=None) as gw:
        yield gw


def head(path: str, extra: str, content_type: str = "application/json") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: {content_type}\r\n{extra}\r\n").encode()  # fmt: skip


def parse(raw: bytes) -> tuple[int, dict[str, str], Any]:
    top, _, body = raw.partition(b"\r\n\r\n")
    lines = top.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, orjson.loads(body)


async def stream_until_answered(port: int, request_head: bytes, total: int) -> tuple[bytes, int]:
    """Send ``request_head``, then up to ``total`` bytes of body in 64 KiB chunked pieces while
    reading: (everything the server sent until EOF or a reset, bytes of body sent). A plain
    socket: the kernel hands over what arrived before a reset, which asyncio's streams drop."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    received = bytearray()

    async def read_all() -> None:
        with contextlib.suppress(ConnectionError):
            while chunk := await loop.sock_recv(sock, 65536):
                received.extend(chunk)

    answer = asyncio.ensure_future(read_all())
    piece = b"%x\r\n%s\r\n" % (64 << 10, b"[" * (64 << 10))
    sent = 0
    with contextlib.suppress(ConnectionError):
        await loop.sock_sendall(sock, request_head)
        while sent < total and not answer.done():
            await loop.sock_sendall(sock, piece)
            sent += 64 << 10
    await asyncio.wait_for(answer, 10)
    sock.close()
    return bytes(received), sent


@pytest.mark.parametrize("path", ENDPOINTS)
async def test_a_body_streamed_past_the_cap_gets_413_and_the_rest_is_never_read(gw: RunningGateway, path: str) -> None:
    """A 1 GiB chunked body (no Content-Length): answered 413 once the cap is passed, the
    connection closed; the sender got no further than the socket buffers hold."""
    content_type = "application/sdp" if path.endswith("/calls") else "application/json"
    raw, sent = await stream_until_answered(gw.port, head(path, "Transfer-Encoding: chunked\r\n", content_type),
                                            1 << 30)  # fmt: skip
    status, headers, body = parse(raw)
    assert status == 413
    assert headers["connection"] == "close"
    assert body["error"]["code"] == Code.BODY_TOO_LARGE
    assert body["error"]["type"] == "invalid_request_error"
    assert str(CAP) in body["error"]["message"]
    assert sent < 32 << 20  # far from 1 GiB: reading stopped at the cap


@pytest.mark.parametrize("path", ENDPOINTS)
async def test_a_declared_length_past_the_cap_is_refused_unread(gw: RunningGateway, path: str) -> None:
    async with httpx.AsyncClient(base_url=gw.http) as http:
        response = await http.post(path, content=b"{" + b" " * CAP + b"}", headers=BEARER)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == Code.BODY_TOO_LARGE


async def test_a_body_under_the_cap_is_still_taken(gw: RunningGateway) -> None:
    session = {"type": "realtime", "instructions": "x" * (CAP - 1000)}
    async with httpx.AsyncClient(base_url=gw.http) as http:
        response = await http.post("/v1/realtime/client_secrets", json={"session": session},
                                   headers=BEARER)  # fmt: skip
    assert response.status_code == 200, response.text
    assert response.json()["value"].startswith("ek_")


def nested(depth: int) -> bytes:
    """A JSON schema ``depth`` objects deep, as text (orjson writes at most 254 levels)."""
    return b'{"type": "object", "properties": {"x": ' * depth + b'{"type": "string"}' + b"}}" * depth


@pytest.mark.parametrize("depth", [40, 300])
async def test_deep_nesting_in_a_client_secret_is_a_coded_400_without_a_traceback(
    gw: RunningGateway, depth: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Deeper than the socket path's bound (32 levels): 400 invalid_value naming where, as a
    client event gets; never orjson's 254-level write limit as a 500 with a traceback. (Past
    orjson's read limit, 1,024 levels, the body is not JSON to it: invalid_json, below.)"""
    tool = b'{"type": "function", "name": "f", "description": "d", "parameters": ' + nested(depth) + b"}"
    body = b'{"session": {"type": "realtime", "tools": [' + tool + b"]}}"
    caplog.set_level(logging.WARNING)
    async with httpx.AsyncClient(base_url=gw.http) as http:
        response = await http.post("/v1/realtime/client_secrets", content=body, headers=BEARER)
    assert response.status_code == 400, response.text
    err = response.json()["error"]
    assert err["code"] == Code.INVALID_VALUE
    assert "nested deeper than 32 levels" in err["message"]
    assert err["param"].startswith("body.session.tools.0.parameters")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


async def test_nesting_past_what_json_parsing_reads_is_invalid_json(gw: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=gw.http) as http:
        response = await http.post("/v1/realtime/client_secrets", content=nested(600), headers=BEARER)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == Code.INVALID_JSON
    assert "depth" in response.json()["error"]["message"]


async def test_deep_nesting_in_a_video_interaction_is_a_coded_400(gw: RunningGateway) -> None:
    body = b'{"interaction": {"type": "prompt", "prompt": "a", "extra": ' + nested(300) + b"}}"
    async with httpx.AsyncClient(base_url=gw.http) as http:
        response = await http.post("/v1/realtime/video/sess_x/interactions", content=body,
                                   headers=BEARER)  # fmt: skip
    assert response.status_code == 400
    assert response.json()["error"]["code"] == Code.INVALID_VALUE
