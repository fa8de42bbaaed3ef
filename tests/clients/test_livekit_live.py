"""LiveKit Agents' GPT-Live model (livekit-plugins-openai's ``GPTLiveModel``, pointed at the
gateway by ``base_url``) holds a spoken conversation on the embedded default, the CPU
cascade: no error, the user's speech transcribed, and the answer's transcript and audio
back. The client runs on its own environment (clients_support)."""

from __future__ import annotations

from pathlib import Path

import pytest
from clients_support import run_client
from support.gateway import RunningGateway
from support.speech import silence, speak

pytestmark = pytest.mark.timeout(240)


async def test_livekit_gpt_live_holds_a_spoken_conversation(gateway: RunningGateway, tmp_path: Path) -> None:
    speech = silence(300) + await speak("what is your name") + silence(300)
    report = await run_client("livekit_live.py", tmp_path, url=gateway.http + "/v1", speech=speech)
    assert report["errors"] == [] and report["log_errors"] == [], report
    assert not [w for w in report["warnings"] if "failed to handle" in w], report  # every event it read
    assert report["session_id"].startswith("live_"), report
    heard = " ".join(report["transcripts"]).strip()
    assert "what" in heard.lower(), report
    # The cascade's echo thinker says what it heard: the answer is to what was said.
    assert report["said"].startswith("You said:") and heard.split()[0].lower() in report["said"].lower(), report
    assert report["audio_bytes"] > 24000, report
