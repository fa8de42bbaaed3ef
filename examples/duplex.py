"""One spoken exchange in vLLM-Omni's duplex dialect (`/v1/realtime?duplex=1`), over a
plain WebSocket: open, set the input rate, send the speech, commit, read the answer,
then close the session for good (`session.close`, answered by `session.closed`).

The gateway: GATEWAY_URL (default ws://127.0.0.1:8000), its key if it needs one: GATEWAY_API_KEY.
"""

import asyncio
import base64
import json
import os
import wave
from pathlib import Path

from websockets.asyncio.client import connect

GATEWAY = os.environ.get("GATEWAY_URL", "ws://127.0.0.1:8000")
SPEECH = Path(__file__).with_name("what_is_your_name.wav")


async def main() -> None:
    with wave.open(str(SPEECH)) as wav:
        speech = wav.readframes(wav.getnframes())  # PCM16 mono, 24 kHz
    key = os.environ.get("GATEWAY_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else None
    async with connect(GATEWAY + "/v1/realtime?duplex=1&model=omni-cascade", additional_headers=headers) as ws:
        await ws.send(
            json.dumps({"type": "session.update", "session": {"sample_rate_hz": 24000, "turn_detection": None}})
        )
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(speech).decode()}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))  # the commit asks for the answer
        async for message in ws:
            event = json.loads(message)
            if event["type"] == "conversation.item.input_audio_transcription.completed":
                print("heard:", event["transcript"])
            elif event["type"] == "response.output_audio_transcript.done":
                print("answer:", event["transcript"])
            elif event["type"] == "error":
                raise SystemExit(f"error: {event['error']}")
            elif event["type"] == "response.done":
                await ws.send(json.dumps({"type": "session.close"}))
            elif event["type"] == "session.closed":
                print("closed:", event["reason"])
                break


asyncio.run(main())
