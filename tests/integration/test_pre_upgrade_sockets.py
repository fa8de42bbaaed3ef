"""No socket is held without a word before its upgrade, over real sockets against a running
gateway: a head line too long for an upgrade is answered (431) and closed; a head that does
not arrive in time (slowloris) gets 408 and is closed; past the cap of sockets not yet
upgraded a new one gets 503 at once, while /healthz goes on answering."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from support.gateway import RunningGateway, connect, run_gateway

from gateway.protocol.errors import Code
from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(60)

KEY = "sk-pre-upgrade-3e9a41"
UPGRADE = (
    "GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
)


def gateway(**kwargs: Any) -> Any:
    settings = Settings(engine="passthrough", video_engine="none", api_keys=(KEY,), detach_grace_s=0.2, **kwargs)
    return run_gateway(settings, engine=PassthroughEngine(paced=False), vad_factory=None)


class Raw:
    """A plain TCP socket (the kernel hands over what arrived before a reset, which asyncio's
    streams would drop)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.loop = asyncio.get_running_loop()

    @classmethod
    async def open(cls, port: int) -> Raw:
        sock = socket.socket()
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        return cls(sock)

    async def send(self, data: bytes) -> None:
        await self.loop.sock_sendall(self.sock, data)

    async def until_eof(self, timeout: float) -> bytes:
        """Everything the server sends until it closes (EOF or reset); fails past ``timeout``."""
        received = bytearray()
        with contextlib.suppress(ConnectionError):
            async with asyncio.timeout(timeout):
                while chunk := await self.loop.sock_recv(self.sock, 65536):
                    received.extend(chunk)
        return bytes(received)

    async def response(self, timeout: float = 5.0) -> tuple[int, bytes]:
        """One HTTP response on a connection that stays open (Content-Length framed)."""
        received = bytearray()
        async with asyncio.timeout(timeout):
            while b"\r\n\r\n" not in received:
                received.extend(await self.loop.sock_recv(self.sock, 65536))
            top, _, body = bytes(received).partition(b"\r\n\r\n")
            fields = dict(line.lower().split(b": ", 1) for line in top.split(b"\r\n")[1:])
            length = int(fields[b"content-length"])
            while len(body) < length:
                body += await self.loop.sock_recv(self.sock, 65536)
        return int(top.split()[1]), body

    def close(self) -> None:
        self.sock.close()


def status_of(raw: bytes) -> int:
    assert raw.startswith(b"HTTP/1.1 "), raw[:200]
    return int(raw.split()[1])


def error_of(raw: bytes) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads(raw.partition(b"\r\n\r\n")[2])["error"]
    return body


@pytest.fixture
async def gw() -> AsyncIterator[RunningGateway]:
    async with gateway() as gw:
        yield gw


@pytest.mark.parametrize(
    "line", [f"X-Padding: {'a' * 9000}", f"Authorization: Bearer eyJ{'a' * 9000}"], ids=["a-header", "a-huge-jwt"]
)
async def test_an_upgrade_with_a_head_line_over_8_kib_is_answered_and_closed(gw: RunningGateway, line: str) -> None:
    raw = await Raw.open(gw.port)
    await raw.send(f"{UPGRADE}{line}\r\n\r\n".encode())
    answer = await raw.until_eof(5.0)  # was: nothing, for ever (websockets' 431 was never written)
    assert status_of(answer) == 431
    raw.close()


@pytest.mark.parametrize("upgrade", [True, False], ids=["upgrade", "plain-http"])
async def test_a_head_over_64_kib_is_answered_431_and_closed(gw: RunningGateway, upgrade: bool) -> None:
    raw = await Raw.open(gw.port)
    start = UPGRADE if upgrade else "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    await raw.send(start.encode() + b"".join(b"X-H%d: %s\r\n" % (i, b"b" * 4000) for i in range(20)))
    answer = await raw.until_eof(5.0)  # (the head is not finished: a client could go on for ever)
    assert status_of(answer) == 431
    assert error_of(answer)["code"] == Code.HEADERS_TOO_LARGE
    raw.close()


async def test_a_slowloris_head_gets_408_and_is_closed_after_the_header_timeout() -> None:
    async with gateway(header_timeout_s=0.5) as gw:
        silent = await Raw.open(gw.port)  # sends nothing at all
        slow = await Raw.open(gw.port)
        await slow.send(UPGRADE.encode())
        start = time.monotonic()

        async def trickle() -> None:
            with contextlib.suppress(ConnectionError, OSError):
                for _ in range(100):  # a byte every 50 ms: never a whole head
                    await slow.send(b"X")
                    await asyncio.sleep(0.05)

        trickling = asyncio.ensure_future(trickle())
        answers = await asyncio.gather(slow.until_eof(5.0), silent.until_eof(5.0))
        elapsed = time.monotonic() - start
        trickling.cancel()
        for answer in answers:
            assert status_of(answer) == 408
            assert error_of(answer)["code"] == Code.REQUEST_TIMEOUT
        assert 0.4 < elapsed < 3.0
        async with connect(gw.url, headers={"Authorization": f"Bearer {KEY}"}) as c:  # a prompt one is served
            await c.wait_for("session.created")


async def wait_pending(gw: RunningGateway, n: int) -> None:
    """Until the server counts ``n`` sockets not yet upgraded (it has accepted them)."""
    pending = gw.server.config.http_protocol_class.pending
    deadline = time.monotonic() + 5
    while pending.n != n:
        assert time.monotonic() < deadline, f"{pending.n} pending, not {n}"
        await asyncio.sleep(0.01)


async def test_past_the_cap_of_sockets_not_yet_upgraded_new_ones_get_503_and_healthz_goes_on() -> None:
    async with gateway(max_pending_connections=5, header_timeout_s=30) as gw:
        probe = await Raw.open(gw.port)  # a keep-alive /healthz probe, in before the flood
        await probe.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await probe.response())[0] == 200
        flood = [await Raw.open(gw.port) for _ in range(4)]
        for raw in flood:
            await raw.send(UPGRADE.encode())  # heads never finished
        await wait_pending(gw, 5)
        extra = await Raw.open(gw.port)
        answer = await extra.until_eof(5.0)  # refused at once, unread
        assert status_of(answer) == 503 and error_of(answer)["code"] == Code.SERVER_BUSY
        await probe.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # the probe in goes on
        assert (await probe.response())[0] == 200
        for raw in flood:
            raw.close()
        await wait_pending(gw, 1)
        fresh = await Raw.open(gw.port)  # afterwards, new ones are served again
        await fresh.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await fresh.response())[0] == 200
        for raw in (probe, extra, fresh):
            raw.close()


async def test_upgraded_sockets_leave_the_count() -> None:
    async with gateway(max_pending_connections=3) as gw:
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(5):
                c = await stack.enter_async_context(connect(gw.url, headers={"Authorization": f"Bearer {KEY}"}))
                await c.wait_for("session.created")
            await wait_pending(gw, 0)
            fresh = await Raw.open(gw.port)
            await fresh.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await fresh.response())[0] == 200
            fresh.close()
