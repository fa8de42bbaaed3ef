"""A connection that is gone keeps nothing of what it received (gateway/transport/ws_compat.py
``release_parser``): websockets' parser, a generator, holds the last frame it parsed in a
local, and it and its connection refer to each other, so that frame (up to ``ws_max_size``)
would wait for a full garbage collection. Driven over an in-memory transport."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from gateway.transport.ws_compat import _REQUEST, _client_frame, _MemoryTransport
from gateway.transport.ws_server import StreamingWebSocketProtocol


def chain(generator: Any) -> list[Any]:
    """A generator and those it delegates to, outermost first."""
    out = []
    while inspect.isgenerator(generator):
        out.append(generator)
        generator = generator.gi_yieldfrom
    return out


async def test_a_lost_connection_frees_the_frame_its_parser_held() -> None:
    received: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        while (message := await receive())["type"] != "websocket.disconnect":
            received.append(message)

    config = uvicorn.Config(app, ws=StreamingWebSocketProtocol, ws_max_size=1 << 22, ws_per_message_deflate=False,
                            lifespan="off", log_config=None, ws_ping_interval=None)  # fmt: skip
    config.load()
    protocol = StreamingWebSocketProtocol(config, ServerState(), {})
    transport = _MemoryTransport()
    protocol.connection_made(transport)
    protocol.data_received(_REQUEST)
    async with asyncio.timeout(5):
        while not transport.written.startswith(b"HTTP/1.1 101"):  # noqa: ASYNC110 (a transport signals nothing)
            await asyncio.sleep(0)
    # A fragmented message: not the fast path's (nor is a frame over FAST_FRAME_MAX), websockets' parser parses it.
    protocol.data_received(_client_frame(0x2, b"x" * 30_000, fin=False) + _client_frame(0x0, b"y" * 30_000))
    async with asyncio.timeout(5):
        while not received:  # noqa: ASYNC110 (the app's task runs in the loop's next turns)
            await asyncio.sleep(0)
    assert received[0]["bytes"] == b"x" * 30_000 + b"y" * 30_000
    parsers = chain(protocol.conn.parser)  # the server's parse() delegates to the protocol's (yield from)
    holding = [g for g in parsers if "frame" in g.gi_frame.f_locals]
    assert holding, "the parser holds the last frame while the connection lives"
    protocol.connection_lost(None)
    assert all(g.gi_frame is None for g in parsers)  # closed: their frames, and the payload held, freed now
    protocol.data_received(b"")  # (nothing parses after the loss, and nothing breaks)
