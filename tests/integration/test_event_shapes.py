"""Every server event, in both dialects, validates strictly against the official
SDK's models: sessions that exercise voice (server VAD, transcription, speech
out), text, barge-in, truncate, cancel, item edits, errors and resume on the
real CPU cascade, over real sockets.

``support.gateway.Client`` checks each event as it arrives
(``support.sdk_shapes.check_event``), here and in every other test that uses
it; this module makes sure the sessions cover every kind of event the gateway
sends, so that no event type escapes the check.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support.gateway import Client, RunningGateway, connect, run_gateway
from support.sdk_shapes import ShapeError, check_event
from support.speech import chunks, silence, speak

from gateway.settings import Settings
from orchestrator.engine import Message
from orchestrator.engines.cascade import CascadeEngine
from orchestrator.engines.cascade.thinker import EchoThinker

pytestmark = pytest.mark.timeout(180)

BETA = {"subprotocols": ["realtime", "openai-beta.realtime-v1"]}


class SlowEchoThinker:
    """The echo thinker, a word every 50 ms: answers last long enough to barge in on."""

    description = "slow echo (test)"

    async def think(self, messages: tuple[Message, ...], instructions: str, **kwargs: Any):  # type: ignore[no-untyped-def]
        async for word in EchoThinker().think(messages, instructions):
            await asyncio.sleep(0.05)
            yield word


@pytest.fixture
async def gateway() -> AsyncIterator[RunningGateway]:
    engine = CascadeEngine(thinker=SlowEchoThinker())
    async with run_gateway(Settings(engine="cascade", video_engine="none"), engine=engine) as gw:
        yield gw


def session(beta: bool, **fields: Any) -> dict[str, Any]:
    return fields if beta else {"type": "realtime", **fields}


def user_text(text: str) -> dict[str, Any]:
    return {
        "type": "conversation.item.create",
        "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
    }


async def stream(c: Client, pcm: bytes) -> None:
    for chunk in chunks(pcm):
        await c.append(chunk)


async def voice_barge_in_and_truncate(c: Client, beta: bool) -> None:
    transcription = {"model": "gpt-realtime-whisper"}  # any name routes to the engine's STT
    if beta:
        await c.send({"type": "session.update", "session": {"input_audio_transcription": transcription}})
    else:
        await c.send(
            {"type": "session.update", "session": session(beta, audio={"input": {"transcription": transcription}})}
        )
    await c.wait_for("session.updated")
    speech = await speak("what is your name")
    await stream(c, silence(300) + speech + silence(900))
    await c.wait_for("conversation.item.input_audio_transcription.completed", timeout=60)
    audio_delta = "response.audio.delta" if beta else "response.output_audio.delta"
    first = await c.wait_for(audio_delta, timeout=60)
    await stream(c, silence(100) + speech + silence(900))  # talks over the answer
    await c.wait_for("input_audio_buffer.speech_started")
    done = await c.wait_for("response.done", timeout=60)
    assert done["response"]["status"] in ("cancelled", "completed")
    await c.send({"type": "conversation.item.truncate", "item_id": first["item_id"], "content_index": 0,
                  "audio_end_ms": 20})  # fmt: skip
    await c.wait_for("conversation.item.truncated")
    if c.types().count("response.done") < 2:
        await c.wait_for("response.done", timeout=60)  # the second turn's answer


async def text_cancel_edits_and_errors(c: Client, beta: bool) -> None:
    await c.send({"type": "session.update", "session": session(beta, audio={"input": {"turn_detection": None}})
                  if not beta else {"turn_detection": None}})  # fmt: skip
    await c.wait_for("session.updated")
    await c.send(user_text("hello there"))
    added = await c.wait_for("conversation.item.done" if not beta else "conversation.item.created")
    modalities = {"modalities": ["text"]} if beta else {"output_modalities": ["text"]}
    await c.send({"type": "response.create", "response": modalities})
    done = await c.wait_for("response.done", timeout=60)
    assert done["response"]["status"] == "completed"
    await c.send({"type": "response.create"})
    await c.wait_for("response.created")
    await c.send({"type": "response.cancel"})
    cancelled = await c.wait_for("response.done", timeout=60)
    assert cancelled["response"]["status"] == "cancelled"
    item_id = added["item"]["id"]
    await c.send({"type": "conversation.item.retrieve", "item_id": item_id})
    await c.wait_for("conversation.item.retrieved")
    await c.send({"type": "conversation.item.delete", "item_id": item_id})
    await c.wait_for("conversation.item.deleted")
    await c.append(bytes(4800))
    await c.send({"type": "input_audio_buffer.clear"})
    await c.wait_for("input_audio_buffer.cleared")
    await c.append(bytes(4800 * 2))
    await c.send({"type": "input_audio_buffer.commit"})
    await c.wait_for("input_audio_buffer.committed")
    for bad in ({"type": "nope"}, {"type": "conversation.item.delete", "item_id": "missing"},
                {"type": "session.update", "session": {"bogus": 1}}):  # fmt: skip
        await c.send(bad)
        await c.wait_for("error")
    await c.ws.send("not json")
    await c.wait_for("error")


@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
async def test_every_server_event_validates_against_the_sdk(gateway: RunningGateway, beta: bool) -> None:
    opts = BETA if beta else {}
    async with connect(gateway.url, **opts) as c:
        created = await c.wait_for("session.created")
        await voice_barge_in_and_truncate(c, beta)
        await text_cancel_edits_and_errors(c, beta)
        seen = set(c.types())
        last_seq = c.events[-1]["server_event_seq"]
    async with connect(gateway.url, **opts) as r:  # resume: the gap replayed, then live events
        await r.wait_for("session.created")
        resume = {"session_id": created["session"]["id"], "resume_token": created["resume_token"]}
        await r.send({"type": "session.resume", **resume, "last_received_server_event_seq": last_seq - 5})
        await r.wait_for("session.resumed")
        await r.send(user_text("again"))
        await r.send({"type": "response.create"})
        await r.wait_for("response.done", timeout=60)
        seen |= set(r.types())
    names = {
        "conversation.item.added": "conversation.item.created",
        "response.output_audio.delta": "response.audio.delta",
        "response.output_audio.done": "response.audio.done",
        "response.output_audio_transcript.delta": "response.audio_transcript.delta",
        "response.output_audio_transcript.done": "response.audio_transcript.done",
        "response.output_text.delta": "response.text.delta",
        "response.output_text.done": "response.text.done",
    }
    expected = {
        "session.created", "session.updated", "session.resumed", "error",
        "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
        "input_audio_buffer.cleared", "conversation.item.added", "conversation.item.retrieved",
        "conversation.item.truncated", "conversation.item.deleted",
        "conversation.item.input_audio_transcription.delta", "conversation.item.input_audio_transcription.completed",
        "response.created", "response.output_item.added", "response.content_part.added",
        "response.output_audio.delta", "response.output_audio.done", "response.output_audio_transcript.delta",
        "response.output_audio_transcript.done", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.done", "rate_limits.updated",
    }  # fmt: skip
    if not beta:
        expected.add("conversation.item.done")
    expected = {names.get(t, t) for t in expected} if beta else expected
    assert expected <= seen, sorted(expected - seen)


def test_the_checker_refuses_what_the_sdk_refuses() -> None:
    """The check itself can fail: a content part named like an item's content, an
    unknown field, and a gateway event sent to a client that did not opt in."""
    part = {"type": "response.content_part.added", "event_id": "e", "response_id": "r", "item_id": "i",
            "output_index": 0, "content_index": 0, "part": {"type": "audio", "transcript": ""}}  # fmt: skip
    check_event(part)
    for bad in ({**part, "part": {"type": "output_audio", "transcript": ""}}, {**part, "extra": 1}):
        with pytest.raises(ShapeError):
            check_event(bad)
    warning = {"type": "session.warning", "event_id": "e", "code": "c", "message": "m", "param": None}
    with pytest.raises(ShapeError):
        check_event(warning)
    check_event(warning, extensions=True)
