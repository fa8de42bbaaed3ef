"""The WebRTC calls bench runs and measures what it says (N=2, a few seconds of each phase).

This proves the bench, not the gateway's speed: figures on a shared CI machine mean nothing,
so nothing here is timed. What must hold at any speed: every call connects (offer posted,
ICE, DTLS and the data channel up, ``session.created``), audio flows both ways (the gateway
hears the caller's turns, and its answer track carries sound), the CPU is read, and the
latency phase gets samples of both legs over both transports.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
N = 2
pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("aiortc", "pocketsphinx", "httpx")),
    reason="needs the webrtc and cpu extras and httpx (dev)",
)


def test_calls_connect_and_audio_flows_both_ways_on_the_default_gateway(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    # A 5 s turn cycle, the calls half a cycle apart: every call speaks within the first 3 s.
    cmd = [sys.executable, "bench/webrtc_calls.py", "--engine", "cascade", "--calls", str(N), "--cycle-s", "5",
           "--warmup", "1", "--duration", "8", "--latency-s", "7", "--latency-calls", "1",
           "--json", str(out)]  # fmt: skip
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "calls per core" in run.stdout and "WebRTC - WebSocket (p50)" in run.stdout
    figures = json.loads(out.read_text())

    (load,) = figures["load"]
    assert load["engine"] == "cascade" and load["connected"] == N, load
    assert load["errors"] == 0, load["first_error"]
    assert load["turns_heard"] >= 1 and load["answers"] >= 1  # the gateway heard a caller, and answered
    # The answer tracks carried frames. (Whether an answer's sound fell inside the load window
    # depends on the machine's speed; the latency phase below proves sound comes back.)
    assert load["frames"] > 0
    assert load["gateway_cores"] > 0 and math.isfinite(load["calls_per_core"])
    # (What the echo thinker said inside the load window depends on the machine's speed, as its
    # sound does; the latency phase below holds that answers come back.)

    lat = figures["latency"]
    assert lat["connected"] == 1 and lat["errors"] == 0
    for path in ("websocket", "webrtc"):
        for leg in ("in_ms", "out_ms"):
            stats = lat[f"{path}_{leg}"]
            assert stats["n"] >= 1, (path, leg, lat)
            assert 0 < stats["p50"] <= stats["max"]
    assert lat["webrtc_started_ms"]["n"] >= 1
