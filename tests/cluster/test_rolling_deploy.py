"""A rolling deploy that no listener hears: 3 replicas behind nginx, sessions asking for
answer after answer, each replica in turn SIGTERMed and started again (a drain), and the
same with SIGKILL (a crash). Real processes, real Redis, the Python SDK reconnecting
through nginx (the driver: tests/support/rolling.py; the figures: bench/rolling_deploy.py).

With a drain window long enough for an answer, no answer is cut: each session was handed
over between answers. With crashes, answers are cut (replica_lost) and re-issued, and
nothing is lost or repeated either way. Silences are figures (the bench prints them), not
asserted here: a loaded CI machine stretches them."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator

import pytest
from support.rolling import API_KEY, rolling_deploy, summary

from deploy.local_cluster import Cluster

pytestmark = pytest.mark.timeout(300)

SESSIONS = 12


@pytest.fixture
async def rolled(cluster_binaries: None) -> AsyncIterator[Cluster]:
    env = {"OMNI_GATEWAY_VIDEO_ENGINE": "none", "OMNI_GATEWAY_DRAIN_WINDOW_S": "20"}
    async with Cluster(replicas=3, engine="passthrough", api_keys=(API_KEY,), env=env) as cluster:
        yield cluster


async def test_a_rolling_sigterm_deploy_cuts_no_answer_and_loses_nothing(rolled: Cluster) -> None:
    report = await rolling_deploy(rolled, sessions=SESSIONS, rounds=1, sig=signal.SIGTERM)
    lines = "\n".join(summary(report))
    assert report.bad == 0, lines
    assert report.cut == 0 and report.counts["reissued"] == 0, lines  # handed over between answers
    assert report.sdk["resumes"] + report.sdk["resyncs"] >= SESSIONS, lines  # every session moved at least once
    assert report.sdk["gaps"] == 0, lines
    assert len(report.silences) == SESSIONS and report.answers > SESSIONS, lines


async def test_a_rolling_sigkill_deploy_loses_nothing(rolled: Cluster) -> None:
    report = await rolling_deploy(rolled, sessions=SESSIONS, rounds=1, sig=signal.SIGKILL)
    lines = "\n".join(summary(report))
    assert report.bad == 0, lines
    assert report.counts["cut_drained"] == 0, lines  # a crash is never called a drain
    assert report.counts["reissued"] <= report.counts["cut_replica_lost"], lines  # each re-issue follows a cut
    assert report.sdk["gaps"] == 0, lines
    assert report.answers > SESSIONS, lines
