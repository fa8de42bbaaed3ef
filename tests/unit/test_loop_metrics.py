"""The lock-free per-chunk metrics scrape as Prometheus counters and histograms."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from orchestrator.metrics import LoopCounter, LoopHistogram

BUCKETS = (0.001, 0.01, 0.1)


def samples(registry: CollectorRegistry, name: str) -> dict[str, float]:
    out = {}
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith(name):
            key, value = line.rsplit(" ", 1)
            out[key.replace(name, "", 1)] = float(value)
    return out


def test_histogram_buckets_match_prometheus_client() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop = LoopHistogram("h_seconds", "doc", "kind", BUCKETS, ours)
    reference = Histogram("h_seconds", "doc", ["kind"], buckets=BUCKETS, registry=theirs)
    for value in (0.0005, 0.001, 0.0011, 0.01, 0.5, 7.0):  # on a bound counts in that bucket (le)
        loop.labels("a").observe(value)
        reference.labels("a").observe(value)
    expected = {k: v for k, v in samples(theirs, "h_seconds").items() if not k.startswith("_created")}
    assert samples(ours, "h_seconds") == expected
    assert expected['_bucket{kind="a",le="0.001"}'] == 2.0


def test_counter_children_count_separately() -> None:
    registry = CollectorRegistry()
    counter = LoopCounter("events", "doc", "type", registry)
    counter.labels("a").inc()
    counter.labels("a").inc(2)
    counter.labels("b").inc()
    assert samples(registry, "events_total") == {'{type="a"}': 3.0, '{type="b"}': 1.0}
