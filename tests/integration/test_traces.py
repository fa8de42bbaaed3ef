"""OpenTelemetry traces of a real cascade voice turn (silero VAD, pocketsphinx, the
echo thinker, eSpeak NG over a real socket), caught by the SDK's in-memory exporter:
the spans exist, nest, carry the session and the principal, and a turn's five
phases add up to the turn. And with tracing off nothing is traced or imported."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys

import pytest
from support.gateway import Client, connect, run_gateway
from support.speech import chunks, silence, speak

from gateway.auth import principal_of_key
from gateway.settings import Settings
from gateway.telemetry import PHASES, Telemetry

pytest.importorskip("opentelemetry.sdk", reason="the otel extra")
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

pytestmark = pytest.mark.timeout(120)

KEY = "sk-traces"
TRANSCRIBE = {"type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}}


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def spoken_turn(c: Client) -> dict:
    await c.wait_for("session.created")
    await c.send({"type": "session.update", "session": TRANSCRIBE})
    await c.wait_for("session.updated")
    for chunk in chunks(silence(400) + await speak("what is your name") + silence(1200)):
        await c.append(chunk)
        await asyncio.sleep(0.02)  # a microphone's pace: the VAD phase is the real silence wait
    return await c.wait_for("response.done", timeout=60)


async def test_a_voice_turn_is_traced_in_nested_spans_whose_phases_add_up() -> None:
    exporter = InMemorySpanExporter()
    telemetry = Telemetry.with_processor(SimpleSpanProcessor(exporter), "omni-test", "r-traces")
    settings = Settings(engine="cascade", api_keys=(KEY,), video_engine="none")
    async with run_gateway(settings, telemetry=telemetry) as gw:
        async with connect(gw.url, headers={"Authorization": f"Bearer {KEY}"}) as c:
            done = await spoken_turn(c)
            assert done["response"]["status"] == "completed"
            sid = c.events[0]["session"]["id"]
        for _ in range(100):  # the session span ends when the host does (after the socket closes)
            if by_name(exporter.get_finished_spans(), "session"):
                break
            await asyncio.sleep(0.05)
    spans = exporter.get_finished_spans()

    (session,) = by_name(spans, "session")
    assert session.parent is None  # a trace of its own
    assert session.attributes["omni.session_id"] == sid
    assert session.attributes["omni.principal"] == principal_of_key(KEY)  # hashed, never the key
    assert KEY not in str([dict(s.attributes or {}) for s in spans])
    assert session.resource.attributes["service.name"] == "omni-test"

    (turn,) = by_name(spans, "turn")
    assert parent_of(turn) == session.context.span_id
    assert turn.attributes["omni.outcome"] == "audio"
    assert turn.attributes["omni.session_id"] == sid and turn.attributes["omni.principal"] == principal_of_key(KEY)
    assert turn.attributes["omni.response_id"] == done["response"]["id"]
    phases = [s for s in spans if s.name.startswith("turn.")]
    assert [p.name for p in sorted(phases, key=lambda s: s.start_time)] == list(PHASES)
    assert all(parent_of(p) == turn.context.span_id for p in phases)
    # Contiguous, inside the turn, adding up to it exactly.
    ordered = sorted(phases, key=lambda s: s.start_time)
    assert ordered[0].start_time == turn.start_time and ordered[-1].end_time == turn.end_time
    for before, after in itertools.pairwise(ordered):
        assert before.end_time == after.start_time
    durations = {p.name: p.end_time - p.start_time for p in phases}
    assert sum(durations.values()) == turn.end_time - turn.start_time
    # Each phase is real work here: the VAD waits for the silence (500 ms by default, at the
    # microphone's pace), pocketsphinx finishes the utterance, eSpeak synthesises a sentence.
    assert durations["turn.vad"] >= 0.3e9, durations
    assert durations["turn.transcription"] > 0 and durations["turn.synthesis"] > 0, durations
    assert turn.end_time - turn.start_time < 20e9, durations

    requests = by_name(spans, "engine.transcription") + by_name(spans, "engine.response")
    assert {s.name for s in requests} == {"engine.transcription", "engine.response"}
    for s in requests:
        assert parent_of(s) == session.context.span_id
        assert session.start_time <= s.start_time <= s.end_time <= session.end_time
        assert s.attributes["omni.session_id"] == sid and s.attributes["omni.principal"] == principal_of_key(KEY)
        assert s.attributes["omni.status"] == "completed" and s.attributes["omni.outputs"] > 0
        assert s.attributes["omni.engine"] == "cascade"
    (response,) = by_name(spans, "engine.response")
    assert response.attributes["omni.request_id"] == done["response"]["id"]
    assert session.start_time <= turn.start_time <= turn.end_time <= session.end_time


async def test_sessions_not_sampled_are_not_traced() -> None:
    exporter = InMemorySpanExporter()
    telemetry = Telemetry.with_processor(SimpleSpanProcessor(exporter), "omni-test", "r", sample_ratio=0.0)
    async with run_gateway(Settings(engine="passthrough", video_engine="none"), telemetry=telemetry) as gw:
        async with connect(gw.url) as c:
            await c.wait_for("session.created")
            host = next(iter(gw.runtime.hosts.values()))
            assert host.trace is None  # the hot path sees what tracing off gives it
    assert exporter.get_finished_spans() == ()


def test_tracing_off_imports_no_opentelemetry() -> None:
    code = (
        "import sys; from gateway.app import create_app; from gateway.settings import Settings; "
        "app = create_app(Settings(engine='passthrough', video_engine='none'), vad_factory=None); "
        "assert app.state.runtime.telemetry is None; "
        "print([m for m in sys.modules if m.startswith('opentelemetry')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
