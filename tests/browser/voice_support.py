"""What the voice page's tests share: the spoken WAV the fake microphone plays, waiting on
the page's ``window.__voice``, opening the page, and thinkers that make answers long or
slow enough to barge in on."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from browser_support import PageLog, write_wav
from support.gateway import RunningGateway
from support.speech import silence, speak

from orchestrator.engine import Message
from orchestrator.engines.cascade.thinker import EchoThinker

SPOKEN = "what is your name"  # pocketsphinx hears "what" in every eSpeak rendering
RATE = 48000  # the WAV's rate: the page resamples the device's audio to 24 kHz itself
MS = 24  # 24 kHz: samples per millisecond of the answer audio


async def speech_wav(path: Path, lead_ms: int, tail_ms: int) -> Path:
    pcm = silence(lead_ms, RATE) + await speak(SPOKEN, RATE) + silence(tail_ms, RATE)
    return write_wav(path, pcm, RATE)


async def wait_until(page: Any, condition: str, timeout_s: float = 30.0, log: PageLog | None = None) -> Any:
    """Poll a JS expression over ``window.__voice`` until it is truthy; its value."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = await page.evaluate(f"() => {{ const v = window.__voice; return ({condition}); }}")
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            seen = await page.evaluate("() => window.__voice.seen")
            raise AssertionError(f"timed out waiting for {condition}\nseen: {seen}\n{log or ''}")
        await asyncio.sleep(0.1)


async def open_voice_page(context: Any, gateway: RunningGateway, transport: str = "auto") -> tuple[Any, PageLog]:
    """The voice page, started (``transport``: its ?transport=, auto: WebRTC here)."""
    page = await context.new_page()
    log = PageLog(page)
    await page.goto(gateway.http + f"/voice.html?transport={transport}")
    await page.get_by_role("button", name="Start").click()
    await wait_until(page, "v.client && v.client.state === 'open'", 15, log)
    return page, log


class LongAnswerThinker:
    """Echo, then a long tail, one word every 100 ms: still generating and far from
    played when the looped speech comes round again."""

    description = "slow long echo (test)"
    TAIL = " ".join(["I am still talking about this and that, so you can interrupt me."] * 4)

    async def think(self, messages: tuple[Message, ...], instructions: str):  # type: ignore[no-untyped-def]
        async for word in EchoThinker().think(messages, instructions):
            await asyncio.sleep(0.1)
            yield word
        yield "."
        for word in self.TAIL.split(" "):
            await asyncio.sleep(0.1)
            yield " " + word


class RecordingThinker:
    """Echo, then three sentences 300 ms apart; records what it heard and answered."""

    description = "recording echo (test)"
    SENTENCES = (". The first sentence is here.", " The second sentence follows it.", " The third one ends it.")

    def __init__(self) -> None:
        self.heard: list[str] = []
        self.answers: list[str] = []

    async def think(self, messages: tuple[Message, ...], instructions: str):  # type: ignore[no-untyped-def]
        self.heard.append(next(m.text for m in reversed(messages) if m.role == "user"))
        answer = ""
        async for word in EchoThinker().think(messages, instructions):
            answer += word
            yield word
        for sentence in self.SENTENCES:
            await asyncio.sleep(0.3)
            answer += sentence
            yield sentence
        self.answers.append(answer)


def check_turn_latency(seen: dict[str, Any], first_audio: str) -> float:
    """The page's one definition of turn latency (voice.html, #latency-definition): from the
    turn's end (speech_stopped arriving) to the answer's first sound as the page plays it,
    the level of what it plays measured in the page. So it comes after the answer's first
    audio reached the page (``first_audio``: the WebSocket's first audio delta, WebRTC's
    output_audio_buffer.started) and within the playout that follows. The figure."""
    [latency] = seen["latencies"]
    events = seen["events"]
    ended = next(e["at"] for e in events if e["type"] == "input_audio_buffer.speech_stopped")
    arrived = next(e["at"] for e in events if e["type"] == first_audio and e["at"] >= ended) - ended
    assert arrived <= latency + 25, (arrived, latency)  # heard after it arrived (one 20 ms meter window of slack)
    assert latency < arrived + 1500, (arrived, latency)  # and not a later sound
    return float(latency)
