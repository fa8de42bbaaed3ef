"""Turns an upstream takes itself (the ``remote`` engine's ``turns: "upstream"``), passed through.

The upstream is a second gateway in this process on the CPU cascade (silero VAD,
pocketsphinx, the echo thinker, eSpeak NG) with its speech detector on: in the duplex
dialect (which a gateway advertises) with ``server_vad`` it ends turns, answers them and
stops its answers when the caller speaks over them, by itself. The gateway the client
talks to runs ``RemoteEngine(turns="upstream")`` with **no speech detector at all**
(``vad_factory=None``): it cannot end a turn or hear a barge-in, so whatever turn the
client sees taken, the upstream took. Speech is eSpeak NG's, made at test time; the
Live client's events are checked strictly against ``openai.types.live``. Nothing is
mocked.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from support.gateway import Client, RunningGateway, connect, run_gateway
from support.speech import chunks, silence, speak

from gateway.settings import Settings
from orchestrator.engines.remote import RemoteEngine

pytestmark = pytest.mark.timeout(120)

SPOKEN = "what is your name"  # pocketsphinx hears "what" in every eSpeak rendering
LONG = (
    "what is the weather going to be like tomorrow morning in the city "
    "and should I take the train or the bus to the office"
)


def upstream_settings() -> Settings:
    return Settings(engine="cascade", video_engine="none", drain_window_s=0)


async def say(c: Client, pcm: bytes) -> None:
    for chunk in chunks(pcm):
        await c.send({"type": "session.input_audio.append", "audio": base64.b64encode(chunk).decode()})


def upstream_sessions(up: RunningGateway) -> int:
    return len(up.runtime.hosts)


async def read_until(c: Client, done: Any, timeout: float = 40.0) -> None:
    """Read events until ``done()`` (over ``c.events``) holds."""
    while not done():
        await c.recv(timeout)


async def event(c: Client, match: Any, timeout: float = 40.0) -> dict[str, Any]:
    """The first event received that ``match``es, received already or to come."""
    await read_until(c, lambda: any(match(e) for e in c.events), timeout)
    return next(e for e in c.events if match(e))


def said(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "session.output_transcript.delta")


def audio_ms(event: dict[str, Any]) -> float:
    if event["type"] != "session.output_audio.delta":
        return 0.0
    return len(base64.b64decode(event["delta"])) / 2 / 24  # PCM16 at 24 kHz, the session's format


def heard(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "session.input_transcript.delta")


@pytest.fixture
async def chain() -> AsyncIterator[tuple[RunningGateway, RunningGateway, RemoteEngine]]:
    async with run_gateway(upstream_settings()) as up:  # its own speech detector: it takes the turns
        remote = RemoteEngine([up.http], turns="upstream")
        async with run_gateway(Settings(video_engine="none", live_output_lead_ms=300), engine=remote,
                               vad_factory=None) as gw:  # fmt: skip
            assert gw.runtime.vad_factory is None  # this gateway can end no turn by itself
            yield up, gw, remote


def live_url(gw: RunningGateway) -> str:
    return f"ws://127.0.0.1:{gw.port}/v1/live/sessions"


async def test_the_upstreams_own_turn_passes_through_to_a_live_client(
    chain: tuple[RunningGateway, RunningGateway, RemoteEngine],
) -> None:
    up, gw, remote = chain
    async with httpx.AsyncClient(base_url=gw.http) as http:
        (model,) = (await http.get("/v1/models")).json()["data"]
    assert model["engine"] == "remote" and model["takes_turns"] is True
    speech = await speak(SPOKEN)
    async with connect(live_url(gw)) as c:
        await c.send({"type": "session.start", "session": {"model": "gpt-live-1"}})
        await c.wait_for("session.started")
        await say(c, silence(300) + speech + silence(1500))
        # The upstream heard the turn, ended it and answered it: "You said: what ..." in speech.
        await read_until(c, lambda: "what" in said(c.events).lower())
        await read_until(c, lambda: "what" in heard(c.events).lower())  # what it heard, on the timeline
        assert said(c.events).lower().startswith("you said")
        transcript = next(e for e in c.events if e["type"] == "session.input_transcript.delta")
        # Placed on the session timeline where the upstream's detector heard the speech (from
        # its prefix padding on: 300 ms before the speech, so from about 0 here).
        speech_end_ms = 300 + len(speech) // 48
        assert 0 <= transcript["start_ms"] < speech_end_ms < transcript["end_ms"] <= speech_end_ms + 1500
        # One upstream session held for the whole session (not one per answer), with its own VAD.
        (stats,) = remote.pool.stats()
        assert stats["served"] == 1
        assert upstream_sessions(up) == 1
        # Context appended meanwhile reaches the upstream's conversation (its answers follow it).
        await c.send({"type": "session.instructions.append", "content": "Answer in French.", "delegation_id": None})
        await c.wait_for("session.instructions.appended")
        await eventually(lambda: "Answer in French." in upstream_texts(up))
        await c.send({"type": "session.close"})
        await c.wait_for("session.closed")
    # The session's end closes the upstream's for good (session.close in the duplex dialect).
    await read_upstream_gone(up)


async def read_upstream_gone(up: RunningGateway) -> None:
    await eventually(lambda: upstream_sessions(up) == 0)  # (else it outlived the gateway session)


def upstream_texts(up: RunningGateway) -> list[str]:
    return [
        item.as_message().text
        for host in up.runtime.hosts.values()
        for item in host.session.conversation
        if item.type == "message"
    ]


async def eventually(condition: Any, within: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_the_upstreams_barge_in_cuts_the_answer_that_plays(
    chain: tuple[RunningGateway, RunningGateway, RemoteEngine],
) -> None:
    _, gw, _ = chain
    question, interruption = await speak(LONG), await speak("stop, stop, wait a moment")
    async with connect(live_url(gw)) as c:
        await c.send({"type": "session.start", "session": {"model": "gpt-live-1"}})
        await c.wait_for("session.started")
        await say(c, silence(300) + question + silence(1500))
        # The upstream answers the long question: some seconds of "You said: ...", paced.
        await c.wait_for("session.output_audio.delta", timeout=40)
        await read_until(c, lambda: heard(c.events).strip() != "")  # (the answer need not wait for it)
        asked = heard(c.events)
        # The caller talks over the answer: only the upstream can hear it (no detector here).
        mark = len(c.events)
        await say(c, interruption + silence(1500))
        # The upstream takes the interruption as the next turn: its transcript, then its answer.
        await read_until(c, lambda: heard(c.events[mark:]).strip() != "")
        cut = len(c.events)
        await read_until(c, lambda: said(c.events[cut:]).lower().startswith("you said"))
        # What the client was sent of the first answer is a beginning of it, cut short: the
        # whole answer, "You said: " and the question as the upstream heard it, is some seconds
        # of eSpeak NG (the upstream's voice), and the client had barely begun to play it.
        whole_ms = len(await speak(f"You said: {asked.strip()}")) / 2 / 24
        sent_ms = sum(audio_ms(e) for e in c.events[:cut])
        assert 0 < sent_ms < whole_ms / 2, (sent_ms, whole_ms)
        # (Counted up to the interruption's transcript: the first answer's audio, and perhaps
        # the beginning of the upstream's answer to the interruption, which need not wait for it.)
        errors = [e for e in c.events if e["type"] == "error"]
        assert not errors, errors


async def test_a_conversation_lost_with_its_upstream_is_said_and_the_next_audio_opens_another() -> None:
    async with run_gateway(upstream_settings()) as a, run_gateway(upstream_settings()) as b:
        remote = RemoteEngine([a.http, b.http], turns="upstream")
        async with (
            run_gateway(Settings(video_engine="none"), engine=remote, vad_factory=None) as gw,
            connect(live_url(gw)) as c,
        ):
            await c.send({"type": "session.start", "session": {"model": "gpt-live-1"}})
            await c.wait_for("session.started")
            await say(c, silence(200))  # the first audio opens the conversation, on one upstream
            await eventually(lambda: upstream_sessions(a) + upstream_sessions(b) == 1)
            holder, other = (a, b) if upstream_sessions(a) else (b, a)
            await holder.stop()  # the upstream is gone, and the conversation with it
            lost = await c.wait_for("error", timeout=30)
            assert lost["error"]["code"] == "upstream_lost"
            # The session goes on: its next audio opens a conversation on the other upstream,
            # which takes the turn.
            await say(c, silence(300) + await speak(SPOKEN) + silence(1500))
            await read_until(c, lambda: "what" in said(c.events).lower())
            assert upstream_sessions(other) == 1


async def test_on_the_realtime_api_the_upstreams_turns_pass_through_with_server_turn_detection(
    chain: tuple[RunningGateway, RunningGateway, RemoteEngine],
) -> None:
    up, gw, _ = chain
    question, interruption = await speak(LONG), await speak("stop, stop, wait a moment")
    async with connect(gw.url) as c:
        await c.wait_for("session.created")
        # Server turn detection (this gateway has no detector: the engine's takes the turns).
        vad = {"type": "server_vad"}
        audio_in = {"turn_detection": vad, "transcription": {"model": "whisper-1"}}
        await c.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": audio_in}}})
        await c.wait_for("session.updated")
        for chunk in chunks(silence(300) + question + silence(1500)):
            await c.append(chunk)
        # The upstream's turn, as a server VAD turn: speech, committed, transcribed, answered.
        started = await c.wait_for("input_audio_buffer.speech_started", timeout=40)
        stopped = await c.wait_for("input_audio_buffer.speech_stopped")
        committed = await c.wait_for("input_audio_buffer.committed")
        assert started["item_id"] == stopped["item_id"] == committed["item_id"]
        assert started["audio_start_ms"] < stopped["audio_end_ms"]
        created = await c.wait_for("response.created")
        await c.wait_for("response.output_audio.delta")
        # The caller talks over it: the upstream hears it, and its speech start reaches the client.
        for chunk in chunks(interruption + silence(1500)):
            await c.append(chunk)
        again = await c.wait_for("input_audio_buffer.speech_started", timeout=40)
        assert again["item_id"] != started["item_id"]
        first_id = created["response"]["id"]
        first = await event(c, lambda e: e["type"] == "response.done" and e["response"]["id"] == first_id)
        # Ended whole (the upstream had made it all before) or cut by the barge-in; never failed.
        assert first["response"]["status"] in ("completed", "cancelled")
        done = await event(c, lambda e: e["type"] == "response.done" and e["response"]["id"] != first_id)
        assert done["response"]["status"] == "completed"
        transcript = done["response"]["output"][0]["content"][0]["transcript"]
        completed = [e for e in c.events if e["type"] == "conversation.item.input_audio_transcription.completed"]
        assert [e["item_id"] for e in completed] == [started["item_id"], again["item_id"]]
        assert transcript == f"You said: {completed[1]['transcript']}"  # the upstream's answer to the interruption
        assert not [e for e in c.events if e["type"] == "error"]
        # Turns the client commits (no turn detection): the gateway's requests, one per answer.
        await c.send(
            {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}}
        )
        await c.wait_for("session.updated")
        await eventually(lambda: upstream_sessions(up) == 0)  # the conversation ended with it
        for chunk in chunks(await speak(SPOKEN)):
            await c.append(chunk)
        await c.send({"type": "input_audio_buffer.commit"})
        await c.send({"type": "response.create"})
        done = await c.wait_for("response.done", timeout=40)
        transcript = done["response"]["output"][0]["content"][0]["transcript"]
        assert done["response"]["status"] == "completed" and transcript.lower().startswith("you said")
