"""In-process session store: the embedded default when no ``REDIS_URL`` is set.

It behaves exactly like ``RedisStore`` (same fencing, journal caps, gap rules,
TTLs, bus semantics; the same contract tests prove both), but everything lives
in this process: a restart loses every session, and the bus reaches only
subscribers in this process. Every method is atomic because none awaits while
it mutates state. Expired entries are dropped lazily on access and by a sweep
at most once per ``SWEEP_INTERVAL_S``.
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gateway.store.base import (
    Admission,
    Budget,
    BusMessage,
    FencedError,
    JournalRead,
    Owner,
    QueuedSubscription,
    SessionStore,
    StateHeld,
    StateLimitExceeded,
    StateQuota,
    StoreLimits,
    Subscription,
    check_read_args,
    ttl_ms,
)
from gateway.store.health import StoreHealth

SWEEP_INTERVAL_S = 30.0  # how often expired sessions and tokens are reclaimed (at most; a shorter
#   idle TTL sweeps as often as its TTL, so that nothing outlives it by more than twice)
DEFAULT_BUS_QUEUE = 1024  # per subscription; when full the oldest message is dropped


@dataclass(slots=True)
class _Journal:
    events: deque[tuple[int, bytes]] = field(default_factory=deque)
    bytes: int = 0
    last: int = 0  # highest seq ever appended (or skipped as already acked)
    trimmed: int = 0  # highest seq dropped: caps, acks, writer overflow


@dataclass(slots=True)
class _Session:
    expires_at: float
    fence: int | None = None
    snapshot: bytes | None = None
    journal: _Journal | None = None
    items: dict[str, bytes] = field(default_factory=dict)
    items_bytes: int = 0  # their sum, kept as they change (a commit must not cost the conversation)
    ttl_s: float = 0.0  # its idle TTL (its quota's, or the store's)
    tenant: str | None = None  # the principal whose ledger counts it
    size: int = 0  # the bytes the ledger counts for it (as of its last write)

    def payload(self) -> int:
        journal = self.journal.bytes if self.journal is not None else 0
        return len(self.snapshot or b"") + self.items_bytes + journal


@dataclass(slots=True)
class _Lease:
    owner: str
    fence: int
    expires_at: float


class MemorySubscription(QueuedSubscription):
    def __init__(self, bus: dict[str, set[MemorySubscription]], channels: tuple[str, ...], queue_size: int) -> None:
        super().__init__(queue_size)
        self._bus = bus
        self._channels = channels
        for ch in channels:
            bus.setdefault(ch, set()).add(self)

    @property
    def connected(self) -> bool:
        return not self._closed

    async def wait_connected(self) -> None:
        return  # in-process: subscribed from the start

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for ch in self._channels:
            subs = self._bus.get(ch)
            if subs is not None:
                subs.discard(self)
                if not subs:
                    del self._bus[ch]
        self._wake()


class MemoryStore(SessionStore):
    def __init__(
        self,
        limits: StoreLimits | None = None,
        *,
        bus_queue_size: int = DEFAULT_BUS_QUEUE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits or StoreLimits()
        self.round_trips = 0
        self.health = StoreHealth("up")  # in-process: always answers
        self._epoch = secrets.token_hex(8)
        self._clock = clock
        self._bus_queue_size = bus_queue_size
        self._sessions: dict[str, _Session] = {}
        self._leases: dict[str, _Lease] = {}
        self._tokens: dict[str, tuple[bytes, float]] = {}
        self._bus: dict[str, set[MemorySubscription]] = {}
        # tenant limits: principal -> {conn_id: expires_at}; principal -> [(started_at, conn_id)]
        # in start order; (principal, kind) -> [window, used, window_ms]
        self._open: dict[str, dict[str, float]] = {}
        self._starts: dict[str, deque[tuple[float, str]]] = {}
        self._budgets: dict[tuple[str, str], list[int]] = {}
        # the ledger: principal -> its sessions' ids; principal -> their bytes
        self._ledger: dict[str, set[str]] = {}
        self._held: dict[str, int] = {}
        self._sweep_s = min(SWEEP_INTERVAL_S, self.limits.idle_ttl_s)
        self._next_sweep = clock() + self._sweep_s

    # -- helpers --

    def _tick(self) -> float:
        self.round_trips += 1
        now = self._clock()
        if now >= self._next_sweep:
            self._next_sweep = now + self._sweep_s
            for sid in [s for s, r in self._sessions.items() if r.expires_at <= now]:
                self._drop(sid)
            for sid in [s for s, ls in self._leases.items() if ls.expires_at <= now]:
                del self._leases[sid]
            for tok in [t for t, (_, exp) in self._tokens.items() if exp <= now]:
                del self._tokens[tok]
            for principal in list(self._open):
                self._open_of(principal, now)
            for principal in list(self._starts):
                self._starts_of(principal, now)
            now_ms = int(now * 1000)
            for key in [k for k, (w, _, ms) in self._budgets.items() if now_ms // ms > w]:
                del self._budgets[key]
        return now

    def _session(self, session_id: str, now: float) -> _Session | None:
        rec = self._sessions.get(session_id)
        if rec is not None and rec.expires_at <= now:
            self._drop(session_id)
            return None
        return rec

    def _drop(self, session_id: str) -> None:
        """Forget a session's state (its lease lapses on its own), and its ledger entry."""
        rec = self._sessions.pop(session_id, None)
        if rec is not None and rec.tenant is not None:
            self._held[rec.tenant] -= rec.size
            sids = self._ledger[rec.tenant]
            sids.discard(session_id)
            if not sids:
                del self._ledger[rec.tenant], self._held[rec.tenant]

    def _account(self, session_id: str, rec: _Session, quota: StateQuota | None, now: float) -> None:
        """After a write under ``quota``: the session's bytes in its principal's ledger, and
        kept sessions forgotten while the principal holds more than its ``max_bytes``."""
        if quota is None:
            return
        p = quota.principal
        if rec.tenant != p:
            if rec.tenant is not None:
                self._held[rec.tenant] -= rec.size
                self._ledger[rec.tenant].discard(session_id)
            rec.tenant, rec.size = p, 0
            self._ledger.setdefault(p, set()).add(session_id)
            self._held.setdefault(p, 0)
        size = rec.payload()
        self._held[p] += size - rec.size
        rec.size = size
        if quota.max_bytes and self._held[p] > quota.max_bytes:
            self._forget_kept(quota, now, keep=session_id)

    def _kept(self, principal: str, now: float) -> list[str]:
        """The principal's sessions no replica serves, least recently served first."""
        recs = [(sid, self._session(sid, now)) for sid in list(self._ledger.get(principal, ()))]
        kept = [(r.expires_at, sid) for sid, r in recs if r is not None and self._lease(sid, now) is None]
        return [sid for _, sid in sorted(kept)]

    def _forget_kept(self, quota: StateQuota, now: float, *, keep: str | None = None, room: int = 0) -> None:
        """Forget kept sessions, oldest first, while the principal has more than ``max_kept``
        of them or more than ``max_bytes - room`` bytes."""
        kept = [sid for sid in self._kept(quota.principal, now) if sid != keep]
        while kept and (
            (quota.max_kept and len(kept) > quota.max_kept)
            or (quota.max_bytes and self._held.get(quota.principal, 0) > quota.max_bytes - room)
        ):
            self._drop(kept.pop(0))

    def _ttl_s(self, quota: StateQuota | None) -> float:
        return ttl_ms(self.limits, quota) / 1000

    def _lease(self, session_id: str, now: float) -> _Lease | None:
        lease = self._leases.get(session_id)
        if lease is not None and lease.expires_at <= now:
            del self._leases[session_id]
            return None
        return lease

    def _touch(self, rec: _Session, now: float) -> None:
        rec.expires_at = now + (rec.ttl_s or self.limits.idle_ttl_s)

    def _apply_caps(self, j: _Journal) -> None:
        while j.events and (len(j.events) > self.limits.max_events or j.bytes > self.limits.max_bytes):
            seq, data = j.events.popleft()
            j.bytes -= len(data)
            j.trimmed = max(j.trimmed, seq)

    # -- snapshot + journal --

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
        now = self._tick()
        rec = self._session(session_id, now)
        current = rec.fence if rec is not None else None
        if current != fence:
            raise FencedError(session_id, fence, current)
        assert rec is not None
        if snapshot is not None:
            rec.snapshot = _exact(snapshot)
        for item_id in drop_items:
            rec.items_bytes -= len(rec.items.pop(item_id, b""))
        for item_id, data in (items or {}).items():
            rec.items_bytes += len(data) - len(rec.items.get(item_id, b""))
            rec.items[item_id] = _exact(data)
        if events or lost_through or rec.journal is not None:
            j = rec.journal = rec.journal or _Journal()
            j.trimmed = max(j.trimmed, lost_through)
            for seq, data in events:
                if seq > j.last and seq > j.trimmed:
                    j.events.append((seq, _exact(data)))
                    j.bytes += len(data)
                j.last = max(j.last, seq)
            self._apply_caps(j)
        if quota is not None:
            rec.ttl_s = self._ttl_s(quota)
        self._touch(rec, now)
        self._account(session_id, rec, quota, now)

    async def load_snapshot(self, session_id: str) -> bytes | None:
        rec = self._session(session_id, self._tick())
        return rec.snapshot if rec is not None else None

    async def load_session(self, session_id: str) -> tuple[bytes, dict[str, bytes]] | None:
        rec = self._session(session_id, self._tick())
        if rec is None or rec.snapshot is None:
            return None
        return rec.snapshot, dict(rec.items)

    async def delete_session(self, session_id: str, *, quota: StateQuota | None = None) -> None:
        self._tick()
        self._drop(session_id)
        self._leases.pop(session_id, None)

    async def state_held(self, principal: str) -> StateHeld:
        now = self._tick()
        kept = len(self._kept(principal, now))  # (drops the expired first)
        return StateHeld(self._held.get(principal, 0), len(self._ledger.get(principal, ())), kept)

    async def read_events(self, session_id: str, after_seq: int, limit: int | None = None) -> JournalRead:
        check_read_args(after_seq, limit)
        rec = self._session(session_id, self._tick())
        j = rec.journal if rec is not None else None
        if j is None:
            # No journal: a client that saw an event means the journal was lost.
            return JournalRead([], gap=after_seq > 0, first_seq=None, last_seq=None)
        out: list[tuple[int, bytes]] = []
        for seq, data in j.events:
            if limit is not None and len(out) >= limit:
                break
            if seq > after_seq:
                out.append((seq, data))
        first = j.events[0][0] if j.events else None
        return JournalRead(out, gap=after_seq < j.trimmed, first_seq=first, last_seq=j.last)

    async def trim_events(self, session_id: str, up_to_seq: int, *, quota: StateQuota | None = None) -> None:
        if up_to_seq < 0:
            raise ValueError("up_to_seq must be >= 0")
        now = self._tick()
        rec = self._session(session_id, now)
        if rec is None:
            return
        j = rec.journal = rec.journal or _Journal()
        while j.events and j.events[0][0] <= up_to_seq:
            j.bytes -= len(j.events.popleft()[1])
        j.trimmed = max(j.trimmed, up_to_seq)
        self._touch(rec, now)
        self._account(session_id, rec, quota, now)

    # -- lease --

    async def acquire(
        self, session_id: str, owner: str, ttl_ms: int, *, quota: StateQuota | None = None, new: bool = False
    ) -> int:
        now = self._tick()
        if quota is not None and new and quota.max_bytes:
            self._forget_kept(quota, now, room=1)  # room for the new session: fewer than max_bytes
            held = self._held.get(quota.principal, 0)
            if held >= quota.max_bytes:
                raise StateLimitExceeded(quota.principal, held, quota.max_bytes)
        rec = self._session(session_id, now)
        if rec is None:
            rec = self._sessions[session_id] = _Session(expires_at=now)
        if quota is not None:
            rec.ttl_s = self._ttl_s(quota)
        # Seeded from the wall clock when the counter is new, so a token issued
        # after the counter expired still beats every token issued before.
        seed = time.time_ns() // 1_000_000
        rec.fence = rec.fence + 1 if rec.fence is not None else seed
        self._leases[session_id] = _Lease(owner, rec.fence, now + ttl_ms / 1000)
        self._touch(rec, now)
        self._account(session_id, rec, quota, now)
        return rec.fence

    async def renew(
        self, session_id: str, owner: str, fence: int, ttl_ms: int, *, quota: StateQuota | None = None
    ) -> bool:
        now = self._tick()
        rec = self._session(session_id, now)
        if rec is None or rec.fence != fence:
            return False
        self._leases[session_id] = _Lease(owner, fence, now + ttl_ms / 1000)
        if quota is not None:
            rec.ttl_s = self._ttl_s(quota)
        self._touch(rec, now)
        if quota is not None and rec.tenant != quota.principal:
            self._account(session_id, rec, quota, now)
        return True

    async def release(self, session_id: str, owner: str, fence: int, *, quota: StateQuota | None = None) -> bool:
        now = self._tick()
        rec = self._session(session_id, now)
        if rec is None or rec.fence != fence:
            return False
        self._leases.pop(session_id, None)
        if quota is not None:
            self._forget_kept(quota, now)  # one more kept session: the oldest beyond max_kept go
        return True

    async def owner_of(self, session_id: str) -> Owner | None:
        lease = self._lease(session_id, self._tick())
        return Owner(lease.owner, lease.fence) if lease is not None else None

    # -- bus --

    async def publish(self, channel: str, message: bytes) -> int:
        self._tick()
        subs = list(self._bus.get(channel, ()))
        for sub in subs:
            sub.deliver(BusMessage(channel, message))
        return len(subs)

    async def subscribe(self, *channels: str) -> Subscription:
        self._tick()
        return MemorySubscription(self._bus, channels, self._bus_queue_size)

    # -- tokens --

    async def put_token(self, token_hash: str, payload: bytes, ttl_s: float) -> None:
        self._tokens[token_hash] = (payload, self._tick() + ttl_s)

    async def take_token(self, token_hash: str) -> bytes | None:
        now = self._tick()
        entry = self._tokens.pop(token_hash, None)
        if entry is None or entry[1] <= now:
            return None
        return entry[0]

    # -- tenant limits --

    def _open_of(self, principal: str, now: float) -> dict[str, float]:
        entries = self._open.get(principal, {})
        for conn in [c for c, exp in entries.items() if exp <= now]:
            del entries[conn]
        if not entries:
            self._open.pop(principal, None)
        return entries

    def _starts_of(self, principal: str, now: float) -> deque[tuple[float, str]]:
        starts = self._starts.get(principal, deque())
        while starts and starts[0][0] <= now - 60.0:
            starts.popleft()
        if not starts:
            self._starts.pop(principal, None)
        return starts

    async def admit_connection(
        self, principal: str, conn_id: str, *, max_open: int, starts_per_min: int, ttl_ms: int
    ) -> Admission:
        now = self._tick()
        entries, starts = self._open_of(principal, now), self._starts_of(principal, now)
        reset_ms = int((starts[0][0] + 60.0 - now) * 1000) if starts else 0
        if max_open and len(entries) >= max_open:
            return Admission(False, "max_sessions", len(entries), len(starts), reset_ms)
        if starts_per_min and len(starts) >= starts_per_min:
            return Admission(False, "session_starts_per_min", len(entries), len(starts), reset_ms)
        if max_open:
            self._open.setdefault(principal, entries)[conn_id] = now + ttl_ms / 1000
        if starts_per_min:
            self._starts.setdefault(principal, starts).append((now, conn_id))
            reset_ms = int((starts[0][0] + 60.0 - now) * 1000)
        return Admission(True, None, len(entries), len(starts), reset_ms)

    async def release_connection(self, principal: str, conn_id: str) -> None:
        self._tick()
        entries = self._open.get(principal)
        if entries is not None:
            entries.pop(conn_id, None)
            if not entries:
                del self._open[principal]

    async def refresh_connections(self, entries: Sequence[tuple[str, str]], ttl_ms: int) -> list[int]:
        now = self._tick()
        out = []
        for principal, conn_id in entries:
            held = self._open_of(principal, now)
            if conn_id in held:
                held[conn_id] = now + ttl_ms / 1000
            out.append(len(held))
        return out

    async def take_budget(self, principal: str, kind: str, want: int, *, limit: int, window_ms: int) -> Budget:
        now_ms = int(self._tick() * 1000)
        window = now_ms // window_ms
        entry = self._budgets.get((principal, kind))
        if entry is None or entry[0] != window:
            entry = self._budgets[(principal, kind)] = [window, 0, window_ms]
        granted = max(0, min(want, limit - entry[1]))
        entry[1] += granted
        return Budget(granted, entry[1], window, (window + 1) * window_ms - now_ms)

    async def return_budget(self, principal: str, kind: str, amount: int, *, window: int) -> None:
        self._tick()
        entry = self._budgets.get((principal, kind))
        if entry is not None and entry[0] == window:
            entry[1] -= min(amount, entry[1])

    # -- lifecycle --

    async def probe(self) -> str:
        self.round_trips += 1
        return self._epoch

    async def ping(self) -> None:
        self._tick()

    async def close(self) -> None:
        for subs in list(self._bus.values()):
            for sub in list(subs):
                await sub.close()


def _exact(data: bytes) -> bytes:
    """A copy sized to its content: orjson's output keeps its whole build buffer
    (about 4 KB however short), which a store that keeps it would pay per event."""
    return memoryview(data).tobytes()
