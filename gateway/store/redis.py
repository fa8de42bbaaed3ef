"""Redis session store: what lets sessions survive socket drops and replica deaths.

Key schema (``P`` = ``limits.key_prefix``, default ``omni:``; the ``{sid}``
hash tag keeps one session's keys in one Redis Cluster slot, so each Lua
script touches a single slot):

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
=========================  =======  =============================================

(``ph``: the first 16 hex of sha256(principal), so any principal makes a
short key with one hash tag. A principal's client secrets are counted the same
way under the principal ``secrets:<principal>``: ``open`` holds those neither
used nor expired, ``starts`` those minted in the last 60 s.)

(no space between ``P`` and the rest; ``omni:s:{abc}:snap``). Bus channels are
``P bus:<channel>``, e.g. ``omni:bus:replica:<owner>``, ``omni:bus:session:<sid>``.

Every write and lease call is one Lua script (``_redis_lua.py``): the fence
check and the write happen atomically in one round trip. The idle TTL is
refreshed on every commit, acquire, renew and ack trim.

Failure behaviour: every call that cannot complete raises ``StoreUnavailable``.
Nothing hangs: connects give up after ``connect_timeout_s`` (default 1 s), reads
after ``socket_timeout_s`` (default 2 s), and a failed command is retried once,
at once, on a fresh connection (which heals pooled connections broken by a Redis
restart) and never more; so a call gives up within 2 x (connect + socket
timeout) at worst (a frozen Redis with the defaults: about 4 s; measured 0.4 s
with a 0.2 s socket timeout). A refused connection (Redis down) fails at once.
The client reconnects by itself, so the same store works again as soon as Redis
is back. Redis without persistence loses every session on restart: resumes
then find no snapshot (or, for a live session, a journal gap) and say so to the
client, and every live writer gets ``FencedError`` with ``current=None`` (the
fence counter is gone) until its session is acquired again.

Bus subscriptions run on their own connection in a background task; when it
breaks they resubscribe with jittered backoff (``BUS_BACKOFF_*``). Pub/sub is
at most once: a message published while a subscriber is reconnecting is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import DataError, NoScriptError, RedisError

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

log = logging.getLogger(__name__)
T = TypeVar("T")
Arg = bytes | str | int | float  # what a Lua script argument may be

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
                    log.warning("bus subscription broken (retry in %.2fs): %r", backoff, exc)
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
        max_connections: int | None = None,  # None: redis-py's default pool size
    ) -> None:
        self.limits = limits or StoreLimits()
        self.round_trips = 0
        self.connect_timeout_s = connect_timeout_s
        self._bus_queue_size = bus_queue_size
        self._p = self.limits.key_prefix
        kwargs: dict[str, Any] = {}
        if max_connections is not None:
            kwargs["max_connections"] = max_connections
        self._redis = Redis.from_url(
            url,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=connect_timeout_s,
            # One immediate retry on a fresh connection, never more: fail fast.
            retry=Retry(NoBackoff(), 1),
            health_check_interval=15,  # PING a connection idle this long before use
            **kwargs,
        )
        self._commit = self._redis.register_script(lua.COMMIT)
        self._trim = self._redis.register_script(lua.TRIM)
        self._acquire = self._redis.register_script(lua.ACQUIRE)
        self._renew = self._redis.register_script(lua.RENEW)
        self._release = self._redis.register_script(lua.RELEASE)
        self._admit = self._redis.register_script(lua.ADMIT)
        self._refresh = self._redis.register_script(lua.REFRESH)
        self._take_budget = self._redis.register_script(lua.TAKE_BUDGET)
        self._return_budget = self._redis.register_script(lua.RETURN_BUDGET)
        self._delete = self._redis.register_script(lua.DELETE)
        self._state_held = self._redis.register_script(lua.STATE_HELD)
        self._subs: weakref.WeakSet[RedisSubscription] = weakref.WeakSet()

    # -- helpers --

    def _keys(self, session_id: str) -> dict[str, str]:
        base = f"{self._p}s:{{{session_id}}}:"
        return {k: base + k for k in ("fence", "lease", "snap", "log", "meta", "items")}

    def _ledger(self, principal: str) -> list[str]:
        """The keys of a principal's ledger (state, held, leased)."""
        return [self._tenant_key(principal, what) for what in ("state", "held", "leased")]

    async def _call(self, fn: Callable[[], Awaitable[T]]) -> T:
        self.round_trips += 1
        try:
            return await fn()
        except DataError:  # raised before sending: a caller's bug, not an outage
            raise
        except RedisError as exc:
            raise StoreUnavailable(f"redis: {exc!r}") from exc
        except (OSError, TimeoutError) as exc:
            raise StoreUnavailable(f"redis: {exc!r}") from exc

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
        keys, args = self._commit_call(Commit(session_id, fence, events, snapshot, lost_through, items, drop_items,
                                              quota))  # fmt: skip
        ok, current = await self._call(lambda: self._commit(keys=keys, args=args))
        if not ok:
            raise FencedError(session_id, fence, int(current) if current else None)

    async def commit_many(self, commits: Sequence[Commit]) -> list[StoreError | None]:
        """One pipeline (not a transaction: each script is atomic on its own) for all."""
        if len(commits) == 1:
            return await super().commit_many(commits)
        calls = [self._commit_call(c) for c in commits]

        async def run() -> list[Any]:
            # EVALSHA by hand: a Script queued on a pipeline costs a SCRIPT EXISTS round
            # trip per execute. A Redis that lost the script (restarted) says NOSCRIPT for
            # each: load it and send the batch again (the commits are idempotent).
            for _ in range(2):
                pipe = self._redis.pipeline(transaction=False)
                for keys, args in calls:
                    pipe.evalsha(self._commit.sha, len(keys), *keys, *args)
                replies: list[Any] = await pipe.execute(raise_on_error=False)
                if not any(isinstance(r, NoScriptError) for r in replies):
                    break
                self._commit.sha = await self._redis.script_load(lua.COMMIT)
            return replies

        try:
            replies = await self._call(run)
        except StoreUnavailable as exc:
            return [exc] * len(commits)
        results: list[StoreError | None] = []
        for c, reply in zip(commits, replies, strict=True):
            if isinstance(reply, BaseException):  # this script failed (OOM, a replica's read-only...)
                results.append(StoreUnavailable(f"redis: {reply!r}"))
            elif not reply[0]:
                results.append(FencedError(c.session_id, c.fence, int(reply[1]) if reply[1] else None))
            else:
                results.append(None)
        return results

    def _commit_call(self, c: Commit) -> tuple[list[str], list[Arg]]:
        """The COMMIT script's keys and arguments for ``c``."""
        k = self._keys(c.session_id)
        items = c.items or {}
        quota = c.quota
        args: list[Arg] = [
            c.fence,
            ttl_ms(self.limits, quota),
            self.limits.max_events,
            self.limits.max_bytes,
            c.lost_through,
            1 if c.snapshot is not None else 0,
            c.snapshot or b"",
            len(items),
            len(c.drop_items),
            c.session_id,
            self._p,
            quota.max_bytes if quota is not None else 0,
            self.limits.idle_ttl_ms,
        ]
        for item_id, data in items.items():
            args.append(item_id)
            args.append(data)
        args.extend(c.drop_items)
        for seq, data in c.events:
            args.append(seq)
            args.append(data)
        keys = [k["fence"], k["snap"], k["log"], k["meta"], k["items"]]
        if quota is not None:
            keys += self._ledger(quota.principal)
        return keys, args

    async def load_snapshot(self, session_id: str) -> bytes | None:
        key = self._keys(session_id)["snap"]
        value: Any = await self._call(lambda: self._redis.get(key))
        return value if value is None else bytes(value)

    async def load_session(self, session_id: str) -> tuple[bytes, dict[str, bytes]] | None:
        k = self._keys(session_id)

        async def run() -> list[Any]:
            pipe = self._redis.pipeline(transaction=True)  # one consistent view
            pipe.get(k["snap"])
            pipe.hgetall(k["items"])
            return await pipe.execute()

        head, items = await self._call(run)
        if head is None:
            return None
        return bytes(head), {(key.decode() if isinstance(key, bytes) else key): bytes(v) for key, v in items.items()}

    async def delete_session(self, session_id: str, *, quota: StateQuota | None = None) -> None:
        keys = list(self._keys(session_id).values())
        if quota is None:
            await self._call(lambda: self._redis.delete(*keys))
            return
        keys += self._ledger(quota.principal)
        await self._call(lambda: self._delete(keys=keys, args=[session_id]))

    async def state_held(self, principal: str) -> StateHeld:
        keys = self._ledger(principal)
        held, sessions, kept = await self._call(lambda: self._state_held(keys=keys))
        return StateHeld(int(held), int(sessions), int(kept))

    async def read_events(self, session_id: str, after_seq: int, limit: int | None = None) -> JournalRead:
        check_read_args(after_seq, limit)
        k = self._keys(session_id)

        async def run() -> list[Any]:
            pipe = self._redis.pipeline(transaction=True)  # one consistent view
            pipe.hmget(k["meta"], "last", "trimmed")
            pipe.xrange(k["log"], f"({after_seq}-0", "+", count=limit)
            pipe.xrange(k["log"], "-", "+", count=1)
            return await pipe.execute()

        (last, trimmed), entries, first = await self._call(run)
        if last is None:
            return JournalRead([], gap=after_seq > 0, first_seq=None, last_seq=None)
        events = [(_seq(eid), fields[b"d"]) for eid, fields in entries]
        return JournalRead(
            events,
            gap=after_seq < int(trimmed or 0),
            first_seq=_seq(first[0][0]) if first else None,
            last_seq=int(last),
        )

    async def trim_events(self, session_id: str, up_to_seq: int, *, quota: StateQuota | None = None) -> None:
        if up_to_seq < 0:
            raise ValueError("up_to_seq must be >= 0")
        k = self._keys(session_id)
        keys = [k["fence"], k["log"], k["meta"]]
        args: list[Arg] = [up_to_seq, ttl_ms(self.limits, quota), session_id, self.limits.idle_ttl_ms]
        if quota is not None:
            keys += [k["snap"], k["items"], *self._ledger(quota.principal)]
        await self._call(lambda: self._trim(keys=keys, args=args))

    # -- lease --

    def _lease_keys(self, session_id: str, quota: StateQuota | None = None) -> list[str]:
        k = self._keys(session_id)
        keys = [k["fence"], k["lease"], k["snap"], k["log"], k["meta"], k["items"]]
        return keys if quota is None else keys + self._ledger(quota.principal)

    async def acquire(
        self, session_id: str, owner: str, ttl_ms: int, *, quota: StateQuota | None = None, new: bool = False
    ) -> int:
        keys = self._lease_keys(session_id, quota)
        args: list[Arg] = [owner, int(ttl_ms), _ttl(self.limits, quota)]
        if quota is not None:
            args += [session_id, self._p, quota.max_bytes, self.limits.idle_ttl_ms, 1 if new else 0]
        ok, value = await self._call(lambda: self._acquire(keys=keys, args=args))
        if not ok:
            assert quota is not None
            raise StateLimitExceeded(quota.principal, int(value), quota.max_bytes)
        return int(value)

    def _renew_args(self, sid: str, owner: str, fence: int, lease_ms: int, quota: StateQuota | None) -> list[Arg]:
        args: list[Arg] = [owner, fence, int(lease_ms), _ttl(self.limits, quota)]
        return args if quota is None else [*args, sid, self.limits.idle_ttl_ms]

    async def renew(
        self, session_id: str, owner: str, fence: int, ttl_ms: int, *, quota: StateQuota | None = None
    ) -> bool:
        keys = self._lease_keys(session_id, quota)
        args = self._renew_args(session_id, owner, fence, ttl_ms, quota)
        return bool(await self._call(lambda: self._renew(keys=keys, args=args)))

    async def renew_many(
        self, owner: str, ttl_ms: int, leases: list[tuple[str, int]], quotas: Sequence[StateQuota | None] = ()
    ) -> list[bool]:
        if not leases:
            return []
        qs = list(quotas) or [None] * len(leases)

        async def run() -> list[Any]:
            pipe = self._redis.pipeline(transaction=False)  # one round trip, each renewal atomic on its own
            for (sid, fence), quota in zip(leases, qs, strict=True):
                args = self._renew_args(sid, owner, fence, ttl_ms, quota)
                await self._renew(keys=self._lease_keys(sid, quota), args=args, client=pipe)  # queued, not sent
            return await pipe.execute()

        return [bool(ok) for ok in await self._call(run)]

    async def release(self, session_id: str, owner: str, fence: int, *, quota: StateQuota | None = None) -> bool:
        keys = self._lease_keys(session_id)[:2]
        args: list[Arg] = [fence]
        if quota is not None:
            keys += self._ledger(quota.principal)
            args += [session_id, self._p, quota.max_bytes, quota.max_kept]
        return bool(await self._call(lambda: self._release(keys=keys, args=args)))

    async def owner_of(self, session_id: str) -> Owner | None:
        key = self._keys(session_id)["lease"]
        owner: Any
        fence: Any
        owner, fence = await self._call(lambda: self._redis.hmget(key, "owner", "fence"))
        if owner is None or fence is None:
            return None
        return Owner(owner.decode(), int(fence))

    # -- bus --

    async def publish(self, channel: str, message: bytes) -> int:
        name = self._p + "bus:" + channel
        return int(await self._call(lambda: self._redis.publish(name, message)))

    async def subscribe(self, *channels: str) -> Subscription:
        if not channels:
            raise ValueError("subscribe needs at least one channel")
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
        await self._call(lambda: self._redis.set(key, payload, px=ms))

    async def take_token(self, token_hash: str) -> bytes | None:
        key = self._p + "tok:" + token_hash
        value: Any = await self._call(lambda: self._redis.getdel(key))
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
        ok, refused, open_, starts, reset = await self._call(lambda: self._admit(keys=keys, args=args))
        name = refused.decode() if isinstance(refused, bytes) else str(refused)
        return Admission(bool(ok), name or None, int(open_), int(starts), int(reset))

    async def release_connection(self, principal: str, conn_id: str) -> None:
        key = self._tenant_key(principal, "open")
        await self._call(lambda: self._redis.zrem(key, conn_id))

    async def refresh_connections(self, entries: Sequence[tuple[str, str]], ttl_ms: int) -> list[int]:
        if not entries:
            return []

        async def run() -> list[Any]:
            pipe = self._redis.pipeline(transaction=False)  # one round trip for the replica's connections
            for principal, conn_id in entries:
                keys = [self._tenant_key(principal, "open")]
                await self._refresh(keys=keys, args=[conn_id, int(ttl_ms)], client=pipe)
            return await pipe.execute()

        return [int(n) for n in await self._call(run)]

    async def take_budget(self, principal: str, kind: str, want: int, *, limit: int, window_ms: int) -> Budget:
        keys = [self._tenant_key(principal, "b:" + kind)]
        args: list[Arg] = [int(want), int(limit), int(window_ms)]
        granted, used, window, reset = await self._call(lambda: self._take_budget(keys=keys, args=args))
        return Budget(int(granted), int(used), int(window), int(reset))

    async def return_budget(self, principal: str, kind: str, amount: int, *, window: int) -> None:
        keys = [self._tenant_key(principal, "b:" + kind)]
        await self._call(lambda: self._return_budget(keys=keys, args=[int(amount), int(window)]))

    # -- lifecycle --

    async def ping(self) -> None:
        await self._call(lambda: self._redis.ping())

    async def close(self) -> None:
        for sub in list(self._subs):
            await sub.close()
        await self._redis.aclose()


def _ttl(limits: StoreLimits, quota: StateQuota | None) -> int:
    return ttl_ms(limits, quota)


def _seq(entry_id: bytes) -> int:
    return int(entry_id.split(b"-", 1)[0])
