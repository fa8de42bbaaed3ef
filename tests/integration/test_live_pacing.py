"""GPT-Live's paced output on a WebSocket, on the embedded default engine (the CPU cascade:
silero VAD, pocketsphinx, the echo thinker, eSpeak NG) over a real loopback socket: the
model's audio comes no faster than real time plus the lead (``live_output_lead_ms``), and a
client that barges in mid-answer is sent at most about the lead of that answer after it.

Measured in audio bytes against the audio the client has played (it plays from the first
delta it receives, at real time), with slack for the loop's and the socket's delays: the
asserts hold on a slow machine (lateness only lowers what was received). Every event is
checked strictly against ``openai.types.live`` (``Client(live=True)``)."""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import pytest
import websockets
from support.gateway import Client, connect, run_gateway
from support.speech import chunks, silence, speak

from gateway.settings import Settings

pytestmark = pytest.mark.timeout(120)

LEAD_MS = 300
BYTES_PER_MS = 48  # PCM16 at 24 kHz, the session's format
SLACK_MS = 700  # the loop's, the socket's and the speech detector's delays (a busy machine's)
# The echo thinker says commentary as it is: some twenty seconds of eSpeak NG.
SAY = (
    "This is a long announcement about the maintenance window of the staging cluster. "
    "Every service will restart one at a time, starting with the database, then the queue, "
    "then the web tier, and finally the workers that send the nightly reports to every team. "
    "Nothing needs to be done by anyone, but please save your work before the evening."
)


async def say(c: Client, pcm: bytes) -> None:
    for chunk in chunks(pcm):
        await c.send({"type": "session.input_audio.append", "audio": base64.b64encode(chunk).decode()})


def audio_bytes(event: dict[str, Any]) -> int:
    return len(base64.b64decode(event["delta"])) if event["type"] == "session.output_audio.delta" else 0


async def test_a_barge_in_leaves_the_client_at_most_the_lead_of_the_answer() -> None:
    interruption = await speak("wait, stop, I have a question")
    settings = Settings(engine="cascade", live_output_lead_ms=LEAD_MS)
    async with run_gateway(settings) as gw, connect(f"ws://127.0.0.1:{gw.port}/v1/live/sessions") as c:
        await c.send({"type": "session.start", "session": {"model": "gpt-live-1"}})
        await c.wait_for("session.started")
        await say(c, silence(500))
        await c.send({"type": "session.commentary.append", "content": SAY, "delegation_id": None})
        first = await c.wait_for("session.output_audio.delta")
        t0 = time.monotonic()  # the client starts playing
        received = audio_bytes(first)
        # Paced: what it receives is never more than the lead (and slack) beyond what it has played.
        while received < 2500 * BYTES_PER_MS:
            event = await c.recv()
            received += audio_bytes(event)
            played_ms = (time.monotonic() - t0) * 1000
            assert received / BYTES_PER_MS <= played_ms + LEAD_MS + SLACK_MS, (received, played_ms)
        before = received
        played_ms = (time.monotonic() - t0) * 1000
        # The caller talks over the answer: what it is sent of the answer from now on is what
        # was on its way (the lead) and what went while the speech was being detected.
        await say(c, interruption + silence(1200))
        heard = await c.wait_for("session.input_transcript.delta", timeout=30)
        at = c.events.index(heard)
        answer = [e for e in c.events[: at + 1] if e["type"].startswith("session.output")]
        total = sum(audio_bytes(e) for e in answer)
        after = total - before
        assert after <= (LEAD_MS + SLACK_MS) * BYTES_PER_MS, after / BYTES_PER_MS
        unplayed_ms = total / BYTES_PER_MS - played_ms  # what the client still had to play at the barge-in
        assert unplayed_ms <= LEAD_MS + SLACK_MS, unplayed_ms
        # The answer's transcript is of the audio sent: a beginning of what was to be said, cut short.
        said = "".join(e["delta"] for e in answer if e["type"] == "session.output_transcript.delta")
        assert said.strip() and SAY.startswith(said.strip()) and len(said.strip()) < len(SAY) // 2
        spans = [e for e in answer if e["type"] == "session.output_transcript.delta"]
        assert all(e["start_ms"] <= e["end_ms"] for e in spans)

        # The caller's turn is answered (the echo thinker) and the session goes on.
        def reply() -> str:
            return "".join(e["delta"] for e in c.events[at:] if e["type"] == "session.output_transcript.delta")

        await c.wait_for(lambda e: "You said" in reply(), timeout=30)
        assert not [e for e in c.events if e["type"] == "error"]


async def test_a_drain_waits_for_the_answers_paced_audio_before_handing_the_session_over() -> None:
    """The engine has made the whole answer (the cascade makes a sentence's audio at once), the
    gateway is still sending it: the session is not idle until it has gone out, so a drain hands
    it over (close 1012) only after the client has all of it, with all its transcript."""
    short = "The staging cluster restarts tonight at nine, one service at a time."
    async with (
        run_gateway(Settings(engine="cascade")) as gw,
        connect(f"ws://127.0.0.1:{gw.port}/v1/live/sessions") as c,
    ):
        await c.send({"type": "session.start", "session": {"model": "gpt-live-1"}})
        await c.wait_for("session.started")
        await say(c, silence(300))
        await c.send({"type": "session.commentary.append", "content": short, "delegation_id": None})
        await c.wait_for("session.output_audio.delta")
        host = next(iter(gw.runtime.hosts.values()))
        while host.session.responses.answering():  # (the engine makes it in a moment)
            await c.recv()
        assert host.session.output_pending  # made, and not all sent yet
        drain = asyncio.ensure_future(gw.runtime.drain())
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                await c.recv()
        await drain
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
        said = "".join(e["delta"] for e in c.events if e["type"] == "session.output_transcript.delta")
        assert said.strip() == short  # all of it reached the client before the handover
