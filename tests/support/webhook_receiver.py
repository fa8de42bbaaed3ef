"""A webhook receiver on loopback (a real HTTP/1.1 server), checking Standard Webhooks signatures.

Written from the Standard Webhooks specification (standardwebhooks.com), not from the
gateway: the secret is ``whsec_`` + base64 of the key; ``webhook-signature`` holds one or
more ``v1,<base64 HMAC-SHA256 of "{webhook-id}.{webhook-timestamp}.{body}">``, space
separated. Every request is kept (``received``) with whether its signature verified.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson


def verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    content = f"{headers.get('webhook-id', '')}.{headers.get('webhook-timestamp', '')}.".encode() + body
    expected = base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()
    for entry in headers.get("webhook-signature", "").split(" "):
        version, _, sig = entry.partition(",")
        if version == "v1" and hmac.compare_digest(sig, expected):
            return True
    return False


@dataclass
class Delivery:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    verified: bool


@dataclass
class Receiver:
    secret: str
    status: int = 200
    on_event: Callable[[Delivery], Awaitable[None]] | None = None
    received: list[Delivery] = field(default_factory=list)
    url: str = ""
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *lines = head.decode("latin-1").split("\r\n")
            headers = {}
            for line in lines:
                if ":" in line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            delivery = Delivery(request_line.split(" ")[1], headers, orjson.loads(body),
                                verify(self.secret, headers, body))  # fmt: skip
            self.received.append(delivery)
            writer.write(f"HTTP/1.1 {self.status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            if self.on_event is not None and self.status == 200:
                task = asyncio.get_running_loop().create_task(self.on_event(delivery))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def receiver(secret: str) -> AsyncIterator[Receiver]:
    r = Receiver(secret)
    server = await asyncio.start_server(r._handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    r.url = f"http://127.0.0.1:{port}/hooks/calls"
    try:
        yield r
    finally:
        server.close()
        for task in list(r.tasks):
            task.cancel()
