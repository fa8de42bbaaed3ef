"""The voice page (web_demo/voice.html) over the WebSocket (``?transport=websocket``: the
page's fallback where WebRTC is not to be had) in Chromium against a real gateway running
the CPU voice cascade. The microphone is Chromium's fake capture device fed
from a WAV of synthesized speech (Chromium loops the file). Its WebRTC path (the default):
test_voice_webrtc.py."""

from __future__ import annotations

import asyncio
import wave
from pathlib import Path
from typing import Any

import pytest
from browser_support import PageLog, browser, client_event_count, screenshot
from support.gateway import RunningGateway, run_gateway
from voice_support import MS, RATE, LongAnswerThinker, RecordingThinker, check_turn_latency, speech_wav, wait_until
from voice_support import open_voice_page as open_page

from gateway.settings import Settings
from orchestrator.engines.cascade import CascadeEngine

pytestmark = pytest.mark.timeout(120)


async def open_voice_page(context: Any, gateway: RunningGateway) -> tuple[Any, PageLog]:
    return await open_page(context, gateway, "websocket")


async def test_a_spoken_turn_shows_the_transcripts_and_plays_the_answer(tmp_path: Path) -> None:
    wav = await speech_wav(tmp_path / "speech.wav", lead_ms=800, tail_ms=15000)
    async with (
        run_gateway(Settings(engine="cascade", video_engine="none")) as gateway,
        browser(wav) as context,
    ):
        page, log = await open_voice_page(context, gateway)
        assert await page.locator("#path").inner_text() == "binary frames (omni-binary.v1)"
        answered = "v.seen.responses.length >= 1 && v.seen.latencies.length >= 1 && v.seen"  # heard, too
        seen = await wait_until(page, answered, 40, log)
        [user_item] = seen["inputTranscripts"]
        assert "what" in seen["inputTranscripts"][user_item]
        assert seen["inputDeltas"][user_item].strip()  # live deltas came before the final transcript
        [answer_item] = seen["outputTranscripts"]
        answer = seen["outputTranscripts"][answer_item]
        assert answer == seen["outputDone"][answer_item] == f"You said: {seen['inputTranscripts'][user_item]}"
        assert seen["responses"][0]["status"] == "completed"
        latency = check_turn_latency(seen, "response.output_audio.delta")
        assert latency > 0  # (no bound: a busy machine's pocketsphinx takes seconds; bench/ measures speed)

        # The answer's bytes reached the playback worklet and were all played out, none skipped.
        # (Not "without an underrun": a starved machine's page or gateway falls behind real
        # time and the worklet rightly waits; bench/ measures the gaps.)
        played = "v.audio.stats.bufferedMs === 0 && v.audio.stats.playedSamples > 0 && v.audio.stats"
        stats = await wait_until(page, played, 20, log)
        assert stats["receivedBytes"] > 2 * MS * 500  # over half a second of speech
        assert stats["playedSamples"] * 2 >= stats["receivedBytes"] - 2 * MS * 5  # all of it, within 5 ms
        assert stats["droppedSamples"] == 0
        print(f"underruns: {stats['underruns']}")

        # What a person sees.
        assert "You said:" in await page.locator("#log").inner_text()
        assert await page.locator("#status").get_attribute("data-state") == "open"
        assert "Turn 1:" in await page.locator("#latency").inner_text()
        assert "first sound in this page" in await page.locator("#latency-definition").inner_text()
        await screenshot(page, "voice_page.png")
        assert not log.errors, log


async def test_barge_in_stops_playback_and_the_gateway_receives_the_truncate(tmp_path: Path) -> None:
    # The loop: speech at 0.5 s, then 4 s of silence; the long answer is still
    # playing when the speech comes round again at about 6 s.
    wav = await speech_wav(tmp_path / "speech.wav", lead_ms=500, tail_ms=4000)
    engine = CascadeEngine(thinker=LongAnswerThinker())
    async with (
        run_gateway(Settings(engine="cascade", video_engine="none"), engine=engine) as gateway,
        browser(wav) as context,
    ):
        page, log = await open_voice_page(context, gateway)
        await wait_until(page, "v.audio.stats.playing", 90, log)  # the first answer plays (a bound: CI shares 2 cores)
        truncation = await wait_until(page, "v.seen.truncations[0]", 30, log)
        assert truncation["why"] == "speech_started"
        # It was cut while still playing: less was heard than had arrived.
        assert 0 < truncation["audioEndMs"] < truncation["receivedMs"]

        # Playback of that answer stopped at once and its late audio is not played.
        positions = await page.evaluate("() => window.__voice.audio.stats.positions")
        before = positions.get(truncation["itemId"], {}).get("playedSamples", 0)
        await asyncio.sleep(0.5)
        positions = await page.evaluate("() => window.__voice.audio.stats.positions")
        assert positions.get(truncation["itemId"], {}).get("playedSamples", 0) == before
        assert before <= truncation["audioEndMs"] * MS + MS  # nothing played after the cut

        # The gateway received the truncate and applied it to what was heard.
        for _ in range(50):
            if await client_event_count(gateway.http, "conversation.item.truncate") >= 1:
                break
            await asyncio.sleep(0.1)
        assert await client_event_count(gateway.http, "conversation.item.truncate") >= 1
        note = page.locator(f'li[data-item-id="{truncation["itemId"]}"] .note')
        await note.filter(has_text="trimmed to what you heard").wait_for(timeout=5000)
        seen = await page.evaluate("() => window.__voice.seen")
        assert not [e for e in seen["errors"] if e and e.get("code") == "invalid_truncate"], seen["errors"]
        # The speech that barged in is the next turn, heard like the first.
        two_turns = "Object.keys(v.seen.inputTranscripts).length >= 2 && v.seen.inputTranscripts"
        transcripts = await wait_until(page, two_turns, 20, log)
        # (heard: a transcript of each; its words are pocketsphinx's guess at the fake microphone's
        # loop, which a busy machine's Chromium may clip: "what'd you do you" for "what is your name")
        assert all(text.strip() for text in transcripts.values()), transcripts
        # The server was still generating the answer: barge-in cancelled it.
        first = await wait_until(page, "v.seen.responses[0]", 10, log)
        assert (first["status"], first["reason"]) == ("cancelled", "turn_detected")
        await screenshot(page, "voice_page_barge_in.png")
        assert not log.errors, log


async def test_a_socket_killed_under_the_page_resumes_with_no_transcript_text_missing(tmp_path: Path) -> None:
    wav = await speech_wav(tmp_path / "speech.wav", lead_ms=800, tail_ms=15000)
    thinker = RecordingThinker()
    engine = CascadeEngine(thinker=thinker)
    async with (
        run_gateway(Settings(engine="cascade", video_engine="none"), engine=engine) as gateway,
        browser(wav) as context,
    ):
        page, log = await open_voice_page(context, gateway)
        # Kill the socket from the page the moment the answer starts: the frames the
        # server already sent behind that event are lost with it and must be replayed.
        await page.evaluate(
            """() => {
              const c = window.__voice.client;
              const off = c.on("response.output_audio_transcript.delta", () => {
                off();
                window.__killedAfterSeq = c.lastSeq;
                c.ws.close(4000, "test: the network dropped");
              });
            }"""
        )
        seen = await wait_until(page, "v.seen.responses.length >= 1 && v.seen", 40, log)
        stats = await page.evaluate("() => window.__voice.client.stats")
        killed_after = await page.evaluate("() => window.__killedAfterSeq")
        assert killed_after, "the socket was never killed"
        assert seen["states"] == ["connecting", "open", "reconnecting", "resuming", "open"]
        assert stats["resumes"] == 1 and stats["replayedEvents"] > 0
        assert stats["gaps"] == 0 and stats["sessionsLost"] == 0

        # Nothing the server produced is missing from what the page shows, nothing doubled.
        [answer] = thinker.answers
        [heard] = thinker.heard
        [answer_item] = seen["outputTranscripts"]
        assert seen["outputTranscripts"][answer_item] == answer == seen["outputDone"][answer_item]
        assert list(seen["inputTranscripts"].values()) == [heard]
        assert seen["responses"][0]["status"] == "completed"
        log_text = await page.locator("#log").inner_text()
        assert answer in log_text
        # The connection state a person sees.
        assert await page.locator("#resumes").inner_text() == "1"
        assert await page.locator("#replayed").inner_text() == f"{stats['replayedEvents']} / 0"
        assert "resumed" in await page.locator("#status").inner_text()
        # And the answer audio replayed after the resume reached the speaker.
        playback = await wait_until(page, "v.audio.stats.bufferedMs === 0 && v.audio.stats", 20, log)
        assert playback["underruns"] <= 1  # at most the outage itself
        assert playback["playedSamples"] > 3 * 1000 * MS  # four sentences of speech
        await screenshot(page, "voice_page_resumed.png")
        assert not log.errors, log


async def test_push_to_talk_turns_server_vad_off_and_sends_the_turn_on_release(tmp_path: Path) -> None:
    # A short loop; the button is held for longer than a loop and an utterance, so one
    # whole utterance falls inside the turn however long the page took to connect.
    wav = await speech_wav(tmp_path / "speech.wav", lead_ms=300, tail_ms=1200)
    with wave.open(str(wav)) as w:
        loop_s = w.getnframes() / RATE
    hold_s = loop_s + (loop_s - 1.5) + 0.3  # the speech lasts the loop less its 1.5 s of silence
    async with (
        run_gateway(Settings(engine="cascade", video_engine="none")) as gateway,
        browser(wav) as context,
    ):
        page = await context.new_page()
        log = PageLog(page)
        await page.goto(gateway.http + "/voice.html?transport=websocket")
        await page.get_by_role("switch", name="Push to talk").check()
        await page.get_by_role("button", name="Start").click()
        await wait_until(page, "v.client && v.client.state === 'open'", 15, log)
        vad_off = "v.seen.session?.audio.input.turn_detection === null && v.seen.session.audio.input"
        audio_input = await wait_until(page, vad_off, 10, log)
        assert audio_input["transcription"]["model"] == "whisper-1"
        # Chromium's fake microphone runs on a timer: on a starved machine it skips what it could
        # not deliver in time, and pocketsphinx hears garbled words (CI heard "you do you want to
        # do ya"). So up to three turns, each after the last answer has played: one must hear it.
        talk = page.get_by_role("button", name="Talk")
        turns: list[str] = []
        while len(turns) < 3 and not any("what" in heard for heard in turns):
            await talk.click()
            assert await talk.get_attribute("aria-pressed") == "true"
            await asyncio.sleep(hold_s)  # the looped speech plays into the microphone
            await page.get_by_role("button", name="Done talking: send").click()
            answered = f"v.seen.responses.length > {len(turns)} && v.seen.latencies.length > {len(turns)} && v.seen"
            await wait_until(page, answered, 30, log)
            played = f"v.audio.stats.bufferedMs === 0 && Object.keys(v.seen.outputDone).length > {len(turns)}"
            seen = await wait_until(page, f"({played}) && v.seen", 30, log)
            turns = list(seen["inputTranscripts"].values())
        assert any("what" in heard for heard in turns), turns
        assert list(seen["outputTranscripts"].values()) == [f"You said: {heard}" for heard in turns]
        assert len(seen["latencies"]) == len(turns)  # each measured from its commit
        assert seen["bargeIns"] == 0
        assert not log.errors, log
