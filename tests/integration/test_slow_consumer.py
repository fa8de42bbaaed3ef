"""Clients that stop reading, over real sockets with a tiny receive window: each is
closed with 4010 once its socket has taken no byte for ``outbound_stall_s`` (JSON and
binary frames alike, long before uvicorn's keepalive would close with 1011), then dropped
``SLOW_CLOSE_GRACE_S`` later if it still reads nothing, and its slot and session are
released: no connection, no "Exception in ASGI application", no leak of session slots."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections.abc import AsyncIterator, Iterator

import orjson
import pytest
from support.gateway import RunningGateway, run_gateway
from support.raw_ws import CLOSE, TEXT, RawClient, frame

from gateway.settings import Settings
from gateway.transport import realtime
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(90)

STALL_S = 1.0
GRACE_S = 1.0


@pytest.fixture
async def gw(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[RunningGateway]:
    monkeypatch.setattr(realtime, "SLOW_CLOSE_GRACE_S", GRACE_S)
    settings = Settings(engine="passthrough", video_engine="none", outbound_stall_s=STALL_S, max_sessions=6,
                        socket_send_buffer_bytes=32 << 10, detach_grace_s=0.2)  # fmt: skip
    engine = PassthroughEngine(audio_chunks=3000, paced=True)  # a minute of audio, 50 deltas a second
    async with run_gateway(settings, engine=engine, vad_factory=None) as g:
        yield g


@pytest.fixture
def asgi_errors() -> Iterator[list[str]]:
    """What uvicorn logs as an application failure (attached after the server's logging config)."""
    seen: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.ERROR:
                seen.append(record.getMessage())

    handler = Catch()
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    try:
        yield seen
    finally:
        logger.removeHandler(handler)


async def stalled_client(port: int, *, binary: bool) -> RawClient:
    """A client with a 4 KiB receive buffer that starts an answer and then reads nothing."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 16)
    protocols = "Sec-WebSocket-Protocol: omni-binary.v1\r\n" if binary else ""
    writer.write(
        b"GET /v1/realtime HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n" + protocols.encode() + b"\r\n"
    )
    await reader.readuntil(b"\r\n\r\n")
    client = RawClient(reader, writer)
    update = {"type": "session.update", "session": {"type": "realtime", "output_modalities": ["audio"]}}
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}
    for event in (update, {"type": "conversation.item.create", "item": item}, {"type": "response.create"}):
        await client.send(frame(TEXT, orjson.dumps(event)))
    return client


async def connection_gone(client: RawClient) -> bool:
    """The client finds its socket dropped: what the kernel still held, then EOF or a reset."""
    try:
        while await asyncio.wait_for(client.reader.read(1 << 16), 5):
            pass
    except OSError:
        return True
    except TimeoutError:
        return False
    return True


async def eventually(check: object, timeout: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if check():  # type: ignore[operator]
            return True
        await asyncio.sleep(0.05)
    return bool(check())  # type: ignore[operator]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
async def test_a_client_that_stops_reading_gets_4010_when_it_reads_again(gw: RunningGateway, binary: bool) -> None:
    client = await stalled_client(gw.port, binary=binary)
    closes = gw.runtime.metrics.closes.labels("4010")
    before = closes._value.get()
    assert await eventually(lambda: closes._value.get() > before, 20), "no 4010 decision"
    # It reads after all, within the grace: the rest of what was in flight, then the close.
    code = None
    while code is None:
        opcode, payload = await asyncio.wait_for(client.read_frame(), 10)
        if opcode == CLOSE:
            code = struct.unpack("!H", payload[:2])[0]
    assert code == 4010
    client.abort()


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
async def test_a_client_that_never_reads_again_is_dropped_and_its_slot_released(
    gw: RunningGateway, binary: bool, asgi_errors: list[str]
) -> None:
    rt = gw.runtime
    clients = [await stalled_client(gw.port, binary=binary) for _ in range(5)]
    assert await eventually(lambda: len(rt.connections) == 5, 5)
    # Decision after STALL_S of no progress, the drop GRACE_S later: well inside 10 s.
    assert await eventually(lambda: not rt.connections, 10), f"{len(rt.connections)} connections left"
    assert rt.metrics.sessions._value.get() == 0
    assert await eventually(lambda: not gw.server.server_state.connections, 5), "sockets still open"
    for c in clients:
        assert await connection_gone(c)
        c.abort()
    assert not asgi_errors, asgi_errors
    # Every slot is free again: max_sessions new sessions are accepted.
    fresh = [await stalled_client(gw.port, binary=False) for _ in range(6)]
    assert await eventually(lambda: len(rt.connections) == 6, 5)
    for c in fresh:
        c.abort()
