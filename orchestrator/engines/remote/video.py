"""``RemoteVideoEngine``: the ``VideoEngine`` served by upstream ``/v1/realtime/video``.

One upstream connection per video (the protocol streams one video per
socket): ``session.start`` (prompt, size, fps, ``num_frames``, seed, format
``m4s`` or ``jpeg``, negative prompt, sampling params) -> ``video.start``;
then per chunk ``video.chunk_metadata`` + one binary frame -> ``VideoChunk``
(the fMP4 init segment, sent before the first fragment, is kept and set on
every chunk; ``trailer`` chunks, which carry no frames, are skipped; JPEG
chunks are split into frames by ``frame_byte_lengths`` or at each EOI
marker) -> ``session.done`` ends the iterator. ``submit_interaction`` sends
``session.interaction`` on the same socket and waits for
``session.interaction.queued`` or the ``error`` naming its ``event_id``
(the upstream's code kept when it is one of ours: ``event_id_conflict``,
``no_active_request``...; a malformed one is ``invalid_interaction``).
``abort`` sends ``session.stop`` and closes the socket.

An upstream lost mid-stream fails the video with ``upstream_lost``; lost
before its first chunk, the video is started again once, on another up
upstream when there is one (as ``RemoteEngine`` does).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

from orchestrator.engine import EngineError
from orchestrator.engines.interactions import hold_event_id, interaction_payload
from orchestrator.engines.remote.pool import VIDEO_PATH, Lease, PooledEngine, Upstream, UpstreamLost, UpstreamPool
from orchestrator.video_engine import (
    ERROR_CODES,
    Interaction,
    VideoChunk,
    VideoEngineInfo,
    VideoFormat,
    VideoRequest,
    validate_request,
)

log = logging.getLogger("omni.engines.remote")

_FORMAT = {"mp4": "m4s", "jpeg": "jpeg"}
_MALFORMED = {"invalid_value", "invalid_type", "missing_required_parameter", "unsupported_field", "invalid_json"}


def split_init_segment(data: bytes) -> tuple[bytes, bytes]:
    """fMP4 bytes -> (init segment: the boxes before the first ``moof``/``styp``, the rest)."""
    pos = 0
    while pos + 8 <= len(data):
        size = int.from_bytes(data[pos : pos + 4], "big")
        kind = data[pos + 4 : pos + 8]
        if kind in (b"moof", b"styp", b"sidx"):
            return data[:pos], data[pos:]
        if size == 1 and pos + 16 <= len(data):
            size = int.from_bytes(data[pos + 8 : pos + 16], "big")
        if size < 8:
            break
        pos += size
    return b"", data


def split_jpegs(data: bytes, lengths: Any = None) -> tuple[bytes, ...]:
    if isinstance(lengths, list) and sum(int(n) for n in lengths) == len(data):
        out, pos = [], 0
        for n in lengths:
            out.append(data[pos : pos + int(n)])
            pos += int(n)
        return tuple(out)
    frames, start = [], 0
    while start < len(data):
        end = data.find(b"\xff\xd9", start)
        if end < 0:
            frames.append(data[start:])
            break
        frames.append(data[start : end + 2])
        start = end + 2
    return tuple(frames)


def interaction_error(event: dict[str, Any]) -> EngineError:
    code = event.get("code") if isinstance(event.get("code"), str) else None
    message = str(event.get("message") or "the upstream refused the interaction")
    if code in ERROR_CODES:
        return EngineError(code, f"upstream: {message}")
    if code is None or code in _MALFORMED:
        return EngineError("invalid_interaction", f"upstream: {message}")
    return EngineError(code, f"upstream: {message}")


_Item = VideoChunk | BaseException | None  # a chunk, the failure, or the end


class _Video:
    def __init__(self) -> None:
        self.aborted = False
        self.lease: Lease | None = None
        self.ready = asyncio.Event()  # video.start received on the current connection
        self.event_ids: set[str] = set()
        self.acks: dict[str, asyncio.Future[None]] = {}

    def fail_acks(self, error: EngineError) -> None:
        for future in self.acks.values():
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved: no "never retrieved" warning when nobody waits
        self.acks.clear()


class RemoteVideoEngine(PooledEngine):
    """Streaming video from upstream ``/v1/realtime/video`` servers (see the module docstring).

    ``upstreams``: URLs or the ``UpstreamPool`` of a ``RemoteEngine``.
    ``formats``: the formats the upstreams stream (vLLM-Omni: ``("mp4",)``).
    ``ack_timeout_s``: how long an interaction waits for the upstream's answer
    (then ``upstream_timeout``). ``event_timeout_s``: the longest silence
    between two chunks before the video counts as lost. ``buffer_chunks``:
    chunks read ahead of the caller; when they wait unread, the upstream
    socket is not read (its own backpressure applies).
    """

    def __init__(
        self,
        upstreams: str | Sequence[str] | UpstreamPool,
        *,
        info: VideoEngineInfo | None = None,
        formats: Sequence[VideoFormat] = ("mp4", "jpeg"),
        retries: int = 1,
        ack_timeout_s: float = 10.0,
        event_timeout_s: float = 60.0,
        buffer_chunks: int = 4,
        **pool_options: Any,
    ) -> None:
        if isinstance(upstreams, UpstreamPool):
            self.pool = upstreams
        else:
            self.pool = UpstreamPool([upstreams] if isinstance(upstreams, str) else list(upstreams), **pool_options)
        names = ", ".join(u.name for u in self.pool.upstreams)
        self.info = info or VideoEngineInfo(
            name="remote",
            description=f"Remote streaming video upstreams over WebSocket (least-loaded): {names}.",
            formats=tuple(formats),
        )
        self.retries = retries
        self.ack_timeout_s = ack_timeout_s
        self.event_timeout_s = event_timeout_s
        self.buffer_chunks = buffer_chunks
        self._videos: dict[str, _Video] = {}
        self._started = False

    def _running(self) -> list[str]:
        return list(self._videos)

    async def abort(self, request_id: str) -> None:
        video = self._videos.get(request_id)
        if video is None:
            return
        video.aborted = True
        video.fail_acks(EngineError("no_active_request", f"video request {request_id!r} was stopped"))
        if video.lease is not None:
            self.pool.spawn(video.lease.conn.close([{"type": "session.stop"}]))

    async def generate_video(self, request: VideoRequest) -> AsyncIterator[VideoChunk]:
        validate_request(request)
        if not self._started:
            raise EngineError("engine_not_started", "the remote video engine is not running")
        if request.request_id in self._videos:
            raise EngineError("request_id_conflict", f"request {request.request_id!r} is running")
        video = _Video()
        self._videos[request.request_id] = video
        tried: set[Upstream] = set()
        tries = 0
        try:
            while not video.aborted:
                lease = await self.pool.lease("video", VIDEO_PATH, tried)
                video.lease = lease
                produced = False
                try:
                    async for chunk in self._stream(lease, request, video):
                        produced = True
                        yield chunk
                    return
                except UpstreamLost as exc:
                    video.ready.clear()
                    video.fail_acks(EngineError("no_active_request", "the upstream of this video was lost"))
                    if video.aborted:
                        return
                    self.pool.mark_down(lease.upstream, str(exc))
                    if produced or tries >= self.retries:
                        raise
                    tries += 1
                    tried.add(lease.upstream)
                    log.warning("video %s lost upstream %s before its first chunk; retrying", request.request_id,
                                lease.upstream.name)  # fmt: skip
                finally:
                    video.lease = None
                    lease.release()  # one video per socket: never reused
        finally:
            video.fail_acks(EngineError("no_active_request", f"video request {request.request_id!r} is over"))
            if self._videos.get(request.request_id) is video:
                del self._videos[request.request_id]

    def _start_event(self, request: VideoRequest) -> dict[str, Any]:
        event: dict[str, Any] = {
            "type": "session.start",
            "prompt": request.prompt,
            "width": request.width,
            "height": request.height,
            "fps": request.fps,
            "format": _FORMAT[request.format],
        }
        for key in ("num_frames", "frames_per_chunk", "seed", "negative_prompt"):
            value = getattr(request, key)
            if value is not None:
                event[key] = value
        if request.sampling_params:
            event["sampling_params"] = dict(request.sampling_params)
        return event

    async def _stream(self, lease: Lease, request: VideoRequest, video: _Video) -> AsyncIterator[VideoChunk]:
        """The chunks of one upstream session. A reader task takes everything
        the upstream sends as it comes (interaction answers at once), holding
        at most ``buffer_chunks`` chunks for a caller that paces its reads."""
        await lease.conn.send(self._start_event(request))
        lease.farewell = [{"type": "session.stop"}]
        queue: asyncio.Queue[_Item] = asyncio.Queue(self.buffer_chunks)
        reader = asyncio.get_running_loop().create_task(self._read(lease, request, video, queue))
        try:
            while True:
                item = await queue.get()
                if item is None:
                    lease.farewell = []
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            reader.cancel()

    async def _read(
        self,
        lease: Lease,
        request: VideoRequest,
        video: _Video,
        queue: asyncio.Queue[VideoChunk | BaseException | None],
    ) -> None:
        conn, init = lease.conn, b""
        try:
            while True:
                event = await conn.recv(self.event_timeout_s)
                if isinstance(event, bytes):
                    continue  # a frame without metadata: not this protocol's
                kind = event.get("type")
                if kind == "video.start":
                    video.ready.set()
                elif kind == "video.chunk_metadata":
                    payload = await conn.recv(self.event_timeout_s)
                    if not isinstance(payload, bytes):
                        raise UpstreamLost(f"upstream {lease.upstream.name} sent chunk metadata without its frame")
                    if event.get("kind", "media") != "media" or not event.get("num_frames"):
                        continue  # an fMP4 trailer: no frames
                    first = request.format == "mp4" and not init
                    if first:
                        init = split_init_segment(payload)[0]
                    await queue.put(self._chunk(request, event, payload, init, first))
                elif kind == "session.interaction.queued":
                    future = video.acks.pop(str(event.get("event_id")), None)
                    if future is not None and not future.done():
                        future.set_result(None)
                elif kind == "error":
                    future = video.acks.pop(str(event.get("event_id")), None)
                    if future is not None:
                        if not future.done():
                            future.set_exception(interaction_error(event))
                        continue
                    raise EngineError(str(event.get("code") or "generation_failed"),
                                      f"upstream: {event.get('message') or 'the video failed'}")  # fmt: skip
                elif kind == "session.done":
                    await queue.put(None)
                    return
        except Exception as exc:
            await queue.put(exc)

    def _chunk(
        self, request: VideoRequest, meta: dict[str, Any], payload: bytes, init: bytes, first: bool
    ) -> VideoChunk:
        ids = {k: tuple(str(x) for x in meta.get(f"{k}_event_ids") or []) for k in
               ("started", "active", "completed", "superseded")}  # fmt: skip
        index = meta.get("generation_chunk_index")
        common: dict[str, Any] = {
            "generation_chunk_index": index if isinstance(index, int) else 0,
            "num_frames": int(meta.get("num_frames") or 0),
            "started_event_ids": ids["started"],
            "active_event_ids": ids["active"],
            "completed_event_ids": ids["completed"],
            "superseded_event_ids": ids["superseded"],
        }
        if request.format == "jpeg":
            frames = split_jpegs(payload, meta.get("frame_byte_lengths"))
            return VideoChunk(kind="jpeg", data=payload, mime_type=str(meta.get("mime_type") or "image/jpeg"),
                              frames=frames, **common)  # fmt: skip
        mime = str(meta.get("mime_type") or 'video/mp4; codecs="avc1.42C01E"')
        if first:
            data = payload  # the first chunk delivered carries the init segment before its fragment
        else:
            data = payload[len(init) :] if init and payload.startswith(init) else payload
        return VideoChunk(kind="mp4", data=data, mime_type=mime, init_segment=init, **common)

    async def submit_interaction(self, request_id: str, interaction: Interaction) -> None:
        video = hold_event_id(request_id, self._videos.get(request_id), interaction)
        try:
            await self._interact(video, interaction)
        except BaseException:
            video.event_ids.discard(interaction.event_id)  # refused: the id may be used again
            raise

    async def _interact(self, video: _Video, interaction: Interaction) -> None:
        try:
            async with asyncio.timeout(self.ack_timeout_s):
                await video.ready.wait()
                lease = video.lease
                if lease is None or video.aborted:
                    raise EngineError("no_active_request", "the video is not streaming")
                future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                video.acks[interaction.event_id] = future
                await lease.conn.send({"type": "session.interaction", "interaction": interaction_payload(interaction)})
                await future
        except TimeoutError:
            video.acks.pop(interaction.event_id, None)
            raise EngineError("upstream_timeout", "the upstream did not answer the interaction in time") from None
        except UpstreamLost as exc:
            video.acks.pop(interaction.event_id, None)
            raise EngineError("no_active_request", f"the upstream of this video was lost ({exc.message})") from None
