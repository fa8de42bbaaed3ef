"""JournalWriter: batches one session's journal appends and snapshot updates;
JournalFlusher: commits every session's batch of one process together.

A streaming session emits many small events (audio and text deltas). Writing
each one would cost a round trip per event; instead the session calls
``append`` (synchronous, no await) and ``set_snapshot``, and the process's one
``JournalFlusher`` (per store and event loop) sends everything pending of every
session that is due in ONE ``store.commit_many`` (on Redis, one pipelined round
trip; per session still one atomic commit: fence check + appends + snapshot +
caps + TTL refresh):

- the first append after a quiet period is flushed on the next loop turn
  (no added latency when traffic is sparse);
- while busy, a session's flushes are spaced at least ``flush_interval_ms``
  apart, on a process-wide grid of ``interval / GRID_STEPS`` steps, so busy
  sessions share their batches: a session costs at most
  ``1000 / flush_interval_ms`` commits per second, and the process at most
  ``GRID_STEPS * 1000 / flush_interval_ms`` batches per second (plus forced
  flushes), however many sessions it holds;
- ``flush()`` forces a flush now (the commit gate, before acking a resume, on
  close, at drain); forced flushes of one loop turn share a batch too;
- each batch commits in a task of its own, and a session is in at most one
  batch at a time (so its commits keep their order): a slow commit holds up
  its own sessions only.

What a crash can lose: the events appended since the last successful flush,
i.e. at most one flush interval and a grid step (default 20 + 5 ms) plus the
batch in flight. The client may have received those events; a resume then
finds ``JournalRead.last_seq`` below the client's ``after_seq`` and must resync.

Failures, per session: ``FencedError`` (another replica took the session)
stops the writer for good: pending events are dropped, ``fenced`` is set,
``on_fenced`` is called, and further ``append`` calls raise it.
``StoreUnavailable`` keeps the batch and retries with backoff (doubling from
the interval up to ``MAX_RETRY_S``); the pending buffer is capped
(``max_pending_events`` / ``max_pending_bytes``, default: the journal's count cap and
``StoreLimits.max_pending_bytes``, 1 MiB) and
when full the oldest pending events are dropped and reported to the journal as
lost, so a resume from before them reports a gap rather than a silent hole. While the
store fails, what waits is kept in copies of its own size (orjson's output keeps a
build buffer of several KB however short the event: 9.5 KB an event, measured), so
the cap bounds the memory it takes.
"""

from __future__ import annotations

import asyncio
import logging
import math
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import ClassVar, NamedTuple

from gateway.store.base import Commit, FencedError, SessionStore, StateQuota, StoreError, StoreUnavailable
from gateway.store.health import THROTTLE

log = logging.getLogger(__name__)

MAX_RETRY_S = 1.0  # longest wait between retries while the store is unavailable
GRID_STEPS = 4  # a flush interval holds this many grid steps: the phases busy sessions share


class _Batch(NamedTuple):
    """What one flush took from a writer (put back if the store fails)."""

    events: deque[tuple[int, bytes]]
    snapshot: bytes | None
    lost: int
    items: dict[str, bytes]
    drops: set[str]
    waiters: list[asyncio.Future[None]]  # flush() calls this batch answers


class JournalWriter:
    def __init__(
        self,
        store: SessionStore,
        session_id: str,
        fence: int,
        *,
        # None: limits.flush_interval_ms. At most one commit per interval.
        flush_interval_ms: float | None = None,
        # None: limits.max_events / the smaller of max_bytes and max_pending_bytes. When the unflushed buffer passes
        # either (the store is down or slow), the oldest pending events are
        # dropped and the journal is told they were lost (a resume from before
        # them gets gap=True).
        max_pending_events: int | None = None,
        max_pending_bytes: int | None = None,
        # Called once, from the flusher, when another replica took the session.
        on_fenced: Callable[[FencedError], None] | None = None,
        # Called after each commit attempt with the highest seq it carried and whether
        # it was committed (False: the store failed; the batch is kept for a retry).
        on_flushed: Callable[[int, bool], None] | None = None,
        # The principal the session belongs to: every commit keeps its ledger (base.StateQuota).
        quota: StateQuota | None = None,
    ) -> None:
        limits = store.limits
        self.store = store
        self.session_id = session_id
        self.fence = fence
        ms = limits.flush_interval_ms if flush_interval_ms is None else flush_interval_ms
        self.interval_s = ms / 1000
        self.max_pending_events = max_pending_events or limits.max_events
        self.max_pending_bytes = max_pending_bytes or min(limits.max_bytes, limits.max_pending_bytes)
        self.on_fenced = on_fenced
        self.on_flushed = on_flushed
        self.quota = quota
        self.committed_seq = 0  # the highest seq the store holds from this writer

        self._events: deque[tuple[int, bytes]] = deque()
        self._bytes = 0
        self._snapshot: bytes | None = None
        self._items: dict[str, bytes] = {}  # item records to write with the next flush
        self._drops: set[str] = set()  # item records to delete with it
        self._lost_through = 0
        self._waiters: list[asyncio.Future[None]] = []  # flush() calls for the next batch
        self._flusher: JournalFlusher | None = None
        self._in_flight = False  # one batch of ours at a time, so order holds
        self._next_at = 0.0  # loop time before which the flusher may not flush us
        self._retry_s = 0.0
        self._closed = False

        self.fenced: FencedError | None = None
        self.last_error: StoreError | None = None  # last failed flush, None after a success
        self.flushes = 0  # successful commits
        self.flush_seconds = 0.0  # total time spent in successful commits

    # -- producer side (synchronous) --

    @property
    def pending(self) -> int:
        return len(self._events)

    def append(self, seq: int, data: bytes) -> None:
        """Queue one event; it reaches the journal within ~one flush interval."""
        if self.fenced is not None:
            raise self.fenced
        if self._closed:
            raise RuntimeError("JournalWriter is closed")
        if self.last_error is not None:
            # The store is failing: this may wait long. orjson's output keeps its whole build
            # buffer (several KB however short the event), so keep a copy of its size.
            data = memoryview(data).tobytes()
        self._events.append((seq, data))
        self._bytes += len(data)
        if len(self._events) > self.max_pending_events or self._bytes > self.max_pending_bytes:
            self._enforce_caps()
        self._kick()

    def mark_lost(self, through_seq: int) -> None:
        """Tell the journal (with the next flush) that events up to ``through_seq``
        may be missing, so a read from before them reports a gap."""
        self._lost_through = max(self._lost_through, through_seq)
        self._kick()

    def set_snapshot(self, snapshot: bytes, items: dict[str, bytes] | None = None, drops: Iterable[str] = ()) -> None:
        """Replace the pending snapshot, and set or drop conversation item records (the
        latest of each wins); all written with the next flush, atomically."""
        if self.fenced is not None:
            raise self.fenced
        if self._closed:
            raise RuntimeError("JournalWriter is closed")
        self._snapshot = snapshot
        for item_id in drops:
            self._items.pop(item_id, None)
            self._drops.add(item_id)
        for item_id, data in (items or {}).items():
            self._items[item_id] = data
            self._drops.discard(item_id)
        self._kick()

    def _enforce_caps(self) -> None:
        while len(self._events) > self.max_pending_events or (self._bytes > self.max_pending_bytes and self._events):
            seq, data = self._events.popleft()
            self._bytes -= len(data)
            self._lost_through = max(self._lost_through, seq)

    def _has_pending(self) -> bool:
        return bool(self._events or self._snapshot is not None or self._lost_through or self._items or self._drops)

    def _kick(self, at: float | None = None) -> None:
        if self._stopped:
            return
        flusher = self._flusher
        if flusher is None:
            flusher = self._flusher = JournalFlusher.of(self.store)
        flusher.schedule(self, self._next_at if at is None else at)

    # -- flushing --

    async def flush(self) -> None:
        """Commit everything pending now (and wait for a batch in flight). Raises
        FencedError / StoreUnavailable (the batch is kept for a retry on StoreUnavailable)."""
        if self.fenced is not None:
            raise self.fenced
        if self._stopped or not (self._has_pending() or self._in_flight):
            return  # (stopped: nothing of it is committed any more)
        health = self.store.health
        if health.down and health.trial_interval_s is None and not self._in_flight:
            # The store is known down (and a probe, not our calls, will find it back): fail
            # now, without handing the whole pending buffer to a commit that cannot be sent
            # (on a long outage, that buffer is large); the backoff retries keep it going.
            raise StoreUnavailable(health.refuse())
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._kick(at=0.0)  # now, before the interval or a backoff says
        await waiter

    def _take(self, now: float) -> _Batch | None:
        """The flusher takes what is pending (None: nothing; the waiters are answered)."""
        waiters, self._waiters = self._waiters, []
        if self.fenced is not None or not self._has_pending():
            _answer(waiters, self.fenced)
            return None
        batch = _Batch(self._events, self._snapshot, self._lost_through, self._items, self._drops, waiters)
        self._events = deque()  # (handed over, not copied)
        self._bytes = 0
        self._snapshot = None
        self._items, self._drops = {}, set()
        self._lost_through = 0
        self._in_flight = True
        self._next_at = now + self.interval_s
        return batch

    def _commit_of(self, batch: _Batch) -> Commit:
        drops = sorted(batch.drops) if batch.drops else ()
        return Commit(self.session_id, self.fence, batch.events, batch.snapshot, batch.lost, batch.items, drops,
                      self.quota)  # fmt: skip

    def _settle(self, batch: _Batch, error: BaseException | None, now: float, seconds: float) -> None:
        """The flusher's answer for ``batch``: committed (``error`` None) or not."""
        self._in_flight = False
        if self._stopped:  # abandoned or closed unflushed: the session went on without us
            _answer(batch.waiters, error)
            _answer(self._waiters, None)
            self._waiters = []
            return
        if error is None:
            self.last_error = None
            self._retry_s = 0.0
            self.flushes += 1
            self.flush_seconds += seconds
            if batch.events:
                self.committed_seq = max(self.committed_seq, batch.events[-1][0])
            if self.on_flushed is not None:
                self.on_flushed(self.committed_seq, True)
            _answer(batch.waiters, None)
        elif isinstance(error, FencedError):
            self.fenced = error
            self._events.clear()
            self._bytes = 0
            if self.on_fenced is not None:
                self.on_fenced(error)
            _answer(batch.waiters, error)
            _answer(self._waiters, error)
            self._waiters = []
            return
        else:
            # The first failure in a row: what was appended while all was well is compacted
            # once (see ``append``); later batches hold compact copies already.
            self._restore(batch, compact=self.last_error is None)
            if isinstance(error, StoreUnavailable):
                self.last_error = error
                self._retry_s = min(max(self._retry_s * 2, self.interval_s, 0.01), MAX_RETRY_S)
                THROTTLE.warning(log, "journal", "journal flush failed for session %s (retry in %.2fs): %s",
                                 self.session_id, self._retry_s, error)  # fmt: skip
            else:  # a bug must not stop the journal silently
                if isinstance(error, StoreError):
                    self.last_error = error
                self._retry_s = MAX_RETRY_S
                log.error("journal flush crashed for session %s", self.session_id, exc_info=error)
            self._next_at = now + self._retry_s
            if self.on_flushed is not None and batch.events:
                self.on_flushed(batch.events[-1][0], False)
            _answer(batch.waiters, error)
        if self._waiters or self._has_pending():
            self._kick(at=0.0 if self._waiters else None)  # a flush() waiting: at once

    def _restore(self, batch: _Batch, *, compact: bool = False) -> None:
        # Put the batch back in front of what arrived meanwhile (it may or may
        # not have been applied; a retry is idempotent). What came later wins.
        if compact:
            self._events = deque((seq, memoryview(d).tobytes()) for seq, d in self._events)
            self._events.extendleft(reversed([(seq, memoryview(d).tobytes()) for seq, d in batch.events]))
        else:
            self._events.extendleft(reversed(batch.events))
        self._bytes = sum(len(d) for _, d in self._events)
        if self._snapshot is None:
            self._snapshot = batch.snapshot
        later = self._items.keys() | self._drops
        self._items.update({k: v for k, v in batch.items.items() if k not in later})
        self._drops |= {d for d in batch.drops if d not in later}
        self._lost_through = max(self._lost_through, batch.lost)
        self._enforce_caps()

    def abandon(self) -> None:
        """Stop now, dropping what is pending (the session went to another replica, or
        this writer's lease is gone): nothing of ours is flushed after this (a batch
        already in flight lands or is fenced; its news is ignored)."""
        self._closed = True
        self._events.clear()
        self._bytes = 0
        self._items, self._drops, self._snapshot, self._lost_through = {}, set(), None, 0
        self._forget()

    @property
    def _stopped(self) -> bool:
        """Closed and out of the flusher: nothing of this writer is committed any more."""
        return self._closed and self._flusher is None

    def _forget(self) -> None:
        """Out of the flusher, for good. The flushes still waiting are answered now: their
        batch will never be taken, and a commit gate waiting on one would hold back every
        later event of its connection (issue 34's silence after a resume)."""
        if self._flusher is not None:
            self._flusher.forget(self)
            self._flusher = None
        _answer(self._waiters, None)
        self._waiters = []

    async def close(self, *, flush: bool = True) -> None:
        """Stop; with ``flush`` commit what is pending first (its error, if any, is
        raised after the writer is stopped)."""
        self._closed = True
        try:
            if flush and self.fenced is None:
                await self.flush()
        finally:
            self._forget()


def _answer(waiters: list[asyncio.Future[None]], error: BaseException | None) -> None:
    for waiter in waiters:
        if not waiter.done():
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)


class JournalFlusher:
    """Flushes the due writers of one store, in one event loop, in one ``commit_many``.

    A timer at the earliest due writer takes every writer due by then (and not already in
    flight: one batch per writer at a time keeps its order) into one batch, committed in a
    task of its own, so a slow batch holds up only its own writers. A ``flush()`` (the commit
    gate: several a second per session) fires it on the next loop turn for the writers that
    asked, without a scan of the others. Got with ``of(store)``."""

    _by_store: ClassVar[weakref.WeakKeyDictionary[SessionStore, JournalFlusher]] = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, store: SessionStore) -> JournalFlusher:
        loop = asyncio.get_running_loop()
        flusher = cls._by_store.get(store)
        if flusher is None or flusher._loop is not loop or flusher._loop.is_closed():
            flusher = cls._by_store[store] = cls(store, loop)
        return flusher

    def __init__(self, store: SessionStore, loop: asyncio.AbstractEventLoop) -> None:
        self.store = store
        self._loop = loop
        ms = store.limits.flush_interval_ms
        self._grid_s = ms / 1000 / GRID_STEPS
        self._due: dict[JournalWriter, float] = {}  # on the grid: writer -> loop time it may flush from
        self._due_at = math.inf  # the earliest of them not in flight (a lower bound: it may have left)
        self._urgent: dict[JournalWriter, None] = {}  # flush() asked: at once (an ordered set)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._tasks: set[asyncio.Task[None]] = set()  # batches in flight
        self.batches = 0  # commit_many calls made (one store round trip each on Redis)

    def schedule(self, writer: JournalWriter, at: float) -> None:
        """``writer`` has something to flush from loop time ``at`` (earlier wins; 0: now)."""
        if at <= 0:
            self._urgent[writer] = None
            if not writer._in_flight and self._timer_at > 0:  # (in flight: its batch's end fires)
                self._arm(0.0)
            return
        due = self._due.get(writer)
        if due is not None and due <= at:
            return
        if self._grid_s > 0:  # on the grid, so busy writers share batches
            at = math.ceil(at / self._grid_s) * self._grid_s
        self._due[writer] = at
        if not writer._in_flight:
            self._due_at = min(self._due_at, at)
            if at < self._timer_at:
                self._arm(at)

    def forget(self, writer: JournalWriter) -> None:
        self._due.pop(writer, None)
        self._urgent.pop(writer, None)

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self._loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self._timer, self._timer_at = None, math.inf
        now = self._loop.time()
        batch: list[tuple[JournalWriter, _Batch]] = []
        for writer in list(self._urgent):
            if not writer._in_flight:
                del self._urgent[writer]
                self._due.pop(writer, None)
                taken = writer._take(now)
                if taken is not None:
                    batch.append((writer, taken))
        if self._due_at <= now:  # a grid step came: every writer due by now
            earliest = math.inf
            for writer, at in list(self._due.items()):
                if writer._in_flight:
                    continue  # its batch's end looks at it again
                if at <= now:
                    del self._due[writer]
                    taken = writer._take(now)
                    if taken is not None:
                        batch.append((writer, taken))
                elif at < earliest:
                    earliest = at
            self._due_at = earliest
        if batch:
            self.batches += 1
            task = self._loop.create_task(self._commit(batch, now), name="journal-flush")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self._due_at < self._timer_at:
            self._arm(self._due_at)

    async def _commit(self, batch: list[tuple[JournalWriter, _Batch]], started: float) -> None:
        errors: Sequence[BaseException | None]
        try:
            errors = await self.store.commit_many([w._commit_of(b) for w, b in batch])
        except asyncio.CancelledError:  # the loop is going away: put every batch back
            for writer, taken in batch:
                writer._in_flight = False
                writer._restore(taken)
                _answer(taken.waiters, StoreUnavailable("the journal flusher was stopped"))
            raise
        except Exception as exc:  # a bug must not stop every journal
            errors = [exc] * len(batch)
        done = self._loop.time()
        for (writer, taken), error in zip(batch, errors, strict=True):
            writer._settle(taken, error, done, done - started)
        # Its writers are free again: those due meanwhile go now, or when due.
        for writer, _ in batch:
            if writer._in_flight:
                continue
            if writer in self._urgent:
                if self._timer_at > 0:
                    self._arm(0.0)
            elif (at := self._due.get(writer)) is not None and at < self._due_at:
                self._due_at = at
        if self._due_at < self._timer_at:
            self._arm(self._due_at)
