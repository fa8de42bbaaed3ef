"""An unmodified OpenAI client (the official ``openai`` Python SDK, GA realtime
API) holds a spoken conversation with the gateway: only its base URL changes.
Every event it receives validates strictly against the SDK's own models."""

from __future__ import annotations

import base64

import orjson
import pytest
from support.gateway import run_gateway
from support.sdk_shapes import check_event
from support.speech import chunks, silence, speak

from gateway.settings import Settings

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.timeout(120)


async def test_openai_sdk_holds_a_spoken_conversation() -> None:
    speech = await speak("what is your name")
    async with run_gateway(Settings(engine="cascade", api_keys=("sk-test",))) as gw:
        client = openai.AsyncOpenAI(api_key="sk-test", websocket_base_url=f"ws://127.0.0.1:{gw.port}/v1")
        async with client.realtime.connect(model="omni-cascade") as conn:
            await conn.session.update(
                session={
                    "type": "realtime",
                    "output_modalities": ["audio"],
                    "audio": {
                        "input": {
                            "format": {"type": "audio/pcm", "rate": 24000},
                            "transcription": {"model": "gpt-4o-mini-transcribe"},
                            "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
                        },
                        "output": {"voice": "marin", "format": {"type": "audio/pcm", "rate": 24000}},
                    },
                }
            )
            for chunk in chunks(silence(300) + speech + silence(1200)):
                await conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
            seen: list[str] = []
            audio = bytearray()
            transcript = ""
            heard = ""
            while True:
                raw = await conn.recv_bytes()
                check_event(orjson.loads(raw))  # no validation error: strictly the SDK's shapes
                event = conn.parse_event(raw)
                seen.append(event.type)
                if event.type == "response.output_audio.delta":
                    audio += base64.b64decode(event.delta)
                elif event.type == "conversation.item.input_audio_transcription.completed":
                    heard = event.transcript
                elif event.type == "response.output_audio_transcript.done":
                    transcript = event.transcript
                elif event.type == "error":
                    pytest.fail(f"error event: {event}")
                elif event.type == "response.done":
                    assert event.response.status == "completed"
                    break
        assert seen[0] == "session.created"
        assert "session.updated" in seen
        assert "input_audio_buffer.speech_started" in seen
        assert "input_audio_buffer.committed" in seen
        assert heard.strip()
        assert transcript.startswith("You said:")
        assert len(audio) > 24000  # half a second of PCM16 at 24 kHz
