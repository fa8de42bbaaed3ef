"""pipecat's realtime service (``OpenAIRealtimeLLMService`` with ``base_url``, its
defaults unchanged) holds a voice conversation with the gateway on the CPU
cascade: no error frame, no error logged, the user's speech transcribed and
answered in speech. The client runs on its own environment (clients_support)."""

from __future__ import annotations

from pathlib import Path

import pytest
from clients_support import run_client
from support.gateway import RunningGateway
from support.speech import silence, speak

pytestmark = pytest.mark.timeout(240)


async def test_pipecat_holds_a_voice_conversation(gateway: RunningGateway, tmp_path: Path) -> None:
    speech = silence(300) + await speak("what is your name") + silence(300)
    report = await run_client("pipecat_voice.py", tmp_path, url=gateway.url, speech=speech)
    assert report["errors"] == [] and report["log_errors"] == [], report
    assert report["transcripts"] and "what" in " ".join(report["transcripts"]).lower(), report
    assert report["answers"] >= 1 and report["audio_bytes"] > 24000, report
