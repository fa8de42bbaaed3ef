"""RedisStore when Redis restarts or freezes: fail fast, then work again."""

from __future__ import annotations

import asyncio
import time

import pytest
from support.redis_server import RedisServer

from gateway.store import (
    FencedError,
    JournalWriter,
    StoreUnavailable,
    create_store,
    replica_channel,
)


async def test_store_fails_fast_while_redis_is_down_and_recovers(
    private_redis: RedisServer,
) -> None:
    store = create_store(private_redis.url, key_prefix="r:", flush_interval_ms=20)
    try:
        fence = await store.acquire("s1", "A", 5_000)
        await store.save_snapshot("s1", b"snap", fence=fence)
        sub = await store.subscribe(replica_channel("A"))
        assert sub.connected
        writer = JournalWriter(store, "s1", fence)

        private_redis.stop()
        calls = [
            store.ping(),
            store.load_snapshot("s1"),
            store.acquire("s1", "A", 5_000),
            store.append_events("s1", [(1, b"x")], fence=fence),
            store.read_events("s1", 0),
            store.publish(replica_channel("A"), b"lost"),
            store.take_token("t"),
        ]
        for call in calls:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable) as info:
                await call
            assert time.monotonic() - started < 1.0
            assert info.value.code == "store_unavailable"

        writer.append(1, b"buffered")  # kept, retried in the background
        await asyncio.sleep(0.1)
        assert writer.pending == 1 and isinstance(writer.last_error, StoreUnavailable)

        private_redis.start()  # same port, empty: no persistence
        await store.ping()  # the same store object works again
        assert await store.load_snapshot("s1") is None
        # The fence counter went with the data: the old writer is fenced
        # (current None), and the session must be acquired anew.
        await asyncio.sleep(0.2)
        assert writer.fenced is not None and writer.fenced.current is None
        with pytest.raises(FencedError):
            await writer.flush()
        new_fence = await store.acquire("s1", "A", 5_000)
        await store.save_snapshot("s1", b"again", fence=new_fence)
        assert await store.load_snapshot("s1") == b"again"

        async with asyncio.timeout(5):  # the subscription resubscribed by itself
            await sub.wait_connected()
        assert await store.publish(replica_channel("A"), b"after") == 1
        async with asyncio.timeout(2):
            msg = await sub.get()
        assert msg is not None and msg.data == b"after"
        await writer.close(flush=False)
    finally:
        await store.close()


async def test_frozen_redis_times_out_instead_of_hanging(private_redis: RedisServer) -> None:
    store = create_store(private_redis.url, key_prefix="r:", socket_timeout_s=0.2)
    try:
        await store.ping()
        private_redis.pause()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await store.load_snapshot("s1")
        elapsed = time.monotonic() - started
        print(f"\nfrozen redis: StoreUnavailable after {elapsed:.2f} s (socket_timeout 0.2 s)")
        assert elapsed < 1.5
        private_redis.resume()
        await store.ping()
    finally:
        private_redis.resume()
        await store.close()


async def test_a_frozen_redis_counts_as_down_after_one_timeout_and_calls_then_fail_without_reaching_it(
    private_redis: RedisServer,
) -> None:
    """SIGSTOP: the first call fails after one socket timeout (not retried on a fresh
    connection to wait again), the store is then down, and every call fails at once without
    being sent (nothing queues behind a frozen Redis), except one trial call per
    trial_interval_s; after SIGCONT the first call Redis answers brings the store back up."""
    store = create_store(private_redis.url, key_prefix="r:", socket_timeout_s=0.3)
    try:
        await store.ping()
        assert store.health.up
        fence = await store.acquire("s1", "A", 5_000)
        store.health.trial_interval_s = 3600.0  # (no trial call during the checks below)
        private_redis.pause()
        with pytest.raises(StoreUnavailable):
            await store.load_snapshot("s1")
        assert store.health.down and "Timeout" in store.health.reason
        sent, refused = store.round_trips, store.health.refused
        for call in (store.load_snapshot("s1"), store.commit("s1", fence=fence, events=[(1, b"x")]),
                     store.renew("s1", "A", fence, 5_000), store.read_events("s1", 0)):  # fmt: skip
            with pytest.raises(StoreUnavailable) as info:
                await call
            assert "unreachable" in str(info.value)
        assert store.round_trips == sent  # none of them reached Redis
        assert store.health.refused == refused + 4
        private_redis.resume()
        await store.ping()  # the probe goes through, and brings it back
        assert store.health.up and store.health.recoveries == 1
        assert await store.load_snapshot("s1") is None
    finally:
        private_redis.resume()
        await store.close()
