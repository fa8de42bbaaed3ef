"""LiveKit Agents' GPT-Live model (``livekit.plugins.openai.realtime.GPTLiveModel``) holds a
spoken conversation with the gateway's ``/v1/live/sessions``, used on its own (no LiveKit
room): its ``GPTLiveSession`` configured as an ``AgentSession``'s adapter configures it
(``_update_session``: instructions, no tools) and fed ``rtc.AudioFrame``s. Run on
``.venv-clients``'s python by tests/clients/test_livekit_live.py. Writes a JSON report to
``--out``: errors (its ``error`` events and ERROR log records), what the model heard (its
final input transcripts), what it said (output transcript deltas) and its audio.

    python livekit_live.py --url http://127.0.0.1:PORT/v1 --speech in.pcm --out report.json
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import client_script  # this directory's shared command line (tests/clients/client_script.py)
from livekit import rtc
from livekit.plugins.openai.realtime import GPTLiveModel

RATE = 24000
SAMPLES = RATE * 20 // 1000  # 20 ms frames


async def main(report: dict[str, Any], url: str, speech: bytes, timeout: float) -> None:
    # Its defaults, but for delegation: "responses" (the default) needs a Responses backend the
    # gateway's operator configures (live_responses_url); the gateway refuses it without one.
    model = GPTLiveModel(base_url=url, api_key="sk-test", delegation="client")
    warnings = client_script.ErrorRecords()  # an event it could not handle is only a warning there
    warnings.setLevel(logging.WARNING)
    logging.getLogger("livekit.agents").addHandler(warnings)
    session = model.session()
    answered = asyncio.Event()

    def check() -> None:  # what was said heard, and an answer said with its audio
        if report["transcripts"] and report["said"].strip() and report["audio_bytes"] > 24000:
            answered.set()

    def heard(ev: Any) -> None:
        if ev.is_final:
            report["transcripts"].append(ev.transcript)
            check()

    def said(ev: Any) -> None:
        report["said"] += ev.text
        check()

    session.on("input_audio_transcription_completed", heard)
    session.on("transcript_delta", said)
    session.on("error", lambda ev: report["errors"].append(str(getattr(ev, "error", ev))[:2000]))

    async def listen() -> None:
        async for frame in session.audio_stream:
            report["audio_bytes"] += len(bytes(frame.frame.data))
            check()

    async def talk() -> None:
        step = SAMPLES * 2
        for i in range(0, len(speech), step):
            chunk = speech[i : i + step].ljust(step, b"\0")
            session.push_audio(rtc.AudioFrame(chunk, RATE, 1, SAMPLES))
            await asyncio.sleep(0.02)
        while True:  # the microphone goes on, silent
            session.push_audio(rtc.AudioFrame(bytes(step), RATE, 1, SAMPLES))
            await asyncio.sleep(0.02)

    # What AgentSession's adapter does first: the whole configuration, which releases session.start.
    await session._update_session(instructions="Answer briefly.", tools=[])
    tasks = [asyncio.create_task(listen()), asyncio.create_task(talk())]
    try:
        await asyncio.wait_for(answered.wait(), timeout)
        await asyncio.sleep(1.0)  # the rest of the answer's transcript, then a clean close
    except TimeoutError:
        report["errors"].append("timed out waiting for the answer to what was said")
    finally:
        tasks[1].cancel()
        await session.aclose()
        tasks[0].cancel()
        await model.aclose()
        report["session_id"] = session.session_id or ""
        report["warnings"] = warnings.messages


if __name__ == "__main__":
    report: dict[str, Any] = {"errors": [], "transcripts": [], "said": "", "audio_bytes": 0}
    client_script.run(main, report, log=logging.getLogger())
