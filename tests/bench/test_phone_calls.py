"""The phone calls bench runs and measures what it says (N=2, a few seconds of each phase).

This proves the bench, not the gateway's speed: figures on a shared machine mean nothing, so
nothing here is timed. What must hold at any speed: every call connects and is answered
(answer audio heard, marks echoed), the gateway's CPU is read, and the latency phase gets
samples of the three paths.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# (Twilio's media stream is measured by tests/bench/test_phone_paths.py, beside SIP and a WebSocket.)
@pytest.mark.parametrize("carrier", ["vonage", "exotel", "plivo-l16"])
def test_calls_are_answered_and_the_latency_of_each_path_is_sampled(carrier: str, tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    cmd = [sys.executable, "bench/phone_calls.py", "--carrier", carrier, "--calls", "2", "--duration", "6",
           "--warmup", "3", "--cycle-s", "4", "--latency-trials", "3", "--json", str(out)]  # fmt: skip
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "calls per core" in run.stdout and "the bridge adds" in run.stdout
    figures = json.loads(out.read_text())
    load = figures["load"]
    assert load["calls"] == 2 and load["connected"] == 2, load
    assert load["answer_audio_heard_s"] > 0 and load["marks_echoed"] > 0
    assert load["gateway_cores"] > 0 and math.isfinite(load["calls_per_core"])
    lat = figures["latency"]
    for path in ("websocket_pcm_ms", "websocket_mulaw_ms", "phone_ms"):
        assert lat[path]["n"] == 3 and 0 < lat[path]["p50"] <= lat[path]["max"], lat
