"""The full-duplex voice bench runs and measures what it says (a small N, a few seconds).

This proves the bench, not the gateway's speed: figures on a shared CI machine
mean nothing, so nothing here is timed. What must hold at any speed: every
session connects, every input chunk is answered, every answer completes, the
gateway's audio comes out paced (50 deltas/s per answering session) while the
input streams, and the report prints the duplex rows and a ratio.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
N = 6


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_duplex_bench_answers_every_session_while_it_streams(tmp_path: Path, binary: bool) -> None:
    out = tmp_path / "figures.json"
    cmd = [sys.executable, "bench/voice_load.py", "--duplex", "--sessions", str(N), "--duration", "3",
           "--warmup", "1", "--answer-s", "1", "--commit-ms", "500", "--no-idle", "--json", str(out)]  # fmt: skip
    if binary:
        cmd.append("--binary")
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "out gap jitter p99 ms" in run.stdout and "chunks handled (in answered + audio out)" in run.stdout
    figures = json.loads(out.read_text())
    for target in ("gateway", "echo"):
        fig = figures[target]
        assert fig["connected"] == N and fig["duplex"] and fig["binary"] == binary
        assert (fig["unanswered"], fig["errors"], fig["closed"]) == (0, 0, 0), fig["first_error"]
        assert fig["samples"] > 0 and fig["jitter_p50_ms"] == fig["jitter_p50_ms"]  # not NaN
    gw, echo = figures["gateway"], figures["echo"]
    # Input never stops, and what was sent is answered (by its transcript number): in the window,
    # the chunks answered keep up with those sent (a rate against a rate, not against the clock:
    # on a loaded machine both fall together; the bench prints the figures).
    # (what is sent also holds the commits, acks and response.creates; a late reply falls past the window)
    assert gw["chunks_answered_s"] >= 0.5 * gw["msgs_in_s"] > 0, (gw["chunks_answered_s"], gw["msgs_in_s"])
    # Answers came back while the input streamed.
    assert gw["audio_out_s"] > 0 and gw["responses_s"] > 0, gw
    # The echo answers the messages it reads with 20 ms audio messages.
    assert echo["audio_out_s"] > 0
    # The bench gives a throughput ratio only for a run the client kept up with (send lag p99 within
    # 20 ms: bench/voice_load.py's healthy()); on a busy machine it says so and gives none.
    late = max(gw["lag_p99_ms"], echo["lag_p99_ms"]) > 20
    assert (figures["ratio"] is None and late) or figures["ratio"] > 0, (figures["ratio"], gw["lag_p99_ms"])


def _bench(tmp_path: Path, *extra: str) -> tuple[str, dict[str, dict[str, object]]]:
    out = tmp_path / "figures.json"
    cmd = [sys.executable, "bench/voice_load.py", "--duplex", "--sessions", str(N), "--duration", "3",
           "--warmup", "1", "--answer-s", "1", "--commit-ms", "500", "--no-idle", "--json", str(out)]  # fmt: skip
    run = subprocess.run([*cmd, *extra], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout, json.loads(out.read_text())


def _served_every_session(fig: dict[str, object]) -> None:
    assert fig["connected"] == N
    assert (fig["unanswered"], fig["errors"], fig["closed"]) == (0, 0, 0), fig["first_error"]
    # Answer audio came back (how much per second is the bench's figure to print, not a pass mark:
    # on a busy machine every rate falls).
    assert isinstance(fig["audio_out_s"], float) and fig["audio_out_s"] > 0


def test_with_redis_the_gateway_is_measured_on_both_stores_in_one_table(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("needs redis-server on PATH")
    stdout, figures = _bench(tmp_path, "--redis")
    memory, redis = figures["gateway"], figures["gateway+redis"]
    assert memory["store"] == "memory" and redis["store"] == "redis"
    for fig in (memory, redis):
        _served_every_session(fig)
    assert isinstance(redis["redis_cpu_pct"], float) and redis["redis_cpu_pct"] > 0  # its own redis-server
    assert memory["redis_cpu_pct"] == 0
    header = next(line for line in stdout.splitlines() if "gateway+redis" in line and "echo" in line)
    assert header.split()[:3] == ["gateway", "gateway+redis", "echo"]
    assert "of the memory store's" in stdout


def test_with_workers_every_worker_serves_and_is_counted(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("needs redis-server on PATH (workers share their sessions through Redis)")
    _, figures = _bench(tmp_path, "--workers", "2", "--only", "gateway")
    fig = figures["gateway+redis"]
    assert fig["workers"] == 2
    _served_every_session(fig)
    # The workers' CPU is counted, not only the supervisor's (which serves nothing and idles).
    assert isinstance(fig["server_cpu_pct"], float) and fig["server_cpu_pct"] > 5


def test_both_dialects_are_measured_in_one_run_beside_the_same_echo(tmp_path: Path) -> None:
    """``--dialect both``: the Realtime and the GPT-Live sessions of one gateway build, each
    served in full (every commentary answered, its audio paced out), and the report prints
    both dialects' sessions per core and added latency."""
    stdout, figures = _bench(tmp_path, "--dialect", "both")
    realtime, live = figures["gateway"], figures["live"]
    _served_every_session(realtime)
    _served_every_session(live)
    assert live["binary"] is False and live["samples"] > 0  # commentary -> its first audio, sampled
    assert live["responses_s"] > 0  # answers said back to back while the microphone streamed
    assert live["msgs_in_s"] > 0  # the microphone streamed (50 appends/s per session, as the machine lets it)
    assert isinstance(live["added_p50_ms"], float) and isinstance(realtime["added_p50_ms"], float)  # beside the echo
    for dialect, key in (("Realtime", "gateway"), ("GPT-Live", "live")):
        line = next(line for line in stdout.splitlines() if line.startswith(f"{dialect} ({key})"))
        assert "sessions per server core" in line and "latency the gateway adds" in line, line
    header = next(line for line in stdout.splitlines() if "sessions (connected)" in line)
    row = next(line for line in stdout.splitlines() if line.startswith("sessions per server core"))
    assert len(row.split()) == 4 + 3, (header, row)  # a figure (or "-": an unhealthy run) per column
