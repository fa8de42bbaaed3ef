"""Test support: ``serve --workers N`` as a user runs it (a supervisor and its workers,
real processes on one port), and what a test reads of it: each worker's pid, which
worker holds a session (its lease in Redis), one ``/metrics`` scrape by worker."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families
from support.gateway import free_port
from support.redis_server import RedisServer
from support.serve import Served, clean_env

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 2
REPLICA = "wk"  # the workers' replica ids: wk-w0, wk-w1, ...


def scrape(port: int, key: str | None = None) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of one ``/metrics`` scrape, by sample name (``key``: an operator key, when auth is on)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=5) as r:
        text = r.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


def by_worker(samples: list[tuple[dict[str, str], float]], **match: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, value in samples:
        if all(labels.get(k) == v for k, v in match.items()):
            out[labels["worker"]] = out.get(labels["worker"], 0.0) + value
    return out


@dataclass
class Workers:
    """A running ``serve --workers`` and what a test reads of it."""

    served: Served
    redis: aioredis.Redis
    count: int
    key: str | None = None  # an operator key, when the workers require auth

    @property
    def port(self) -> int:
        return self.served.port

    @property
    def url(self) -> str:
        return self.served.url

    def pids(self) -> dict[int, int]:
        """The live pid of each slot, from the supervisor's log ("worker w<slot> started (pid N)")."""
        found: dict[int, int] = {}
        for slot, pid in re.findall(r"worker w(\d+) started \(pid (\d+)\)", self.served.log(200_000)):
            found[int(slot)] = int(pid)
        return found

    def wait_all_up(self, timeout_s: float = 60.0, restarts: dict[str, float] | None = None) -> None:
        """Until every worker answers in the aggregated scrape (and, if given, with these restart counts)."""
        loop_until(timeout_s, lambda: self._all_up(restarts), f"not every worker up:\n{self.served.log()}")

    def _all_up(self, restarts: dict[str, float] | None) -> bool:
        try:
            samples = scrape(self.port, self.key)
        except OSError:
            return False
        up = by_worker(samples.get("omni_worker_up", []))
        if up != {str(i): 1.0 for i in range(self.count)}:
            return False
        return restarts is None or by_worker(samples.get("omni_worker_restarts", [])) == restarts

    async def owner(self, session_id: str) -> int:
        """The slot of the worker holding ``session_id``'s lease."""
        for _ in range(200):
            raw = await self.redis.hget(f"omni:s:{{{session_id}}}:lease", "owner")
            if raw is not None:
                name = raw.decode()
                assert name.startswith(f"{REPLICA}-w"), name
                return int(name.rsplit("-w", 1)[1])
            await asyncio.sleep(0.02)
        raise AssertionError(f"no lease for {session_id}")


def loop_until(timeout_s: float, check: Callable[[], bool], message: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(message)
        time.sleep(0.2)


@contextlib.asynccontextmanager
async def serve_workers(
    redis_server: RedisServer, tmp: Path, count: int = WORKERS, **env: str
) -> AsyncIterator[Workers]:
    """``serve --workers count --engine passthrough`` on a free port, once every worker serves."""
    port = free_port()
    command = f"{sys.executable} -m gateway serve --workers {count} --engine passthrough"
    command += f" --redis-url {redis_server.url}"
    environ = clean_env(OMNI_GATEWAY_PORT=str(port), OMNI_GATEWAY_REPLICA_ID=REPLICA,
                        OMNI_GATEWAY_VIDEO_ENGINE="none", PYTHONPATH=str(ROOT), **env)  # fmt: skip
    served = Served(command, port=port, cwd=ROOT, log_path=tmp / f"workers-{port}.log", env=environ)
    client = aioredis.from_url(redis_server.url)
    try:
        key = env.get("OMNI_GATEWAY_API_KEYS", "").split(",")[0] or None
        w = Workers(served, client, count, key)
        await asyncio.to_thread(w.wait_all_up)
        yield w
    finally:
        served.stop()
        await client.aclose()
