"""livekit-agents' OpenAI realtime model (livekit-plugins-openai, pointed at the
gateway by ``base_url``) holds a voice conversation on the CPU cascade: no error,
the user's speech transcribed and answered in speech. The client runs on its
own environment (clients_support)."""

from __future__ import annotations

from pathlib import Path

import pytest
from clients_support import run_client
from support.gateway import RunningGateway
from support.speech import silence, speak

pytestmark = pytest.mark.timeout(240)


async def test_livekit_holds_a_voice_conversation(gateway: RunningGateway, tmp_path: Path) -> None:
    speech = silence(300) + await speak("what is your name") + silence(300)
    report = await run_client("livekit_voice.py", tmp_path, url=gateway.url, speech=speech)
    assert report["errors"] == [] and report["log_errors"] == [], report
    assert report["transcripts"] and "what" in " ".join(report["transcripts"]).lower(), report
    assert any(a.lower().startswith("you said") for a in report["answers"]), report
    assert report["audio_bytes"] > 24000, report
