"""deploy/grafana/omni-gateway.json: every metric it queries is in a scrape of a running
gateway (``serve --workers 2`` on a private Redis, after the traffic that makes each
series: an answer, a bad event, a resume that replaces a socket), and every metric
docs/observability.md's list names is on it."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import websockets
from support.gateway import connect
from support.redis_server import REDIS_BINARY, RedisServer
from support.workers import scrape, serve_workers

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "omni-gateway.json"
METRIC = re.compile(r"\bomni_[a-z_]+\b")
TEXT = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def queried() -> set[str]:
    """The metric names the panels' PromQL reads (a histogram as its ``_bucket`` series)."""
    return {m for p in panels() for t in p["targets"] for m in METRIC.findall(t["expr"])}


def documented_metrics() -> set[str]:
    text = (ROOT / "docs" / "observability.md").read_text()
    listed = text[text.index("`GET /metrics`") : text.index("Logs carry")]
    return set(METRIC.findall(listed))


def family(sample: str) -> str:
    for suffix in ("_bucket", "_count", "_sum"):
        if sample.endswith(suffix):
            return sample[: -len(suffix)]
    return sample


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    if not REDIS_BINARY:
        pytest.skip("redis-server is not installed")
    with RedisServer() as server:
        yield server


def test_the_dashboard_is_well_formed() -> None:
    d = dashboard()
    assert d["uid"] and d["title"]
    names = [v["name"] for v in d["templating"]["list"]]
    assert names[0] == "datasource" and d["templating"]["list"][0]["query"] == "prometheus"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in panels():
        assert p["title"] and p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"] and all(t["expr"] and t["refId"] for t in p["targets"]), p["title"]
        for t in p["targets"]:
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]
            assert 'job=~"$job"' in t["expr"], t["expr"]


def test_every_metric_the_readme_lists_is_on_the_dashboard() -> None:
    listed = documented_metrics()
    assert len(listed) >= 14, listed
    on_dashboard = {family(m) for m in queried()}
    assert listed <= on_dashboard, f"not on the dashboard: {sorted(listed - on_dashboard)}"
    assert on_dashboard <= listed, f"queried but not in docs/observability.md's list: {sorted(on_dashboard - listed)}"


async def test_every_metric_the_dashboard_queries_is_in_a_scrape_of_a_running_gateway(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    async with serve_workers(redis_server, tmp_path) as w, contextlib.AsyncExitStack() as stack:
        a = await stack.enter_async_context(connect(w.url))
        created = await a.wait_for("session.created")
        await a.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
            "turn_detection": None}}}})  # fmt: skip
        await a.send({"type": "conversation.item.create", "item": TEXT})
        await a.send({"type": "response.create"})
        assert (await a.wait_for("response.done"))["response"]["status"] == "completed"
        await a.ws.send("not json")  # an error event (invalid_json)
        await a.wait_for("error")
        b = await stack.enter_async_context(connect(w.url))
        await b.wait_for("session.created")
        await b.send({"type": "session.resume", "session_id": created["session"]["id"],
                      "resume_token": created["resume_token"],
                      "last_received_server_event_seq": a.events[-1]["server_event_seq"]})  # fmt: skip
        # Replayed, or (a worker under load whose journal had not committed the error yet:
        # the client is ahead of the store) resynced: either is a resume the metrics count.
        await b.wait_for(lambda e: e["type"] in ("session.resumed", "session.resync_required"))
        with pytest.raises(websockets.ConnectionClosed) as closed:  # the old socket: closed 4009 (it did
            await a.wait_for("session.replaced")  # not opt in to gateway events: no session.replaced)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4009
        samples = scrape(w.port)
    missing = sorted(m for m in queried() if m not in samples)
    assert not missing, f"queried by the dashboard, not in the scrape: {missing}"
    empty = sorted(m for m in queried() if not samples[m])
    assert not empty, f"in the scrape without a sample: {empty}"
