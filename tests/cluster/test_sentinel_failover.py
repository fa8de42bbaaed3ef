"""A Redis Sentinel failover under streaming sessions: two gateway replicas behind nginx on a
``redis+sentinel://`` URL (a master, a replica, three sentinels; passwords on both;
``wait_replicas=1``: every replica), sessions asking for answer after answer (the rolling-deploy
driver, tests/support/rolling.py), and the master failed over twice: by ``SENTINEL
FAILOVER``, then by SIGKILL (its node comes back empty, as a replica). After each, every
session drops its socket and resumes, through nginx, on either replica, from the journal the
new master holds.

What must hold: no answer lost or cut, no event lost or repeated for a client that resumes
(no seq gap, no duplicate, no resync: every write a session was told is stored was on the
promoted replica), new sessions open on each replica after each failover, and readiness
says so (each replica's ``/readyz`` is 200 once it can open sessions again). Every wait is
for a state; the figures (how long new sessions were refused, answers per phase) are printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from support.gateway import connect
from support.rolling import API_KEY, Listener, Report, summary

from deploy.local_cluster import Cluster, http_status
from deploy.local_redis import SentinelRedis

pytestmark = pytest.mark.timeout(240)

SESSIONS = 6
PHASE_TIMEOUT_S = 60.0


@pytest.fixture
async def cluster(cluster_binaries: None) -> AsyncIterator[Cluster]:
    env = {"OMNI_GATEWAY_VIDEO_ENGINE": "none", "OMNI_GATEWAY_DRAIN_WINDOW_S": "0.5"}
    keep = os.environ.get("OMNI_CLUSTER_KEEP_RUN_DIR", "") not in ("", "0")
    async with Cluster(replicas=2, engine="passthrough", api_keys=(API_KEY,), env=env, redis="sentinel",
                       keep_run_dir=keep) as c:  # fmt: skip
        print(f"\ncluster run dir: {c.run_dir} (kept: {keep})")
        yield c


@dataclass(frozen=True)
class Probe:
    when: float
    replica: int
    ready: int | None  # /readyz's status just before (None: no answer)
    opened: bool  # a new session opened on that replica right after
    why: str = ""


@dataclass
class Opener:
    """Reads a replica's ``/readyz`` and opens a new session on it, each replica in turn,
    over and over: when sessions could be opened, and what readiness said just before."""

    cluster: Cluster
    probes: list[Probe] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        i = 0
        while not stop.is_set():
            replica = self.cluster.replicas[i % len(self.cluster.replicas)]
            i += 1
            status = await asyncio.to_thread(http_status, replica.port, "/readyz", 2.0)
            opened, why = False, ""
            try:
                async with connect(replica.url, headers={"Authorization": f"Bearer {API_KEY}"}) as c:
                    first = await c.recv()
                    opened, why = first["type"] == "session.created", str(first)[:200]
            except Exception as exc:  # a refused upgrade, a close with 1013
                why = repr(exc)[:200]
            self.probes.append(Probe(time.monotonic(), replica.index, status, opened, why))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)

    def _replicas(self) -> set[int]:
        return {r.index for r in self.cluster.replicas}

    def opened_on_each_after(self, t: float) -> bool:
        return {p.replica for p in self.probes if p.when > t and p.opened} == self._replicas()

    def ready_on_each_after(self, t: float) -> bool:
        return {p.replica for p in self.probes if p.when > t and p.ready == 200} == self._replicas()

    def refused(self, a: float, b: float) -> list[Probe]:
        return [p for p in self.probes if a <= p.when <= b and not p.opened]


async def until(check: object, what: str, timeout_s: float = PHASE_TIMEOUT_S) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f}s")
        await asyncio.sleep(0.05)


async def test_a_sentinel_failover_under_streaming_sessions_loses_nothing(cluster: Cluster) -> None:
    sentinel = cluster.topology
    assert isinstance(sentinel, SentinelRedis)
    report = Report()
    stop = asyncio.Event()
    # A resume refused with store_unavailable (the store still failing over, or a WAIT slower
    # than its timeout on a loaded machine) closes 1013 and the SDK resumes again: counted.
    listeners = [Listener(i, cluster.url, report, passing=("store_unavailable",)) for i in range(SESSIONS)]
    opener = Opener(cluster)
    running = [asyncio.create_task(listener.run(stop)) for listener in listeners]
    probing = asyncio.create_task(opener.run(stop))
    phases: list[str] = []

    def failed() -> bool:
        return report.bad > 0

    async def streaming(what: str) -> None:
        """Every session answers again (a turn completed by each since now), nothing failed."""
        turns = [listener.turn for listener in listeners]
        await until(lambda: failed() or all(ls.turn > t + 1 for ls, t in zip(listeners, turns, strict=True)), what)
        assert not failed(), "\n".join(summary(report))

    async def resume_everywhere(what: str) -> None:
        resumed = report_resumes()
        for listener in listeners:
            ws = listener.rt._ws  # abort the TCP connection, as a network failure would
            if ws is not None:
                ws.transport.abort()
        await until(lambda: failed() or report_resumes() >= resumed + SESSIONS, f"{what}: every session resumed")
        await streaming(f"{what}: every session answers after its resume")

    def report_resumes() -> int:
        return sum(ls.rt.stats.resumes + ls.rt.stats.resyncs for ls in listeners)

    try:
        await streaming("every session answers before the failover")
        for how in ("SENTINEL FAILOVER", "SIGKILL of the master"):
            began = time.monotonic()
            if how == "SENTINEL FAILOVER":
                old, new = sentinel.master_port(), await asyncio.to_thread(sentinel.failover)
            else:
                old, new = await asyncio.to_thread(sentinel.kill_master)
                await asyncio.to_thread(sentinel.restart_node, old)  # back, empty, as a replica
            promoted = time.monotonic()
            assert new != old
            await streaming(f"after the {how}: every session answers")
            await until(lambda t=promoted: opener.opened_on_each_after(t), f"after the {how}: new sessions open")
            await until(lambda t=promoted: opener.ready_on_each_after(t), f"after the {how}: /readyz 200")
            await resume_everywhere(f"after the {how}")
            refused = opener.refused(began, time.monotonic())
            phases.append(f"{how}: master {old} -> {new} in {promoted - began:.1f} s; new sessions refused "
                          f"{len(refused)} times meanwhile, /readyz 200 just before "
                          f"{sum(p.ready == 200 for p in refused)} of them")  # fmt: skip
    finally:
        stop.set()
        await asyncio.gather(*running, probing)
    for listener in listeners:
        s = listener.rt.stats
        for name in ("resumes", "resyncs", "replayed_events", "duplicates_dropped", "failed_attempts", "gaps"):
            report.sdk[name] += getattr(s, name)
    opened = sum(p.opened for p in opener.probes)
    lines = "\n".join([*phases, *summary(report), f"new sessions: {opened} opened, "
                       f"{len(opener.probes) - opened} refused; resumes refused (store_unavailable, "
                       f"resumed again): {report.counts['error_store_unavailable']}"])  # fmt: skip
    print(lines)
    assert report.bad == 0, lines
    # An answer under way when its socket dropped is ended (replica_lost: it ran on the replica
    # the session left) and re-issued by the one it resumed on, whole: no drain cut any.
    assert report.counts["cut_drained"] == 0, lines
    assert report.counts["reissued"] == report.counts["cut_replica_lost"], lines
    assert report.sdk["gaps"] == 0 and report.sdk["duplicates_dropped"] == 0, lines
    assert report.sdk["resyncs"] == 0, lines  # the journal lost nothing a client had seen
    assert report.sdk["resumes"] >= 2 * SESSIONS, lines
