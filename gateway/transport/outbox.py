"""The outbound queue of one socket, drained in order.

Producers (the reader, engine callbacks) never await: they ``put`` and go on,
so a slow client cannot stall an engine. Where the server offers a direct
write (``write_now``: ``omni.websocket.write``), what was put during one loop
turn is written at the end of that turn in one call, with no task switch; when
that cannot be done (the transport is over its high-water mark, or a send is
under way), the writer task drains the queue through ASGI ``send``, which waits
for the socket. Either way the order of the puts is the order on the wire.

A client is a slow consumer, and the connection is closed with 4010
(``SLOW_CONSUMER``) instead of growing memory without bound, when either

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
WriteNow = Callable[[list[tuple[bool, bytes]]], bool]  # frames (is_text, payload): written now, or False


class SlowConsumer(Exception):
    pass


class Outbox:
    def __init__(self, send: Send, max_bytes: int, stall_s: float = 10.0, write_now: WriteNow | None = None) -> None:
        self._send = send
        self.write_now = write_now
        self.max_bytes = max_bytes
        self.stall_s = stall_s
        self._loop = asyncio.get_running_loop()
        self._sending_since = 0.0  # loop time the send under way began; 0: none
        self._queue: deque[tuple[bool, bytes]] = deque()  # frames: (is_text, payload)
        self._bytes = 0
        self._flush_at_turn_end = False  # a direct write of the queue is scheduled
        self._wakeup = asyncio.Event()
        self._closing: dict[str, Any] | None = None
        self.closed = False

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    def put_text(self, text: str | bytes) -> None:
        """A text message: a str, or its UTF-8 bytes (JSON the caller encoded: not decoded again)."""
        self._put(True, text.encode() if isinstance(text, str) else text)

    def put_bytes(self, data: bytes) -> None:
        self._put(False, data)

    def _put(self, text: bool, payload: bytes) -> None:
        if self._closing is not None:
            return
        size = len(payload)
        if self._bytes + size > self.max_bytes:
            raise SlowConsumer(f"{self._bytes + size} bytes queued for a client that is not reading")
        since = self._sending_since
        if since and self._loop.time() - since > self.stall_s:
            raise SlowConsumer(f"the socket took no byte for {self.stall_s:.0f} s")
        self._queue.append((text, payload))
        self._bytes += size
        if self.write_now is None or since:
            self._wakeup.set()  # a send is under way: the writer task keeps the order
        elif not self._flush_at_turn_end:
            self._flush_at_turn_end = True
            self._loop.call_soon(self._write_queued)

    def _write_queued(self) -> None:
        """The direct path: everything queued, in one write, unless a send is under way
        or the server cannot take it now (then the writer task drains the queue)."""
        self._flush_at_turn_end = False
        queue = self._queue
        if not queue or self._closing is not None or self._sending_since:
            self._wakeup.set()
            return
        write_now = self.write_now
        if write_now is not None and write_now(list(queue)):
            queue.clear()
            self._bytes = 0
        else:
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
                    text, payload = queue.popleft()
                    self._bytes -= len(payload)
                    self._sending_since = self._loop.time()
                    message = {"type": "websocket.send", "text": payload.decode()} if text else {
                        "type": "websocket.send", "bytes": payload}  # fmt: skip
                    await send(message)
                    self._sending_since = 0.0
                if self._closing is not None:
                    await send(self._closing)
                    return
        except OSError:
            return  # the peer is gone; the reader sees the disconnect
        finally:
            self.closed = True
