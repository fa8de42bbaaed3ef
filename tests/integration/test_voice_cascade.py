"""The embedded CPU voice cascade end to end, over real sockets against a real
uvicorn: silero VAD, pocketsphinx, the echo thinker and eSpeak NG, with speech
synthesized at test time. Nothing is mocked."""

from __future__ import annotations

import asyncio
import base64

import pytest
from support.gateway import Client, connect, run_gateway
from support.speech import chunks, silence, speak

from gateway.settings import Settings
from orchestrator.engine import Message
from orchestrator.engines.cascade import CascadeEngine
from orchestrator.engines.cascade.thinker import EchoThinker

pytestmark = pytest.mark.timeout(120)

SPOKEN = "what is your name"  # pocketsphinx hears "what" in every eSpeak rendering (40/40)


async def stream_audio(client: Client, pcm: bytes, *, realtime: bool = False) -> None:
    for chunk in chunks(pcm):
        await client.append(chunk)
        if realtime:
            await asyncio.sleep(0.02)


@pytest.fixture
async def gateway():
    async with run_gateway(Settings(engine="cascade")) as gw:
        yield gw


async def test_spoken_turn_with_server_vad_is_transcribed_and_answered_in_speech(gateway) -> None:
    speech = await speak(SPOKEN)
    async with connect(gateway.url + "?model=omni-cascade") as c:
        created = await c.wait_for("session.created")
        assert created["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
        await c.send(
            {
                "type": "session.update",
                "session": {"type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}},
            }
        )
        await c.wait_for("session.updated")
        await stream_audio(c, silence(400) + speech + silence(1200))
        started = await c.wait_for("input_audio_buffer.speech_started")
        stopped = await c.wait_for("input_audio_buffer.speech_stopped")
        assert started["item_id"] == stopped["item_id"]
        assert 0 <= started["audio_start_ms"] < stopped["audio_end_ms"]
        committed = await c.wait_for("input_audio_buffer.committed")
        assert committed["item_id"] == started["item_id"]
        done = await c.wait_for("response.done", timeout=60)
        assert done["response"]["status"] == "completed"
        types = c.types()
        completed = next(e for e in c.events if e["type"] == "conversation.item.input_audio_transcription.completed")
        heard = completed["transcript"]
        assert "what" in heard.lower(), heard
        audio = b"".join(base64.b64decode(e["delta"]) for e in c.events if e["type"] == "response.output_audio.delta")
        assert len(audio) > 24000 * 2 * 0.5  # at least half a second of speech came back
        transcript = next(e for e in c.events if e["type"] == "response.output_audio_transcript.done")["transcript"]
        assert transcript.lower().startswith("you said")
        assert types.index("response.created") < types.index("response.output_audio.delta")
        usage = done["response"]["usage"]
        assert usage["output_tokens"] > 0


async def test_manual_turn_commit_and_response_create(gateway) -> None:
    speech = await speak(SPOKEN)
    async with connect(gateway.url) as c:
        await c.wait_for("session.created")
        await c.send(
            {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}}
        )
        await c.wait_for("session.updated")
        await stream_audio(c, speech)
        await c.send({"type": "input_audio_buffer.commit"})
        await c.send({"type": "response.create"})
        done = await c.wait_for("response.done", timeout=60)
        assert done["response"]["status"] == "completed"
        assert "input_audio_buffer.speech_started" not in c.types()
        transcript = done["response"]["output"][0]["content"][0]["transcript"]
        assert transcript.lower().startswith("you said")
        assert len(transcript) > len("you said: ")  # the recognised words reached the thinker


async def test_text_turn_is_answered_in_audio_and_text(gateway) -> None:
    async with connect(gateway.url) as c:
        await c.wait_for("session.created")
        await c.send(
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "good morning"}],
                },
            }
        )
        await c.send({"type": "response.create"})
        done = await c.wait_for("response.done", timeout=60)
        assert done["response"]["output"][0]["content"][0]["transcript"] == "You said: good morning"
        assert any(e["type"] == "response.output_audio.delta" for e in c.events)
        await c.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
        done = await c.wait_for("response.done", timeout=60)
        assert done["response"]["output"][0]["content"][0]["type"] == "output_text"


class SlowEchoThinker:
    """The echo thinker, one word every 100 ms: a model that is still generating
    when the user barges in (eSpeak alone finishes long before a person speaks)."""

    description = "slow echo (test)"

    async def think(self, messages: tuple[Message, ...], instructions: str):  # type: ignore[no-untyped-def]
        async for word in EchoThinker().think(messages, instructions):
            await asyncio.sleep(0.1)
            yield word


async def test_barge_in_cancels_the_answer_and_truncate_trims_it_to_what_was_played() -> None:
    long_text = " ".join(["the quick brown fox jumps over the lazy dog."] * 6)
    speech = await speak(SPOKEN)
    engine = CascadeEngine(thinker=SlowEchoThinker())
    async with run_gateway(Settings(engine="cascade"), engine=engine) as gateway, connect(gateway.url) as c:
        await c.wait_for("session.created")
        await c.send(
            {
                "type": "conversation.item.create",
                "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": long_text}]},
            }
        )
        await c.send({"type": "response.create"})
        first = await c.wait_for("response.output_audio.delta", timeout=60)
        item_id = first["item_id"]
        # The user talks over the answer.
        await stream_audio(c, silence(200) + speech + silence(1000))
        started = await c.wait_for("input_audio_buffer.speech_started")
        done = await c.wait_for("response.done")
        assert done["response"]["status"] == "cancelled"
        assert done["response"]["status_details"]["reason"] == "turn_detected"
        types = c.types()
        assert types.index("input_audio_buffer.speech_started") < types.index("response.done")
        assert started["item_id"] != item_id
        # The client played part of what it received (at most 500 ms) before it stopped playback.
        received = sum(
            len(base64.b64decode(e["delta"]))
            for e in c.events
            if e["type"] == "response.output_audio.delta" and e["item_id"] == item_id
        )
        played_ms = min(500, received // 48 - 1)  # 48 bytes per ms of 24 kHz PCM16
        await c.send(
            {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": played_ms}
        )
        truncated = await c.wait_for(lambda e: e["type"] in ("conversation.item.truncated", "error"))
        assert truncated["type"] == "conversation.item.truncated", truncated
        assert truncated["audio_end_ms"] == played_ms
        await c.send({"type": "conversation.item.retrieve", "item_id": item_id})
        item = (await c.wait_for("conversation.item.retrieved"))["item"]
        kept = item["content"][0]["transcript"]
        assert len(kept) < len("You said: " + long_text)
        # The next turn (the barge-in speech) is answered.
        second = await c.wait_for("response.done", timeout=60)
        assert second["response"]["status"] == "completed"


async def test_client_disconnect_mid_response_aborts_the_engine_request(gateway) -> None:
    long_text = " ".join(["one two three four five six seven eight nine ten"] * 5)
    async with connect(gateway.url) as c:
        await c.wait_for("session.created")
        await c.send(
            {
                "type": "conversation.item.create",
                "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": long_text}]},
            }
        )
        await c.send({"type": "response.create"})
        await c.wait_for("response.output_audio.delta", timeout=60)
    orch = gateway.runtime.orchestrator
    for _ in range(200):
        if orch.pending == 0 and not orch._aborts:
            break
        await asyncio.sleep(0.05)
    assert orch.pending == 0
    assert gateway.runtime.connections == set()
