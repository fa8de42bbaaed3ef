"""Prometheus metrics of the orchestrator and the gateway, one registry per app.

A registry per app (not the global one) lets several apps live in one process,
as the tests and benchmarks do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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
        self.delta_gap = Histogram(
            "omni_request_inter_delta_seconds", "Time between consecutive output deltas of a request.",
            ["kind"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.turn_latency = Histogram(
            "omni_speech_stopped_to_first_audio_seconds",
            "From the end of the user's speech (server VAD) to the first audio delta of the answer.",
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.sessions = Gauge("omni_sessions_active", "Open realtime sessions.", registry=r)
        self.sessions_total = Counter("omni_sessions_total", "Realtime sessions opened.", registry=r)
        self.client_events = Counter(
            "omni_client_events_total", "Client events received, by type.", ["type"], registry=r
        )
        self.errors = Counter("omni_errors_total", "Error events sent, by code.", ["code"], registry=r)
        self.closes = Counter("omni_session_closes_total", "Sessions closed, by close code.", ["code"], registry=r)
        self.video_dropped = Counter(
            "omni_video_chunks_dropped_total", "Video chunks dropped for slow clients.", registry=r
        )
        self.resumes = Counter("omni_resumes_total", "Sessions resumed, by outcome.", ["outcome"], registry=r)
        self.auth_failures = Counter("omni_auth_failures_total", "Refused connections and requests.", registry=r)
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
