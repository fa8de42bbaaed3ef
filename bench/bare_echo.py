"""A bare Starlette WebSocket echo: the baseline ``voice_load.py`` measures the gateway against.

On ``/echo`` every text or binary message is sent straight back, unchanged.
On ``/duplex`` (the baseline of ``voice_load.py --duplex``) every message read
is answered with one 20 ms audio message, as a voice session that is speaking
sends one while it listens: a ``response.output_audio.delta`` JSON event for a
text message, an output audio frame of the gateway's size for a binary one.
Either way the same messages go in and out as with the gateway. It is served
exactly as ``omni-gateway serve`` serves the gateway (uvicorn with uvloop,
httptools, ``websockets-sansio``, no permessage-deflate, the same frame size
limit), so the difference between the two is the gateway's own work::

    python bench/bare_echo.py --port 8001
"""

from __future__ import annotations

import argparse
import base64

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

BINARY_SUBPROTOCOL = "omni-binary.v1"  # echoed when offered, as the gateway does
MAX_FRAME_BYTES = 8 << 20  # the gateway's default max_frame_bytes
_PCM = bytes(range(256)) * 3 + bytes(192)  # 960 B: 20 ms of 24 kHz PCM16
# What the gateway sends for 20 ms of answer: the same fields, ids of the same length.
AUDIO_DELTA_TEXT = orjson.dumps({
    "type": "response.output_audio.delta", "event_id": "event_0123456789abcdef0123",
    "response_id": "resp_0123456789abcdef012345", "item_id": "item_0123456789abcdef012345", "output_index": 0,
    "content_index": 0,
    "delta": base64.b64encode(_PCM).decode(), "server_event_seq": 123456,
}).decode()  # fmt: skip
AUDIO_DELTA_FRAME = bytes(40) + _PCM  # the gateway's binary header (13 B + a 27-char item id, padded) + PCM


async def answer(ws: WebSocket, text_reply: str | None, bytes_reply: bytes | None) -> None:
    """Accept, then answer every message: with the given reply, or (None) with the message itself."""
    offered = ws.scope.get("subprotocols") or []
    await ws.accept(subprotocol=BINARY_SUBPROTOCOL if BINARY_SUBPROTOCOL in offered else None)
    while True:
        # receive() rather than receive_text(): one loop serves text and binary alike.
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return
        text = message.get("text")
        if text is not None:
            await ws.send_text(text if text_reply is None else text_reply)
        else:
            await ws.send_bytes(bytes_reply if bytes_reply is not None else message.get("bytes") or b"")


async def echo(ws: WebSocket) -> None:
    await answer(ws, None, None)


async def duplex(ws: WebSocket) -> None:
    await answer(ws, AUDIO_DELTA_TEXT, AUDIO_DELTA_FRAME)


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok")


def create_app() -> Starlette:
    return Starlette(
        routes=[Route("/healthz", healthz), WebSocketRoute("/echo", echo), WebSocketRoute("/duplex", duplex)]
    )


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
