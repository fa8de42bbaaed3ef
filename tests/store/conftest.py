"""Fixtures that run every store contract test against memory AND Redis.

Redis is a private redis-server started for this test session on a free port
(never the shared one on 6379); without the binary, ``REDIS_URL`` is used, and
without either the Redis half is skipped. Each test gets its own key prefix.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for support.*

from support.redis_server import (
    RedisServer,
    external_redis_url,
    have_redis_server,
)
from support.store_backend import Backend


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    if have_redis_server():
        with RedisServer() as server:
            yield server.url
    elif url := external_redis_url():
        yield url
    else:
        pytest.skip("no redis-server binary and no REDIS_URL")


@pytest.fixture(params=["memory", "redis"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    b = Backend(request.param, url)
    yield b
    await b.close()


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own, which the test may restart."""
    if not have_redis_server():
        pytest.skip("needs the redis-server binary (restarts it)")
    with RedisServer() as server:
        yield server
