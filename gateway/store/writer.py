"""JournalWriter: batches one session's journal appends and snapshot updates.

A streaming session emits many small events (audio and text deltas). Writing
each one would cost a round trip per event; instead the session calls
``append`` (synchronous, no await) and ``set_snapshot``, and a flusher task
sends everything pending in ONE ``store.commit`` (fence check + appends +
snapshot + caps + TTL refresh, atomically), at most once per
``flush_interval_ms``:

- the first append after a quiet period is flushed on the next loop turn
  (no added latency when traffic is sparse);
- while busy, flushes are spaced ``flush_interval_ms`` apart, so a session
  costs at most ``1000 / flush_interval_ms`` round trips per second however
  many events it emits;
- ``flush()`` forces a flush now (before acking a resume, on close, at drain).

What a crash can lose: the events appended since the last successful flush,
i.e. at most one flush interval (default 20 ms) plus the round trip in flight.
The client may have received those events; a resume then finds
``JournalRead.last_seq`` below the client's ``after_seq`` and must resync.

Failures: ``FencedError`` (another replica took the session) stops the writer
for good: pending events are dropped, ``fenced`` is set, ``on_fenced`` is
called, and further ``append`` calls raise it. ``StoreUnavailable`` keeps the
batch and retries with backoff (doubling from the interval up to
``MAX_RETRY_S``); the pending buffer is capped (``max_pending_events`` /
``max_pending_bytes``, default: the journal caps) and when full the oldest
pending events are dropped and reported to the journal as lost, so a resume
from before them reports a gap rather than a silent hole.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable

from gateway.store.base import FencedError, SessionStore, StateQuota, StoreError, StoreUnavailable

log = logging.getLogger(__name__)

MAX_RETRY_S = 1.0  # longest wait between retries while the store is unavailable


class JournalWriter:
    def __init__(
        self,
        store: SessionStore,
        session_id: str,
        fence: int,
        *,
        # None: limits.flush_interval_ms. At most one commit per interval.
        flush_interval_ms: float | None = None,
        # None: limits.max_events / max_bytes. When the unflushed buffer passes
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
        self.max_pending_bytes = max_pending_bytes or limits.max_bytes
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
        self._lock = asyncio.Lock()  # one commit in flight, so order holds
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._next_at = 0.0  # loop time before which the flusher may not flush
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
        self._events.append((seq, data))
        self._bytes += len(data)
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

    def _kick(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"journal-writer:{self.session_id}")
        self._wake.set()

    # -- flushing --

    async def flush(self) -> None:
        """Commit everything pending now. Raises FencedError / StoreUnavailable
        (the batch is kept for a retry on StoreUnavailable)."""
        async with self._lock:
            await self._flush_locked()

    async def _flush_locked(self) -> None:
        if self.fenced is not None:
            raise self.fenced
        if (
            not self._events
            and self._snapshot is None
            and not self._lost_through
            and not self._items
            and not self._drops
        ):
            return
        events, snapshot, lost = list(self._events), self._snapshot, self._lost_through
        items, drops = self._items, self._drops
        self._events.clear()
        self._bytes = 0
        self._snapshot = None
        self._items, self._drops = {}, set()
        self._lost_through = 0
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            await self.store.commit(
                self.session_id,
                fence=self.fence,
                events=events,
                snapshot=snapshot,
                lost_through=lost,
                items=items,
                drop_items=sorted(drops),
                quota=self.quota,
            )
        except FencedError as exc:
            self.fenced = exc
            self._events.clear()
            self._bytes = 0
            if self.on_fenced is not None:
                self.on_fenced(exc)
            raise
        except StoreError as exc:
            self.last_error = exc
            self._restore(events, snapshot, lost, items, drops)
            if self.on_flushed is not None and events:
                self.on_flushed(events[-1][0], False)
            raise
        except asyncio.CancelledError:
            self._restore(events, snapshot, lost, items, drops)
            raise
        self.last_error = None
        self.flushes += 1
        self.flush_seconds += loop.time() - started
        if events:
            self.committed_seq = max(self.committed_seq, events[-1][0])
        if self.on_flushed is not None:
            self.on_flushed(self.committed_seq, True)

    def _restore(
        self,
        events: list[tuple[int, bytes]],
        snapshot: bytes | None,
        lost: int,
        items: dict[str, bytes],
        drops: set[str],
    ) -> None:
        # Put the batch back in front of what arrived meanwhile (it may or may
        # not have been applied; a retry is idempotent). What came later wins.
        self._events.extendleft(reversed(events))
        self._bytes = sum(len(d) for _, d in self._events)
        if self._snapshot is None:
            self._snapshot = snapshot
        later = self._items.keys() | self._drops
        self._items.update({k: v for k, v in items.items() if k not in later})
        self._drops |= {d for d in drops if d not in later}
        self._lost_through = max(self._lost_through, lost)
        self._enforce_caps()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        retry_s = 0.0
        while True:
            await self._wake.wait()
            delay = self._next_at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)  # appends meanwhile join this batch
            self._wake.clear()
            self._next_at = loop.time() + self.interval_s
            try:
                await self.flush()
                retry_s = 0.0
            except FencedError:
                return
            except StoreUnavailable as exc:
                retry_s = min(max(retry_s * 2, self.interval_s, 0.01), MAX_RETRY_S)
                self._next_at = loop.time() + retry_s
                self._wake.set()
                log.warning("journal flush failed for session %s (retry in %.2fs): %s", self.session_id, retry_s, exc)
            except Exception:  # a bug must not kill the flusher silently
                log.exception("journal flush crashed for session %s", self.session_id)
                self._next_at = loop.time() + MAX_RETRY_S
                self._wake.set()

    def abandon(self) -> None:
        """Stop now, dropping what is pending (the session went to another replica, or
        this writer's lease is gone): no flusher task outlives its writer."""
        self._closed = True
        self._events.clear()
        self._items, self._drops, self._snapshot = {}, set(), None
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def close(self, *, flush: bool = True) -> None:
        """Stop the flusher; with ``flush`` commit what is pending first (its
        error, if any, is raised after the flusher is stopped)."""
        self._closed = True
        error: BaseException | None = None
        if flush and self.fenced is None:
            try:
                await self.flush()
            except StoreError as exc:
                error = exc
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task})  # our own cancellation still raises; the task's does not
            self._task = None
        if error is not None:
            raise error
