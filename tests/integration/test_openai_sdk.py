"""An unmodified OpenAI client (the official ``openai`` Python SDK, GA realtime
API) holds a spoken conversation with the gateway: only its base URL changes.
Every event it receives validates strictly against the SDK's own models."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest
from support.gateway import run_gateway
from support.images import SeeingPassthrough, data_url, png
from support.sdk_shapes import check_event
from support.speech import chunks, silence, speak

from gateway.settings import Settings
from orchestrator.engines.remote import RemoteEngine

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
            heard_deltas: list[str] = []
            while True:
                raw = await conn.recv_bytes()
                check_event(orjson.loads(raw))  # no validation error: strictly the SDK's shapes
                event = conn.parse_event(raw)
                seen.append(event.type)
                if event.type == "response.output_audio.delta":
                    audio += base64.b64decode(event.delta)
                elif event.type == "conversation.item.input_audio_transcription.delta":
                    heard_deltas.append(event.delta or "")
                elif event.type == "conversation.item.input_audio_transcription.completed":
                    heard = event.transcript
                elif event.type == "response.output_audio_transcript.done":
                    transcript = event.transcript
                elif event.type == "error":
                    pytest.fail(f"error event: {event}")
                elif event.type == "response.done":
                    assert event.response.status == "completed"
                    break
        assert seen[:2] == ["session.created", "conversation.created"]  # as the SDK documents
        assert "session.updated" in seen
        assert "input_audio_buffer.speech_started" in seen
        assert "input_audio_buffer.committed" in seen
        assert heard.strip()
        assert "".join(heard_deltas) == heard  # the deltas add up to the transcript, as the API's do
        assert transcript.startswith("You said:")
        assert len(audio) > 24000  # half a second of PCM16 at 24 kHz


async def test_openai_sdk_sends_an_image_to_a_model_that_takes_images_through_a_remote_upstream() -> None:
    """The SDK's input_image part crosses a gateway whose remote engine relays it to an
    upstream gateway, whose engine gets the very image (the engine there records what it is
    given: no vision model runs on this CPU). A model that takes no images refuses the part."""
    seeing = SeeingPassthrough()
    picture = png(4, 3, (10, 200, 30))
    async with run_gateway(Settings(engine="cascade", video_engine="none"), engine=seeing, vad_factory=None) as up:
        remote = RemoteEngine([up.http])
        settings = Settings(model="vision-remote", api_keys=("sk-test",), video_engine="none")
        async with run_gateway(settings, engine=remote) as gw:
            client = openai.AsyncOpenAI(api_key="sk-test", websocket_base_url=f"ws://127.0.0.1:{gw.port}/v1")
            async with client.realtime.connect(model="vision-remote") as conn:
                await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
                await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "What colour is it?"},
                    {"type": "input_image", "image_url": data_url(picture), "detail": "low"},
                ]})  # fmt: skip
                await conn.response.create()
                added = None
                async for event in _events(conn):
                    if event.type == "conversation.item.added" and event.item.role == "user":
                        added = event.item
                    if event.type == "error":
                        pytest.fail(f"error event: {event}")
                    if event.type == "response.done":
                        assert event.response.status == "completed"
                        break
                assert added is not None and added.content[1].image_url == data_url(picture)
        (seen,) = [m for m in seeing.messages if m.images]
        assert seen.text == "What colour is it?"
        assert [(i.mime, i.data, i.detail) for i in seen.images] == [("image/png", picture, "low")]
    # The cascade takes no images: a coded error naming the part, and the session goes on.
    async with run_gateway(Settings(engine="cascade", api_keys=("sk-test",), video_engine="none")) as gw:
        client = openai.AsyncOpenAI(api_key="sk-test", websocket_base_url=f"ws://127.0.0.1:{gw.port}/v1")
        async with client.realtime.connect(model="omni-cascade") as conn:
            await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                {"type": "input_image", "image_url": data_url(picture)}]}, event_id="evt_img")  # fmt: skip
            async for event in _events(conn):
                if event.type == "error":
                    assert (event.error.code, event.error.param, event.error.event_id) == (
                        "unsupported", "item.content[0]", "evt_img",
                    )  # fmt: skip
                    break
            await conn.session.update(session={"type": "realtime", "instructions": "still here"})
            async for event in _events(conn):
                if event.type == "session.updated":
                    break


async def _events(conn: Any) -> Any:
    """The connection's events, each validated strictly against the SDK's models."""
    while True:
        raw = await conn.recv_bytes()
        check_event(orjson.loads(raw))
        yield conn.parse_event(raw)
