"""Fixtures for the multi-replica proofs: one local cluster (redis + 3 gateway
replicas + nginx, round-robin, no sticky sessions) per test module.

``redis_topology`` (module scope; default ``single``) is the Redis under it: a test that
must hold on a Redis Cluster too says so with
``@pytest.mark.parametrize("redis_topology", ["single", "cluster"], indirect=True)``.

The cluster is started once per module (``cluster``); ``harness`` wraps it for
one test: it brings back any replica a previous test left dead, and gives the
test a Redis client (on the test's own event loop) to read the ownership lease
of a session, i.e. which replica serves it now.

``OMNI_CLUSTER_KEEP_RUN_DIR=1`` keeps the run directory (replica, nginx and
redis logs) after the module for debugging; its path is printed either way.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(REPO_ROOT))  # deploy/ (the local cluster script)

from deploy.local_cluster import Cluster, ClusterError, ensure_binaries, http_status  # noqa: E402
from gateway.store.redis_topology import Clients, connect  # noqa: E402
from gateway.store.redis_url import parse_redis_url  # noqa: E402

API_KEY = "sk-cluster-resume"
REPLICAS = 3
DRAIN_WINDOW_S = 0.5  # short, so a drain test sees both a finished and a cut answer
CLUSTER_ENV = {
    "OMNI_GATEWAY_VIDEO_ENGINE": "none",  # keeps replicas light: no torch
    "OMNI_GATEWAY_DRAIN_WINDOW_S": str(DRAIN_WINDOW_S),
    # A WebRTC call's media stays on loopback, whatever other addresses the machine has.
    "OMNI_GATEWAY_WEBRTC_ADVERTISED_ADDRESSES": "127.0.0.1",
    "OMNI_GATEWAY_WEBRTC_ADVERTISE_MODE": "replace",
}
KEY_PREFIX = "omni:"  # gateway/store/base.py StoreLimits.key_prefix (the replicas' default)


@pytest.fixture(scope="session")
def cluster_binaries() -> None:
    """nginx and redis-server, installed where they can be; without them the cluster tests skip."""
    try:
        ensure_binaries()
    except ClusterError as err:
        pytest.skip(f"nginx/redis-server unavailable and could not be installed: {err}")


@pytest.fixture(scope="module")
def redis_topology(request: pytest.FixtureRequest) -> str:
    """The Redis the module's cluster runs on: single, unless a test parametrizes it."""
    return str(getattr(request, "param", "single"))


@pytest.fixture(scope="module")
def cluster(cluster_binaries: None, redis_topology: str) -> Iterator[Cluster]:
    keep = os.environ.get("OMNI_CLUSTER_KEEP_RUN_DIR", "") not in ("", "0")
    with Cluster(replicas=REPLICAS, engine="passthrough", api_keys=(API_KEY,), env=CLUSTER_ENV,
                 keep_run_dir=keep, redis=redis_topology) as c:  # fmt: skip
        print(f"\ncluster run dir: {c.run_dir} (kept: {keep}; redis: {redis_topology})")
        yield c


def redis_clients(url: str) -> Clients:
    """A test's own client of the cluster's Redis, whatever its topology (``.redis``)."""
    return connect(parse_redis_url(url), 5.0, 5.0, None)


@dataclass
class Harness:
    """The module's cluster, seen from one test."""

    cluster: Cluster
    redis: Any  # redis.asyncio Redis, or RedisCluster
    api_key: str = API_KEY
    replicas: int = REPLICAS

    def lease_key(self, session_id: str) -> str:
        return f"{KEY_PREFIX}s:{{{session_id}}}:lease"  # key schema: gateway/store/redis.py

    async def journal_last(self, session_id: str) -> int:
        """The highest seq committed to the session's journal (0: none)."""
        raw = await self.redis.hget(f"{KEY_PREFIX}s:{{{session_id}}}:meta", "last")
        return int(raw or 0)

    async def wait_journaled(self, session_id: str, seq: int, timeout_s: float = 10.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while await self.journal_last(session_id) < seq:
            if loop.time() > deadline:
                raise AssertionError(f"seq {seq} of {session_id} not journaled after {timeout_s}s")
            await asyncio.sleep(0.005)

    async def owner(self, session_id: str) -> int | None:
        """Index of the replica holding ``session_id``'s lease (replica ids are ``r<i>``), or None."""
        raw: bytes | None = None
        for attempt in range(20):  # the pooled connection breaks when a test restarts Redis
            try:
                raw = await self.redis.hget(self.lease_key(session_id), "owner")
                break
            except RedisConnectionError:
                if attempt == 19:
                    raise
                await asyncio.sleep(0.1)
        if raw is None:
            return None
        name = raw.decode()
        return int(name[1:]) if name.startswith("r") and name[1:].isdigit() else None

    async def wait_owner(self, session_id: str, timeout_s: float = 10.0) -> int:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (owner := await self.owner(session_id)) is None:
            if loop.time() > deadline:
                raise AssertionError(f"no lease for {session_id} after {timeout_s}s")
            await asyncio.sleep(0.05)
        return owner

    async def status(self, index: int, path: str) -> int | None:
        """GET ``path`` on replica ``index`` directly (not through nginx); None if nothing answers."""
        return await asyncio.to_thread(http_status, self.cluster.replicas[index].port, path, 1.0)

    async def wait_ready(self, timeout_s: float = 15.0) -> None:
        """Until every replica's /readyz says 200. After a Redis restart a replica refuses new
        sessions (store_unavailable, /readyz 503) until its next probe finds Redis back
        (redis_probe_interval_s, 1 s): a test that opens sessions waits for that state."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for replica in self.cluster.replicas:
            while (code := await self.status(replica.index, "/readyz")) != 200:
                if loop.time() > deadline:
                    raise AssertionError(f"{replica.name} not ready after {timeout_s}s (/readyz: {code})")
                if not replica.alive:  # (one a previous test drained has exited meanwhile)
                    await self.cluster.astart_replica(replica.index)
                await asyncio.sleep(0.05)

    async def ensure_all_up(self) -> None:
        """Restart every replica that is not running (a previous test may have killed it)."""
        for replica in self.cluster.replicas:
            if not replica.alive:
                await self.cluster.astart_replica(replica.index)

    def log_tail(self, index: int, chars: int = 4000) -> str:
        path = self.cluster.replicas[index].log_path
        try:
            return path.read_bytes()[-chars:].decode(errors="replace")
        except OSError:
            return "(no log)"


@pytest.fixture
async def harness(cluster: Cluster) -> AsyncIterator[Harness]:
    clients = redis_clients(cluster.redis_url)
    h = Harness(cluster, clients.redis)
    await h.ensure_all_up()
    await h.wait_ready()  # (a previous test may have restarted Redis just now)
    try:
        yield h
    finally:
        await clients.close()
