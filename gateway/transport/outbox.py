"""The outbound queue of one socket: a single writer task drains it in order.

Producers (the reader, engine callbacks) never await: they ``put`` and go on,
so a slow client cannot stall an engine. A client is a slow consumer, and the
connection is closed with 4010 (``SLOW_CONSUMER``) instead of growing memory
without bound, when either

- more than ``max_bytes`` wait unsent, or
- one send has been blocked (the socket accepts no byte) for ``stall_s``
  seconds while more events come: a client that stopped reading, found long
  before ``max_bytes`` fill on a slow stream (binary audio: 48 kB/s) and
  before the server's keepalive would (1011 after 40 s).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

Send = Callable[[dict[str, Any]], Awaitable[None]]


class SlowConsumer(Exception):
    pass


class Outbox:
    def __init__(self, send: Send, max_bytes: int, stall_s: float = 10.0) -> None:
        self._send = send
        self.max_bytes = max_bytes
        self.stall_s = stall_s
        self._loop = asyncio.get_running_loop()
        self._sending_since = 0.0  # loop time the send under way began; 0: none
        self._queue: deque[tuple[dict[str, Any], int]] = deque()
        self._bytes = 0
        self._wakeup = asyncio.Event()
        self._closing: dict[str, Any] | None = None
        self.closed = False

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    def put_text(self, text: str) -> None:
        self._put({"type": "websocket.send", "text": text}, len(text))

    def put_bytes(self, data: bytes) -> None:
        self._put({"type": "websocket.send", "bytes": data}, len(data))

    def _put(self, message: dict[str, Any], size: int) -> None:
        if self._closing is not None:
            return
        if self._bytes + size > self.max_bytes:
            raise SlowConsumer(f"{self._bytes + size} bytes queued for a client that is not reading")
        since = self._sending_since
        if since and self._loop.time() - since > self.stall_s:
            raise SlowConsumer(f"the socket took no byte for {self.stall_s:.0f} s")
        self._queue.append((message, size))
        self._bytes += size
        self._wakeup.set()

    def close(self, code: int, reason: str) -> None:
        """Send what is queued, then the close frame (first close wins)."""
        if self._closing is None:
            self._closing = {"type": "websocket.close", "code": code, "reason": reason}
            self._wakeup.set()

    def abort(self, code: int, reason: str) -> None:
        """Drop what is queued and close now (slow consumer)."""
        self._queue.clear()
        self._bytes = 0
        self._closing = {"type": "websocket.close", "code": code, "reason": reason}
        self._wakeup.set()

    async def run(self) -> None:
        """The writer task: returns after the close frame went out or the peer left."""
        send, queue = self._send, self._queue
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                while queue:
                    message, size = queue.popleft()
                    self._bytes -= size
                    self._sending_since = self._loop.time()
                    await send(message)
                    self._sending_since = 0.0
                if self._closing is not None:
                    await send(self._closing)
                    return
        except OSError:
            return  # the peer is gone; the reader sees the disconnect
        finally:
            self.closed = True
