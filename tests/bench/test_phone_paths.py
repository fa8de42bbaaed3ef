"""The phone paths bench runs its three paths in one run and measures what it says (N=2, short windows).

This proves the bench, not the gateway's speed: figures on a shared CI machine mean nothing,
so nothing here is timed. What must hold at any speed: every path carries the N calls, the
gateway's CPU is read on each, turns are answered on each (so the latency each path adds
over the WebSocket baseline is computed), the media stream's latency trials are sampled,
and the table names the three paths.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
N = 2
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("av") is None or shutil.which("sipp") is None,
    reason="the SIP path needs sipp (apt install sip-tester) and the webrtc extra's av",
)


def test_the_three_paths_carry_the_same_calls_and_their_turns_are_timed(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    # A 3 s turn cycle, the calls half a cycle apart, a 7 s window: every caller speaks twice in it.
    cmd = [sys.executable, "bench/phone_paths.py", "--calls", str(N), "--window-s", "7", "--cycle-s", "3",
           "--latency-trials", "2", "--json", str(out)]  # fmt: skip
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    for row in ("| WebSocket, μ-law 8 kHz (baseline) |", "| SIP (sipp, RTP μ-law 8 kHz) |", "| media stream (twilio"):
        assert row in run.stdout, run.stdout
    figures = json.loads(out.read_text())
    ws, sip, stream = figures["websocket"], figures["sip"], figures["media_stream"]
    assert ws["errors"] == [], ws
    assert sip["sipp_rc"] == 0, sip
    assert stream["load"]["connected"] == N, stream
    for path in (ws, sip, stream["load"]):
        assert path["calls"] == N and path["gateway_cores"] > 0 and math.isfinite(path["calls_per_core"]), path
        assert path["turn_latency_ms"]["n"] > 0 and path["turn_latency_ms"]["p50"] > 0, path
    assert stream["latency"]["phone_ms"]["n"] == 2, stream
