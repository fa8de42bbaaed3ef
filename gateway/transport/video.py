"""``/v1/realtime/video``: the shell around a ``VideoSession``.

Delivery under pressure. Everything for the client goes through one ordered
queue drained by one writer task, so a slow client never stalls the engine:

- control events (``video.start``, ``session.interaction.queued``, errors,
  ``session.done``) are never dropped;
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
import secrets
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import orjson

from gateway.protocol import fmp4
from gateway.protocol import video_events as ve
from gateway.protocol.errors import CloseCode, Code, ProtocolError
from gateway.protocol.video_events import error_event
from gateway.session.video_session import CloseVideo, Interact, StartVideo, StopVideo, VideoSession
from gateway.store.base import SessionStore, StoreError
from gateway.transport.handshake import accept, common_refusal, refuse
from gateway.transport.lifecycle import drop, settle
from gateway.transport.services import Services
from gateway.transport.ws_server import ABORT_EXTENSION
from orchestrator.engine import EngineError
from orchestrator.orchestrator import Orchestrator, RequestHandle
from orchestrator.video_engine import Interaction, VideoChunk, VideoEngine

log = logging.getLogger("omni.video")

MAX_TRAILER_ENTRIES = 100_000  # fragments indexed for the trailer (14 h at two chunks a second); later
#   ones are left out of it
MAX_CONTROL_QUEUED = 256  # control events waiting for a client that does not read; more: close 4010
SLOW_CLOSE_GRACE_S = 5.0  # after the 4010 decision, how long the close frame may wait behind a full
#   socket before the connection is dropped without it


class VideoServices(Services, Protocol):
    """What the video endpoint needs of the process (the runtime provides it)."""

    @property
    def video_engine(self) -> VideoEngine | None: ...

    @property
    def orchestrator(self) -> Orchestrator:
        """The one that runs video requests."""

    @property
    def video_sessions(self) -> dict[str, VideoConnection]: ...

    @property
    def store(self) -> SessionStore:
        """Where a video session is registered, so interactions from other replicas reach it."""

    @property
    def replica_id(self) -> str: ...

    @property
    def lease_ttl_ms(self) -> int: ...


class VideoEndpoint:
    """ASGI app for the streaming video WebSocket."""

    def __init__(self, runtime: VideoServices) -> None:
        self.runtime = runtime

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        rt = self.runtime
        hs = await accept(rt, scope, receive, send, choose_subprotocol)
        if hs is None:
            return
        refusal = common_refusal(rt, hs)
        if refusal is None and rt.video_engine is None:
            refusal = (Code.NO_VIDEO_ENGINE, "This gateway runs no video engine.", CloseCode.NORMAL)
        if refusal is not None:
            await refuse(rt, send, refusal, orjson.dumps(error_event(refusal[0], refusal[1])))
            return
        assert hs.grant is not None
        conn = VideoConnection(rt, receive, send, principal=hs.grant.principal)
        conn.abort = scope.get("extensions", {}).get(ABORT_EXTENSION)
        await conn.run()


def choose_subprotocol(offered: list[str]) -> str | None:
    """Echo the first offered subprotocol that is not a credential."""
    return next((p for p in offered if not p.startswith("openai-insecure-api-key.")), None)


class VideoConnection:
    def __init__(self, runtime: VideoServices, receive: Any, send: Any, *, principal: str) -> None:
        assert runtime.video_engine is not None
        self.runtime = runtime
        self.principal = principal
        self._receive = receive
        self._send = send
        self.abort: Callable[[], None] | None = None  # the server's way to drop the TCP connection
        self.session = VideoSession(session_id="vsess_" + secrets.token_hex(10), info=runtime.video_engine.info)
        self.handle: RequestHandle | None = None
        # ("json", event) | ("chunk", metadata, media, init_segment)
        self._queue: deque[tuple[Any, ...]] = deque()
        self._queued_chunks = 0
        self._wake = asyncio.Event()
        self._close: tuple[int, str] | None = None
        self._dropped: list[int] = []  # generation indexes dropped since the last delivered chunk
        self._consecutive_drops = 0
        self._sent_chunks = 0
        self._init_sent = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._fence: int | None = None
        self._reader: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._progress = 0.0  # loop time of the last chunk produced or ping (the stall clock)
        self._mp4 = False
        self._fragments: list[tuple[int, int]] = []  # (decode time, moof offset) of delivered fragments
        self._stream_bytes = 0  # fMP4 bytes delivered so far
        self._track = 1

    @property
    def id(self) -> str:
        return self.session.id

    # --- lifecycle --------------------------------------------------------------

    async def run(self) -> None:
        rt = self.runtime
        rt.video_sessions[self.id] = self
        rt.metrics.sessions.inc()
        rt.metrics.sessions_total.inc()
        loop = asyncio.get_running_loop()
        writer = self._writer = loop.create_task(self._write_loop())
        reader = self._reader = loop.create_task(self._read_loop())
        self._spawn(self._watch())
        await self._register()
        try:
            await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
            await settle(reader, 2.0)
        finally:
            for task in (reader, writer, *self._tasks):
                task.cancel()
            if self.handle is not None:
                self.handle.cancel()  # a client gone mid-stream: the engine request is aborted
                self.handle = None
            rt.video_sessions.pop(self.id, None)
            rt.metrics.sessions.dec()
            await self._unregister()

    async def _register(self) -> None:
        """Own the session in the store, so interactions from other replicas reach us."""
        store, rt = self.runtime.store, self.runtime
        try:
            self._fence = await store.acquire(self.id, rt.replica_id, rt.lease_ttl_ms)
            data = orjson.dumps({"kind": "video", "principal": self.principal})
            await store.save_snapshot(self.id, data, fence=self._fence)
        except StoreError as exc:
            log.warning("video session %s not registered in the store: %s", self.id, exc)

    async def _unregister(self) -> None:
        if self._fence is None:
            return
        try:
            await self.runtime.store.release(self.id, self.runtime.replica_id, self._fence)
            await self.runtime.store.delete_session(self.id)
        except StoreError:
            pass

    async def _read_loop(self) -> None:
        default_k = self.session.info.default_transition_chunks
        while True:
            message = await self._receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            try:
                if text is None:
                    raise ProtocolError(Code.INVALID_VALUE, "Binary frames are not accepted on the video socket.")
                event = ve.decode(text)
                if isinstance(event, ve.InteractionEvent) and not event.explicit_transition:
                    event = ve.decode_interaction(orjson.loads(text).get("interaction"), default_k)
                self.runtime.metrics.client_events.labels(f"video.{type(event).__name__.lower()}").inc()
                if isinstance(event, ve.Ping):
                    self._progress = asyncio.get_running_loop().time()  # a ping refreshes the stall clock
                self.session.handle(event)
            except ProtocolError as err:
                self.session.refuse(err)
            self.flush()

    async def _watch(self) -> None:
        """The start timeout and the stall report (vLLM-Omni's: 10 s to send session.start; a
        stream with no chunk and no ping for 60 s is stopped). Checked twice a second."""
        settings, loop = self.runtime.settings, asyncio.get_running_loop()
        connected = loop.time()
        while self.session.state != "done":
            await asyncio.sleep(min(0.5, settings.video_start_timeout_s, settings.video_stall_timeout_s))
            now = loop.time()
            if self.session.state == "idle" and now - connected >= settings.video_start_timeout_s:
                self.session.start_timed_out(settings.video_start_timeout_s)
            elif self.session.state == "streaming" and now - self._progress >= settings.video_stall_timeout_s:
                log.warning("video session %s stalled: no progress for %.0f s", self.id, now - self._progress)
                self.session.stalled(settings.video_stall_timeout_s)
            self.flush()

    # --- session outputs -----------------------------------------------------------

    def flush(self) -> None:
        events, effects = self.session.take()
        for event in events:
            self._put_control(event)
        for effect in effects:
            match effect:
                case StartVideo():
                    self._progress = asyncio.get_running_loop().time()
                    self._mp4 = effect.request.format == "mp4"
                    self.handle = self.runtime.orchestrator.submit(
                        "video",
                        effect.request,
                        on_output=self._on_chunk,
                        on_error=self._on_error,
                        on_done=self._on_done,
                    )
                case Interact():
                    self._spawn(self._interact(effect.request_id, effect.interaction))
                case StopVideo():
                    if self.handle is not None:
                        self.handle.cancel()
                        self.handle = None
                case CloseVideo():
                    self.close(effect.code, effect.reason)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _interact(self, request_id: str, interaction: Interaction) -> tuple[str, str] | None:
        try:
            await self.runtime.orchestrator.interact(request_id, interaction)
        except EngineError as exc:
            self.session.on_interaction_failed(interaction.event_id, exc.code, exc.message)
            self.flush()
            return Code.INTERACTION_FAILED, exc.message
        self.session.on_interaction_queued(interaction.event_id)
        self.flush()
        return None

    async def interact_now(self, interaction: Interaction) -> tuple[str, str] | None:
        """An interaction from outside the socket (HTTP, another replica): None when queued,
        else (code, message). The socket's client sees the outcome too."""
        try:
            self.session.interact(interaction)
        except ProtocolError as err:
            self.session.error(err)
            self.flush()
            return err.code, err.message
        events, effects = self.session.take()
        for event in events:
            self._put_control(event)
        request_id = next(e.request_id for e in effects if isinstance(e, Interact))
        return await self._interact(request_id, interaction)

    def _on_chunk(self, chunk: VideoChunk) -> None:
        self._progress = asyncio.get_running_loop().time()
        meta = self.session.on_chunk(chunk)
        if meta is None:
            return
        if chunk.kind == "jpeg":
            meta["frame_byte_lengths"] = [len(f) for f in chunk.frames]
        self._put_chunk(meta, chunk.media, chunk.init_segment)

    def _on_done(self) -> None:
        self.handle = None
        if self._mp4 and self.session.state == "streaming" and self._close is None:
            self._queue.append(("trailer",))  # the stream completed: its trailer, then session.done
            self._wake.set()
        self.session.on_done()
        self.flush()

    def _on_error(self, code: str, message: str) -> None:
        self.handle = None
        self.session.on_failed(code, message)
        self.flush()

    def close(self, code: int, reason: str) -> None:
        self._close = (code, reason)
        self._wake.set()

    # --- the queue ---------------------------------------------------------------------

    def _put_control(self, event: dict[str, Any]) -> None:
        if self._close is not None:
            return
        if len(self._queue) - self._queued_chunks >= MAX_CONTROL_QUEUED:
            self._slow("control events are piling up")
            return
        self._queue.append(("json", event))
        self._wake.set()

    def _put_chunk(self, meta: dict[str, Any], media: bytes, init: bytes) -> None:
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
                    self.runtime.metrics.video_dropped.inc()
                    break
            if self._consecutive_drops > self.runtime.settings.video_max_consecutive_drops:
                self._slow(f"{self._consecutive_drops} chunks dropped in a row")
                return
        self._queue.append(("chunk", meta, media, init))
        self._queued_chunks += 1
        self._wake.set()

    def _slow(self, why: str) -> None:
        log.warning("video session %s: slow consumer, closing: %s", self.id, why)
        self.runtime.metrics.closes.labels(str(int(CloseCode.SLOW_CONSUMER))).inc()
        self._queue.clear()
        self._queued_chunks = 0
        self._queue.append(("json", error_event(Code.SLOW_CONSUMER, f"The client read too slowly ({why}).",
                                                request_id=self.session.request_id)))  # fmt: skip
        self._close = (CloseCode.SLOW_CONSUMER, Code.SLOW_CONSUMER)
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
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
            "type": "video.chunk_metadata", "request_id": self.session.request_id, "kind": "trailer",
            "generation_chunk_index": None, "transport_chunk_index": self._sent_chunks, "num_frames": 0,
            "byte_length": len(trailer), "mime_type": "video/mp4", "started_event_ids": [], "active_event_ids": [],
            "completed_event_ids": [], "superseded_event_ids": [], "dropped_chunks": len(self._dropped),
            "dropped_generation_chunk_indexes": self._dropped,
        }  # fmt: skip
        self._dropped = []
        await send({"type": "websocket.send", "text": orjson.dumps(meta).decode()})
        await send({"type": "websocket.send", "bytes": trailer})
        self._sent_chunks += 1

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
                    await send({"type": "websocket.send", "text": orjson.dumps(item[1]).decode()})
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
            if self.session.state == "done" and self.handle is None and not queue:
                await send({"type": "websocket.close", "code": int(CloseCode.NORMAL), "reason": "done"})
                return
