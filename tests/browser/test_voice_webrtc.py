"""The voice page over WebRTC (its default where the browser has RTCPeerConnection) in a real
Chromium against a real gateway on the embedded CPU cascade (silero VAD, pocketsphinx,
echo, eSpeak NG): the fake microphone plays a spoken WAV into the call's track, the answer
comes back as the call's Opus track (its level measured in the page with WebAudio), the
events on the ``oai-events`` data channel.

Barge-in is the gateway's over WebRTC: it plays the audio, so it cuts the track and
truncates the item itself. It is measured where it happens: the call's outgoing track
(``AudioOutTrack``) is watched for a clear, and what it sent after it is counted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from browser_support import browser, screenshot
from starlette.responses import JSONResponse
from support.gateway import run_gateway
from voice_support import LongAnswerThinker, RecordingThinker, check_turn_latency, speech_wav, wait_until
from voice_support import open_voice_page as open_page

from gateway.settings import Settings
from orchestrator.engine import Message
from orchestrator.engines.cascade import CascadeEngine
from orchestrator.engines.cascade.thinker import EchoThinker

pytestmark = pytest.mark.timeout(200)

FRAME_MS = 20


async def open_voice_page(context: Any, gateway: Any) -> tuple[Any, Any]:
    page, log = await open_page(context, gateway)
    assert await page.evaluate("() => window.__voice.seen.transport") == "webrtc", log
    return page, log


def the_call(gateway: Any) -> Any:
    calls = list(gateway.runtime.calls.calls.values())
    assert len(calls) == 1, calls
    return calls[0]


async def test_a_spoken_turn_over_webrtc_shows_the_transcripts_and_plays_the_answer_track(tmp_path: Path) -> None:
    wav = await speech_wav(tmp_path / "speech.wav", lead_ms=1500, tail_ms=15000)
    async with (
        run_gateway(Settings(engine="cascade", video_engine="none")) as gateway,
        browser(wav) as context,
    ):
        page, log = await open_voice_page(context, gateway)
        assert await page.locator("#path").inner_text() == "WebRTC (Opus tracks, oai-events)"
        done = "v.seen.playback.some((p) => p.type === 'stopped') && v.seen.latencies.length >= 1 && v.seen"
        seen = await wait_until(page, done, 40, log)
        [user_item] = seen["inputTranscripts"]
        assert "what" in seen["inputTranscripts"][user_item]
        [answer_item] = seen["outputTranscripts"]
        answer = seen["outputTranscripts"][answer_item]
        assert answer == seen["outputDone"][answer_item] == f"You said: {seen['inputTranscripts'][user_item]}"
        [response] = seen["responses"]
        assert response["status"] == "completed"
        # The gateway played it: started when its first frame went out, stopped after its last.
        assert [(p["type"], p["responseId"]) for p in seen["playback"]] == [
            ("started", response["id"]),
            ("stopped", response["id"]),
        ]
        latency = check_turn_latency(seen, "output_audio_buffer.started")  # the same definition as the WebSocket's
        assert latency > 0  # (no bound: a busy machine's pocketsphinx takes seconds; bench/ measures speed)

        # The data channel carried every event but the audio, in order, each once.
        types = [e["type"] for e in seen["events"]]
        assert "response.output_audio.delta" not in types
        assert types[0] == "session.created"
        seqs = [e["seq"] for e in seen["events"] if e["seq"]]
        assert seqs == sorted(set(seqs))

        # The answer's audio went out on the track, 20 ms frames on the wall clock...
        call = the_call(gateway)
        sent_ms = call.track.sent_ms(answer_item)
        assert sent_ms > 500
        assert call.track.audio_frames_sent >= sent_ms // FRAME_MS
        # ...and was heard in the page: the track's level, measured there with WebAudio.
        level = await page.evaluate("() => window.__voice.answerLevel")
        started_at = seen["playback"][0]["at"]
        assert level["peak"] > 0.05, level
        spoken = sum(b - a for a, b in level["bursts"] if b >= started_at)
        assert spoken > 0.3 * sent_ms, (spoken, sent_ms, level)
        assert all(b < started_at or a > started_at - 200 for a, b in level["bursts"])  # nothing before it began

        assert "You said:" in await page.locator("#log").inner_text()
        assert "Turn 1:" in await page.locator("#latency").inner_text()
        await screenshot(page, "voice_page_webrtc.png")
        assert not log.errors, log


class FastLongThinker:
    """Echo, then a long tail, all at once: the answer is generated (response.done) long
    before its audio has played, so a barge-in finds it playing but no longer running."""

    description = "fast long echo (test)"

    async def think(self, messages: tuple[Message, ...], instructions: str):  # type: ignore[no-untyped-def]
        async for word in EchoThinker().think(messages, instructions):
            yield word
        yield ". " + LongAnswerThinker.TAIL


class TrackWatch:
    """The call's outgoing track, watched: each clear() with the ledger as it was then, and
    how many audio frames had gone out when the next answer's audio was fed."""

    def __init__(self, track: Any) -> None:
        self.track = track
        self.clears: list[dict[str, Any]] = []
        clear, feed = track.clear, track.feed

        def watched_clear() -> Any:
            result = clear()  # the next frame composed is silence
            self.clears.append({
                "result": result, "frames": track.frames_sent, "audio_frames": track.audio_frames_sent,
                "audio_frames_next_answer": None,
            })  # fmt: skip
            return result

        def watched_feed(pcm16: bytes, *, response_id: str, item_id: str) -> None:
            last = self.clears[-1] if self.clears else None
            cut = last is not None and last["result"] is not None and last["result"].response_id == response_id
            if last is not None and not cut and last["audio_frames_next_answer"] is None:
                last["audio_frames_next_answer"] = track.audio_frames_sent
                last["frames_next_answer"] = track.frames_sent
            feed(pcm16, response_id=response_id, item_id=item_id)

        track.clear, track.feed = watched_clear, watched_feed


@pytest.mark.parametrize("answer", ["generating", "generated"])
async def test_barge_in_cuts_the_answer_track_within_a_frame_and_truncates_to_what_was_sent(
    tmp_path: Path, answer: str
) -> None:
    # The loop: speech at 0.5 s, then 4 s of silence; the long answer is still playing when
    # the speech comes round again. "generating": the answer is still being written then
    # (the session cancels it); "generated": it is complete, only its audio still plays.
    wav = await speech_wav(tmp_path / "speech.wav", lead_ms=500, tail_ms=4000)
    thinker = LongAnswerThinker() if answer == "generating" else FastLongThinker()
    async with (
        run_gateway(Settings(engine="cascade", video_engine="none"), engine=CascadeEngine(thinker=thinker)) as gateway,
        browser(wav) as context,
    ):
        page, log = await open_voice_page(context, gateway)
        watch = TrackWatch(the_call(gateway).track)
        # (The first answer waits on pocketsphinx, which takes many seconds on a starved machine.)
        await wait_until(page, "v.seen.playback.some((p) => p.type === 'started')", 60, log)
        truncation = await wait_until(page, "v.seen.truncations[0]", 30, log)
        cleared = await wait_until(page, "v.seen.playback.find((p) => p.type === 'cleared')", 10, log)
        # The speech that barged in is answered: its audio is fed after the cut.
        await wait_until(page, "v.seen.playback.filter((p) => p.type === 'started').length >= 2", 30, log)

        clear = next(c for c in watch.clears if c["result"] is not None)  # (the loop may barge in again later)
        cut = clear["result"]
        # Not one frame of audio after the clear: the frame after it was silence, and every
        # one until the next answer (the track kept running: it sent silence meanwhile).
        assert clear["audio_frames_next_answer"] == clear["audio_frames"], clear
        assert clear["frames_next_answer"] > clear["frames"] + 5, clear
        # The item was truncated at what had gone out, to the frame, and the page was told.
        assert (truncation["itemId"], truncation["audioEndMs"]) == (cut.item_id, cut.audio_end_ms)
        assert cut.audio_end_ms % FRAME_MS == 0 and cut.audio_end_ms > 0
        assert cut.dropped_ms > 0  # there was more to say
        assert cleared["responseId"] == cut.response_id
        first = await wait_until(page, "v.seen.responses[0]", 10, log)
        if answer == "generating":
            assert (first["status"], first["reason"]) == ("cancelled", "turn_detected")
        else:
            assert first["status"] == "completed"  # it had ended; only its audio was cut

        # In the page: the answer fell silent after the cleared event, until the next one, once
        # the audio already on its way had played: the browser's jitter buffer and the network,
        # ~0.2 s on a quiet machine, up to 0.53 s seen under a load average of 12 on 2 cores.
        # The next answer comes after the barging speech ends (its ~1 s, then the VAD's 0.5 s of
        # silence): the half second between is the cut's silence.
        level = await page.evaluate("() => window.__voice.answerLevel")
        seen = await page.evaluate("() => window.__voice.seen")
        next_started = [p for p in seen["playback"] if p["type"] == "started"][1]["at"]
        assert next_started > cleared["at"] + 1300, (cleared["at"], next_started)
        heard_after = [(a, b) for a, b in level["bursts"] if b > cleared["at"] + 800 and a < next_started]
        assert heard_after == [], (heard_after, cleared["at"], next_started)
        note = page.locator(f'li[data-item-id="{cut.item_id}"] .note')
        await note.filter(has_text="trimmed to what you heard").wait_for(timeout=5000)
        assert not [e for e in seen["errors"] if e], seen["errors"]
        await screenshot(page, f"voice_page_webrtc_barge_in_{answer}.png")
        assert not log.errors, log


def cut_the_network(call: Any) -> None:
    """The call's UDP goes dark both ways, as when its replica's host is gone: every ICE
    socket under the call drops what it receives and sends nothing (no DTLS close, no SCTP
    abort: the browser learns it only from its consent checks going unanswered)."""
    connections = {t.receiver.transport.transport._connection for t in call.pc.getTransceivers()}
    if call.pc.sctp is not None:
        connections.add(call.pc.sctp.transport.transport._connection)
    for connection in connections:
        for protocol in connection._protocols:
            protocol.datagram_received = lambda data, addr: None
            protocol.send_stun = lambda message, addr: None

            async def send_nothing(data: bytes, addr: Any) -> None:
                return None

            protocol.send_data = send_nothing


def refuse_the_first_reoffer(app: Any, refused: list[str]) -> Any:
    """503 to the first POST /v1/realtime/calls that carries a resume (a replica draining):
    the SDK must back off and offer again."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        resume = scope["type"] == "http" and scope["path"] == "/v1/realtime/calls" and scope["method"] == "POST"
        resume = resume and any(name == b"x-omni-resume" for name, _ in scope["headers"])
        if resume and not refused:
            refused.append(scope["path"])
            body = {"error": {"type": "invalid_request_error", "code": "server_busy", "param": None,
                              "message": "This replica is shutting down; offer the call again."}}  # fmt: skip
            await JSONResponse(body, status_code=503)(scope, receive, send)
            return
        await app(scope, receive, send)

    return wrapped


async def test_a_call_whose_network_dies_is_offered_again_and_resumes_with_no_event_lost_or_doubled(
    tmp_path: Path,
) -> None:
    wav = await speech_wav(tmp_path / "speech.wav", lead_ms=1500, tail_ms=20000)
    thinker = RecordingThinker()
    refused: list[str] = []
    settings = Settings(engine="cascade", video_engine="none")
    async with (
        run_gateway(
            settings, engine=CascadeEngine(thinker=thinker), wrap=lambda app: refuse_the_first_reoffer(app, refused)
        ) as gateway,
        browser(wav) as context,
    ):
        page, log = await open_voice_page(context, gateway)
        first_call = the_call(gateway)
        # Mid-answer: its first words are out, the rest is still being written.
        await wait_until(page, "Object.keys(v.seen.outputTranscripts).length === 1", 40, log)
        killed_after = await page.evaluate("() => window.__voice.client.lastSeq")
        cut_the_network(first_call)

        await wait_until(page, "v.seen.states.filter((s) => s === 'open').length === 2", 60, log)
        seen = await wait_until(page, "v.seen.responses.length >= 1 && v.seen", 30, log)
        client = await page.evaluate(
            "() => { const c = window.__voice.client; return {stats: c.stats, lastSeq: c.lastSeq, callId: c.callId}; }"
        )
        stats = client["stats"]
        # Lost (disconnected past the grace), refused once with 503, offered again, resumed.
        assert refused == ["/v1/realtime/calls"]
        assert seen["states"] == ["connecting", "open", "reconnecting", "reconnecting", "resuming", "open"]
        assert stats["reoffers"] == 2 and stats["failedAttempts"] == 1 and stats["resumes"] == 1
        assert stats["sessionsLost"] == 0 and stats["replayedEvents"] > 0
        # The new call carries on the same session (any replica would: this is the one here).
        new_call = the_call(gateway)
        assert new_call is not first_call and first_call.ended
        assert client["callId"] == new_call.call_id

        # Nothing the server said is missing from what the page emitted, nothing twice.
        [answer] = thinker.answers
        [heard] = thinker.heard
        [answer_item] = seen["outputTranscripts"]
        assert seen["outputTranscripts"][answer_item] == answer == seen["outputDone"][answer_item]
        assert list(seen["inputTranscripts"].values()) == [heard]
        assert seen["responses"][0]["status"] == "completed"
        seqs = [e["seq"] for e in seen["events"] if e["seq"]]
        assert seqs == sorted(set(seqs))
        assert any(seq > killed_after for seq in seqs)
        # The answer's audio the journal still had plays on the new call's track.
        resumed_at = next(e["at"] for e in seen["events"] if e["type"] == "session.resumed")
        await wait_until(page, f"v.answerLevel.bursts.some(([a, b]) => a > {resumed_at})", 20, log)
        assert "resumed" in await page.locator("#status").inner_text()
        await screenshot(page, "voice_page_webrtc_resumed.png")
        assert not [e for e in log.errors if "status of 503" not in e], log
