"""The bus on a Redis Cluster: sharded pub/sub (SSUBSCRIBE), one link per channel.

A sharded channel lives on the shard that owns its slot (as a key would): SPUBLISH
reaches the subscribers of that shard only, and answers how many they are. Each channel
of a subscription therefore gets a connection of its own to its shard's master, found by
asking any node and following its ``MOVED`` answer (no client-side slot map to go stale).
When the slot moves (a failover, a resharding) the node says ``sunsubscribe`` or the
connection breaks: the link finds the new owner and subscribes again, with jittered
backoff while no node answers. As with plain pub/sub, a message published while a link is
re-subscribing is lost (at most once).

redis-py's asyncio cluster client has sharded pub/sub only from 8.0; this uses its plain
``Connection`` (``send_command`` / ``read_response``, there since 4.2), so every redis-py
the project admits works the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re

from redis.asyncio.connection import Connection
from redis.exceptions import ResponseError

from gateway.store.base import BusMessage, QueuedSubscription
from gateway.store.redis_topology import ShardLinks

log = logging.getLogger(__name__)

BACKOFF_MIN_S = 0.05  # first wait before subscribing again after a broken link
BACKOFF_MAX_S = 2.0  # the wait doubles up to this while no node answers
MAX_REDIRECTS = 5  # MOVED answers followed in one attempt (more: the cluster is reshaping; retry)
IDLE_PING_S = 5.0  # a link silent this long sends PING; no answer within the socket timeout: broken
_MOVED = re.compile(r"(?:MOVED )?\d+ (\S*):(\d+)")


class ShardedSubscription(QueuedSubscription):
    def __init__(self, links: ShardLinks | None, prefix: str, channels: tuple[str, ...], queue_size: int) -> None:
        super().__init__(queue_size)
        assert links is not None, "a sharded subscription needs a cluster's links"
        self._links = links
        self._names = {(prefix + ch).encode(): ch for ch in channels}
        self._subscribed: set[bytes] = set()
        self._ready = asyncio.Event()
        self.reconnects = 0
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._follow(name), name=f"shard-subscription:{name.decode()}")
                       for name in self._names]  # fmt: skip

    @property
    def connected(self) -> bool:
        return self._ready.is_set()

    async def wait_connected(self) -> None:
        await self._ready.wait()

    def _mark(self, name: bytes, subscribed: bool) -> None:
        if subscribed:
            self._subscribed.add(name)
        else:
            self._subscribed.discard(name)
        if len(self._subscribed) == len(self._names):
            self._ready.set()
        else:
            self._ready.clear()

    async def _follow(self, name: bytes) -> None:
        """Keep ``name`` subscribed on whichever node owns its slot, for as long as we live."""
        backoff = BACKOFF_MIN_S
        known: tuple[str, int] | None = None  # where it was subscribed last
        while not self._closed:
            candidates = ([known] if known else []) + list(self._links.startup)
            for address in candidates:
                conn: Connection | None = None
                try:
                    conn, known = await self._subscribe(name, address)
                    self._mark(name, True)
                    backoff = BACKOFF_MIN_S
                    await self._listen(conn, name)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # any failure: try the next node, never crash
                    if not self._closed:
                        log.debug("shard subscription %s via %s:%s: %r", name, *address, exc)
                finally:
                    self._mark(name, False)
                    if conn is not None:
                        with contextlib.suppress(Exception):
                            await conn.disconnect()
                if self._closed:
                    return
            self.reconnects += 1
            log.warning("bus subscription %s broken on every node (retry in %.2fs)", name.decode(), backoff)
            await asyncio.sleep(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def _subscribe(self, name: bytes, address: tuple[str, int]) -> tuple[Connection, tuple[str, int]]:
        """A connection subscribed to ``name`` on its owner, asking from ``address``."""
        for _ in range(MAX_REDIRECTS):
            conn = Connection(host=address[0], port=address[1], protocol=2, **self._links.connection)
            try:
                await conn.connect()
                await conn.send_command("SSUBSCRIBE", name)
                reply = await conn.read_response()
            except ResponseError as err:
                await conn.disconnect()
                moved = _MOVED.fullmatch(str(err).strip())
                if moved is None:
                    raise
                address = (moved.group(1) or address[0], int(moved.group(2)))
                continue
            except BaseException:
                await conn.disconnect()
                raise
            if not (isinstance(reply, list) and reply and reply[0] in (b"ssubscribe", "ssubscribe")):
                await conn.disconnect()
                raise ConnectionError(f"unexpected answer to SSUBSCRIBE: {reply!r}")
            return conn, address
        raise ConnectionError(f"more than {MAX_REDIRECTS} MOVED answers for {name!r}")

    async def _listen(self, conn: Connection, name: bytes) -> None:
        """Deliver ``name``'s messages until the link breaks or the node lets go of the slot."""
        loop = asyncio.get_running_loop()
        pinged_at: float | None = None
        limit = float(self._links.connection.get("socket_timeout") or IDLE_PING_S)
        while not self._closed:
            reply = await conn.read_response(timeout=IDLE_PING_S if pinged_at is None else limit)
            if reply is None:  # silence: is the node still there?
                if pinged_at is not None:
                    raise TimeoutError(f"no answer to PING within {limit:.1f}s")
                await conn.send_command("PING")
                pinged_at = loop.time()
                continue
            pinged_at = None
            kind = reply[0] if isinstance(reply, list) and reply else None
            if kind in (b"smessage", "smessage") and reply[1] == name:
                self.deliver(BusMessage(self._names[name], bytes(reply[2])))
            elif kind in (b"sunsubscribe", "sunsubscribe"):
                return  # the slot moved away from this node: find its new owner
            # (pong: the node is alive)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
        await asyncio.wait(self._tasks)
        self._wake()
