"""The I/O shell under ``RedisStore``: one redis-py client per topology, and the one way
every script and write reaches Redis (``run_ops``).

- single: ``Redis.from_url`` (redis-py reads the URL);
- Sentinel: ``redis.asyncio.sentinel.Sentinel(...).master_for(name)``: each new connection
  asks the sentinels where the master is, so after a failover the client follows as soon
  as its connections to the old master break (Sentinel closes them when it reconfigures the
  old master; a dead master refuses them). A ``WAIT`` that finds too few replicas also
  drops the idle connections, so the next call asks the sentinels again;
- cluster: ``redis.asyncio.cluster.RedisCluster`` over the listed startup nodes (it learns
  the slot map and follows MOVED itself); the bus's sharded subscriptions
  (``ShardedSubscription``) get their own connections from ``ShardLinks``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, NoScriptError

from gateway.store.base import StoreUnavailable
from gateway.store.redis_url import RedisTarget

Arg = bytes | str | int | float  # what a Lua script argument may be
HEALTH_CHECK_S = 15  # PING a connection idle this long before use


class Op(NamedTuple):
    """One call of a batch: a Lua script (run by its SHA1) with its keys and arguments, or,
    with ``script`` None, a plain command whose words are ``args``."""

    script: str | None
    keys: Sequence[str] = ()
    args: Sequence[Arg] = ()


_SHAS: dict[str, str] = {}


def sha_of(script: str) -> str:
    sha = _SHAS.get(script)
    if sha is None:
        sha = _SHAS[script] = hashlib.sha1(script.encode()).hexdigest()
    return sha


async def run_ops(client: Any, ops: Sequence[Op], wait_replicas: int, wait_timeout_ms: int) -> list[Any]:
    """``ops`` in one pipeline (not a transaction: each script is atomic on its own; on a
    cluster, one round trip per node): their replies, a failed op's as an exception object.

    Scripts go by EVALSHA; the ones Redis does not know (a restarted Redis, a promoted
    replica: scripts are not replicated) are loaded and only those run again. With
    ``wait_replicas`` a ``WAIT`` ends the pipeline, on the same connection: fewer replicas
    than that within ``wait_timeout_ms`` raise ``StoreUnavailable`` for the whole batch."""
    replies: list[Any] = [None] * len(ops)
    todo = list(range(len(ops)))
    for attempt in range(2):
        pipe = client.pipeline(transaction=False)
        for i in todo:
            op = ops[i]
            if op.script is None:
                pipe.execute_command(*op.args)
            else:  # (by name: redis-py 5's cluster pipeline blocks its evalsha method, not the command)
                pipe.execute_command("EVALSHA", sha_of(op.script), len(op.keys), *op.keys, *op.args)
        if wait_replicas:
            pipe.execute_command("WAIT", wait_replicas, wait_timeout_ms)
        out: list[Any] = await pipe.execute(raise_on_error=False)
        if wait_replicas:
            acked = out.pop()
            if isinstance(acked, BaseException) or int(acked) < wait_replicas:
                # The master lost its replica, or is no longer the master (a failover): ask
                # the sentinels again on the next call rather than reuse these connections.
                await client.connection_pool.disconnect(inuse_connections=False)
                raise StoreUnavailable(
                    f"redis: a write reached {acked!r} of the {wait_replicas} replicas wait_replicas "
                    f"asks for within {wait_timeout_ms} ms (it may stay on the master; it is retried)"
                )
        for i, reply in zip(todo, out, strict=True):
            replies[i] = reply
        todo = [i for i in todo if isinstance(replies[i], NoScriptError)]
        if not todo or attempt:
            break
        for script in {ops[i].script for i in todo}:
            assert script is not None
            await client.script_load(script)  # on a cluster: every master
    return replies


@dataclass(frozen=True, slots=True)
class ShardLinks:
    """How a sharded subscription reaches the cluster's nodes: where to start asking, and
    the connection settings (credentials, timeouts) every node shares."""

    startup: tuple[tuple[str, int], ...]
    connection: dict[str, Any] = field(default_factory=dict)


@dataclass
class Clients:
    redis: Any  # Redis (single, Sentinel's master) or RedisCluster
    shard_links: ShardLinks | None = None  # cluster only
    sentinel: Sentinel | None = None

    async def close(self) -> None:
        await _close(self.redis)
        if self.sentinel is not None:
            for client in self.sentinel.sentinels:
                await _close(client)


async def _close(client: Any) -> None:
    closer = getattr(client, "aclose", None) or client.close  # (aclose: redis-py 5.0.1 and later)
    await closer()


def connect(
    target: RedisTarget, socket_timeout_s: float, connect_timeout_s: float, max_connections: int | None
) -> Clients:
    """The redis-py client(s) for ``target``. Connects lazily: nothing is sent here."""
    timeouts: dict[str, Any] = {"socket_timeout": socket_timeout_s, "socket_connect_timeout": connect_timeout_s}
    pool: dict[str, Any] = {} if max_connections is None else {"max_connections": max_connections}
    # One immediate retry on a fresh connection, never more: fail fast. Named errors, since
    # redis-py retries only those (a pipeline too): a broken pooled connection, or (Sentinel)
    # a master demoted under us, whose READONLY redis-py turns into a ConnectionError. Not a
    # timeout: a Redis silent past socket_timeout (frozen) is reported after one timeout, not
    # two (the store then fails fast: health.py).
    once: dict[str, Any] = {"retry": Retry(NoBackoff(), 1, supported_errors=(ConnectionError,)),
                            "retry_on_error": [ConnectionError],
                            "health_check_interval": HEALTH_CHECK_S}  # fmt: skip
    auth: dict[str, Any] = {"username": target.username, "password": target.password}
    if target.topology == "single":
        return Clients(Redis.from_url(target.url, **timeouts, **once, **pool))
    if target.topology == "sentinel":
        sentinel = Sentinel(
            list(target.nodes),
            sentinel_kwargs={**timeouts, "username": target.sentinel_username, "password": target.sentinel_password},
            **timeouts,
            **auth,
            db=target.db,
        )
        return Clients(sentinel.master_for(target.master, redis_class=Redis, **once, **pool), sentinel=sentinel)
    cluster = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
        **timeouts,
        **auth,
        **pool,
        health_check_interval=HEALTH_CHECK_S,
    )
    return Clients(cluster, shard_links=ShardLinks(target.nodes, {**timeouts, **auth}))
