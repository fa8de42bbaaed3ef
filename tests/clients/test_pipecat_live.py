"""pipecat's GPT-Live service (``OpenAILiveLLMService`` with ``base_url``, its defaults
unchanged) holds a spoken conversation with the gateway on the embedded default, the CPU
cascade: no error frame, no error logged, no event it could not parse, the user's speech
transcribed, and the answer's transcript and audio back. The client runs on its own
environment (clients_support)."""

from __future__ import annotations

from pathlib import Path

import pytest
from clients_support import run_client
from support.gateway import RunningGateway
from support.speech import silence, speak

pytestmark = pytest.mark.timeout(240)


async def test_pipecat_live_holds_a_spoken_conversation(gateway: RunningGateway, tmp_path: Path) -> None:
    speech = silence(300) + await speak("what is your name") + silence(300)
    url = f"ws://127.0.0.1:{gateway.port}/v1/live/sessions"
    report = await run_client("pipecat_live.py", tmp_path, url=url, speech=speech)
    assert report["errors"] == [] and report["log_errors"] == [], report
    assert report["session_id"].startswith("live_"), report
    heard = " ".join(report["transcripts"]).strip()
    assert "what" in heard.lower(), report
    # The cascade's echo thinker says what it heard: the answer is to what was said.
    assert report["said"].startswith("You said:") and heard.split()[0].lower() in report["said"].lower(), report
    assert report["answers"] >= 1 and report["audio_bytes"] > 24000, report
