"""Barge-in on a WebRTC call whose answer was already written: the gateway's embedded
cascade writes an answer faster than real time, so when the caller talks over it the
response is done (nothing for the session to cancel) while the call's track still plays
its queued audio. The call must cut the track on ``speech_started`` and truncate the item at
what was sent, as OpenAI's WebRTC does (``output_audio_buffer.cleared``).

The caller is aiortc (tests/webrtc/rtc_support.py) playing a WAV with two utterances; the
gateway is the real one (``POST /v1/realtime/calls``), on the CPU cascade.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from aiortc import RTCSessionDescription
from rtc_support import make_browser, wait_for, write_wav
from support.gateway import run_gateway
from support.speech import silence, speak

from gateway.settings import Settings
from orchestrator.engine import Message
from orchestrator.engines.cascade import CascadeEngine
from orchestrator.engines.cascade.thinker import EchoThinker

pytestmark = pytest.mark.timeout(90)

TAIL = " ".join(["I am still talking about this and that, so you can interrupt me."] * 4)


class WrittenAtOnceThinker:
    """Echo and a long tail, all at once: the response is done within a second or so, its
    audio (some 15 s) plays on from the call's track."""

    description = "long echo, written at once (test)"

    async def think(self, messages: tuple[Message, ...], instructions: str) -> AsyncIterator[str]:
        async for word in EchoThinker().think(messages, instructions):
            assert isinstance(word, str)
            yield word
        yield ". " + TAIL


async def test_speech_over_an_answer_already_written_cuts_the_track_and_truncates_at_what_was_sent(
    tmp_path: Path,
) -> None:
    utterance = await speak("what is your name", 48000)
    wav = write_wav(
        tmp_path / "caller.wav",
        silence(500, 48000) + utterance + silence(3500, 48000) + utterance + silence(3000, 48000),
        48000,
    )
    engine = CascadeEngine(thinker=WrittenAtOnceThinker())
    async with run_gateway(Settings(engine="cascade", video_engine="none"), engine=engine) as gateway:
        caller, offer = await make_browser(wav=wav)
        events: list[dict[str, Any]] = []
        assert caller.channel is not None
        caller.channel.on("message", lambda text: events.append(orjson.loads(text)))
        try:
            async with httpx.AsyncClient() as http:
                res = await http.post(
                    gateway.http + "/v1/realtime/calls", content=offer, headers={"Content-Type": "application/sdp"}
                )
            assert res.status_code == 201, res.text
            [call] = gateway.runtime.calls.calls.values()
            await caller.pc.setRemoteDescription(RTCSessionDescription(sdp=res.text, type="answer"))

            def first(kind: str) -> dict[str, Any] | None:
                return next((e for e in events if e["type"] == kind), None)

            await wait_for(lambda: first("response.done") is not None, "the first answer to be written")
            done = first("response.done")
            assert done is not None and done["response"]["status"] == "completed"
            item_id = done["response"]["output"][0]["id"]
            assert call.track.playing is not None  # written, still playing
            # (each event is its own data channel message: wait for both, not the first of them)
            await wait_for(lambda: first("conversation.item.truncated") is not None
                           and first("output_audio_buffer.cleared") is not None, "the barge-in")  # fmt: skip
            sent_then = call.track.sent_ms(item_id)
            truncated = first("conversation.item.truncated")
            cleared = first("output_audio_buffer.cleared")
            assert truncated is not None and cleared is not None
            assert truncated["item_id"] == item_id
            assert cleared["response_id"] == done["response"]["id"]
            # Cut at what had gone out, to the 20 ms frame; far from all of it.
            assert truncated["audio_end_ms"] == sent_then and sent_then % 20 == 0
            assert 0 < sent_then < 10_000
            speech = [e for e in events if e["type"] == "input_audio_buffer.speech_started"]
            assert len(speech) == 2
            assert events.index(speech[1]) < events.index(truncated)
            # The cut item's audio went no further while the track ran on.
            frames = call.track.frames_sent
            await wait_for(lambda: call.track.frames_sent > frames + 10, "the track to run on")
            assert call.track.sent_ms(item_id) == sent_then
        finally:
            await caller.close()
