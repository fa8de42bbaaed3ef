"""A spoken turn over a WebRTC call on the embedded default engine (the CPU cascade:
silero VAD, pocketsphinx, the echo thinker, eSpeak NG), traced: the caller's speech is
heard (its transcript on the data channel), the answer plays on the track, and the
turn's trace ends when the answer's first audio left on the track, as it ends on a
socket when the first audio delta is written."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support.gateway import run_gateway
from support.serve import webrtc_turn

from gateway.settings import Settings
from gateway.telemetry import Telemetry

pytestmark = pytest.mark.timeout(180)


async def test_a_spoken_turn_over_a_call_is_heard_answered_and_traced(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    telemetry = Telemetry.with_processor(SimpleSpanProcessor(exporter), "omni-test", "r-webrtc")
    async with run_gateway(Settings(video_engine="none"), telemetry=telemetry) as gw:
        heard, done, loud = await webrtc_turn(gw.http, "what is your name", tmp_path)
        assert heard.strip(), "the cascade heard nothing over the call"
        assert done["response"]["status"] == "completed" and loud > 25
        for _ in range(200):  # the turn span ends as the first answer audio leaves on the track
            if [s for s in exporter.get_finished_spans() if s.name == "turn"]:
                break
            await asyncio.sleep(0.05)
    (turn,) = [s for s in exporter.get_finished_spans() if s.name == "turn"]
    assert turn.attributes is not None and turn.attributes["omni.outcome"] == "audio"
    assert turn.attributes["omni.response_id"] == done["response"]["id"]
