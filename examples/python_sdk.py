"""One spoken exchange through the gateway's own Python SDK (`omni_gateway_client`), turn by hand.

The SDK keeps the session through dropped sockets and replica restarts (it
reconnects and resumes); audio travels as binary frames (`binary=True`). With
turn detection off, the client ends its turn itself: commit, then ask for the
answer. Prints what the gateway heard, what it answered and how much audio came.

The gateway: GATEWAY_URL (default ws://127.0.0.1:8000), its key if it needs one: GATEWAY_API_KEY.
"""

import asyncio
import os
import wave
from pathlib import Path

from omni_gateway_client import RealtimeClient

GATEWAY = os.environ.get("GATEWAY_URL", "ws://127.0.0.1:8000")
SPEECH = Path(__file__).with_name("what_is_your_name.wav")


async def main() -> None:
    with wave.open(str(SPEECH)) as wav:
        speech = wav.readframes(wav.getnframes())  # PCM16 mono, 24 kHz
    async with RealtimeClient(
        GATEWAY + "/v1/realtime", model="omni-cascade", api_key=os.environ.get("GATEWAY_API_KEY"), binary=True
    ) as rt:
        await rt.session_update(
            {"type": "realtime", "audio": {"input": {"turn_detection": None, "transcription": {"model": "any"}}}}
        )
        await rt.append_audio(speech)
        await rt.commit()
        await rt.create_response()
        answer_audio = 0
        async for event in rt:  # dicts; an audio delta's "delta" is bytes
            if event["type"] == "conversation.item.input_audio_transcription.completed":
                print("heard:", event["transcript"])
            elif event["type"] == "response.output_audio.delta":
                answer_audio += len(event["delta"])
            elif event["type"] == "response.output_audio_transcript.done":
                print("answer:", event["transcript"])
            elif event["type"] == "error":
                raise SystemExit(f"error: {event['error']['code']}: {event['error']['message']}")
            elif event["type"] == "response.done":
                print(f"answer audio: {answer_audio / 48000:.1f} s")
                break


asyncio.run(main())
