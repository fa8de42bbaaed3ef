"""The official ``openai`` SDK's GPT-Live client (``client.live``), unmodified, holds a
spoken conversation with the gateway on its embedded default (the CPU cascade: the
speech is recognised, the echo thinker answers, eSpeak NG speaks): only its base URL
changes. Every event it receives validates strictly against ``openai.types.live``."""

from __future__ import annotations

import base64

import orjson
import pytest
from support.gateway import run_gateway
from support.sdk_shapes import check_live_event
from support.speech import chunks, silence, speak

from gateway.settings import Settings

openai = pytest.importorskip("openai")
pytest.importorskip("openai.types.live")
pytestmark = pytest.mark.timeout(120)


async def test_the_official_sdk_holds_a_spoken_live_conversation() -> None:
    speech = await speak("what is your name")
    async with run_gateway(Settings(engine="cascade", api_keys=("sk-test",))) as gw:
        client = openai.AsyncOpenAI(api_key="sk-test", websocket_base_url=f"ws://127.0.0.1:{gw.port}/v1")
        async with client.live.connect() as conn:
            await conn.session.start(
                session={
                    "model": "gpt-live-1",
                    "instructions": "Answer briefly.",
                    "audio": {"output": {"voice": "marin"}},
                }
            )
            started = conn.parse_event(await conn.recv_bytes())
            assert started.type == "session.started" and started.session.id.startswith("live_")
            assert started.session.audio is not None and started.session.audio.output is not None
            assert started.session.audio.output.voice == "marin"
            for chunk in chunks(silence(300) + speech + silence(1200)):
                await conn.session.input_audio.append(audio=base64.b64encode(chunk).decode())
            heard, said, audio = "", "", bytearray()
            while not (heard and said.endswith(heard.strip()) and len(audio) > 24000):
                raw = await conn.recv_bytes()
                check_live_event(orjson.loads(raw))  # strictly the SDK's shapes
                event = conn.parse_event(raw)
                assert event.type != "error", event
                if event.type == "session.input_transcript.delta":
                    heard += event.delta
                elif event.type == "session.output_transcript.delta":
                    said += event.delta
                elif event.type == "session.output_audio.delta":
                    audio += base64.b64decode(event.delta)
            assert heard.strip()  # recognised speech (pocketsphinx: not always the very words)
            assert said == f"You said: {heard.strip()}"  # the echo thinker repeats what it heard
            await conn.session.close()
            while True:
                event = conn.parse_event(await conn.recv_bytes())
                if event.type == "session.closed":
                    break
            assert event.reason == "close_requested" and event.usage.seconds >= 1
