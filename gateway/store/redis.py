"""Redis session store: what lets sessions survive socket drops and replica deaths.

One Redis, Sentinel or Redis Cluster, by the URL's form (``redis_url.py``; the clients:
``redis_topology.py``). The same keys and scripts serve all three.

Key schema (``P`` = ``limits.key_prefix``, default ``omni:``). Two hash tags: ``{sid}``
keeps one session's keys in one Redis Cluster slot, ``{ph}`` one principal's; every Lua
script is given every key it touches and all of them carry one tag, so each script runs
on one slot:

=========================  =======  =============================================
key                        type     content and expiry
=========================  =======  =============================================
``P s:{sid}:snap``         string   the opaque session snapshot; idle TTL
``P s:{sid}:log``          stream   the event journal; entry id ``<seq>-0``, one
                                    field ``d`` = the encoded event; idle TTL
``P s:{sid}:meta``         hash     journal bookkeeping: ``last`` (highest seq
                                    appended), ``trimmed`` (highest seq dropped),
                                    ``bytes`` (payload bytes stored); idle TTL
``P s:{sid}:fence``        string   current fencing token (INCR); idle TTL
``P s:{sid}:lease``        hash     ``owner``, ``fence`` of the live owner; lease TTL
``P tok:<token_hash>``     string   single-use token payload; its own TTL
``P t:{ph}:open``          zset     a principal's open connections: conn id ->
                                    expiry (ms); refreshed every lease_ttl/3
``P t:{ph}:starts``        zset     its connections started in the last 60 s:
                                    conn id -> start (ms); 60 s TTL
``P t:{ph}:b:<kind>``      hash     a budget window: ``w`` (its number), ``used``
                                    (units given out); TTL two windows
``P t:{ph}:state``         zset     the principal's sessions (StateQuota ledger):
                                    session id -> when its state expires (ms)
``P t:{ph}:held``          hash     session id -> bytes held (snapshot + items +
                                    journal); ``_total``: their sum
``P t:{ph}:leased``        zset     of them, the served: session id -> lease
                                    expiry (ms); the others are *kept*
``P t:{ph}:order``         hash     session id -> ``fence:ver`` of the write its
                                    size in ``held`` came from
=========================  =======  =============================================

(``ph``: the first 16 hex of sha256(principal), so any principal makes a
short key with one hash tag. A principal's client secrets are counted the same
way under the principal ``secrets:<principal>``: ``open`` holds those neither
used nor expired, ``starts`` those minted in the last 60 s.)

(no space between ``P`` and the rest; ``omni:s:{abc}:snap``). Bus channels are
``P bus:<channel>``, e.g. ``omni:bus:replica:<owner>``, ``omni:bus:session:<sid>``;
plain pub/sub on one Redis and Sentinel, sharded (SPUBLISH/SSUBSCRIBE) on a cluster.

Every write and lease call is one Lua script (``_redis_lua.py``) on the session's keys:
the fence check and the write happen atomically in one round trip. The idle TTL is
refreshed on every commit, acquire, renew and ack trim.

Under a ``StateQuota`` the principal's ledger is kept by a second script on the ledger's
slot, after the session's (a commit, trim, renew or release) or before it (an acquire: the
ledger admits a new session and counts it as served first). The two are not one atomic
step, so: a commit reports the session's size with its ``fence:ver``, and the ledger keeps
the newest, whatever order two replicas' reports arrive in; a commit counts as done once
its ledger has its size (else ``StoreUnavailable``; the retry reports it again); sessions
the ledger forgets are dropped from it at once and their keys deleted right after, each
only if no replica holds its lease then (one that resumed it in between keeps it; keys
left by a replica that dies between the two steps expire with their idle TTL).

Rolling upgrade from the release before this layout: no key moved, and the values are
the same; new replicas add ``t:{ph}:order`` and meta's ``ver``, which older ones ignore.
On one Redis (the only topology older replicas could use) both run side by side: an
older replica still updates the ledger in its one script, and the ``order`` entries of
sessions it forgets stay until the ledger's idle TTL (a few bytes each).

With ``wait_replicas`` (Sentinel's default: 1) each batch of writes ends with ``WAIT``
on the same connection; too few replicas make the batch ``StoreUnavailable``.

Failure behaviour: every call that cannot complete raises ``StoreUnavailable``.
Nothing hangs: connects give up after ``connect_timeout_s`` (default 1 s), reads
after ``socket_timeout_s`` (``redis_timeout_s``, default 2 s), and a command whose
connection broke is retried once, at once, on a fresh connection (which heals pooled
connections broken by a Redis restart) and never more; a timeout is not retried. A
refused connection (Redis down) fails at once. A call that finds Redis unreachable,
refusing or silent puts the store down (``health.py``): every call then fails at once
without being sent, except ``probe``/``ping`` and one trial call every
``trial_interval_s``, until Redis answers one (on a cluster only the probe moves it, and
no call is refused: one master's failure fails the calls on its slots only).
The client reconnects by itself, so the same store works again as soon as Redis
is back. Redis without persistence loses every session on restart: resumes
then find no snapshot (or, for a live session, a journal gap) and say so to the
client, and every live writer gets ``FencedError`` with ``current=None`` (the
fence counter is gone) until its session is acquired again.

A Sentinel failover: calls fail (``StoreUnavailable``) from the moment the master stops
taking writes (or, with ``wait_replicas``, stops having them replicated) until the client
reaches the promoted master: each new connection asks the sentinels, a demoted master's
READONLY is a broken connection (retried once at once), and a ``WAIT`` short of replicas
drops the idle connections. A cluster node's failure fails the calls on its slots only.

Bus subscriptions run on their own connection in a background task; when it
breaks they resubscribe with jittered backoff (``BUS_BACKOFF_*``; on a cluster, each
channel on its own link to its shard: ``shard_bus.py``). Pub/sub is at most once: a
message published while a subscriber is reconnecting is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import secrets
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.store import _redis_lua as lua
from gateway.store.base import (
    Admission,
    Budget,
    BusMessage,
    Commit,
    FencedError,
    JournalRead,
    Owner,
    QueuedSubscription,
    SessionStore,
    StateHeld,
    StateLimitExceeded,
    StateQuota,
    StoreError,
    StoreLimits,
    StoreUnavailable,
    Subscription,
    check_read_args,
    ttl_ms,
)
from gateway.store.health import THROTTLE, StoreHealth
from gateway.store.redis_topology import Arg, Op, connect, run_ops
from gateway.store.redis_url import parse_redis_url
from gateway.store.shard_bus import ShardedSubscription

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_SOCKET_TIMEOUT_S = 2.0  # a reply slower than this raises StoreUnavailable
DEFAULT_CONNECT_TIMEOUT_S = 1.0  # a connect slower than this raises StoreUnavailable
DEFAULT_BUS_QUEUE = 1024  # per subscription; when full the oldest message is dropped
BUS_BACKOFF_MIN_S = 0.05  # first wait before resubscribing after a broken connection
BUS_BACKOFF_MAX_S = 2.0  # the wait doubles up to this while Redis stays down


class RedisSubscription(QueuedSubscription):
    def __init__(self, client: Redis, prefix: str, channels: tuple[str, ...], queue_size: int) -> None:
        super().__init__(queue_size)
        self._client = client
        self._prefix = prefix
        self._names = {(prefix + ch).encode(): ch for ch in channels}
        self._ready = asyncio.Event()
        self.reconnects = 0
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"bus-subscription:{','.join(channels)}")

    @property
    def connected(self) -> bool:
        return self._ready.is_set()

    async def wait_connected(self) -> None:
        """Wait until subscribed (bound it with ``asyncio.timeout``)."""
        await self._ready.wait()

    async def _run(self) -> None:
        backoff = BUS_BACKOFF_MIN_S
        while not self._closed:
            pubsub = self._client.pubsub()
            try:
                await pubsub.subscribe(*self._names)
                confirmed = 0
                while True:
                    msg = await pubsub.get_message(timeout=1.0)
                    if msg is None:
                        continue
                    if msg["type"] == "subscribe":
                        confirmed += 1
                        if confirmed >= len(self._names):  # PUBLISH reaches us from now on
                            self._ready.set()
                            backoff = BUS_BACKOFF_MIN_S
                    elif msg["type"] == "message":
                        self.deliver(BusMessage(self._names[msg["channel"]], msg["data"]))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure: reconnect, never crash
                if not self._closed:
                    THROTTLE.warning(log, "bus", "bus subscription broken (retry in %.2fs): %r", backoff, exc)
            finally:
                self._ready.clear()
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
            self.reconnects += 1
            await asyncio.sleep(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, BUS_BACKOFF_MAX_S)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._task.cancel()
        await asyncio.wait({self._task})  # our own cancellation still raises; the task's does not
        self._wake()


class RedisStore(SessionStore):
    def __init__(
        self,
        url: str,
        limits: StoreLimits | None = None,
        *,
        socket_timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        bus_queue_size: int = DEFAULT_BUS_QUEUE,
        max_connections: int | None = None,  # None: redis-py's default pool size (per node on a cluster)
    ) -> None:
        self.limits = limits or StoreLimits()
        self.round_trips = 0
        self.waiting = 0  # calls sent to Redis and not answered yet (while it is down: the probe and one trial)
        self.connect_timeout_s = connect_timeout_s
        self._bus_queue_size = bus_queue_size
        self._p = self.limits.key_prefix
        self.target = parse_redis_url(url)  # raises RedisUrlError (a ValueError): say so at start-up
        self._clients = connect(self.target, socket_timeout_s, connect_timeout_s, max_connections)
        # Not reached yet: not ready until Redis answers (the probe at start, or any call).
        self.health = StoreHealth("unknown")
        # One Redis, Sentinel: a call that finds Redis unreachable puts the store down, and
        # calls then fail at once. A cluster: one master's failure must not refuse the calls
        # of the others' slots, so only the probe (its key's master) moves ``health`` there.
        self._fail_fast = self.target.topology != "cluster"
        self._redis: Any = self._clients.redis  # Redis, or RedisCluster
        self._wait = self.target.wait_replicas
        self._subs: weakref.WeakSet[QueuedSubscription] = weakref.WeakSet()

    # -- helpers --

    def _keys(self, session_id: str) -> dict[str, str]:
        base = f"{self._p}s:{{{session_id}}}:"
        return {k: base + k for k in ("fence", "lease", "snap", "log", "meta", "items")}

    def _session_keys(self, session_id: str) -> list[str]:
        """The six keys of a session, in the order the lease scripts take them."""
        k = self._keys(session_id)
        return [k["fence"], k["lease"], k["snap"], k["log"], k["meta"], k["items"]]

    def _ledger(self, principal: str) -> list[str]:
        """The keys of a principal's ledger (state, held, leased, order), all in its slot."""
        return [self._tenant_key(principal, what) for what in ("state", "held", "leased", "order")]

    async def _run(self, ops: Sequence[Op], *, write: bool = True) -> list[Any]:
        """``ops`` in one pipeline (one round trip; on a cluster one per node): each op's reply,
        a script's error as an exception object. ``write`` with ``wait_replicas``: a ``WAIT``
        follows, and too few replicas make the whole batch ``StoreUnavailable``."""
        return await self._call(lambda: run_ops(self._redis, ops, self._wait if write else 0,
                                                self.target.wait_timeout_ms))  # fmt: skip

    async def _one(self, op: Op, *, write: bool = True) -> Any:
        (reply,) = await self._run([op], write=write)
        if isinstance(reply, BaseException):
            raise StoreUnavailable(f"redis: {reply!r}")
        return reply

    async def _call(self, fn: Callable[[], Awaitable[T]], *, probe: bool = False) -> T:
        """``fn``'s Redis I/O, its failures as ``StoreUnavailable``, its fate told to ``health``.
        While ``health`` is down the call fails at once without touching Redis, unless it is
        the probe (``probe``) or the one trial ``health`` admits."""
        health = self.health
        gated = self._fail_fast and not probe  # (a cluster's calls are never refused: below)
        if gated and not health.admit():
            raise StoreUnavailable(health.refuse())
        self.round_trips += 1
        self.waiting += 1
        try:
            result = await fn()
        except DataError:  # raised before sending: a caller's bug, not an outage
            raise
        except (RedisConnectionError, RedisTimeoutError, OSError, TimeoutError) as exc:
            if self._fail_fast or probe:
                health.unreachable(f"{type(exc).__name__}: {exc}")  # refused, reset, or silent too long
            raise StoreUnavailable(f"redis: {exc!r}") from exc
        except RedisError as exc:  # an answer: a command's own error (OOM, READONLY, a script's...)
            health.answered()
            raise StoreUnavailable(f"redis: {exc!r}") from exc
        finally:
            self.waiting -= 1
            health.trial_over()
        health.answered()
        return result

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
        (error,) = await self.commit_many(
            [Commit(session_id, fence, events, snapshot, lost_through, items, drop_items, quota)]
        )
        if error is not None:
            raise error

    async def commit_many(self, commits: Sequence[Commit]) -> list[StoreError | None]:
        """One pipeline (not a transaction: each script is atomic on its own) for all the
        commits, then one for the ledgers of their principals (a commit under a quota is done
        once its principal's ledger has its size: else it reports ``StoreUnavailable``, and
        the writer's retry, idempotent, reports the size again)."""
        health = self.health
        if self._fail_fast and health.down and health.trial_interval_s is None:  # (not even built)
            return [StoreUnavailable(health.refuse())] * len(commits)
        try:
            replies = await self._run([self._commit_op(c) for c in commits])
        except StoreUnavailable as exc:
            return [exc] * len(commits)
        results: list[StoreError | None] = []
        sizes: list[Sized] = []
        for i, (c, reply) in enumerate(zip(commits, replies, strict=True)):
            if isinstance(reply, BaseException):  # this script failed (OOM, a replica's read-only...)
                results.append(StoreUnavailable(f"redis: {reply!r}"))
            elif not int(reply[0]):
                results.append(FencedError(c.session_id, c.fence, int(reply[1]) if reply[1] else None))
            else:
                results.append(None)
                if c.quota is not None:
                    sizes.append(Sized(i, c.quota, c.session_id, int(reply[2]), c.fence, int(reply[3])))
        for i, error in await self._report_sizes(sizes):
            results[i] = error
        return results

    def _commit_op(self, c: Commit) -> Op:
        """The COMMIT script's keys and arguments for ``c``."""
        k = self._keys(c.session_id)
        items = c.items or {}
        args: list[Arg] = [
            c.fence,
            ttl_ms(self.limits, c.quota),
            self.limits.max_events,
            self.limits.max_bytes,
            c.lost_through,
            1 if c.snapshot is not None else 0,
            c.snapshot or b"",
            len(items),
            len(c.drop_items),
            1 if c.quota is not None else 0,
        ]
        for item_id, data in items.items():
            args.append(item_id)
            args.append(data)
        args.extend(c.drop_items)
        for seq, data in c.events:
            args.append(seq)
            args.append(data)
        return Op(lua.COMMIT, [k["fence"], k["snap"], k["log"], k["meta"], k["items"]], args)

    async def _report_sizes(self, sizes: Sequence[Sized], *, forget: bool = True) -> list[tuple[int, StoreError]]:
        """Give each principal's ledger the sizes of its sessions just written (one script per
        principal, all in one pipeline), then forget what the ledgers chose to (``forget``:
        past a quota's max_bytes). Returns (index, error) for the sizes not recorded."""
        by_principal: dict[str, list[Sized]] = {}
        for s in sizes:
            by_principal.setdefault(s.quota.principal, []).append(s)
        if not by_principal:
            return []
        ops = []
        for principal, group in by_principal.items():
            args: list[Arg] = [self.limits.idle_ttl_ms, group[0].quota.max_bytes if forget else 0]
            for s in group:
                args += [s.session_id, s.size, s.fence, s.ver, ttl_ms(self.limits, s.quota)]
            ops.append(Op(lua.LEDGER_SET, self._ledger(principal), args))
        try:
            replies = await self._run(ops)
        except StoreUnavailable as exc:
            return [(s.at, exc) for s in sizes]
        failed: list[tuple[int, StoreError]] = []
        gone: list[str] = []
        for group, reply in zip(by_principal.values(), replies, strict=True):
            if isinstance(reply, BaseException):
                failed += [(s.at, StoreUnavailable(f"redis: {reply!r}")) for s in group]
            else:
                gone += _texts(reply)
        await self._forget(gone)
        return failed

    async def _forget(self, session_ids: Sequence[str]) -> None:
        """Delete the keys of sessions their ledger forgot, unless a replica resumed one since
        (it holds the lease then). Best effort: keys left by a failure here expire with their
        idle TTL (the ledger no longer counts them)."""
        if not session_ids:
            return
        ops = [Op(lua.FORGET, self._session_keys(sid), []) for sid in session_ids]
        try:
            await self._run(ops)
        except StoreUnavailable as exc:
            log.warning("could not delete %d forgotten sessions (their keys expire): %s", len(ops), exc)

    async def load_snapshot(self, session_id: str) -> bytes | None:
        key = self._keys(session_id)["snap"]
        value: Any = await self._call(lambda: self._redis.get(key))
        return value if value is None else bytes(value)

    async def load_session(self, session_id: str) -> tuple[bytes, dict[str, bytes]] | None:
        k = self._keys(session_id)
        head, items = await self._one(Op(lua.LOAD_SESSION, [k["snap"], k["items"]]), write=False)
        if head is None:
            return None
        pairs = iter(items)
        return bytes(head), {_text(key): bytes(value) for key, value in zip(pairs, pairs, strict=True)}

    async def delete_session(self, session_id: str, *, quota: StateQuota | None = None) -> None:
        await self._one(Op(lua.DELETE, list(self._keys(session_id).values())))
        if quota is not None:
            await self._one(Op(lua.LEDGER_DROP, self._ledger(quota.principal), [session_id]))

    async def state_held(self, principal: str) -> StateHeld:
        held, sessions, kept = await self._one(Op(lua.STATE_HELD, self._ledger(principal)), write=False)
        return StateHeld(int(held), int(sessions), int(kept))

    async def read_events(self, session_id: str, after_seq: int, limit: int | None = None) -> JournalRead:
        check_read_args(after_seq, limit)
        k = self._keys(session_id)
        op = Op(lua.READ_EVENTS, [k["meta"], k["log"]], [after_seq, limit or 0])
        last, trimmed, entries, first = await self._one(op, write=False)
        if not last:
            return JournalRead([], gap=after_seq > 0, first_seq=None, last_seq=None)
        events = [(_seq(eid), bytes(fields[1])) for eid, fields in entries]
        return JournalRead(
            events,
            gap=after_seq < int(trimmed or 0),
            first_seq=_seq(first) if first else None,
            last_seq=int(last),
        )

    async def trim_events(self, session_id: str, up_to_seq: int, *, quota: StateQuota | None = None) -> None:
        if up_to_seq < 0:
            raise ValueError("up_to_seq must be >= 0")
        k = self._keys(session_id)
        keys = [k["fence"], k["log"], k["meta"], k["snap"], k["items"]]
        args: list[Arg] = [up_to_seq, ttl_ms(self.limits, quota), 1 if quota is not None else 0]
        _, size, fence, ver = await self._one(Op(lua.TRIM, keys, args))
        if quota is not None and int(size) >= 0:
            for _, error in await self._report_sizes([Sized(0, quota, session_id, int(size), int(fence), int(ver))],
                                                     forget=False):  # fmt: skip
                raise error

    # -- lease --

    async def acquire(
        self, session_id: str, owner: str, ttl_ms: int, *, quota: StateQuota | None = None, new: bool = False
    ) -> int:
        idle = _ttl(self.limits, quota)
        if quota is not None:  # the ledger first: it admits a new session, and counts it as served
            args: list[Arg] = [session_id, int(ttl_ms), idle, self.limits.idle_ttl_ms, quota.max_bytes, 1 if new else 0]
            ok, held, gone = await self._one(Op(lua.LEDGER_ACQUIRE, self._ledger(quota.principal), args))
            await self._forget(_texts(gone))
            if not int(ok):
                raise StateLimitExceeded(quota.principal, int(held), quota.max_bytes)
        op = Op(lua.ACQUIRE, self._session_keys(session_id), [owner, int(ttl_ms), idle])
        return int(await self._one(op))

    async def renew(
        self, session_id: str, owner: str, fence: int, ttl_ms: int, *, quota: StateQuota | None = None
    ) -> bool:
        (renewed,) = await self.renew_many(owner, ttl_ms, [(session_id, fence)], [quota])
        return renewed

    async def renew_many(
        self, owner: str, ttl_ms: int, leases: list[tuple[str, int]], quotas: Sequence[StateQuota | None] = ()
    ) -> list[bool]:
        """Every renewal in one pipelined round trip (each atomic on its own); then, for the
        renewed sessions under a quota, one for their principals' ledgers."""
        if not leases:
            return []
        qs = list(quotas) or [None] * len(leases)
        ops = [
            Op(lua.RENEW, self._session_keys(sid), [owner, fence, int(ttl_ms), _ttl(self.limits, quota)])
            for (sid, fence), quota in zip(leases, qs, strict=True)
        ]
        replies = await self._run(ops)
        if any(isinstance(r, BaseException) for r in replies):
            raise StoreUnavailable(f"redis: {next(r for r in replies if isinstance(r, BaseException))!r}")
        renewed = [bool(int(r)) for r in replies]
        ledgers: dict[str, list[Arg]] = {}
        for ok, (sid, _), quota in zip(renewed, leases, qs, strict=True):
            if ok and quota is not None:
                ledgers.setdefault(quota.principal, [int(ttl_ms), self.limits.idle_ttl_ms])
                ledgers[quota.principal] += [sid, _ttl(self.limits, quota)]
        if ledgers:
            ops = [Op(lua.LEDGER_RENEW, self._ledger(p), args) for p, args in ledgers.items()]
            for reply in await self._run(ops):
                if isinstance(reply, BaseException):
                    raise StoreUnavailable(f"redis: {reply!r}")
        return renewed

    async def release(self, session_id: str, owner: str, fence: int, *, quota: StateQuota | None = None) -> bool:
        keys = self._session_keys(session_id)[:2]
        released = bool(int(await self._one(Op(lua.RELEASE, keys, [fence]))))
        if released and quota is not None:
            args: list[Arg] = [session_id, quota.max_bytes, quota.max_kept]
            gone = await self._one(Op(lua.LEDGER_RELEASE, self._ledger(quota.principal), args))
            await self._forget(_texts(gone))
        return released

    async def owner_of(self, session_id: str) -> Owner | None:
        key = self._keys(session_id)["lease"]
        owner: Any
        fence: Any
        owner, fence = await self._call(lambda: self._redis.hmget(key, "owner", "fence"))
        if owner is None or fence is None:
            return None
        return Owner(owner.decode(), int(fence))

    # -- bus --
    # Single Redis and Sentinel: PUBLISH / SUBSCRIBE. Cluster: sharded pub/sub (SPUBLISH /
    # SSUBSCRIBE), which a cluster keeps on the shard owning the channel's slot, so the
    # receiver count SPUBLISH answers is every subscriber's (PUBLISH's would be one node's).

    async def publish(self, channel: str, message: bytes) -> int:
        name = self._p + "bus:" + channel
        command = "SPUBLISH" if self.target.topology == "cluster" else "PUBLISH"
        return int(await self._call(lambda: self._redis.execute_command(command, name, message)))

    async def subscribe(self, *channels: str) -> Subscription:
        if not channels:
            raise ValueError("subscribe needs at least one channel")
        sub: RedisSubscription | ShardedSubscription
        if self.target.topology == "cluster":
            sub = ShardedSubscription(self._clients.shard_links, self._p + "bus:", channels, self._bus_queue_size)
        else:
            sub = RedisSubscription(self._redis, self._p + "bus:", channels, self._bus_queue_size)
        self._subs.add(sub)
        with contextlib.suppress(TimeoutError):  # keeps retrying in the background
            async with asyncio.timeout(self.connect_timeout_s + 1.0):
                await sub.wait_connected()
        return sub

    # -- tokens --

    async def put_token(self, token_hash: str, payload: bytes, ttl_s: float) -> None:
        key = self._p + "tok:" + token_hash
        ms = max(1, int(ttl_s * 1000))
        await self._one(Op(None, [], ["SET", key, payload, "PX", ms]))

    async def take_token(self, token_hash: str) -> bytes | None:
        key = self._p + "tok:" + token_hash
        value: Any = await self._one(Op(None, [], ["GETDEL", key]))
        return value if value is None else bytes(value)

    # -- tenant limits --

    def _tenant_key(self, principal: str, what: str) -> str:
        digest = hashlib.sha256(principal.encode()).hexdigest()[:16]
        return f"{self._p}t:{{{digest}}}:{what}"

    async def admit_connection(
        self, principal: str, conn_id: str, *, max_open: int, starts_per_min: int, ttl_ms: int
    ) -> Admission:
        keys = [self._tenant_key(principal, "open"), self._tenant_key(principal, "starts")]
        args: list[Arg] = [conn_id, max_open, starts_per_min, int(ttl_ms)]
        ok, refused, open_, starts, reset = await self._one(Op(lua.ADMIT, keys, args))
        name = refused.decode() if isinstance(refused, bytes) else str(refused)
        return Admission(bool(ok), name or None, int(open_), int(starts), int(reset))

    async def release_connection(self, principal: str, conn_id: str) -> None:
        key = self._tenant_key(principal, "open")
        await self._one(Op(None, [], ["ZREM", key, conn_id]))

    async def refresh_connections(self, entries: Sequence[tuple[str, str]], ttl_ms: int) -> list[int]:
        if not entries:
            return []
        ops = [Op(lua.REFRESH, [self._tenant_key(p, "open")], [conn_id, int(ttl_ms)]) for p, conn_id in entries]
        replies = await self._run(ops)  # one round trip for the replica's connections
        for reply in replies:
            if isinstance(reply, BaseException):
                raise StoreUnavailable(f"redis: {reply!r}")
        return [int(n) for n in replies]

    async def take_budget(self, principal: str, kind: str, want: int, *, limit: int, window_ms: int) -> Budget:
        keys = [self._tenant_key(principal, "b:" + kind)]
        args: list[Arg] = [int(want), int(limit), int(window_ms)]
        granted, used, window, reset = await self._one(Op(lua.TAKE_BUDGET, keys, args))
        return Budget(int(granted), int(used), int(window), int(reset))

    async def return_budget(self, principal: str, kind: str, amount: int, *, window: int) -> None:
        keys = [self._tenant_key(principal, "b:" + kind)]
        await self._one(Op(lua.RETURN_BUDGET, keys, [int(amount), int(window)]))

    # -- lifecycle --

    async def ping(self) -> None:
        await self._call(lambda: self._redis.ping(), probe=True)

    async def probe(self) -> str:
        new = secrets.token_hex(8)
        op = Op(lua.EPOCH, [self._p + "epoch"], [new])
        (reply,) = await self._call(lambda: run_ops(self._redis, [op], 0, 0), probe=True)
        if isinstance(reply, BaseException):
            raise StoreUnavailable(f"redis: {reply!r}")
        return _text(reply)

    async def close(self) -> None:
        for sub in list(self._subs):
            await sub.close()
        await self._clients.close()


class Sized(NamedTuple):
    """A session's size after a write, for its principal's ledger (``at``: the write's index)."""

    at: int
    quota: StateQuota
    session_id: str
    size: int
    fence: int
    ver: int


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _texts(values: Any) -> list[str]:
    return [_text(v) for v in values or ()]


def _ttl(limits: StoreLimits, quota: StateQuota | None) -> int:
    return ttl_ms(limits, quota)


def _seq(entry_id: bytes) -> int:
    return int(entry_id.split(b"-", 1)[0])
