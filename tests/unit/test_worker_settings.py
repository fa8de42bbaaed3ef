"""How many workers ``serve`` runs, what it refuses, and how their metrics merge
(the processes themselves: tests/integration/test_workers.py)."""

from __future__ import annotations

import errno
import os
import socket

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway import workers
from gateway.cli import main, settings_from_args
from gateway.settings import Settings
from orchestrator.metrics import Metrics

REDIS = "redis://127.0.0.1:6379/0"


def test_without_redis_the_default_is_one_process() -> None:
    assert workers.worker_count(Settings()) == 1
    assert workers.worker_count(settings_from_args(["serve"], environ={})) == 1


def test_with_redis_the_default_is_one_worker_per_available_core() -> None:
    assert workers.worker_count(Settings(redis_url=REDIS)) == workers.available_cores() >= 1


@pytest.mark.parametrize(
    "settings",
    [
        Settings(redis_url=REDIS, engine="vllm", engine_model="/m"),
        Settings(redis_url=REDIS, engine="omni", engine_model="/m"),
        Settings(redis_url=REDIS, thinker="vllm"),
        Settings(redis_url=REDIS, video_engine="omni", video_model="/v"),
        Settings(redis_url=REDIS, models='{"models": [{"name": "a", "engine": "vllm", "model": "/m"}]}'),
    ],
    ids=["vllm", "omni", "vllm-thinker", "omni-video", "vllm-route"],
)
def test_a_model_loaded_in_process_keeps_the_default_at_one_worker(settings: Settings) -> None:
    assert workers.worker_count(settings) == 1


def test_workers_come_from_the_flag_or_the_environment() -> None:
    assert settings_from_args(["serve", "--workers", "3"], environ={}).workers == 3
    assert settings_from_args(["serve"], environ={"OMNI_GATEWAY_WORKERS": "4"}).workers == 4
    assert settings_from_args(["serve"], environ={"OMNI_GATEWAY_WORKERS": "auto"}).workers is None
    env = {"OMNI_GATEWAY_WORKERS": "4"}
    assert settings_from_args(["serve", "--workers", "auto"], environ=env).workers is None  # the flag wins


def test_more_than_one_worker_without_redis_is_refused_naming_the_setting(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert "--workers 2 needs Redis" in err and "--redis-url" in err and "OMNI_GATEWAY_REDIS_URL" in err


def test_zero_workers_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--workers", "0", "--redis-url", REDIS]) == 2
    assert "--workers must be at least 1" in capsys.readouterr().err


def test_a_cgroup_quota_bounds_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "_cgroup_cpu_quota", lambda: 1.5)
    assert workers.available_cores() == min(2, len(os.sched_getaffinity(0)))
    monkeypatch.setattr(workers, "_cgroup_cpu_quota", lambda: None)
    assert workers.available_cores() == len(os.sched_getaffinity(0))


def test_each_slot_gets_its_own_reuseport_socket_on_one_port() -> None:
    sockets = workers.bind_sockets("127.0.0.1", 0, 3)
    try:
        ports = {s.getsockname()[1] for s in sockets}
        assert len(ports) == 1 and len({s.fileno() for s in sockets}) == 3
        assert all(s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) for s in sockets)
        with socket.create_connection(("127.0.0.1", ports.pop()), timeout=2):
            pass  # queued in one slot's backlog, though no worker accepts yet
    finally:
        for s in sockets:
            s.close()


def test_a_port_in_use_is_one_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--workers", "2", "--redis-url", REDIS, "--port", str(port)]) == 2
    assert f"port {port} on 127.0.0.1 is in use" in capsys.readouterr().err


def test_a_second_supervisor_cannot_share_a_port_through_so_reuseport() -> None:
    first = workers.bind_sockets("127.0.0.1", 0, 2)
    try:
        port = first[0].getsockname()[1]
        with pytest.raises(OSError) as exc:
            workers.bind_sockets("127.0.0.1", port, 2)
        assert exc.value.errno == errno.EADDRINUSE
    finally:
        for s in first:
            s.close()


def test_a_worker_gets_its_own_replica_id() -> None:
    slot = workers.WorkerSlot(1, 2, 5, "/tmp/x", 0)
    assert slot.settings(Settings(replica_id="gw")).replica_id == "gw-w1"
    assert slot.settings(Settings()).replica_id is None  # the per-process default
    assert workers.WorkerSlot.decode(slot.encode()) == slot


def test_expositions_merge_with_a_worker_label_and_every_metric_kind() -> None:
    texts = []
    for n in (1, 2):
        registry = CollectorRegistry()
        Counter("omni_x_total", "x", ["code"], registry=registry).labels("a").inc(n)
        Histogram("omni_h_seconds", "h", registry=registry).observe(0.01 * n)
        Gauge("omni_g", "g", registry=registry).set(n)
        m = Metrics(CollectorRegistry())
        m.client_event_counter("input_audio_buffer.append").inc(n)  # a loop-thread counter
        m.bound("response").delta_gap.observe(0.02)  # a loop-thread histogram
        texts.append(generate_latest(registry) + generate_latest(m.registry))
    merged = workers.merge_expositions([("0", texts[0]), ("1", texts[1]), ("2", None)])
    families = {f.name: f for f in text_string_to_metric_families(merged.decode())}
    x = {s.labels["worker"]: s.value for s in families["omni_x"].samples if s.name == "omni_x_total"}
    assert x == {"0": 1.0, "1": 2.0}
    assert {s.labels["worker"]: s.value for s in families["omni_g"].samples} == {"0": 1.0, "1": 2.0}
    counts = {s.labels["worker"]: s.value for s in families["omni_h_seconds"].samples if s.name.endswith("_count")}
    assert counts == {"0": 1.0, "1": 1.0}
    appends = [s for s in families["omni_client_events"].samples if s.name == "omni_client_events_total"]
    assert {s.labels["worker"]: s.value for s in appends} == {"0": 1.0, "1": 2.0}
    gaps = [s for s in families["omni_request_inter_delta_seconds"].samples if s.name.endswith("_count")]
    assert {s.labels["worker"] for s in gaps} == {"0", "1"}
    up = {s.labels["worker"]: s.value for s in families["omni_worker_up"].samples}
    assert up == {"0": 1.0, "1": 1.0, "2": 0.0}
    # Valid text format: every metric's lines together, each HELP/TYPE once.
    assert merged.decode().count("# TYPE omni_x_total counter") == 1
