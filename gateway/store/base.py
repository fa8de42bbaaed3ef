"""The session store interface and the types both implementations share.

A store keeps, per session: an opaque snapshot, an event journal, an
ownership lease with a fencing token; plus a cross-replica message bus and a
single-use token KV. ``MemoryStore`` (one process) and ``RedisStore`` (many
replicas) implement the same ``SessionStore`` and pass the same contract tests
(``tests/store/test_store_contract.py``).

Guarantees every implementation gives:

- **Fencing.** Every write to a session (snapshot, journal append) carries the
  fencing token its writer got from ``acquire``. A write whose token is not the
  session's current one raises ``FencedError``; the check and the write are one
  atomic step, so a replica that lost the session can never overwrite the state
  of the replica that took it over.
- **Journal order.** Events are stored and returned in ``server_event_seq``
  order; an append whose seq is not above every seq already appended (or
  acknowledged) is skipped, which makes retried appends idempotent.
- **No silent gap.** ``read_events`` says ``gap=True`` whenever an event after
  the requested seq may have existed and is gone (trimmed by a cap, acked, or
  the whole journal lost), so the caller resyncs the client instead of
  replaying a partial range.
- **Failures are fast and typed.** A backend that cannot be reached raises
  ``StoreUnavailable`` (never hangs past the configured timeouts); the same
  store object works again once the backend is back.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from gateway.store.health import StoreHealth

__all__ = [
    "Admission",
    "Budget",
    "BusMessage",
    "Commit",
    "FencedError",
    "JournalRead",
    "Owner",
    "QueuedSubscription",
    "SessionStore",
    "StateHeld",
    "StateLimitExceeded",
    "StateQuota",
    "StoreError",
    "StoreLimits",
    "StoreUnavailable",
    "Subscription",
    "replica_channel",
    "session_channel",
]


# --- errors -----------------------------------------------------------------


class StoreError(Exception):
    """Base of every store failure; ``code`` is stable and machine-readable."""

    code = "store_error"


class FencedError(StoreError):
    """A write carried a fencing token that is no longer the session's current one.

    The writer lost ownership (another replica acquired the session); it must
    stop serving the session and must not retry the write.
    """

    code = "session_fenced"

    def __init__(self, session_id: str, fence: int, current: int | None) -> None:
        super().__init__(f"session {session_id}: fence {fence} is stale (current: {current})")
        self.session_id = session_id
        self.fence = fence
        self.current = current


class StoreUnavailable(StoreError):
    """The backend could not be reached or answered with an error.

    Transient: the same store object recovers once the backend is back. A write
    that raised this may or may not have been applied (the reply was lost);
    every write is idempotent, so retrying is safe.
    """

    code = "store_unavailable"


class StateLimitExceeded(StoreError):
    """A new session would take its principal past ``StateQuota.max_bytes``, and no session
    kept after its close is left to forget: the session is not created (nothing is written)."""

    code = "rate_limit_exceeded"

    def __init__(self, principal: str, held: int, limit: int) -> None:
        super().__init__(f"{principal}: {held} bytes of session state held, limit {limit}")
        self.principal, self.held, self.limit = principal, held, limit


# --- configuration ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StateQuota:
    """One principal's bound on the session state the store keeps for it (its tenant limits,
    ``gateway/quotas.py``). Passed with every write of a session it owns, so that the store
    keeps a ledger per principal: each session's bytes (snapshot + item records + journal
    payload, as of its last write) and whether a replica holds its lease. A session *kept*
    is one no replica serves (closed and past its grace, or its replica died) that is still
    resumable. When a limit is passed, kept sessions are forgotten, least recently served
    first (a resume then gets ``session_not_found``); a session a replica serves never is."""

    principal: str
    max_bytes: int = 0  # 0: no limit. Past it a new session is refused (StateLimitExceeded) once no kept
    #   session is left to forget; a write of a served session past it forgets kept ones, never fails
    max_kept: int = 0  # 0: no limit. Kept sessions beyond it: the oldest are forgotten
    ttl_s: float = 0.0  # how long the state outlives the last write or renewal: the idle TTL for this
    #   principal's sessions (0, or above it: ``StoreLimits.idle_ttl_s``)

    def ttl_ms(self, limits: StoreLimits) -> int:
        ttl = limits.idle_ttl_s if self.ttl_s <= 0 else min(self.ttl_s, limits.idle_ttl_s)
        return max(1, int(ttl * 1000))


def ttl_ms(limits: StoreLimits, quota: StateQuota | None) -> int:
    """The idle TTL of a session written under ``quota`` (None: the store's)."""
    return limits.idle_ttl_ms if quota is None else quota.ttl_ms(limits)


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """Limits every store applies. All are per session unless said otherwise."""

    # Idle TTL of everything a session owns (snapshot, journal, fence counter),
    # refreshed by every commit, acquire, renew and ack trim (so a live owner
    # renewing its lease keeps a quiet session). When it passes untouched the
    # session is gone: ``load_snapshot`` returns None and a resume fails.
    idle_ttl_s: float = 3600.0
    # Journal cap by count. Past it the oldest events are dropped (exactly, in
    # the same atomic step as the append) and a resume from before them gets
    # ``gap=True``.
    max_events: int = 10_000
    # Journal cap by payload bytes (the sum of the encoded events, not Redis's
    # own overhead). Past it the oldest events are dropped as for max_events;
    # a single event larger than the cap is dropped at once.
    max_bytes: int = 8 * 1024 * 1024
    # JournalWriter batching window: at most one round trip per session per
    # interval. A crash loses at most the events appended in the last interval
    # (plus one round trip in flight). Lower: less loss and latency, more load.
    flush_interval_ms: float = 20.0
    # What a JournalWriter keeps of events the store has not taken yet (the store is slow,
    # down or frozen), per session: past it the oldest are dropped and reported to the journal
    # as lost (a resume from before them gets ``gap=True``). Bounds a replica's memory in an
    # outage at sessions x this.
    max_pending_bytes: int = 1 << 20
    # Prefix of every key and bus channel, so several deployments (or test
    # runs) can share one Redis.
    key_prefix: str = "omni:"

    def __post_init__(self) -> None:
        if self.idle_ttl_s <= 0:
            raise ValueError("idle_ttl_s must be > 0")
        if self.max_events < 1 or self.max_bytes < 1 or self.max_pending_bytes < 1:
            raise ValueError("max_events, max_bytes and max_pending_bytes must be >= 1")
        if self.flush_interval_ms < 0:
            raise ValueError("flush_interval_ms must be >= 0")

    @property
    def idle_ttl_ms(self) -> int:
        return max(1, int(self.idle_ttl_s * 1000))

    @classmethod
    def split(cls, options: dict[str, Any]) -> tuple[StoreLimits, dict[str, Any]]:
        """Split keyword options into (limits, the rest) for ``create_store``."""
        names = {f.name for f in fields(cls)}
        limits = cls(**{k: v for k, v in options.items() if k in names})
        return limits, {k: v for k, v in options.items() if k not in names}


# --- results ----------------------------------------------------------------


class Commit(NamedTuple):
    """One session's part of ``commit_many``: the arguments of ``SessionStore.commit``."""

    session_id: str
    fence: int
    events: Sequence[tuple[int, bytes]] = ()
    snapshot: bytes | None = None
    lost_through: int = 0
    items: Mapping[str, bytes] | None = None
    drop_items: Sequence[str] = ()
    quota: StateQuota | None = None


class Owner(NamedTuple):
    owner: str
    fence: int


@dataclass(frozen=True, slots=True)
class JournalRead:
    """The answer to ``read_events``.

    ``events``: (seq, bytes) with seq > after_seq, ascending, at most ``limit``.
    ``gap``: True when an event after ``after_seq`` may have existed and is no
    longer available (trimmed by a cap or an ack, or the journal was lost):
    replay from ``after_seq`` is impossible and the client must resync.
    ``first_seq``: lowest seq still stored (None: the journal is empty).
    ``last_seq``: highest seq ever appended (None: no journal). A client that
    claims ``after_seq > last_seq`` received events the journal never got
    (they were lost with a crashed writer's unflushed buffer).
    """

    events: list[tuple[int, bytes]]
    gap: bool
    first_seq: int | None
    last_seq: int | None


@dataclass(frozen=True, slots=True)
class Admission:
    """The answer to ``admit_connection``: admitted, or which limit refused it."""

    ok: bool
    refused: str | None  # "max_sessions" | "session_starts_per_min" (None when admitted)
    open: int  # the principal's open connections, this one included when admitted (counted only
    #   while ``max_open`` is set)
    starts: int  # its connections started in the last 60 s, likewise (only while ``starts_per_min`` is set)
    reset_ms: int  # until the oldest of those starts leaves the 60 s window (0: none)


@dataclass(frozen=True, slots=True)
class StateHeld:
    """The answer to ``state_held``: a principal's sessions in the store's ledger."""

    bytes: int  # snapshot + item records + journal payload of them all, as of each one's last write
    sessions: int  # sessions whose state is held
    kept: int  # of them, those no replica serves (no live lease)


@dataclass(frozen=True, slots=True)
class Budget:
    """The answer to ``take_budget``: what was granted of the current window's budget."""

    granted: int  # units given to the caller (at most what it asked for)
    used: int  # units of the window given out so far (to every replica), these included
    window: int  # the window's number (pass it back to ``return_budget``)
    reset_ms: int  # until the window ends (and ``used`` starts again from 0)


@dataclass(frozen=True, slots=True)
class BusMessage:
    channel: str  # the logical channel name, without the key prefix
    data: bytes


class Subscription(abc.ABC):
    """An async iterator of ``BusMessage``; close it (or use ``async with``)."""

    @abc.abstractmethod
    def __aiter__(self) -> AsyncIterator[BusMessage]: ...

    @abc.abstractmethod
    async def get(self) -> BusMessage | None:
        """The next message; None once closed. Bound the wait with
        ``asyncio.timeout``."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    @property
    @abc.abstractmethod
    def connected(self) -> bool:
        """False while the backend is unreachable (messages sent then are lost)."""

    @abc.abstractmethod
    async def wait_connected(self) -> None:
        """Wait until subscribed (bound it with ``asyncio.timeout``)."""

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class QueuedSubscription(Subscription):
    """A subscription fed through a bounded queue: when the consumer falls behind,
    the oldest message is dropped (counted in ``dropped``) to keep the newest."""

    def __init__(self, queue_size: int) -> None:
        self._queue: asyncio.Queue[BusMessage | None] = asyncio.Queue(queue_size)
        self._closed = False
        self.dropped = 0

    def deliver(self, message: BusMessage) -> None:
        if self._queue.full():
            self._queue.get_nowait()
            self.dropped += 1
        self._queue.put_nowait(message)

    async def get(self) -> BusMessage | None:
        if self._closed and self._queue.empty():
            return None
        return await self._queue.get()

    async def __aiter__(self) -> AsyncIterator[BusMessage]:
        while True:
            msg = await self.get()
            if msg is None:
                return
            yield msg

    def _wake(self) -> None:
        """Unblock a consumer waiting in ``get`` after close."""
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(None)


def replica_channel(owner: str) -> str:
    """The bus channel a replica listens on for messages to sessions it owns."""
    return f"replica:{owner}"


def session_channel(session_id: str) -> str:
    """A per-session bus channel (e.g. for observers of one session)."""
    return f"session:{session_id}"


def check_read_args(after_seq: int, limit: int | None) -> None:
    """Reject arguments both implementations would otherwise treat differently."""
    if after_seq < 0:
        raise ValueError("after_seq must be >= 0")
    if limit is not None and limit < 1:
        raise ValueError("limit must be None or >= 1")


# --- the interface ----------------------------------------------------------


class SessionStore(abc.ABC):
    """One interface, two implementations (memory, redis); see the module doc."""

    limits: StoreLimits
    # Backend calls made so far (one per network round trip on Redis); for
    # benchmarks and the batching tests.
    round_trips: int
    # Whether the backend answers, as this replica last found it (``health.py``): readiness
    # reports it; while it is down a Redis store's calls fail at once.
    health: StoreHealth

    # -- snapshot + journal writes (fenced) --

    @abc.abstractmethod
    async def commit(
        self,
        session_id: str,
        *,
        fence: int,
        events: Sequence[tuple[int, bytes]] = (),
        snapshot: bytes | None = None,
        lost_through: int = 0,
        items: Mapping[str, bytes] | None = None,
        drop_items: Sequence[str] = (),
        quota: StateQuota | None = None,
    ) -> None:
        """Atomically: check ``fence``, append ``events``, set ``snapshot`` (if
        given), set ``items`` and drop ``drop_items`` (the session's conversation
        items, one record each, so a change costs what the item costs, not the
        conversation), apply the journal caps, refresh the idle TTL. One round trip.

        ``quota``: the principal the session belongs to: its ledger gets the session's
        bytes, and kept sessions of it are forgotten while it holds more than ``max_bytes``.

        ``lost_through``: the writer dropped events up to this seq without
        journaling them (its buffer overflowed while the backend was down); the
        journal records it so a resume from before it reports a gap.
        Raises ``FencedError`` (nothing is written) or ``StoreUnavailable``.
        """

    async def commit_many(self, commits: Sequence[Commit]) -> list[StoreError | None]:
        """Every commit of ``commits``, each one atomic as ``commit`` is (of different
        sessions, or in order for one), in ONE round trip where the backend can batch
        (Redis: a pipeline). Never raises a store error: the answer holds, per commit,
        None (committed) or its error (``FencedError``: nothing of it written;
        ``StoreUnavailable``: it may or may not have been applied, and a retry is
        idempotent). This default runs them one after another."""
        results: list[StoreError | None] = []
        for c in commits:
            try:
                await self.commit(
                    c.session_id, fence=c.fence, events=c.events, snapshot=c.snapshot, lost_through=c.lost_through,
                    items=c.items, drop_items=c.drop_items, quota=c.quota,
                )  # fmt: skip
            except StoreError as exc:
                results.append(exc)
            else:
                results.append(None)
        return results

    async def save_snapshot(self, session_id: str, snapshot: bytes, *, fence: int) -> None:
        await self.commit(session_id, fence=fence, snapshot=snapshot)

    async def append_events(self, session_id: str, events: Sequence[tuple[int, bytes]], *, fence: int) -> None:
        await self.commit(session_id, fence=fence, events=events)

    @abc.abstractmethod
    async def load_snapshot(self, session_id: str) -> bytes | None: ...

    @abc.abstractmethod
    async def load_session(self, session_id: str) -> tuple[bytes, dict[str, bytes]] | None:
        """The snapshot and every item record, read together (one round trip); None: no snapshot."""

    @abc.abstractmethod
    async def delete_session(self, session_id: str, *, quota: StateQuota | None = None) -> None:
        """Drop snapshot, journal, lease and fence counter (and the ledger's entry)."""

    @abc.abstractmethod
    async def state_held(self, principal: str) -> StateHeld:
        """What the ledger holds for ``principal`` (sessions written with its quota)."""

    # -- journal reads --

    @abc.abstractmethod
    async def read_events(self, session_id: str, after_seq: int, limit: int | None = None) -> JournalRead: ...

    @abc.abstractmethod
    async def trim_events(self, session_id: str, up_to_seq: int, *, quota: StateQuota | None = None) -> None:
        """The client acked everything up to ``up_to_seq``: drop it. Not fenced:
        dropping what the client already has is safe from any replica. Later
        appends at or below ``up_to_seq`` are skipped."""

    # -- ownership lease + fencing --

    @abc.abstractmethod
    async def acquire(
        self, session_id: str, owner: str, ttl_ms: int, *, quota: StateQuota | None = None, new: bool = False
    ) -> int:
        """Make ``owner`` the owner for ``ttl_ms`` and return a new fencing
        token, greater than every token issued for this session before. Always
        succeeds: takeover is allowed (the resuming replica wins). With ``quota``
        the ledger counts the session as served; with ``new`` too (a session being
        created) it is admitted first: kept sessions of the principal are forgotten
        while it holds ``max_bytes`` or more, and if it still does, ``StateLimitExceeded``
        is raised and nothing is written."""

    @abc.abstractmethod
    async def renew(
        self, session_id: str, owner: str, fence: int, ttl_ms: int, *, quota: StateQuota | None = None
    ) -> bool:
        """Extend the lease. False (lease untouched) when ``fence`` is not current:
        someone took the session over. A lapsed lease whose fence is still
        current is re-established (nobody took over)."""

    async def renew_many(
        self, owner: str, ttl_ms: int, leases: list[tuple[str, int]], quotas: Sequence[StateQuota | None] = ()
    ) -> list[bool]:
        """``renew`` for many ``(session_id, fence)`` at once (a replica renews all
        its leases together), each with its quota (``quotas``, in order; none: no
        quota); one result per lease, in order. Stores that can batch (Redis: one
        pipelined round trip) override this."""
        qs = list(quotas) or [None] * len(leases)
        pairs = zip(leases, qs, strict=True)
        return [await self.renew(sid, owner, fence, ttl_ms, quota=q) for (sid, fence), q in pairs]

    @abc.abstractmethod
    async def release(self, session_id: str, owner: str, fence: int, *, quota: StateQuota | None = None) -> bool:
        """Drop the lease if ``fence`` is current; the fence counter stays. With ``quota``
        the session is now kept: the principal's oldest kept sessions beyond ``max_kept``
        (and while it holds more than ``max_bytes``) are forgotten."""

    @abc.abstractmethod
    async def owner_of(self, session_id: str) -> Owner | None:
        """The live lease holder, or None (released or lapsed)."""

    # -- bus --

    @abc.abstractmethod
    async def publish(self, channel: str, message: bytes) -> int:
        """Send to every current subscriber of ``channel`` (at most once, no
        buffering for absent subscribers). Returns the number of receivers
        (on Redis: of receiving connections)."""

    @abc.abstractmethod
    async def subscribe(self, *channels: str) -> Subscription:
        """Listen on ``channels``. Returns once subscribed, or, when the backend
        is unreachable, after its connect timeout with ``connected`` False; it
        keeps retrying in the background either way."""

    async def send_to_owner(self, session_id: str, message: bytes) -> bool:
        """Deliver ``message`` to the replica owning ``session_id`` (on its
        ``replica_channel``). False when the session has no live owner or no
        replica was listening."""
        owner = await self.owner_of(session_id)
        if owner is None:
            return False
        return await self.publish(replica_channel(owner.owner), message) > 0

    # -- single-use tokens --

    @abc.abstractmethod
    async def put_token(self, token_hash: str, payload: bytes, ttl_s: float) -> None: ...

    @abc.abstractmethod
    async def take_token(self, token_hash: str) -> bytes | None:
        """Atomically read and delete: only the first taker gets the payload."""

    # -- tenant limits (gateway/quotas.py), shared by every replica --
    #
    # A principal's open connections and recent starts, and its budgets per fixed
    # window (audio seconds, events), are counted here so that a limit holds
    # across replicas. Each call is one atomic step (Redis: one Lua script) on the
    # store's own clock.

    @abc.abstractmethod
    async def admit_connection(
        self, principal: str, conn_id: str, *, max_open: int, starts_per_min: int, ttl_ms: int
    ) -> Admission:
        """Atomically: forget the principal's connections whose entry expired and its
        starts older than 60 s; refuse when ``max_open`` are open or ``starts_per_min``
        started (0: no limit); else record ``conn_id`` as open (for ``ttl_ms``, renewed
        by ``refresh_connections``) and as started now. (``gateway/auth.py`` counts a
        principal's client secrets with it too: an entry per secret, for its lifetime.)"""

    @abc.abstractmethod
    async def release_connection(self, principal: str, conn_id: str) -> None:
        """``conn_id`` closed: it no longer counts as open (its start still counts)."""

    @abc.abstractmethod
    async def refresh_connections(self, entries: Sequence[tuple[str, str]], ttl_ms: int) -> list[int]:
        """Keep ``(principal, conn_id)`` entries open for another ``ttl_ms`` (a replica
        renews all of its own at once; entries of a replica that died lapse). Returns,
        per entry, its principal's open connections. One round trip."""

    @abc.abstractmethod
    async def take_budget(self, principal: str, kind: str, want: int, *, limit: int, window_ms: int) -> Budget:
        """Atomically grant up to ``want`` of the ``limit`` units ``principal`` has of
        ``kind`` per window of ``window_ms`` (windows are aligned to the store's
        clock; the count starts from 0 in each). Never grants past the limit."""

    @abc.abstractmethod
    async def return_budget(self, principal: str, kind: str, amount: int, *, window: int) -> None:
        """Give back ``amount`` units granted in ``window`` and not used (a no-op once
        that window is over)."""

    # -- lifecycle --

    @abc.abstractmethod
    async def ping(self) -> None:
        """Raise ``StoreUnavailable`` if the backend is unreachable."""

    @abc.abstractmethod
    async def probe(self) -> str:
        """The store's epoch: an id of its data, the same until the store loses it (a Redis
        restarted empty gets a new one). One round trip that goes to the backend even while
        ``health`` says it is down (the only one that does), so it is what brings ``health``
        back up. Raises ``StoreUnavailable``."""

    @abc.abstractmethod
    async def close(self) -> None: ...
