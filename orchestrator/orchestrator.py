"""The orchestrator owns engine requests: admission, pause, the input pump,
abort, and per-request metrics. It knows no WebSocket and no JSON.

A request is submitted with callbacks (``on_output``, ``on_error``) that the
caller provides, so nothing here imports a higher floor. Each request runs in
one task the orchestrator owns:

1. admission: wait while generation is paused, then for a free slot of its
   kind; both waits together are bounded by ``admission_timeout_s``, after
   which the request fails with ``server_busy``. A request past the pause gate
   but not yet running is counted in ``admitting``, so ``pause()`` returns only
   once no admission is in flight: a pause or a drain never races one.
2. the input pump: chunks given to ``feed`` reach the engine through an async
   iterator; ``end`` is the final marker (the iterator ends). ``cancel``
   aborts the engine request and sends no final marker. A transcription whose
   engine offers ``transcriber`` (``engine.Transcriber``) is stepped in place
   instead: each fed chunk is one plain call, its outputs delivered on the next
   loop turn (no task step or async-generator hop per chunk).
3. outputs go to ``on_output`` as they come; an exception becomes
   ``on_error(code, message)``. A response whose engine offers ``responder``
   (``engine.Responder``) is pushed instead of iterated: the engine calls the
   handle with each output from a callback of its own (a paced engine steps all
   its answers in one timer), and the request's task only waits for the end.

A ``conversation`` (an engine that takes its own turns: ``Engine.converse``) is a
request like the others, held for a session's whole length: its inputs are the
caller's audio as it comes, its outputs the engine's turn events and answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.engine import (
    AudioChunk,
    AudioDelta,
    ConversationRequest,
    Engine,
    EngineError,
    EngineInput,
    Finished,
    Responder,
    ResponseRequest,
    Transcriber,
    TranscriptionRequest,
)
from orchestrator.metrics import KindMetrics, Metrics
from orchestrator.video_engine import Interaction, VideoChunk, VideoEngine, VideoRequest

log = logging.getLogger("omni.orchestrator")


async def _nothing() -> AsyncIterator[Any]:
    return
    yield


Kind = Literal["transcription", "response", "video", "conversation"]
_END = object()


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    """Bounds on running requests. When a kind is full, new requests wait up to
    ``admission_timeout_s`` for a slot, then fail with ``server_busy``."""

    max_transcriptions: int = 1024
    max_responses: int = 256
    max_videos: int = 32
    # Conversations held at once (each an engine that takes its own turns, for a whole session:
    # one upstream session each on the remote engine); past it a session's wait for one is
    # bounded by ``admission_timeout_s`` like any request's, then ``server_busy``.
    max_conversations: int = 256
    admission_timeout_s: float = 10.0
    # Video is paced to real time: the next chunk is asked of the engine no
    # earlier than ``video_lead_chunks`` chunks before it is due to play, so a
    # fast engine does not flood clients (and spends no work ahead of need).
    video_lead_chunks: int = 2


class RequestHandle:
    """One engine request; created by ``Orchestrator.submit``."""

    def __init__(
        self,
        orchestrator: Orchestrator,
        kind: Kind,
        request: TranscriptionRequest | ResponseRequest | VideoRequest | ConversationRequest,
        on_output: Callable[[Any], None],
        on_error: Callable[[str, str], None],
        turn_started_at: float | None,
        on_done: Callable[[], None] | None = None,
    ) -> None:
        self.kind = kind
        self.request = request
        self.request_id = request.request_id
        self._orch = orchestrator
        self._on_output = on_output
        self._on_error = on_error
        self._on_done = on_done
        self._turn_started_at = turn_started_at
        self._inputs: deque[object] = deque()  # fed chunks not yet taken by the engine, then _END
        self._waiter: asyncio.Future[None] | None = None  # set while the engine waits for input
        self._ended = False
        self._engine_started = False
        # A transcription the engine steps in place (Transcriber): while set, ``feed``
        # calls it directly and its outputs go out on the next loop turn.
        self._stepper: Transcriber | None = None
        self._failure: BaseException | None = None  # the stepper's error in ``feed``, raised by the task
        # A response the engine pushes (Responder): while set, ``feed`` and ``end`` go to it
        # directly and its outputs come through ``_emit``; ``_pushed`` ends with its Finished.
        self._pusher: Responder | None = None
        self._pushed: asyncio.Future[None] | None = None
        self._admitted = 0.0  # when the engine got it (first-delta metric)
        self._km: KindMetrics | None = None  # its kind's metrics, bound at admission
        self._last: float | None = None  # when the last output came (delta gap metric)
        self._first_audio = True
        self.submitted_at = time.monotonic()
        orchestrator._handles[self.request_id] = self
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"request {self.request_id}")
        # A callback, not a ``finally`` in _run: a task cancelled before its first step
        # never runs its coroutine, and its handle must not stay registered for ever.
        self.task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        if self._orch._handles.get(self.request_id) is self:
            del self._orch._handles[self.request_id]

    def feed(self, chunk: EngineInput) -> None:
        if not self._ended:
            self._put(chunk)

    def end(self) -> None:
        if not self._ended:
            self._ended = True
            self._put(_END)

    def _put(self, item: object) -> None:
        # A deque and one future while the engine waits: this runs per audio chunk,
        # and asyncio.Queue's bookkeeping cost ~10 % of a loaded gateway's CPU.
        stepper = self._stepper
        if stepper is not None and item is not _END and not self._inputs:
            self._step(stepper, item)  # type: ignore[arg-type]
            return
        pusher = self._pusher
        if pusher is not None and not self._inputs:
            self._push(pusher, item)
            return
        self._inputs.append(item)
        self._wake()

    def _push(self, pusher: Responder, item: object) -> None:
        try:
            if item is _END:
                pusher.end()
            else:
                pusher.feed(item)  # type: ignore[arg-type]
        except Exception as exc:
            self._fail_pushed(exc)

    def _emit(self, output: Any) -> None:
        """An output of a pushed response (from the engine's own callback)."""
        pushed = self._pushed
        if self._pusher is None or pushed is None or pushed.done():
            return  # cancelled, failed or finished: nothing more goes out
        try:
            self._deliver(output)
        except Exception as exc:  # as in an iterated request: this request fails, not the engine
            self._fail_pushed(exc)
            return
        if isinstance(output, Finished):
            pushed.set_result(None)

    def _fail_pushed(self, exc: BaseException) -> None:
        pushed = self._pushed
        if pushed is not None and not pushed.done():
            pushed.set_exception(exc)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _step(self, stepper: Transcriber, chunk: AudioChunk) -> None:
        try:
            outputs = stepper.feed(chunk)
        except BaseException as exc:  # the task fails the request with it
            self._stepper, self._failure = None, exc
            self._wake()
            return
        if outputs:
            # On the next loop turn, as an iterated engine's would: the caller (the session's
            # effects) is not re-entered. Before the final marker's: call_soon keeps order.
            asyncio.get_running_loop().call_soon(self._deliver_stepped, stepper, outputs)

    def _deliver_stepped(self, stepper: Transcriber, outputs: Sequence[Any]) -> None:
        if self._stepper is stepper:  # not cancelled or failed meanwhile
            for output in outputs:
                self._deliver(output)

    def _deliver(self, output: Any) -> None:
        """One output to ``on_output``, with its latency metrics."""
        if not isinstance(output, Finished):
            now = time.monotonic()
            km = self._km
            assert km is not None  # (outputs come only once admitted)
            if self._last is None:
                km.first_delta.observe(now - self._admitted)
            else:
                km.delta_gap.observe(now - self._last)
            self._last = now
            if self._first_audio and isinstance(output, AudioDelta) and self._turn_started_at is not None:
                self._orch.metrics.turn_latency.observe(now - self._turn_started_at)
                self._first_audio = False
        self._on_output(output)

    async def _run_stepped(self, stepper: Transcriber) -> None:
        """A stepped transcription: the chunks fed before admission, then each one as it is
        fed (``_put``), until the final marker."""
        inputs = self._inputs
        try:
            while True:
                while inputs:
                    item = inputs.popleft()
                    if item is _END:
                        for output in stepper.finish():
                            self._deliver(output)
                        return
                    for output in stepper.feed(item):  # type: ignore[arg-type]
                        self._deliver(output)
                if self._failure is not None:
                    raise self._failure
                self._stepper = stepper
                waiter = self._waiter = asyncio.get_running_loop().create_future()
                await waiter
        finally:
            self._stepper = None
            stepper.close()

    def cancel(self) -> None:
        """Abort: the task is cancelled and the engine told; no final marker."""
        self._ended = True
        self._stepper = None  # its outputs not yet delivered are dropped
        self._pusher = None  # (closed as the task ends)
        if not self.task.done():
            self.task.cancel()

    async def _paced(self, chunks: AsyncIterator[VideoChunk], fps: int) -> AsyncIterator[VideoChunk]:
        loop = asyncio.get_running_loop()
        lead = self._orch.limits.video_lead_chunks
        start = loop.time()
        media_s = 0.0
        async for chunk in chunks:
            yield chunk
            chunk_s = chunk.num_frames / fps
            media_s += chunk_s
            delay = start + media_s - lead * chunk_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)

    async def _run_pushed(self, pusher: Responder) -> None:
        """A pushed response: the chunks fed before admission, then until its Finished."""
        assert self._pushed is not None
        inputs = self._inputs
        self._pusher = pusher
        try:
            while inputs and self._pusher is pusher:
                self._push(pusher, inputs.popleft())
            await self._pushed
        finally:
            self._pusher = None
            pusher.close()

    async def _input_stream(self) -> AsyncIterator[EngineInput]:
        inputs = self._inputs
        while True:
            if not inputs:
                waiter = self._waiter = asyncio.get_running_loop().create_future()
                await waiter
                continue
            chunk = inputs.popleft()
            if chunk is _END:
                return
            yield chunk  # type: ignore[misc]

    async def _run(self) -> None:
        orch, kind, m = self._orch, self.kind, self._orch.metrics
        status = "failed"
        try:
            await orch._admit(kind)
        except asyncio.CancelledError:
            orch.metrics.requests.labels(kind, "cancelled").inc()
            raise
        except EngineError as exc:
            orch.metrics.requests.labels(kind, "rejected").inc()
            self._on_error(exc.code, exc.message)
            return
        admitted = self._admitted = time.monotonic()
        km = self._km = m.bound(kind)
        km.queue_wait.observe(admitted - self.submitted_at)
        km.inflight.inc()
        orch._running[self.request_id] = self
        self._engine_started = True
        try:
            engine = orch.engine
            stream: AsyncIterator[Any]
            stepper = pusher = None
            if kind == "transcription" and orch._transcriber is not None:
                stepper = orch._transcriber(self.request)
            elif kind == "response" and orch._responder is not None:
                self._pushed = asyncio.get_running_loop().create_future()
                pusher = orch._responder(self.request, self._emit, self._fail_pushed)
            if stepper is not None:
                await self._run_stepped(stepper)
                stream = _nothing()
            elif pusher is not None:
                await self._run_pushed(pusher)
                stream = _nothing()
            elif kind == "video":
                assert orch.video_engine is not None and isinstance(self.request, VideoRequest)
                stream = self._paced(orch.video_engine.generate_video(self.request), self.request.fps)
            elif kind == "conversation":
                converse = getattr(engine, "converse", None)
                if converse is None or not engine.info.takes_turns:
                    raise EngineError("unsupported", "This engine takes no turns of its own.")
                stream = converse(self.request, self._input_stream())
            elif kind == "transcription":
                stream = engine.transcribe(self.request, self._input_stream())  # type: ignore[arg-type]
            else:
                stream = engine.respond(self.request, self._input_stream())  # type: ignore[arg-type]
            async for output in stream:
                self._deliver(output)
            status = "completed"
            if self._on_done is not None:
                self._on_done()
        except asyncio.CancelledError:
            status = "cancelled"
            raise
        except EngineError as exc:
            if exc.fatal:
                orch.engine_failed = exc.message
            self._on_error(exc.code, exc.message)
        except Exception as exc:  # an engine bug must fail one request, not the session
            log.exception("engine request %s failed", self.request_id)
            self._on_error("engine_error", f"The engine failed: {type(exc).__name__}.")
        finally:
            km.inflight.dec()
            m.requests.labels(kind, status).inc()
            orch._running.pop(self.request_id, None)
            orch._release(kind)
            if status != "completed":
                # Abort in a fresh task: this one may be cancelled already.
                orch._spawn_abort(self.request_id, video=kind == "video")


class Orchestrator:
    def __init__(
        self,
        engine: Engine,
        limits: AdmissionLimits | None = None,
        metrics: Metrics | None = None,
        video_engine: VideoEngine | None = None,
    ):
        self.engine = engine
        self.video_engine = video_engine
        self.limits = limits or AdmissionLimits()
        self.metrics = metrics or Metrics()
        self.engine_failed: str | None = None  # set when the engine reported itself dead
        # The engine's in-place transcriptions, if it offers them (engine.Transcriber).
        self._transcriber: Callable[[Any], Transcriber | None] | None = getattr(engine, "transcriber", None)
        self._responder: Callable[..., Responder | None] | None = getattr(engine, "responder", None)
        self._cond = asyncio.Condition()
        self._paused = False
        self._admitting = 0
        self._waiting = 0  # admissions blocked on a full kind
        self._active = {"transcription": 0, "response": 0, "video": 0, "conversation": 0}
        self._handles: dict[str, RequestHandle] = {}  # every request not yet finished
        self._running: dict[str, RequestHandle] = {}  # admitted: the engine has it
        self._aborts: set[asyncio.Task[None]] = set()  # abort and wake-up tasks in flight

    # --- submission ------------------------------------------------------------

    def submit(
        self,
        kind: Kind,
        request: TranscriptionRequest | ResponseRequest | VideoRequest | ConversationRequest,
        *,
        on_output: Callable[[Any], None],
        on_error: Callable[[str, str], None],
        turn_started_at: float | None = None,
        on_done: Callable[[], None] | None = None,
    ) -> RequestHandle:
        """Start a request. ``on_output`` gets each output (``EngineOutput`` for
        voice, ``VideoChunk`` for video); ``on_done`` runs once a video ends."""
        return RequestHandle(self, kind, request, on_output, on_error, turn_started_at, on_done)

    async def interact(self, request_id: str, interaction: Interaction) -> None:
        """Queue a midway interaction for a running video request (EngineError if refused)."""
        if self.video_engine is None:
            raise EngineError("no_video_engine", "This gateway has no video engine.")
        if request_id not in self._running:
            raise EngineError("no_active_request", f"No active video request {request_id!r}.")
        await self.video_engine.submit_interaction(request_id, interaction)

    def _capacity(self, kind: Kind) -> int:
        lim = self.limits
        return {"transcription": lim.max_transcriptions, "response": lim.max_responses, "video": lim.max_videos,
                "conversation": lim.max_conversations}[kind]  # fmt: skip

    async def _admit(self, kind: Kind) -> None:
        engine_ok = self.video_engine.healthy() if kind == "video" and self.video_engine else self.engine.healthy()
        if self.engine_failed is not None or not engine_ok:
            raise EngineError("engine_unavailable", "The engine is not available; try again later.")
        try:
            async with asyncio.timeout(self.limits.admission_timeout_s):
                async with self._cond:
                    await self._cond.wait_for(lambda: not self._paused)
                    self._admitting += 1
                    try:
                        if self._active[kind] >= self._capacity(kind):
                            self._waiting += 1
                            try:
                                await self._cond.wait_for(
                                    lambda: not self._paused and self._active[kind] < self._capacity(kind)
                                )
                            finally:
                                self._waiting -= 1
                        self._active[kind] += 1
                    finally:
                        self._admitting -= 1
                        self._cond.notify_all()
        except TimeoutError:
            raise EngineError(
                "server_busy",
                f"The server is busy: no {kind} slot freed within {self.limits.admission_timeout_s:.0f} s "
                "(generation paused or at capacity). Try again shortly.",
            ) from None

    def _release(self, kind: Kind) -> None:
        self._active[kind] -= 1
        if self._waiting:
            # Waiters sleep on the condition; waking them needs its lock, hence a task.
            task = asyncio.get_running_loop().create_task(self._notify())
            self._aborts.add(task)
            task.add_done_callback(self._aborts.discard)

    async def _notify(self) -> None:
        async with self._cond:
            self._cond.notify_all()

    def _spawn_abort(self, request_id: str, video: bool = False) -> None:
        task = asyncio.get_running_loop().create_task(self._abort(request_id, video))
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    async def _abort(self, request_id: str, video: bool = False) -> None:
        try:
            if video and self.video_engine is not None:
                await self.video_engine.abort(request_id)
            else:
                await self.engine.abort(request_id)
        except Exception:
            log.exception("engine abort of %s failed", request_id)

    # --- pause / resume / drain ------------------------------------------------

    async def pause(self) -> None:
        """Stop admitting; returns once no request is half-way through admission."""
        async with self._cond:
            self._paused = True
            await self._cond.wait_for(lambda: self._admitting == 0)

    async def resume(self) -> None:
        async with self._cond:
            self._paused = False
            self._cond.notify_all()

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def running(self) -> int:
        return len(self._running)

    def stats(self) -> dict[str, int]:
        return {
            "admitting": self._admitting,
            "running_transcriptions": self._active["transcription"],
            "running_responses": self._active["response"],
            "running_videos": self._active["video"],
            "running_conversations": self._active["conversation"],
            "max_responses": self.limits.max_responses,
        }

    @property
    def pending(self) -> int:
        return len(self._handles)

    async def close(self) -> None:
        for handle in list(self._handles.values()):
            handle.cancel()
        tasks = [h.task for h in self._handles.values()]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._aborts:
            await asyncio.gather(*self._aborts, return_exceptions=True)

    async def wait_idle(self) -> None:
        """Wait until every request task and pending abort has finished (tests, drain)."""
        while self._handles or self._aborts:
            with contextlib.suppress(Exception):
                await asyncio.gather(*[h.task for h in self._handles.values()], *self._aborts, return_exceptions=True)
            await asyncio.sleep(0)
