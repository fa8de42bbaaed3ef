"""livekit-agents' OpenAI realtime model (``livekit.plugins.openai.realtime``)
holds a voice conversation with the gateway, used on its own (no LiveKit room:
its ``RealtimeSession`` fed ``rtc.AudioFrame``s as an ``AgentSession`` would).
Run on ``.venv-clients``'s python by tests/clients/test_livekit_client.py.
Writes a JSON report to ``--out``: errors (its ``error`` events and ERROR log
records), the transcript of what was said, the answers and their audio.

    python livekit_voice.py --url ws://127.0.0.1:PORT/v1/realtime --speech in.pcm --out report.json
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import client_script  # this directory's shared command line (tests/clients/client_script.py)
from livekit import rtc
from livekit.plugins.openai.realtime import RealtimeModel

RATE = 24000
SAMPLES = RATE * 20 // 1000  # 20 ms frames


async def main(report: dict[str, Any], url: str, speech: bytes, timeout: float) -> None:
    base = url.replace("ws://", "http://").rsplit("/realtime", 1)[0]  # it wants the API's base URL
    model = RealtimeModel(base_url=base, api_key="sk-test")
    session = model.session()
    answered = asyncio.Event()

    async def generation(ev: Any) -> None:
        async for message in ev.message_stream:
            text = ""

            async def read_text(stream: Any) -> None:
                nonlocal text
                async for piece in stream:
                    text += str(piece)

            reader = asyncio.create_task(read_text(message.text_stream))
            async for frame in message.audio_stream:
                report["audio_bytes"] += len(bytes(frame.data))
            await reader
            report["answers"].append(text)
            if report["transcripts"]:
                answered.set()

    session.on("generation_created", lambda ev: asyncio.create_task(generation(ev)))
    session.on("input_audio_transcription_completed", lambda ev: report["transcripts"].append(ev.transcript))
    session.on("error", lambda ev: report["errors"].append(str(getattr(ev, "error", ev))[:2000]))

    async def talk() -> None:
        step = SAMPLES * 2
        for i in range(0, len(speech), step):
            chunk = speech[i : i + step].ljust(step, b"\0")
            session.push_audio(rtc.AudioFrame(chunk, RATE, 1, SAMPLES))
            await asyncio.sleep(0.02)
        while True:  # the microphone goes on, silent
            session.push_audio(rtc.AudioFrame(bytes(step), RATE, 1, SAMPLES))
            await asyncio.sleep(0.02)

    talker = asyncio.create_task(talk())
    try:
        await asyncio.wait_for(answered.wait(), timeout)
    except TimeoutError:
        report["errors"].append("timed out waiting for the answer to what was said")
    finally:
        talker.cancel()
        await session.aclose()
        await model.aclose()


if __name__ == "__main__":
    report: dict[str, Any] = {"errors": [], "transcripts": [], "answers": [], "audio_bytes": 0}
    client_script.run(main, report, log=logging.getLogger())
