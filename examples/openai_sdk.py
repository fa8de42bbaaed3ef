"""One spoken exchange with the gateway through OpenAI's official Python SDK.

Sends examples/what_is_your_name.wav (PCM16 mono, 24 kHz) and prints what the
gateway heard and what it answered; on the embedded default engine the answer is
"You said: " and the transcript. Needs `pip install openai`.

The gateway: GATEWAY_URL (default ws://127.0.0.1:8000), its key if it needs one: GATEWAY_API_KEY.
"""

import asyncio
import base64
import os
import wave
from pathlib import Path

from openai import AsyncOpenAI

GATEWAY = os.environ.get("GATEWAY_URL", "ws://127.0.0.1:8000")
SPEECH = Path(__file__).with_name("what_is_your_name.wav")


async def main() -> None:
    client = AsyncOpenAI(api_key=os.environ.get("GATEWAY_API_KEY", "none"), websocket_base_url=GATEWAY + "/v1")
    async with client.realtime.connect(model="omni-cascade") as conn:
        await conn.session.update(
            session={"type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}}
        )
        with wave.open(str(SPEECH)) as wav:
            speech = wav.readframes(wav.getnframes())
        # Server VAD ends a turn after a pause; a file has none, so send a second of silence after it.
        audio = speech + bytes(2 * 24000)
        for start in range(0, len(audio), 4800):  # 100 ms a message, as a microphone would stream
            await conn.input_audio_buffer.append(audio=base64.b64encode(audio[start : start + 4800]).decode())

        async for event in conn:
            if event.type == "conversation.item.input_audio_transcription.completed":
                print("heard:", event.transcript)
            elif event.type == "response.output_audio_transcript.done":
                print("answer:", event.transcript)
            elif event.type == "error":
                raise SystemExit(f"error: {event.error.code}: {event.error.message}")
            elif event.type == "response.done":
                break


asyncio.run(main())
