"""``CpuVideoEngine``: the embedded default video engine, on the CPU.

It is not a generative model: each frame is a procedural rendering of the
prompt (see ``render``) encoded for the browser (see ``encode``). It exists
so that the video path (requests, interactions with real transitions,
chunk metadata, fMP4 over the socket) runs for real with no GPU.

Each chunk is rendered and encoded in a worker thread, so the event loop
never blocks; the engine paces nothing: it renders the next chunk only when
the consumer asks for it (``__anext__``), which is the caller's
backpressure. Interactions are queued and applied when the next chunk
starts rendering, i.e. at the next chunk boundary. Interactions still queued
when a request reaches ``num_frames`` are dropped (never reported started),
and a transition cut short by the end of the request is never reported
completed.

Close a stream you stop reading (``aclose()``) or cancel its task: until
then (or until it is garbage-collected) the request stays active and counts
toward ``max_active_requests``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import logging
import os
import threading
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orchestrator.engine import EngineError
from orchestrator.video_engine import (
    Interaction,
    VideoChunk,
    VideoEngineInfo,
    VideoRequest,
    validate_interaction,
    validate_request,
)

if TYPE_CHECKING:
    from orchestrator.engines.video.encode import Fmp4Encoder, JpegEncoder
    from orchestrator.engines.video.render import RenderState

logger = logging.getLogger(__name__)

# torch and PyAV are imported by the first chunk, in its worker: importing torch costs ~1.8 s
# of CPU, which a replica that serves no video never spends (nor one that is starting: its
# start-up would take that from the sessions beside it on the same cores).
NEEDS = ("torch", "av")

# Limits (each documented where it is hit, with what happens):
# - workers: chunks rendered at once, engine-wide; more running requests
#   queue for a worker (their chunks arrive later, nothing fails).
# - max_active_requests: generate_video beyond it raises
#   EngineError("capacity_exceeded") before rendering anything.
# - max_pending_interactions: interactions queued for one request's next
#   boundary; one more raises EngineError("too_many_pending_interactions").
DEFAULT_WORKERS = max(1, min(8, os.cpu_count() or 1))
DEFAULT_MAX_ACTIVE_REQUESTS = 64
DEFAULT_MAX_PENDING_INTERACTIONS = 32

INFO = VideoEngineInfo(
    name="cpu-video",
    description=(
        "Procedural CPU video, not a generative model: each prompt hashes to a "
        "palette, moving shapes and a caption of its words, rendered with torch "
        "and encoded to H.264 fMP4 (or JPEG); prompt and camera interactions "
        "blend over transition_chunks."
    ),
    ignored_fields=("negative_prompt", "sampling_params"),
    model="cpu-video",
)


def _import_libraries() -> None:
    import orchestrator.engines.video.encode
    import orchestrator.engines.video.render  # noqa: F401


class _Aborted(Exception):
    """Raised in a worker when its request was aborted mid-chunk."""


class _Pipeline:
    """Render state and encoder of one request. Used by one worker at a time
    (chunks of a request are sequential); built on the first chunk, in the
    worker, so that the event loop never waits for it."""

    def __init__(self, request: VideoRequest, crf: int | None) -> None:
        self.request = request
        self.crf = crf
        self.cancelled = threading.Event()
        self.state: RenderState | None = None
        self.encoder: Fmp4Encoder | JpegEncoder | None = None

    def next_chunk(self, interactions: list[Interaction], n_frames: int) -> VideoChunk:
        from orchestrator.engines.video.encode import Fmp4Encoder, JpegEncoder, flush_chunk_media
        from orchestrator.engines.video.render import RenderState, iter_chunk

        req = self.request
        if self.state is None:
            self.state = RenderState(req.prompt, req.width, req.height, req.fps, req.chunk_frames, req.seed or 0)
            if req.format == "jpeg":
                self.encoder = JpegEncoder(req.width, req.height, req.fps)
            else:
                crf = {"crf": self.crf} if self.crf is not None else {}
                self.encoder = Fmp4Encoder(req.width, req.height, req.fps, req.chunk_frames, **crf)
        state, encoder = self.state, self.encoder
        assert encoder is not None
        index = state.chunk_index
        state.apply(interactions)
        for planes in iter_chunk(state, n_frames):
            if self.cancelled.is_set():  # abort lands between render batches
                raise _Aborted
            encoder.encode(planes)
        events = state.events
        data, init, frames = flush_chunk_media(encoder, first=index == 0)
        return VideoChunk(
            kind=req.format,
            generation_chunk_index=index,
            num_frames=n_frames,
            data=data,
            mime_type=encoder.mime_type,
            init_segment=init,
            frames=frames,
            started_event_ids=tuple(events.started),
            active_event_ids=tuple(events.active),
            completed_event_ids=tuple(events.completed),
            superseded_event_ids=tuple(events.superseded),
        )

    def close(self) -> None:
        self.cancelled.set()
        if self.encoder is not None:
            self.encoder.close()
        self.state = self.encoder = None


@dataclass(eq=False)
class _Active:
    """Book-keeping of one running request, touched only on the event loop."""

    pipeline: _Pipeline
    aborted: asyncio.Future[None]
    pending: list[Interaction] = field(default_factory=list)
    event_ids: set[str] = field(default_factory=set)


class CpuVideoEngine:
    """The embedded CPU ``VideoEngine`` (see the module docstring)."""

    info = INFO

    def __init__(
        self,
        *,
        workers: int = DEFAULT_WORKERS,
        max_active_requests: int = DEFAULT_MAX_ACTIVE_REQUESTS,
        max_pending_interactions: int = DEFAULT_MAX_PENDING_INTERACTIONS,
        crf: int | None = None,
    ) -> None:
        """Raises ImportError where torch or PyAV is not installed (the ``video`` extra)."""
        missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
        if missing:
            raise ImportError(f"No module named {' or '.join(map(repr, missing))}")
        self.workers = workers
        self.max_active_requests = max_active_requests
        self.max_pending_interactions = max_pending_interactions
        self.crf = crf  # x264 constant rate factor, lower is better and larger; None: encode.H264_CRF
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = False
        self._active: dict[str, _Active] = {}

    async def start(self) -> None:
        if self._executor is None and not self._closed:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=self.workers, thread_name_prefix="cpu-video"
            )

    async def close(self) -> None:
        self._closed = True
        for request_id in list(self._active):
            await self.abort(request_id)
        executor, self._executor = self._executor, None
        if executor is not None:
            # Waits for chunks already rendering (bounded by one chunk each).
            await asyncio.to_thread(executor.shutdown, wait=True, cancel_futures=True)

    async def warm(self) -> None:
        """Import torch and PyAV now, in a worker, as the first chunk would (tests whose clock
        starts with a stream's first chunk)."""
        await self.start()
        assert self._executor is not None
        await asyncio.get_running_loop().run_in_executor(self._executor, _import_libraries)

    def healthy(self) -> bool:
        return self._executor is not None and not self._closed

    @property
    def active_request_ids(self) -> tuple[str, ...]:
        return tuple(self._active)

    async def generate_video(self, request: VideoRequest) -> AsyncGenerator[VideoChunk, None]:
        validate_request(request)
        executor = self._executor
        if executor is None or self._closed:
            raise EngineError("engine_not_started", "the video engine is not running")
        if request.request_id in self._active:
            raise EngineError("request_id_conflict", f"request {request.request_id!r} is running")
        if len(self._active) >= self.max_active_requests:
            raise EngineError("capacity_exceeded", f"{self.max_active_requests} video requests are running")
        entry = _Active(_Pipeline(request, self.crf), asyncio.get_running_loop().create_future())
        self._active[request.request_id] = entry
        job: concurrent.futures.Future[VideoChunk] | None = None
        produced, total, per_chunk = 0, request.num_frames, request.chunk_frames
        try:
            while total is None or produced < total:
                n = per_chunk if total is None else min(per_chunk, total - produced)
                interactions, entry.pending = entry.pending, []
                job = executor.submit(entry.pipeline.next_chunk, interactions, n)
                waiter = asyncio.wrap_future(job)
                try:
                    await asyncio.wait((waiter, entry.aborted), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if not waiter.done():
                        waiter.cancel()  # also cancels a job that has not started
                if entry.aborted.done():
                    return
                try:
                    chunk = waiter.result()
                except Exception as exc:
                    logger.exception("video request %s failed", request.request_id)
                    raise EngineError("generation_failed", f"rendering failed: {exc}") from exc
                job = None
                produced += n
                yield chunk
        finally:
            if self._active.get(request.request_id) is entry:
                del self._active[request.request_id]
            pipeline = entry.pipeline
            if job is not None and not job.done():
                # A worker still runs this chunk: it closes the pipeline when done.
                pipeline.cancelled.set()
                job.add_done_callback(lambda _: pipeline.close())
            else:
                pipeline.close()

    async def submit_interaction(self, request_id: str, interaction: Interaction) -> None:
        validate_interaction(interaction)
        entry = self._active.get(request_id)
        if entry is None or entry.aborted.done():
            raise EngineError("no_active_request", f"no active video request {request_id!r}")
        if interaction.event_id in entry.event_ids:
            raise EngineError("event_id_conflict", f"event_id {interaction.event_id!r} was already used")
        if len(entry.pending) >= self.max_pending_interactions:
            raise EngineError(
                "too_many_pending_interactions",
                f"{self.max_pending_interactions} interactions already wait for the next chunk",
            )
        entry.event_ids.add(interaction.event_id)
        entry.pending.append(interaction)

    async def abort(self, request_id: str) -> None:
        entry = self._active.pop(request_id, None)
        if entry is None:
            return
        entry.pipeline.cancelled.set()
        if not entry.aborted.done():
            entry.aborted.set_result(None)
