"""A GPT-Live sideband in tests (``/v1/live/sessions/{id}/attach``): every event it gets is
checked against openai-python's ``ConnectServerEvent`` and kept."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
import websockets
from support.gateway import RunningGateway
from support.sdk_shapes import check_live_event
from support.waiting import until


class Sideband:
    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self.closed = asyncio.Event()

    async def read(self) -> None:
        """Keep every event until the socket closes (run it as a task)."""
        try:
            async for message in self.ws:
                event = orjson.loads(message)
                check_live_event(event, sideband=True)
                self.events.append(event)
        except websockets.ConnectionClosed:
            pass
        finally:
            self.closed.set()

    def count(self, kind: str) -> int:
        return sum(1 for e in self.events if e["type"] == kind)

    async def wait_for(self, kind: str, timeout: float = 30, **fields: Any) -> dict[str, Any]:
        """The first ``kind`` event whose ``fields`` match, waited for."""

        def found() -> dict[str, Any] | None:
            return next((e for e in self.events if e["type"] == kind and all(e.get(k) == v for k, v in
                                                                               fields.items())), None)  # fmt: skip

        await until(lambda: found() is not None, f"{kind} on the sideband", timeout)
        event = found()
        assert event is not None
        return event

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(orjson.dumps(event).decode())


@contextlib.asynccontextmanager
async def attached(gw: RunningGateway, session_id: str, headers: dict[str, str],
                   serving: RunningGateway | None = None) -> AsyncIterator[Sideband]:  # fmt: skip
    """A sideband on ``session_id`` through ``gw``, reading, once the session has it (where it
    is live: ``serving``, another replica the sideband is relayed to, else ``gw``)."""
    url = f"ws://127.0.0.1:{gw.port}/v1/live/sessions/{session_id}/attach"
    owner = serving or gw
    async with websockets.connect(url, max_size=None, additional_headers=headers) as ws:
        sideband = Sideband(ws)
        reader = asyncio.ensure_future(sideband.read())
        try:
            await until(lambda: bool(owner.runtime.hosting.hosts[session_id].sidebands), "the sideband to join")
            yield sideband
        finally:
            reader.cancel()
