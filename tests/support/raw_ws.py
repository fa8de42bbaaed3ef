"""A WebSocket client over a raw TCP stream: it writes hand-made frames (any opcode,
any bytes, split or joined as the test says) and reads the server's frames as sent."""

from __future__ import annotations

import asyncio
import base64
import os
import struct
from typing import Any

import orjson

from gateway.transport.ws_compat import apply_mask

TEXT, BINARY, CONT, CLOSE, PING, PONG = 0x1, 0x2, 0x0, 0x8, 0x9, 0xA


def frame(opcode: int, payload: bytes, *, fin: bool = True, mask: bool = True, rsv: int = 0) -> bytes:
    head = bytes([(0x80 if fin else 0) | rsv | opcode])
    n = len(payload)
    flag = 0x80 if mask else 0
    if n < 126:
        head += bytes([flag | n])
    elif n < 1 << 16:
        head += bytes([flag | 126]) + struct.pack("!H", n)
    else:
        head += bytes([flag | 127]) + struct.pack("!Q", n)
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + apply_mask(payload, key)


class RawClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def read_frame(self) -> tuple[int, bytes]:
        b0, b1 = await self.reader.readexactly(2)
        n = b1 & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", await self.reader.readexactly(2))
        elif n == 127:
            (n,) = struct.unpack("!Q", await self.reader.readexactly(8))
        return b0 & 0x0F, await self.reader.readexactly(n)

    async def event(self, timeout: float = 5.0) -> dict[str, Any]:
        """The next server event (text frame), skipping other frames."""
        while True:
            opcode, payload = await asyncio.wait_for(self.read_frame(), timeout)
            if opcode == TEXT:
                return dict(orjson.loads(payload))
            if opcode == CLOSE:
                raise ConnectionError(f"closed {struct.unpack('!H', payload[:2])[0] if payload else 1005}")

    async def errors(self, n: int) -> list[str]:
        """The ``error.event_id`` of the next ``n`` error events."""
        out: list[str] = []
        while len(out) < n:
            ev = await self.event()
            if ev["type"] == "error":
                out.append(ev["error"]["event_id"])
        return out

    async def close_code(self, timeout: float = 5.0) -> int:
        while True:
            opcode, payload = await asyncio.wait_for(self.read_frame(), timeout)
            if opcode == CLOSE:
                return int(struct.unpack("!H", payload[:2])[0])

    def abort(self) -> None:
        self.writer.transport.abort()


async def open_raw(port: int, path: str = "/v1/realtime", subprotocols: tuple[str, ...] = ()) -> RawClient:
    """Upgrade a raw TCP connection; the 101 is read, nothing else."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    protocols = f"Sec-WebSocket-Protocol: {', '.join(subprotocols)}\r\n" if subprotocols else ""
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{protocols}\r\n".encode()
    )
    status = await reader.readuntil(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 101"), status
    return RawClient(reader, writer)
