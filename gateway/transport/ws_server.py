"""The WebSocket server protocol: uvicorn's Sans-I/O one, with a fast path for streaming.

uvicorn's ``websockets-sansio`` protocol runs every incoming frame through
websockets' generator-based parser, and pauses the socket after every message
until the app has read it (two event-loop calls per message). A realtime
session is mostly small, whole data frames (50 audio appends a second), so
this subclass changes the following and leaves the rest to uvicorn and
websockets:

- **Whole data frames are decoded here**: a masked, unfragmented text or
  binary frame with no reserved bits, no larger than uvicorn's
  ``ws_max_size``, while the connection is open, no fragmented message is in
  progress and permessage-deflate is off: the header is read, the payload
  unmasked and, for text, decoded as UTF-8, then handed to the app as uvicorn
  would. Every other frame (control frames, fragments, anything malformed,
  oversized or invalid UTF-8) is handed whole to websockets' parser, which is
  then at a frame boundary again, so its checks, close codes and errors are
  unchanged. The state this needs (a fragmented message under way, a close
  frame seen, bytes pipelined behind the upgrade request) is tracked here from
  the frame headers, not read from websockets' internals.
- **Reading pauses only when ``MAX_QUEUED_MESSAGES`` messages, or
  ``MAX_QUEUED_BYTES`` of them, wait** for the app (resuming below
  ``RESUME_BELOW`` messages and half the bytes), instead of after every
  message. A session that stops reading still cannot buffer more than that
  here (plus the message being read, up to ``ws_max_size``, and the kernel's
  socket buffer): 64 small appends, or one 15 MiB message. The messages wait in a
  deque with one waiter (the app's one reader), not an ``asyncio.Queue``.
- **Messages can skip the queue**: the protocol offers the ASGI extension
  ``omni.websocket.direct`` (a function taking a callback). An app that
  registers a callback gets each received message synchronously as it is
  read, with no task switch, whenever nothing is queued ahead of it; the
  callback returns False to decline one (it is queued, with what follows,
  for the app's ``receive``), so the order holds. Apps that ignore the
  extension see plain ASGI.
- **One socket gets at most ``MESSAGES_PER_TURN`` messages per loop turn**:
  the bytes behind them wait, unparsed, with reading paused, until the next
  turn. A client that writes thousands of small messages at once (one read
  can hold a thousand) cannot hold the event loop, and so every other socket
  and ``/healthz``, for the time they all take; TCP slows it down instead.
- **A connection can be dropped**: the extension ``omni.websocket.abort`` (a
  function) aborts the transport, for a client that stopped reading: closing
  it would wait for the unsent bytes for as long as the peer's TCP lives; and
  ``omni.websocket.send_buffer`` (a function of a size) bounds the socket's
  kernel send buffer, so such a client is noticed in seconds, not minutes.
- **Whole data frames are written here** (a server frame is a 2-10 byte header
  and the payload, unmasked) while the connection is open with no extension;
  the rest of ``send`` (accept, close, a closing connection) is uvicorn's.
- **Frames can be written without a send**: the extension
  ``omni.websocket.write`` (a function of ``[(is_text, payload bytes), ...]``)
  writes the frames at once, in one ``writelines``, and returns True, while the
  connection is open, unpaused (under the transport's high-water mark) and
  uncompressed; otherwise it writes nothing and returns False, and the app
  sends through ASGI as usual (which waits for the transport to drain). No
  task switch, no ASGI message, no str round trip for JSON the app already
  holds as UTF-8 bytes.

What this takes from uvicorn's class (its attributes are not documented) is
listed and checked at start-up in ``ws_compat``: use ``server_protocol()`` (below)
as uvicorn's ``ws``, which falls back to the stock protocol if the check fails.

Measured with ``bench/voice_load.py`` (see bench/README.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import struct
from collections import deque
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from gateway.transport.ws_compat import apply_mask, choose, release_parser

DIRECT_EXTENSION = "omni.websocket.direct"
ABORT_EXTENSION = "omni.websocket.abort"  # drop the TCP connection now, unsent bytes and all
SEND_BUFFER_EXTENSION = "omni.websocket.send_buffer"  # bound the kernel's send buffer of the socket
WRITE_EXTENSION = "omni.websocket.write"  # write whole data frames now, or say it cannot
MAX_QUEUED_MESSAGES = 64  # messages read from the socket but not yet by the app: pause reading at this many
MAX_QUEUED_BYTES = 16 << 20  # ... or at this many bytes of them (a 15 MiB message is the API's largest)
RESUME_BELOW = 16  # ... and resume once fewer than this are left (and under half the bytes)
MESSAGES_PER_TURN = 2  # messages taken from one socket per loop turn; the bytes behind wait for the next
FAST_FRAME_MAX = 1 << 16  # a larger frame is streamed to websockets' parser rather than assembled here

_CONT, _TEXT, _BINARY, _CLOSE = 0x0, 0x1, 0x2, 0x8


class Inbox:
    """What uvicorn's protocol needs of its receive queue (``put_nowait``,
    ``get``, ``qsize``, ``empty``) for one reader: a deque, and a future only
    while the reader waits."""

    __slots__ = ("_items", "_waiter", "bytes")

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.bytes = 0  # payload bytes waiting (text counted in characters)

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        self.bytes += _payload_size(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def get(self) -> Any:
        while not self._items:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            await waiter
        item = self._items.popleft()
        self.bytes -= _payload_size(item)
        return item

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items


def _payload_size(message: Any) -> int:
    payload = message.get("text") or message.get("bytes") if isinstance(message, dict) else None
    return len(payload) if payload else 0


def _header(opcode_byte: int, n: int) -> bytes:
    if n < 126:
        return bytes((opcode_byte, n))
    if n < 1 << 16:
        return struct.pack("!BBH", opcode_byte, 126, n)
    return struct.pack("!BBQ", opcode_byte, 127, n)


def answer_refused_request(protocol: Any) -> None:
    """websockets refused the upgrade request (a head line over its 8 KiB: 431; too many
    headers: 431; a request line too long: 414; no valid request) and queued its answer,
    which uvicorn's class never writes: the socket would wait, unanswered, for ever. Write
    it and close. (``conn`` is uvicorn's; ``handshake_exc``, ``data_to_send`` websockets'.)"""
    conn = getattr(protocol, "conn", None)
    if conn is None or getattr(conn, "handshake_exc", None) is None or protocol.handshake_initiated:
        return
    transport = protocol.transport
    if not transport.is_closing():
        transport.write(b"".join(conn.data_to_send()))
        transport.close()
    protocol.handshake_complete = protocol.close_sent = True


class RefusingSansIOProtocol(WebSocketsSansIOProtocol):
    """uvicorn's stock ``websockets-sansio`` protocol, but a request websockets refuses is
    answered and closed (what serves when ``ws_compat``'s check turns the fast path off)."""

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self.handshake_complete:
            answer_refused_request(self)


class StreamingWebSocketProtocol(WebSocketsSansIOProtocol):
    """Pass as uvicorn's ``ws`` (``gateway.transport.ws_server:StreamingWebSocketProtocol``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.inbox = Inbox()
        self.queue = self.inbox  # type: ignore[assignment]
        self._direct: Callable[[dict[str, Any]], bool] | None = None  # the app's on-message callback
        self._turn_left = MESSAGES_PER_TURN  # messages this socket may still deliver in this loop turn
        self._next_turn = False  # parsing stopped at the budget; it goes on at the next turn
        self._fast: bool | None = None  # None until the handshake is done; False: parser only
        self._partial = b""  # the start of a frame not yet complete
        self._to_parser = 0  # bytes of the current frame still owed to the parser
        self._fragmented = False  # a fragmented message is under way (its frames go to the parser)
        self._peer_closed = False  # the client's close frame went to the parser
        self._lost = False  # the TCP connection is gone
        self._head: bytes | None = b""  # the upgrade request until its end is seen
        self._pipelined = False  # bytes arrived behind the upgrade request, before our 101
        config = self.config
        self._max_size: int | None = config.ws_max_size
        self._deflate = bool(config.ws_per_message_deflate)

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:
            scope["extensions"][DIRECT_EXTENSION] = self._set_direct
            scope["extensions"][ABORT_EXTENSION] = self._abort
            scope["extensions"][SEND_BUFFER_EXTENSION] = self._set_send_buffer
            scope["extensions"][WRITE_EXTENSION] = self._write_frames

    def _abort(self) -> None:
        """For a client that reads nothing: ``transport.close()`` would wait for the
        unsent bytes forever (the socket stays ESTABLISHED); this drops it at once."""
        if not self._lost:
            self.transport.abort()

    def _set_send_buffer(self, size: int) -> None:
        """SO_SNDBUF for this socket (Linux then stops growing it up to tcp_wmem's 4 MiB):
        a client that stops reading fills a small buffer in seconds, so the app sees
        the stall, and an idle session's kernel memory stays bounded."""
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)

    def _open_for_frames(self) -> bool:
        return (
            self.handshake_complete
            and not self.close_sent
            and not self._peer_closed
            and not self._lost
            and not self._deflate
            and not self.transport.is_closing()
        )

    def _write_frames(self, frames: list[tuple[bool, bytes]]) -> bool:
        """``omni.websocket.write``: the frames written now (True), or nothing (False)."""
        if not self.writable.is_set() or not self._open_for_frames():
            return False
        parts: list[bytes] = []
        for text, payload in frames:
            parts.append(_header(0x81 if text else 0x82, len(payload)))
            parts.append(payload)
        self.transport.writelines(parts)
        return True

    def _set_direct(self, callback: Callable[[dict[str, Any]], bool]) -> None:
        self._direct = callback

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        super().connection_lost(exc)
        release_parser(self)  # the last frame it parsed, freed now, not at the next full collection

    def data_received(self, data: bytes) -> None:
        if self._fast is None:
            if not self.handshake_complete:
                self._watch_request(data)
                super().data_received(data)
                answer_refused_request(self)
                return
            # The parser sits at a frame boundary after the handshake, unless bytes wait in it.
            self._fast = not self._pipelined and not self._deflate
        if not self._fast or self.close_sent:
            self._fast = False
            self._parse(data)
            return
        if self._to_parser:
            n = min(self._to_parser, len(data))
            self._to_parser -= n
            self._parse(data[:n])
            data = data[n:]
        if self._partial:
            data = self._partial + data
            self._partial = b""
        self._turn_left = MESSAGES_PER_TURN
        self._frames(data)
        if not self._turn_left and self._partial and not self._next_turn:
            self._next_turn = True
            self.transport.pause_reading()
            asyncio.get_running_loop().call_soon(self._take_next_turn)

    def _take_next_turn(self) -> None:
        """Parse what waited behind the last turn's budget; read again unless the queue is full."""
        self._next_turn = False
        if self._lost:
            return
        if not self.read_paused:
            self.transport.resume_reading()
        data, self._partial = self._partial, b""
        self.data_received(data)

    def _watch_request(self, data: bytes) -> None:
        """Before our 101: note whether anything follows the upgrade request (a
        client must wait for the 101, RFC 6455 4.1; one that does not leaves
        bytes in the parser, and the fast path never starts)."""
        if self._head is None or self.handshake_initiated:
            self._pipelined = True
            return
        self._head += data
        end = self._head.find(b"\r\n\r\n")
        if end >= 0:
            self._pipelined = end + 4 < len(self._head)
            self._head = None

    def _frames(self, data: bytes) -> None:
        pos, end = 0, len(data)
        max_size = self._max_size
        while end - pos >= 2 and self._fast:
            b0, b1 = data[pos], data[pos + 1]
            length, head = b1 & 0x7F, 2
            if length == 126:
                if end - pos < 4:
                    break
                length, head = int.from_bytes(data[pos + 2 : pos + 4], "big"), 4
            elif length == 127:
                if end - pos < 10:
                    break
                length, head = int.from_bytes(data[pos + 2 : pos + 10], "big"), 10
            masked = b1 & 0x80
            head += 4 if masked else 0
            size = head + length
            opcode = b0 & 0x0F
            fast = (
                b0 & 0xF0 == 0x80  # FIN, no reserved bits
                and masked
                and (opcode == _TEXT or opcode == _BINARY)
                and length <= FAST_FRAME_MAX
                and (max_size is None or length <= max_size)
                and not self._fragmented
                and not self.close_sent
            )
            if not fast:
                if not masked or (max_size is not None and length > max_size) or opcode == _CLOSE or self.close_sent:
                    # The parser refuses it or the connection is closing: it takes everything from here.
                    self._fast = False
                    self._peer_closed = self._peer_closed or opcode == _CLOSE
                    self._parse(data[pos:])
                    return
                if opcode == _TEXT or opcode == _BINARY:
                    self._fragmented = not b0 & 0x80  # a first fragment: the rest follow as continuations
                elif opcode == _CONT and b0 & 0x80:
                    self._fragmented = False  # the last fragment
                take = min(size, end - pos)
                self._to_parser = size - take
                self._parse(data[pos : pos + take])
                pos += take
                continue
            if end - pos < size or not self._turn_left:
                break
            payload = apply_mask(data[pos + head : pos + size], data[pos + head - 4 : pos + head])
            if opcode == _TEXT:
                try:
                    message: dict[str, Any] = {"type": "websocket.receive", "text": payload.decode()}
                except UnicodeDecodeError:
                    self._parse(data[pos : pos + size])  # uvicorn closes with 1007
                    pos += size
                    continue
            else:
                message = {"type": "websocket.receive", "bytes": payload}
            pos += size
            self._deliver(message)
        if pos < end:
            if self._fast:
                self._partial = data[pos:]
            else:
                self._parse(data[pos:])

    def _parse(self, data: bytes) -> None:
        if data:
            super().data_received(data)

    def _deliver(self, message: dict[str, Any]) -> None:
        if self.close_sent:
            return  # past the app's websocket.close: dropped, as uvicorn does
        self._turn_left -= 1
        direct = self._direct
        if direct is not None and not self.queue.qsize() and direct(message):
            return
        self.queue.put_nowait(message)  # type: ignore[arg-type]  # a websocket.receive event
        queue = self.inbox
        if not self.read_paused and (queue.qsize() >= MAX_QUEUED_MESSAGES or queue.bytes >= MAX_QUEUED_BYTES):
            self.read_paused = True
            self.transport.pause_reading()

    async def send(self, message: Any) -> None:
        if not self.writable.is_set():
            await self.writable.wait()  # the transport's buffer is over its high-water mark
        if message["type"] == "websocket.send" and self._open_for_frames():
            text = message.get("text")
            data = text.encode() if text is not None else message.get("bytes")
            if data is not None:
                self.transport.writelines((_header(0x81 if text is not None else 0x82, len(data)), data))
                return
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body", False):
            # An upgrade answered with a plain HTTP response (a refusal) is a finished handshake;
            # uvicorn's class leaves the flag unset and then logs an ERROR for every refusal.
            self.handshake_complete = True

    async def receive(self) -> Any:
        queue = self.inbox
        message = await queue.get()
        if self.read_paused and queue.qsize() < RESUME_BELOW and queue.bytes < MAX_QUEUED_BYTES // 2:
            self.read_paused = False
            self.transport.resume_reading()
        return message


@functools.cache
def server_protocol() -> Any:
    """What to pass as uvicorn's ``ws``: the fast protocol class, or uvicorn's stock one
    (refused requests answered) if ``ws_compat``'s start-up check fails on it (checked once
    per process)."""
    chosen = choose(StreamingWebSocketProtocol)
    return chosen if chosen is StreamingWebSocketProtocol else RefusingSansIOProtocol
