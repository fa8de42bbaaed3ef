"""A bare Starlette WebSocket echo: the baseline ``voice_load.py`` measures the gateway against.

Every text or binary message is sent straight back, unchanged. It is served
exactly as ``omni-gateway serve`` serves the gateway (uvicorn with uvloop,
httptools, ``websockets-sansio``, no permessage-deflate, the same frame size
limit), so the difference between the two is the gateway's own work::

    python bench/bare_echo.py --port 8001
"""

from __future__ import annotations

import argparse

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

BINARY_SUBPROTOCOL = "omni-binary.v1"  # echoed when offered, as the gateway does
MAX_FRAME_BYTES = 8 << 20  # the gateway's default max_frame_bytes


async def echo(ws: WebSocket) -> None:
    offered = ws.scope.get("subprotocols") or []
    await ws.accept(subprotocol=BINARY_SUBPROTOCOL if BINARY_SUBPROTOCOL in offered else None)
    while True:
        # receive() rather than receive_text(): one loop serves text and binary alike.
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return
        text = message.get("text")
        if text is not None:
            await ws.send_text(text)
        else:
            await ws.send_bytes(message.get("bytes") or b"")


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok")


def create_app() -> Starlette:
    return Starlette(routes=[Route("/healthz", healthz), WebSocketRoute("/echo", echo)])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="bare Starlette WebSocket echo (benchmark baseline)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    import uvicorn

    uvicorn.run(
        create_app(),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        ws="websockets-sansio",
        ws_max_size=MAX_FRAME_BYTES,
        ws_per_message_deflate=False,
        log_level=args.log_level,
        lifespan="off",
    )


if __name__ == "__main__":
    main()
