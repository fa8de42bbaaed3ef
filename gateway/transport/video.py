"""``/v1/realtime/video``: the WebSocket of a streaming video session.

The session itself is hosted (``gateway/hosting/video.py``: the stream, its
ownership in the store, interactions from anywhere); here is the socket and
its delivery under pressure. Everything for the client goes through one
ordered queue drained by one writer task, so a slow client never stalls the
engine:

- control events (``video.start``, ``session.interaction.queued``, errors,
  ``session.done``) are never dropped; ``session.done``'s ``chunks`` is set
  here, when it is written: the chunks this client received (metadata and
  frame), the trailer included, as upstream counts them;
- a chunk is a ``video.chunk_metadata`` event followed by exactly one binary
  frame. At most ``video_queue_chunks`` chunks wait; when a new one arrives
  with the queue full, the *oldest waiting chunk* is dropped whole (metadata
  and frame), and the next chunk delivered reports it in
  ``dropped_chunks`` / ``dropped_generation_chunk_indexes``;
- a client that lets more than ``video_max_consecutive_drops`` chunks drop
  without taking one is closed with 4010 (``slow_consumer``).

The first fMP4 chunk delivered carries the init segment (ftyp+moov) before its
fragment, whichever chunk that is, so a stream stays playable after drops.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import orjson

from gateway.auth import Grant
from gateway.hosting.video import VideoHost, VideoPeer
from gateway.protocol import fmp4
from gateway.protocol.errors import CloseCode, Code, ProtocolError
from gateway.protocol.video_events import error_event
from gateway.transport.handshake import accept, admit_seat, common_refusal, minted_refusal, refuse
from gateway.transport.lifecycle import drop, settle
from gateway.transport.services import Services
from gateway.transport.ws_server import ABORT_EXTENSION

log = logging.getLogger("omni.video")

MAX_TRAILER_ENTRIES = 100_000  # fragments indexed for the trailer (14 h at two chunks a second); later
#   ones are left out of it
MAX_CONTROL_QUEUED = 256  # control events waiting for a client that does not read; more: close 4010
SLOW_CLOSE_GRACE_S = 5.0  # after the 4010 decision, how long the close frame may wait behind a full
#   socket before the connection is dropped without it


class VideoServices(Services, Protocol):
    """What the video endpoint needs of the process (the runtime provides it)."""

    @property
    def serves_video(self) -> bool:
        """Whether a video engine runs here."""

    @property
    def video_model(self) -> str | None:
        """The model the video engine serves, by name (None: it names none)."""

    def video_allowed(self, grant: Grant) -> bool:
        """Whether ``grant`` may use the video model (its tenant's allow-list)."""

    @property
    def video_sockets(self) -> dict[str, VideoSocket]:
        """The video sockets open here, by session id (counted against ``max_sessions``)."""

    async def open_video(self, principal: str, peer: VideoPeer) -> VideoHost:
        """A new video session hosted here, owned in the store before it returns."""


class VideoEndpoint:
    """ASGI app for the streaming video WebSocket."""

    def __init__(self, runtime: VideoServices) -> None:
        self.runtime = runtime

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        rt = self.runtime

        def encode_error(code: str, message: str) -> bytes:
            return orjson.dumps(error_event(code, message))

        hs = await accept(rt, scope, receive, send, choose_subprotocol, encode_error)
        if hs is None:
            return
        refusal = common_refusal(rt, hs) or minted_refusal(hs.grant, video=True, model=None)
        if refusal is None and not rt.serves_video:
            refusal = (Code.NO_VIDEO_ENGINE, "This gateway runs no video engine.", CloseCode.NORMAL)
        if refusal is None and not rt.video_allowed(hs.grant):  # as the realtime route refuses
            refusal = (Code.MODEL_NOT_ALLOWED, f"This credential may not use the video model {rt.video_model!r}.",
                       CloseCode.FORBIDDEN)  # fmt: skip
        if refusal is not None:
            await refuse(rt, send, refusal, encode_error(refusal[0], refusal[1]))
            return
        seat = await admit_seat(rt, hs, send, encode_error)
        if seat is None:
            return
        try:
            socket = VideoSocket(rt, receive, send, abort=scope.get("extensions", {}).get(ABORT_EXTENSION))
            await socket.run(await rt.open_video(hs.grant.principal, socket))
        finally:
            await seat.close()


def choose_subprotocol(offered: list[str]) -> str | None:
    """Echo the first offered subprotocol that is not a credential."""
    return next((p for p in offered if not p.startswith("openai-insecure-api-key.")), None)


class VideoSocket:
    """One video client's socket, a ``VideoPeer`` of its host: the queue and the writer."""

    def __init__(self, runtime: VideoServices, receive: Any, send: Any, *, abort: Callable[[], None] | None) -> None:
        self.runtime = runtime
        self._receive = receive
        self._send = send
        self.abort = abort  # the server's way to drop the TCP connection
        self.host: VideoHost | None = None
        # ("json", event) | ("chunk", metadata, media, init_segment) | ("trailer",)
        self._queue: deque[tuple[Any, ...]] = deque()
        self._queued_chunks = 0
        self._wake = asyncio.Event()
        self._close: tuple[int, str] | None = None
        self._dropped: list[int] = []  # generation indexes dropped since the last delivered chunk
        self._consecutive_drops = 0
        self._sent_chunks = 0
        self._init_sent = False
        self._reader: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._fragments: list[tuple[int, int]] = []  # (decode time, moof offset) of delivered fragments
        self._stream_bytes = 0  # fMP4 bytes delivered so far
        self._track = 1
        self._mp4 = False  # the stream is fragmented MP4 (its fragments are indexed for the trailer)

    # --- lifecycle --------------------------------------------------------------

    async def run(self, host: VideoHost) -> None:
        rt = self.runtime
        self.host = host
        rt.video_sockets[host.id] = self
        metrics = rt.hosting.metrics
        metrics.sessions.inc()
        metrics.sessions_total.inc()
        loop = asyncio.get_running_loop()
        writer = self._writer = loop.create_task(self._write_loop())
        reader = self._reader = loop.create_task(self._read_loop(host))
        try:
            await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
            await settle(reader, 2.0)
        finally:
            for task in (reader, writer):
                task.cancel()
            rt.video_sockets.pop(host.id, None)
            metrics.sessions.dec()
            await host.end()  # a client gone mid-stream: the engine request is aborted

    async def _read_loop(self, host: VideoHost) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            if text is None:
                host.refuse(ProtocolError(Code.INVALID_VALUE, "Binary frames are not accepted on the video socket."))
            else:
                host.receive(text)

    # --- the VideoPeer: what the host sends ----------------------------------------------

    def send_event(self, event: dict[str, Any]) -> None:
        if self._close is not None:
            return
        if len(self._queue) - self._queued_chunks >= MAX_CONTROL_QUEUED:
            self._slow("control events are piling up")
            return
        self._queue.append(("json", event))
        self._wake.set()

    def send_chunk(self, meta: dict[str, Any], media: bytes, init_segment: bytes) -> None:
        if self._close is not None:
            return
        limit = self.runtime.settings.video_queue_chunks
        if self._queued_chunks >= limit:
            for i, item in enumerate(self._queue):
                if item[0] == "chunk":
                    del self._queue[i]
                    self._queued_chunks -= 1
                    self._dropped.append(item[1]["generation_chunk_index"])
                    self._consecutive_drops += 1
                    self.runtime.hosting.metrics.video_dropped.inc()
                    break
            if self._consecutive_drops > self.runtime.settings.video_max_consecutive_drops:
                self._slow(f"{self._consecutive_drops} chunks dropped in a row")
                return
        self._mp4 = str(meta.get("mime_type", "")).startswith("video/mp4")
        self._queue.append(("chunk", meta, media, init_segment))
        self._queued_chunks += 1
        self._wake.set()

    def completed(self) -> None:
        if self._close is None:
            self._queue.append(("trailer",))
            self._wake.set()

    def close(self, code: int, reason: str) -> None:
        """Close once what is queued is sent (the first close wins)."""
        if self._close is None:
            self._close = (code, reason)
            self._wake.set()

    def _slow(self, why: str) -> None:
        host = self.host
        log.warning("video session %s: slow consumer, closing: %s", host.id if host else "?", why)
        self.runtime.hosting.metrics.closes.labels(str(int(CloseCode.SLOW_CONSUMER))).inc()
        self._queue.clear()
        self._queued_chunks = 0
        self._queue.append(("json", error_event(Code.SLOW_CONSUMER, f"The client read too slowly ({why}).",
                                                request_id=self._request_id())))  # fmt: skip
        self._close = (CloseCode.SLOW_CONSUMER, Code.SLOW_CONSUMER)
        if host is not None:
            host.stop()
        self._wake.set()
        # A client that reads nothing keeps the writer blocked on a full socket:
        # give the close frame a moment, then drop the connection without it.
        asyncio.get_running_loop().call_later(SLOW_CLOSE_GRACE_S, self._abandon)

    def _index(self, payload: bytes) -> None:
        """Note where a delivered fMP4 fragment starts (for the trailer's random-access index)."""
        if self._mp4:
            info = fmp4.fragment_info(payload)
            if info is not None and len(self._fragments) < MAX_TRAILER_ENTRIES:
                offset, self._track, time = info
                self._fragments.append((time, self._stream_bytes + offset))
            self._stream_bytes += len(payload)

    async def _send_trailer(self, send: Any) -> None:
        """vLLM-Omni's ``trailer`` chunk: the stream's closing bytes (here the fMP4 ``mfra``
        index of the fragments delivered), its metadata first, as for a media chunk."""
        if not self._fragments:
            return
        trailer = fmp4.mfra(self._track, self._fragments)
        meta = {
            "type": "video.chunk_metadata", "request_id": self._request_id(), "kind": "trailer",
            "generation_chunk_index": None, "transport_chunk_index": self._sent_chunks, "num_frames": 0,
            "byte_length": len(trailer), "mime_type": "video/mp4", "started_event_ids": [], "active_event_ids": [],
            "completed_event_ids": [], "superseded_event_ids": [], "dropped_chunks": len(self._dropped),
            "dropped_generation_chunk_indexes": self._dropped,
        }  # fmt: skip
        self._dropped = []
        await send({"type": "websocket.send", "text": orjson.dumps(meta).decode()})
        await send({"type": "websocket.send", "bytes": trailer})
        self._sent_chunks += 1

    def _request_id(self) -> str | None:
        return self.host.request_id if self.host is not None else None

    def _abandon(self) -> None:
        drop(self.abort, (self._writer, self._reader))

    async def _write_loop(self) -> None:
        send, queue = self._send, self._queue
        while True:
            await self._wake.wait()
            self._wake.clear()
            while queue:
                item = queue.popleft()
                if item[0] == "json":
                    event = item[1]
                    if event.get("type") == "session.done":
                        # vLLM-Omni counts the chunks it sent, the trailer among them
                        # (its chunks_sent); a chunk dropped here was not sent.
                        event = {**event, "chunks": self._sent_chunks}
                    await send({"type": "websocket.send", "text": orjson.dumps(event).decode()})
                    continue
                if item[0] == "trailer":
                    await self._send_trailer(send)
                    continue
                self._queued_chunks -= 1
                _, meta, media, init = item
                payload = media if self._init_sent or not init else init + media
                self._init_sent = self._init_sent or bool(init)
                self._index(payload)
                meta["transport_chunk_index"] = self._sent_chunks
                meta["byte_length"] = len(payload)
                meta["dropped_chunks"] = len(self._dropped)
                meta["dropped_generation_chunk_indexes"] = self._dropped
                self._dropped = []
                await send({"type": "websocket.send", "text": orjson.dumps(meta).decode()})
                await send({"type": "websocket.send", "bytes": payload})
                self._sent_chunks += 1
                self._consecutive_drops = 0
            if self._close is not None:
                await send({"type": "websocket.close", "code": self._close[0], "reason": self._close[1]})
                return
