"""Prometheus metrics of the orchestrator and the gateway, one registry per app.

A registry per app (not the global one) lets several apps live in one process,
as the tests and benchmarks do.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "omni_requests_total", "Engine requests by kind and final status.", ["kind", "status"], registry=r
        )
        self.inflight = Gauge("omni_requests_inflight", "Engine requests admitted and running.", ["kind"], registry=r)
        self.queue_wait = Histogram(
            "omni_request_queue_wait_seconds", "Time from submit to admission.", ["kind"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.first_delta = Histogram(
            "omni_request_time_to_first_delta_seconds", "Time from admission to the first output delta.",
            ["kind"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        # Per chunk: kept lock-free (LoopHistogram, LoopCounter), exposed like the others.
        self.delta_gap = LoopHistogram(
            "omni_request_inter_delta_seconds", "Time between consecutive output deltas of a request.",
            "kind", _LATENCY_BUCKETS, r,
        )  # fmt: skip
        self.turn_latency = Histogram(
            "omni_speech_stopped_to_first_audio_seconds",
            "From the end of the user's speech (server VAD) to the first audio delta of the answer.",
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.sessions = Gauge("omni_sessions_active", "Open realtime sessions.", registry=r)
        self.sessions_total = Counter("omni_sessions_total", "Realtime sessions opened.", registry=r)
        self.client_events = LoopCounter("omni_client_events", "Client events received, by type.", "type", r)
        self.errors = Counter("omni_errors_total", "Error events sent, by code.", ["code"], registry=r)
        self.closes = Counter("omni_session_closes_total", "Sessions closed, by close code.", ["code"], registry=r)
        self.video_dropped = Counter(
            "omni_video_chunks_dropped_total", "Video chunks dropped for slow clients.", registry=r
        )
        self.resumes = Counter("omni_resumes_total", "Sessions resumed, by outcome.", ["outcome"], registry=r)
        self.auth_failures = Counter("omni_auth_failures_total", "Refused connections and requests.", registry=r)
        self.sip_calls = Counter("omni_sip_calls_total", "SIP calls answered, by direction.", ["direction"], registry=r)
        self.sip_refusals = Counter(
            "omni_sip_refusals_total", "SIP INVITEs answered with a failure, by SIP status.", ["status"], registry=r
        )
        self.upgrade_refusals = Counter(
            "omni_upgrade_refusals_total", "WebSocket upgrades refused with an HTTP status, by code.", ["code"],
            registry=r,
        )  # fmt: skip
        self.gc_pauses = Histogram(
            "omni_gc_pause_seconds", "Full garbage collections run by the gateway itself (gateway/allocator.py): "
            "how long each held the event loop.", buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        # The store (Redis), as this replica finds it (gateway/store/health.py, gateway/hosting/store_watch.py).
        self.store_up = Gauge("omni_store_up", "1 while the store answers this replica, 0 while it is down "
                              "(or not reached yet): /readyz is 503 meanwhile.", registry=r)  # fmt: skip
        self.store_calls_refused = Counter(
            "omni_store_calls_refused", "Store calls failed at once, without reaching Redis, while it was down.",
            registry=r,
        )  # fmt: skip
        self.store_losses = Counter(
            "omni_store_losses", "Times Redis was found to have come back without its data (its epoch changed).",
            registry=r,
        )  # fmt: skip
        self.store_writebacks = Counter(
            "omni_store_writebacks", "Sessions this replica took again and wrote back whole after the store "
            "had lost them.", registry=r,
        )  # fmt: skip
        self._event_children: dict[str, Any] = {}
        self._kind_children: dict[str, KindMetrics] = {}

    def client_event_counter(self, event_type: str) -> Any:
        """The counter child for one event type, bound once (``labels()`` per event costs ~1 µs)."""
        child = self._event_children.get(event_type)
        if child is None:
            child = self._event_children[event_type] = self.client_events.labels(event_type)
        return child

    def bound(self, kind: str) -> KindMetrics:
        """The per-kind children the orchestrator updates per output, bound once."""
        found = self._kind_children.get(kind)
        if found is None:
            found = self._kind_children[kind] = KindMetrics(
                self.first_delta.labels(kind), self.delta_gap.labels(kind), self.queue_wait.labels(kind),
                self.inflight.labels(kind),
            )  # fmt: skip
        return found


@dataclass(frozen=True, slots=True)
class KindMetrics:
    first_delta: Any
    delta_gap: Any
    queue_wait: Any
    inflight: Any


class LoopCounter:
    """A counter with one label, updated from the event loop's thread only: a
    child's ``inc`` is one addition (prometheus_client's takes a lock, ~0.4 µs,
    and this one is bumped per audio chunk). Scraped as ``<name>_total``."""

    def __init__(self, name: str, documentation: str, label: str, registry: CollectorRegistry) -> None:
        self.name, self.documentation, self.label = name, documentation, label
        self._children: dict[str, _CounterChild] = {}
        registry.register(self)

    def labels(self, value: str) -> _CounterChild:
        child = self._children.get(value)
        if child is None:
            child = self._children[value] = _CounterChild()
        return child

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=[self.label])
        for value, child in list(self._children.items()):
            family.add_metric([value], child.value)
        yield family


class _CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class LoopHistogram:
    """A histogram with one label for the event loop's thread only: ``observe``
    is a bisect and two additions (prometheus_client's takes ~1 µs with its
    locks, and this one runs per output delta)."""

    def __init__(
        self, name: str, documentation: str, label: str, buckets: tuple[float, ...], registry: CollectorRegistry
    ) -> None:
        self.name, self.documentation, self.label, self.buckets = name, documentation, label, buckets
        self._children: dict[str, _HistogramChild] = {}
        registry.register(self)

    def labels(self, value: str) -> _HistogramChild:
        child = self._children.get(value)
        if child is None:
            child = self._children[value] = _HistogramChild(self.buckets)
        return child

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=[self.label])
        for value, child in list(self._children.items()):
            cumulative, running = [], 0
            for bound, count in zip((*self.buckets, float("inf")), child.counts, strict=True):
                running += count
                cumulative.append(("+Inf" if bound == float("inf") else repr(bound), running))
            family.add_metric([value], cumulative, child.sum)
        yield family


class _HistogramChild:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # the first bucket whose bound is >= value
        self.sum += value
