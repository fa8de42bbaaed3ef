"""Fixtures that run every store contract test against memory AND Redis, the latter in
each topology the gateway supports: one server, Sentinel (a master, a replica, three
sentinels; ``wait_replicas=1``, the Sentinel default) and a three-master Redis Cluster.

Redis is private redis-servers started for this test session on free ports
(never the shared one on 6379); without the binary, ``REDIS_URL`` is used for the
single topology and the others are skipped. Each test gets its own key prefix.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for support.*
if str(Path(__file__).resolve().parents[2]) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repo, for deploy.*

from support.redis_server import (
    RedisServer,
    external_redis_url,
    have_redis_server,
)
from support.store_backend import Backend

from deploy.local_redis import ClusterRedis, SentinelRedis, Topology


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    if have_redis_server():
        with RedisServer() as server:
            yield server.url
    elif url := external_redis_url():
        yield url
    else:
        pytest.skip("no redis-server binary and no REDIS_URL")


def _topology(make: Callable[[], Topology]) -> Iterator[str]:
    if not have_redis_server():
        pytest.skip("needs the redis-server binary (starts a Sentinel set or a cluster)")
    with make() as topology:
        yield topology.url


@pytest.fixture(scope="session")
def sentinel_url() -> Iterator[str]:
    # Slow to call a master down: a busy machine's pause must not fail it over mid-test.
    yield from _topology(lambda: SentinelRedis(down_after_ms=10_000))


@pytest.fixture(scope="session")
def cluster_url() -> Iterator[str]:
    yield from _topology(ClusterRedis)


URLS = {"memory": None, "redis": "redis_url", "sentinel": "sentinel_url", "cluster": "cluster_url"}


@pytest.fixture(params=list(URLS))
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    fixture = URLS[request.param]
    url = request.getfixturevalue(fixture) if fixture else None
    b = Backend("memory" if url is None else "redis", url, topology=request.param)
    yield b
    await b.close()


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own, which the test may restart."""
    if not have_redis_server():
        pytest.skip("needs the redis-server binary (restarts it)")
    with RedisServer() as server:
        yield server
