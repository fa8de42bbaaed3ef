"""Test support: a real uvicorn server on 127.0.0.1 and a small realtime client."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import orjson
import uvicorn
import websockets
from support.sdk_shapes import check_event, check_live_event

from gateway.app import create_app
from gateway.runtime import Runtime
from gateway.settings import Settings
from gateway.transport.http_server import http_protocol, limits_of
from gateway.transport.ws_server import server_protocol
from omni_gateway_client.frames import decode_audio_frame


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RunningGateway:
    def __init__(self, server: uvicorn.Server, task: asyncio.Task[None], port: int, runtime: Runtime) -> None:
        self.server = server
        self.task = task
        self.port = port
        self.runtime = runtime
        self.url = f"ws://127.0.0.1:{port}/v1/realtime"
        self.http = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        self.server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.task, 10)


@contextlib.asynccontextmanager
async def run_gateway(
    settings: Settings | None = None, *, ws: Any = None, video_engine: Any = None, wrap: Any = None, **kwargs: Any
) -> AsyncIterator[RunningGateway]:
    """The gateway under uvicorn, on a free port; ``ws`` is uvicorn's WebSocket protocol
    (default: what ``omni-gateway serve`` uses); ``video_engine``: one to serve
    ``/v1/realtime/video`` with (set before the start, so the runtime starts it); ``wrap``:
    an ASGI middleware to put in front of the app."""
    port = free_port()
    ws = ws or server_protocol()
    settings = replace(settings or Settings(), host="127.0.0.1", port=port)
    if not settings.webrtc_advertised_addresses:  # a test's WebRTC media stays on loopback, whatever the machine has
        settings = replace(settings, webrtc_advertised_addresses=("127.0.0.1",), webrtc_advertise_mode="replace")
    app = create_app(settings, **kwargs)
    if video_engine is not None:
        app.state.runtime.video_engine = video_engine
        app.state.runtime.orchestrator.video_engine = video_engine
    http = http_protocol(limits_of(settings))  # what serve uses: request heads bounded
    config = uvicorn.Config(
        wrap(app) if wrap is not None else app, host="127.0.0.1", port=port, ws=ws, http=http, loop="none",
        log_level="warning", ws_per_message_deflate=False, lifespan="on", ws_max_size=settings.max_frame_bytes,
    )  # fmt: skip
    server = uvicorn.Server(config)
    task = asyncio.get_running_loop().create_task(server.serve())
    for _ in range(500):
        if server.started:
            break
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    gw = RunningGateway(server, task, port, app.state.runtime)
    try:
        yield gw
    finally:
        await gw.stop()


class Client:
    """A minimal realtime client for tests: JSON events in, events out.

    On ``/v1/realtime`` (OpenAI's dialects, not ``?duplex=1``) every JSON event received is checked strictly against the
    official SDK's models (``support.sdk_shapes.check_event``, in the client's
    dialect): a shape the SDK would reject fails the test that received it.
    Gateway extension events are accepted once the client opted in (it sent
    ``session.resume``, or ``session.update`` with ``gateway_events: true``, or
    was connected with ``extensions=True``). Binary audio frames are not JSON
    events and are not checked."""

    def __init__(
        self, ws: Any, *, realtime: bool = False, beta: bool = False, extensions: bool = False, live: bool = False
    ) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self.binary: list[bytes] = []
        self.check_shapes = realtime
        self.beta = beta
        self.extensions = extensions
        self.live = live  # GPT-Live (/v1/live/sessions): its events are checked against openai.types.live

    async def send(self, event: dict[str, Any]) -> None:
        if event.get("type") == "session.resume" or (
            event.get("type") == "session.update"
            and isinstance(event.get("session"), dict)
            and event["session"].get("gateway_events") is True
        ):
            self.extensions = True
        await self.ws.send(orjson.dumps(event).decode())

    async def append(self, pcm: bytes) -> None:
        await self.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})

    async def recv(self, timeout: float = 10.0) -> dict[str, Any]:
        while True:
            msg = await asyncio.wait_for(self.ws.recv(), timeout)
            if isinstance(msg, bytes):
                self.binary.append(msg)
                event = decode_audio_frame(msg)
                self.events.append(event)
                return event
            event = orjson.loads(msg)
            self.events.append(event)
            if self.live and isinstance(event, dict):
                check_live_event(event, extensions=self.extensions)
            elif self.check_shapes and isinstance(event, dict):
                check_event(event, beta=self.beta, extensions=self.extensions)
            return event

    async def wait_for(self, type_: str | Callable[[dict[str, Any]], bool], timeout: float = 20.0) -> dict[str, Any]:
        match = (lambda e: e["type"] == type_) if isinstance(type_, str) else type_
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            left = deadline - loop.time()
            try:
                if left <= 0:
                    raise TimeoutError
                event = await self.recv(left)
            except TimeoutError:
                seen = [e["type"] for e in self.events[-30:]]
                errors = [e.get("error") for e in self.events if e.get("type") == "error"][-3:]
                raise AssertionError(f"timed out waiting for {type_}; last events: {seen}; errors: {errors}") from None
            if match(event):
                return event

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]


@contextlib.asynccontextmanager
async def connect(
    url: str, *, subprotocols: list[str] | None = None, headers: dict[str, str] | None = None, extensions: bool = False
) -> AsyncIterator[Client]:
    """``extensions``: the client opted in to gateway extension events by other means
    (a client secret minted with ``gateway_events``)."""
    parts = urlsplit(url)
    duplex = parse_qs(parts.query).get("duplex", ["0"])[0] not in ("0", "false", "")  # vLLM-Omni's dialect
    realtime = parts.path.rstrip("/").endswith("/v1/realtime") and not duplex
    live = parts.path.rstrip("/").endswith("/v1/live/sessions")
    beta = "openai-beta.realtime-v1" in (subprotocols or []) or "realtime=v1" in " ".join(
        v for k, v in (headers or {}).items() if k.lower() == "openai-beta"
    )
    async with websockets.connect(
        url, subprotocols=subprotocols, additional_headers=headers, max_size=None, compression=None,
        open_timeout=10,
        close_timeout=1,
    ) as ws:  # fmt: skip
        yield Client(ws, realtime=realtime, beta=beta, extensions=extensions, live=live)


async def post(gw: RunningGateway, path: str, body: dict[str, Any] | None = None, *,
               headers: dict[str, str]) -> httpx.Response:  # fmt: skip
    """POST ``body`` (JSON; none: ``{}``) to ``path`` on ``gw`` with ``headers`` (a credential)."""
    async with httpx.AsyncClient(timeout=30) as http:
        return await http.post(gw.http + path, headers=headers, json=body or {})
