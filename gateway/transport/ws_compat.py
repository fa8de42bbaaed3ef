"""What the WebSocket fast path takes from uvicorn's and websockets' internals, checked once.

``gateway/transport/ws_server.py`` subclasses uvicorn's ``websockets-sansio``
protocol. Neither library documents that class's attributes, so everything
the subclass relies on is named here (``UVICORN_ATTRIBUTES``), and
``ws_server.server_protocol()`` checks, once per process and before any client
connects, that it is all there *and* that the subclass really works on the
installed releases: it drives one connection over an in-memory transport
(handshake, whole text and binary frames, a fragmented message, a ping, the
send path, a close) and compares what the app received and what went out on
the wire with what the WebSocket protocol prescribes.

When anything differs, the fast path is off for the whole process: one
warning line says why, and uvicorn's stock ``websockets-sansio`` protocol
serves every connection (the app runs on it unchanged; tested). A session
never meets a half-working fast path.

websockets' C ``apply_mask`` (undocumented; ``websockets.speedups``) is used
when it imports, else a pure-Python XOR over Python integers.

``release_parser`` reaches one more internal, websockets' ``Protocol.parser`` (a
generator), and does nothing where it is not one.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import struct
import threading
from collections.abc import Callable, Generator
from typing import Any

log = logging.getLogger("omni.transport")

STOCK_PROTOCOL = "websockets-sansio"  # uvicorn's own, what serves when the check fails

# uvicorn's WebSocketsSansIOProtocol: the attributes the subclass reads or sets.
UVICORN_ATTRIBUTES = (
    "config",  # uvicorn.Config (documented): ws_max_size, ws_per_message_deflate
    "queue",  # the receive queue: replaced by our one-reader Inbox (put_nowait, get, qsize, empty)
    "read_paused",  # whether transport.pause_reading() is in force
    "transport",
    "handshake_initiated",  # the upgrade request was parsed
    "handshake_complete",  # the 101 was sent (or the upgrade refused)
    "close_sent",  # the app (or a protocol failure) sent the close frame
    "writable",  # asyncio.Event: cleared while the transport is over its high-water mark
)
UVICORN_METHODS = ("data_received", "handle_connect", "connection_lost", "send", "receive")


def _xor_mask(data: bytes, mask: bytes) -> bytes:
    """RFC 6455 5.3 unmasking, pure Python: one XOR over two big integers."""
    n = len(data)
    if not n:
        return b""
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")


def _load_mask() -> Callable[[bytes, bytes], bytes]:
    try:
        from websockets.speedups import apply_mask
    except ImportError:
        return _xor_mask
    fast: Callable[[bytes, bytes], bytes] = apply_mask
    if fast(b"\x01\x02\x03\x04\x05", b"\x01\x01\x01\x01") != b"\x00\x03\x02\x05\x04":
        return _xor_mask
    return fast


apply_mask = _load_mask()


def _parsed_nothing() -> Generator[None]:
    while True:
        yield


def release_parser(protocol: Any) -> None:
    """Free at once what websockets' parser holds of a connection that is gone.

    The parser is a generator that keeps the last frame it parsed (up to
    ``ws_max_size``: 15 MiB) in a local, and it and the connection refer to each
    other: without this the frame waits for a full garbage collection, which an
    idle gateway may not run for minutes (measured: ``bench/fuzz_long.py`` left
    ~25 MiB of closed connections' frames per round). Closing the generator
    frees its frame now; an idle one takes its place (nothing is parsed after
    the connection is lost). Where ``protocol.conn.parser`` is no generator
    (another websockets), nothing is done: the collector frees it later."""
    conn: Any = getattr(protocol, "conn", None)
    parser = getattr(conn, "parser", None)
    if not inspect.isgenerator(parser):
        return
    parser.close()
    idle = _parsed_nothing()
    next(idle)
    conn.parser = idle


def missing_attributes(protocol: Any) -> list[str]:
    """The names ``UVICORN_*`` lists that ``protocol`` (an instance) lacks."""
    missing = [name for name in UVICORN_ATTRIBUTES if not hasattr(protocol, name)]
    missing += [name for name in UVICORN_METHODS if not callable(getattr(protocol, name, None))]
    return missing


def choose(protocol_class: type) -> Any:
    """``protocol_class`` if the probe passes on it, else ``STOCK_PROTOCOL`` and one warning."""
    problem = probe(protocol_class)
    if problem is not None:
        log.warning("WebSocket fast path off (%s); uvicorn's %s serves every connection", problem, STOCK_PROTOCOL)
        return STOCK_PROTOCOL
    return protocol_class


def probe(protocol_class: type) -> str | None:
    """Drive one connection through ``protocol_class``; None if all is as expected,
    else what went wrong. Runs on a loop of its own in a thread, so it can be
    called from anywhere, inside a running loop included (a few milliseconds)."""
    result: list[str | None] = []

    def run() -> None:
        try:
            result.append(asyncio.run(asyncio.wait_for(_probe(protocol_class), 5.0)))
        except Exception as exc:  # whatever it is, the fast path must not serve
            result.append(f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=run, name="ws-compat-probe", daemon=True)
    thread.start()
    thread.join(10.0)
    return result[0] if result else "the probe did not finish"


class _MemoryTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: Any) -> None:
        self.written += data

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def _client_frame(opcode: int, payload: bytes, *, fin: bool = True) -> bytes:
    key = os.urandom(4)
    n = len(payload)
    head = bytes([(0x80 if fin else 0) | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    else:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    return head + key + _xor_mask(payload, key)


def _server_frames(data: bytes) -> list[tuple[int, bytes]]:
    frames, pos = [], 0
    while pos + 2 <= len(data):
        b0, b1 = data[pos], data[pos + 1]
        n, pos = b1 & 0x7F, pos + 2
        if n == 126:
            (n,), pos = struct.unpack("!H", data[pos : pos + 2]), pos + 2
        elif n == 127:
            (n,), pos = struct.unpack("!Q", data[pos : pos + 8]), pos + 8
        if b1 & 0x80:
            raise ValueError("the server masked a frame")
        frames.append((b0, bytes(data[pos : pos + n])))
        pos += n
    return frames


_REQUEST = (
    b"GET /probe HTTP/1.1\r\nHost: probe\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)
_LONG = b"x" * 300  # a 16-bit length, both ways


async def _probe(protocol_class: type) -> str | None:
    import uvicorn
    from uvicorn.server import ServerState

    received: list[dict[str, Any]] = []
    done = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            if (await receive())["type"] != "websocket.connect":
                return
            await send({"type": "websocket.accept"})
            while True:
                message = await receive()
                received.append(message)
                if message["type"] == "websocket.disconnect":
                    return
                if message.get("text") == "echo":
                    await send({"type": "websocket.send", "text": "ok"})
                    await send({"type": "websocket.send", "bytes": _LONG})
        finally:
            done.set()

    config = uvicorn.Config(
        app, ws=protocol_class, ws_max_size=1 << 20, ws_per_message_deflate=False,
        lifespan="off", log_config=None, ws_ping_interval=None, proxy_headers=False,
    )  # fmt: skip
    config.load()
    quiet = logging.Filter("nothing")  # the probe's own connection is not worth a log line
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addFilter(quiet)
    try:
        protocol = protocol_class(config, ServerState(), {})
        missing = missing_attributes(protocol)
        if missing:
            return "uvicorn's protocol lacks " + ", ".join(missing)
        transport = _MemoryTransport()
        protocol.connection_made(transport)
        protocol.data_received(_REQUEST)
        for _ in range(100):
            if transport.written.startswith(b"HTTP/1.1 101"):
                break
            await asyncio.sleep(0)
        head_end = transport.written.find(b"\r\n\r\n")
        if not transport.written.startswith(b"HTTP/1.1 101") or head_end < 0:
            return "no 101 answer to the upgrade"
        sent_from = head_end + 4
        wire = (
            _client_frame(0x1, b"echo")
            + _client_frame(0x2, b"\x00\x01\x02")
            + _client_frame(0x1, b"frag", fin=False)
            + _client_frame(0x9, b"pi")  # a ping between fragments
            + _client_frame(0x0, b"ment")
            + _client_frame(0x1, _LONG)
        )
        protocol.data_received(wire[:7])  # a frame split across reads
        protocol.data_received(wire[7:])
        for _ in range(100):
            await asyncio.sleep(0)
            if len(received) >= 4:
                break
        protocol.data_received(_client_frame(0x8, struct.pack("!H", 1000)))
        await asyncio.wait_for(done.wait(), 2.0)
    finally:
        uvicorn_log.removeFilter(quiet)
    expected = [
        {"type": "websocket.receive", "text": "echo"},
        {"type": "websocket.receive", "bytes": b"\x00\x01\x02"},
        {"type": "websocket.receive", "text": "fragment"},
        {"type": "websocket.receive", "text": _LONG.decode()},
    ]
    got = [{k: v for k, v in m.items() if k in ("type", "text", "bytes")} for m in received[:4]]
    if got != expected:
        return f"the app received {got!r}"
    if not received[4:] or received[4]["type"] != "websocket.disconnect" or received[4].get("code") != 1000:
        return f"the close reached the app as {received[4:]!r}"
    frames = _server_frames(bytes(transport.written[sent_from:]))
    data = [f for f in frames if f[0] in (0x81, 0x82)]  # the pong may come first: it is written as parsed
    if data != [(0x81, b"ok"), (0x82, _LONG)] or (0x8A, b"pi") not in frames or frames[-1][0] != 0x88:
        return f"the wire carried {[(hex(op), payload[:8]) for op, payload in frames]}"
    return None


__all__ = ["STOCK_PROTOCOL", "apply_mask", "choose", "missing_attributes", "probe", "release_parser"]
