"""Session store: snapshot, event journal, ownership lease, cross-replica bus.

``create_store(None)`` gives the in-process ``MemoryStore`` (one replica);
``create_store("redis://...")`` gives ``RedisStore`` (many replicas; sessions
survive socket drops and replica deaths). Both implement ``SessionStore``; see
``base.py`` for the guarantees, ``redis.py`` for the key schema and failure
behaviour, ``writer.py`` for batching and what a crash can lose.
"""

from __future__ import annotations

from typing import Any

from gateway.store.base import (
    BusMessage,
    FencedError,
    JournalRead,
    Owner,
    SessionStore,
    StoreError,
    StoreLimits,
    StoreUnavailable,
    Subscription,
    replica_channel,
    session_channel,
)
from gateway.store.memory import MemoryStore
from gateway.store.writer import JournalWriter

__all__ = [
    "BusMessage",
    "FencedError",
    "JournalRead",
    "JournalWriter",
    "MemoryStore",
    "Owner",
    "SessionStore",
    "StoreError",
    "StoreLimits",
    "StoreUnavailable",
    "Subscription",
    "create_store",
    "replica_channel",
    "session_channel",
]

_REDIS_ONLY = ("socket_timeout_s", "connect_timeout_s", "max_connections")


def create_store(redis_url: str | None, **options: Any) -> SessionStore:
    """A store for ``redis_url`` (None or empty: in-process memory).

    ``options``: any ``StoreLimits`` field (idle_ttl_s, max_events, max_bytes,
    flush_interval_ms, key_prefix); for Redis also ``socket_timeout_s``,
    ``connect_timeout_s``, ``bus_queue_size``, ``max_connections`` (ignored by
    memory, so one settings object serves both). Unknown options raise TypeError.
    """
    limits, rest = StoreLimits.split(options)
    if not redis_url:
        for name in _REDIS_ONLY:
            rest.pop(name, None)
        return MemoryStore(limits, **rest)
    from gateway.store.redis import RedisStore  # imports redis-py only when used

    return RedisStore(redis_url, limits, **rest)
