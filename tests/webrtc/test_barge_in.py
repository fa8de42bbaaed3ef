"""Barge-in over WebRTC with the gateway's real speech detector (silero VAD): the caller
speaks while an answer plays; the gateway cancels the answer, cuts the track within a
20 ms frame, truncates the item at the audio actually sent and says
``output_audio_buffer.cleared``; then it answers the caller's turn. No client bookkeeping:
the "browser" here only speaks and listens.

The caller's microphone is a track of its own: silence, then speech synthesized at test
time (eSpeak NG), then silence, paced at 20 ms as a browser's is.
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack
from av import AudioFrame
from rtc_support import LOOPBACK, Browser, Received, record, wait_for
from support.gateway import RunningGateway, run_gateway
from support.sdk_shapes import check_event
from support.speech import speak

from gateway.settings import Settings
from gateway.transport.webrtc.peer import gather_on
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(120)

RATE = 48_000
FRAME = RATE // 50  # 20 ms


class Microphone(MediaStreamTrack):
    """Silence until ``say`` queues speech; 20 ms frames on the wall clock."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._queue = bytearray()
        self._pts = 0
        self._start: float | None = None

    def say(self, pcm48k: bytes) -> None:
        self._queue += pcm48k

    async def recv(self) -> AudioFrame:
        if self._start is None:
            self._start = time.monotonic()
        due = self._start + self._pts / RATE
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        chunk = bytes(self._queue[: 2 * FRAME]).ljust(2 * FRAME, b"\0")
        del self._queue[: 2 * FRAME]
        frame = AudioFrame(format="s16", layout="mono", samples=FRAME)
        frame.planes[0].update(chunk)
        frame.sample_rate = RATE
        frame.time_base = fractions.Fraction(1, RATE)
        frame.pts = self._pts
        self._pts += FRAME
        return frame


@pytest.fixture
async def gw() -> AsyncIterator[RunningGateway]:
    settings = Settings(engine="passthrough", video_engine="none")
    # A 10 s answer, so that the caller can speak over it; server VAD (silero) on by default.
    async with run_gateway(settings, engine=PassthroughEngine(audio_chunks=500, paced=True)) as gw:
        yield gw


async def test_speech_over_an_answer_cuts_it_within_a_frame_at_what_was_sent(gw: RunningGateway) -> None:
    import httpx

    assert gw.runtime.vad_factory is not None, "silero VAD is part of the cpu extra the tests install"
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    channel = pc.createDataChannel("oai-events")
    mic = Microphone()
    pc.addTrack(mic)
    received = Received()
    browser = Browser(pc, channel, received, None, [])
    pc.on("track", lambda track: browser.tasks.append(asyncio.ensure_future(record(track, received))))
    events: list[dict[str, Any]] = []

    def on_message(message: str) -> None:
        event = orjson.loads(message)
        check_event(event)
        events.append(event)

    channel.on("message", on_message)
    speech = await speak("Hello there, please stop talking now.", rate=RATE)
    try:
        with gather_on(LOOPBACK):
            await pc.setLocalDescription(await pc.createOffer())
        async with httpx.AsyncClient(timeout=30) as http:
            r = await http.post(f"{gw.http}/v1/realtime/calls", content=pc.localDescription.sdp,
                                headers={"Content-Type": "application/sdp"})  # fmt: skip
        assert r.status_code == 201, r.text
        await pc.setRemoteDescription(RTCSessionDescription(sdp=r.text, type="answer"))

        def first(kind: str, **fields: Any) -> dict[str, Any] | None:
            return next((e for e in events if e["type"] == kind and all(e.get(k) == v for k, v in fields.items())),
                        None)  # fmt: skip

        await wait_for(lambda: first("session.created") is not None, "session.created")
        assert first("session.created")["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"  # type: ignore[index]
        channel.send(orjson.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                     "content": [{"type": "input_text", "text": "Tell me a long story."}]}}).decode())  # fmt: skip
        channel.send(orjson.dumps({"type": "response.create"}).decode())
        await wait_for(lambda: len(received.loud()) >= 25, "half a second of the answer")
        (live,) = gw.runtime.calls.calls.values()  # type: ignore[union-attr]
        mic.say(speech)  # the caller barges in
        await wait_for(lambda: first("response.done") is not None, "the answer to end")
        cut_at = live.track.audio_frames_sent
        done = first("response.done")
        assert done is not None and done["response"]["status"] == "cancelled"
        assert done["response"]["status_details"]["reason"] == "turn_detected"
        await wait_for(lambda: first("output_audio_buffer.cleared") is not None, "output_audio_buffer.cleared")
        item_id = done["response"]["output"][0]["id"]
        truncated = first("conversation.item.truncated", item_id=item_id)
        assert truncated is not None and truncated["audio_end_ms"] == live.track.sent_ms(item_id)
        started = first("input_audio_buffer.speech_started")
        assert started is not None and events.index(started) < events.index(done)
        await asyncio.sleep(0.3)  # 15 frame periods
        assert live.track.audio_frames_sent - cut_at <= 1  # within one 20 ms frame of the cut
        # The caller's turn is answered: its audio plays on the same track.
        await wait_for(lambda: sum(e["type"] == "response.created" for e in events) >= 2, "the next answer", 60)
        heard = len(received.loud())
        await wait_for(lambda: len(received.loud()) >= heard + 10, "the next answer's audio")
    finally:
        await browser.close()
