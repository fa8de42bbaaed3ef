"""Real calls between an aiortc "browser" and the gateway's media layer on this machine:
Opus in (a WAV as the microphone), Opus out (the paced track), the data channel.

Every wait is for a state (audio received, frames sent, the connection up), with generous
timeouts; timing is asserted only on what the code controls (when frames leave)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
from aiortc import RTCDataChannel, RTCPeerConnection
from aiortc.mediastreams import MediaStreamTrack
from av import AudioFrame
from rtc_support import (
    Browser,
    aligned_correlation,
    connect,
    dominant_hz,
    envelope,
    loopback_config,
    make_browser,
    nominated,
    rms,
    silence,
    started_factory,
    tone,
    wait_for,
    write_wav,
)

from gateway.audio.codecs import AudioFormat
from gateway.transport.webrtc.audio_in import AudioIn
from gateway.transport.webrtc.audio_out import AudioOutTrack
from gateway.transport.webrtc.datachannel import EventChannel, MessageTooLarge
from gateway.transport.webrtc.peer import PeerFactory, host_candidate_ports, tune_receive_buffer
from gateway.transport.webrtc.sdp import OFFER_NO_AUDIO, OfferError, check_offer

RATE_IN = 16000  # the speech sample's rate (the cascade's VAD/STT rate)
TRACK_IN = AudioFormat("pcm16", 48000)  # what the call's track hands the door: Opus's own rate, unconverted


def host_candidates(sdp: str) -> list[tuple[str, int]]:
    found = re.findall(r"^a=candidate:\S+ \d+ udp \d+ (\S+) (\d+) typ host", sdp, re.MULTILINE)
    return [(address, int(port)) for address, port in found]


class TimedTrack(AudioOutTrack):
    """Records when each frame is handed to the sender."""

    def __init__(self, sample_rate: int = 24000) -> None:
        super().__init__(sample_rate)
        self.handed: list[float] = []

    async def recv(self) -> AudioFrame:
        frame = await super().recv()
        self.handed.append(time.monotonic())
        return frame


class Gateway:
    """The gateway's side of one call, as the signaling endpoint will assemble it."""

    def __init__(self, factory: PeerFactory, out: AudioOutTrack | None = None) -> None:
        self.factory = factory
        self.pc: RTCPeerConnection = factory.create()
        self.out = out if out is not None else AudioOutTrack(24000)
        self.chunks: list[bytes] = []
        self.formats: set[AudioFormat] = set()
        self.audio_in: AudioIn | None = None
        self.pc.on("track", self._track)

    def _track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self.audio_in = AudioIn(track, self._chunk)
            self.audio_in.start()

    def _chunk(self, chunk: bytes, fmt: AudioFormat) -> None:
        self.formats.add(fmt)
        self.chunks.append(chunk)

    async def answer(self, offer: str) -> str:
        check_offer(offer)
        return await self.factory.answer(self.pc, offer, audio_track=self.out)

    async def close(self) -> None:
        if self.audio_in is not None:
            await self.audio_in.stop()
        await self.pc.close()


@pytest.fixture
async def factory() -> PeerFactory:
    return await started_factory(PeerFactory(loopback_config()))


async def call(factory: PeerFactory, **browser_kw: object) -> tuple[Gateway, Browser]:
    browser, offer = await make_browser(**browser_kw)  # type: ignore[arg-type]
    gateway = Gateway(factory)
    await connect(browser, await gateway.answer(offer), gateway.pc)
    return gateway, browser


async def test_a_call_stays_on_loopback(factory: PeerFactory) -> None:
    """127.0.0.1 advertised in replace mode: the gateway gathers there (aioice gathers no
    loopback by itself) and answers only there; the caller does the same, and the media runs
    between two loopback sockets, whatever other addresses this machine has."""
    assert factory.config.gather_addresses == ("127.0.0.1",)
    browser, offer = await make_browser()
    gateway = Gateway(factory)
    try:
        answer = await gateway.answer(offer)
        assert {address for address, _ in host_candidates(offer)} == {"127.0.0.1"}
        assert {address for address, _ in host_candidates(answer)} == {"127.0.0.1"}
        await connect(browser, answer, gateway.pc)
        pairs = nominated(gateway.pc) + nominated(browser.pc)
        assert pairs and all(local[0] == remote[0] == "127.0.0.1" for local, remote in pairs), pairs
    finally:
        await browser.close()
        await gateway.close()


async def test_the_callers_opus_track_arrives_as_mono_pcm16_at_its_own_rate(
    factory: PeerFactory, tmp_path: Path
) -> None:
    rate = 48000
    wav = write_wav(
        tmp_path / "mic.wav",
        silence(300, rate) + tone(440, 600, rate) + silence(400, rate) + tone(1200, 600, rate) + silence(600, rate),
        rate,
    )
    gateway, browser = await call(factory, wav=wav)
    try:
        await wait_for(lambda: len(gateway.chunks) >= 110, "2.2 s of the caller's audio")
        assert gateway.formats == {TRACK_IN}  # (the session converts it to the engine's rate, once)
        assert all(len(c) == 1920 for c in gateway.chunks)  # 20 ms of 48 kHz mono PCM16
        loud = [i for i, c in enumerate(gateway.chunks) if rms(c) > 1000]
        # two loud runs of ~30 chunks each, in order: the 440 Hz then the 1200 Hz tone
        runs: list[list[int]] = []
        for i in loud:
            if runs and i - runs[-1][-1] <= 2:
                runs[-1].append(i)
            else:
                runs.append([i])
        runs = [r for r in runs if len(r) >= 10]
        assert len(runs) == 2, runs
        assert [abs(len(r) - 30) <= 3 for r in runs] == [True, True]
        first = b"".join(gateway.chunks[runs[0][2] : runs[0][-2]])
        second = b"".join(gateway.chunks[runs[1][2] : runs[1][-2]])
        assert dominant_hz(first, TRACK_IN.rate) == pytest.approx(440, abs=10)
        assert dominant_hz(second, TRACK_IN.rate) == pytest.approx(1200, abs=10)
        assert rms(first) == pytest.approx(8000 / np.sqrt(2), rel=0.3)  # Opus keeps the level
    finally:
        await browser.close()
        await gateway.close()


async def test_speech_survives_the_round_trip(factory: PeerFactory, tmp_path: Path) -> None:
    from support.speech import speak

    speech = await speak("The quick brown fox jumps over the lazy dog.", rate=RATE_IN)
    wav = write_wav(tmp_path / "speech.wav", silence(200, RATE_IN) + speech + silence(500, RATE_IN), RATE_IN)
    gateway, browser = await call(factory, wav=wav)
    try:
        want = len(speech) // 640 + 20
        await wait_for(lambda: len(gateway.chunks) >= want, "the whole sentence")
        sent, got = envelope(speech, RATE_IN), envelope(b"".join(gateway.chunks), TRACK_IN.rate)
        assert aligned_correlation(sent, got, min_overlap=1.0) > 0.9  # the loudness envelopes match
        loud = got[got > 0.1 * sent.max()]
        assert 0.5 < loud.mean() / sent[sent > 0.1 * sent.max()].mean() < 2  # and about as loud
    finally:
        await browser.close()
        await gateway.close()


async def test_the_answer_is_paced_at_20_ms_never_burst(factory: PeerFactory) -> None:
    browser, offer = await make_browser()
    out = TimedTrack(24000)
    gateway = Gateway(factory, out)
    try:
        await connect(browser, await gateway.answer(offer), gateway.pc)
        await wait_for(lambda: len(out.handed) >= 5, "the track to start")
        first = len(out.handed)
        out.feed(tone(500, 2000, 24000), response_id="r1", item_id="i1")  # 2 s, all at once
        out.end_response("r1")
        await wait_for(lambda: out.queued_ms == 0 and out.playing is None, "the answer to drain")
        handed = out.handed[first:]
        # Never ahead of the wall clock: any j frames after frame i left at least
        # (j - i - catch-up - 1) frame times later; the catch-up after a stall is bounded.
        slack = out._max_catchup + 1
        times = np.array(handed)
        for i in range(len(times)):
            ahead = (np.arange(len(times) - i) - slack) * 0.020 - (times[i:] - times[i])
            assert ahead.max() <= 0.002, f"frames left faster than real time after frame {i}"
        assert times[-1] - times[0] >= 1.9  # 100 frames took their 2 s
        await wait_for(lambda: len(browser.received.loud()) >= 98, "the browser to hear the answer")
        loud = browser.received.loud()
        arrival = [browser.received.frames[i][0] for i in loud]
        assert arrival[-1] - arrival[0] >= 1.5  # heard over its duration, not in a lump
        heard = np.concatenate([browser.received.frames[i][2] for i in loud[5:-5]])
        assert dominant_hz(heard, 48000) == pytest.approx(500, abs=10)
        assert out.sent_ms("i1") == 2000
    finally:
        await browser.close()
        await gateway.close()


async def test_clear_cuts_the_track_within_a_frame_and_the_ledger_says_how_much_was_sent(factory: PeerFactory) -> None:
    events: list[tuple[str, str]] = []
    out = AudioOutTrack(
        24000, on_started=lambda r: events.append(("started", r)), on_stopped=lambda r: events.append(("stopped", r))
    )
    browser, offer = await make_browser()
    gateway = Gateway(factory, out)
    try:
        await connect(browser, await gateway.answer(offer), gateway.pc)
        out.feed(tone(700, 3000, 24000), response_id="r1", item_id="i1")
        out.end_response("r1")
        await wait_for(lambda: out.sent_ms("i1") >= 600, "600 ms of the answer to go out")
        audio_frames = out.audio_frames_sent
        result = out.clear()
        assert result is not None and (result.response_id, result.item_id) == ("r1", "i1")
        assert result.audio_end_ms == out.sent_ms("i1") == 20 * audio_frames
        assert result.audio_end_ms + result.dropped_ms == 3000
        frames_at_clear = out.frames_sent
        await wait_for(lambda: out.frames_sent >= frames_at_clear + 25, "half a second more of the track")
        assert out.audio_frames_sent == audio_frames  # nothing of the answer left after the cut
        await wait_for(lambda: len(browser.received.frames) >= frames_at_clear + 20, "the browser to receive them")
        loud = browser.received.loud()
        assert abs(len(loud) - audio_frames) <= 2  # what was heard is what the ledger counted
        last = loud[-1]
        tail = browser.received.frames[last + 2 : last + 20]
        assert len(tail) == 18 and all(rms(x) < 50 for _, _, x in tail)  # silence from then on
        assert events == [("started", "r1")]  # cleared: no stopped
    finally:
        await browser.close()
        await gateway.close()


async def test_the_oai_events_channel_carries_json_both_ways(factory: PeerFactory) -> None:
    browser, offer = await make_browser()
    summary = check_offer(offer)
    gateway = Gateway(factory)
    from_browser: list[str] = []
    binary: list[bytes] = []

    def on_message(text: str) -> None:
        from_browser.append(text)
        try:
            event = orjson.loads(text)
        except orjson.JSONDecodeError:
            # what the session's decoder does with a bad text frame, and the channel stays up
            channel.send({"type": "error", "error": {"type": "invalid_request_error", "code": "invalid_json"}})
            return
        channel.send({"type": "echo", "of": event})

    channel = EventChannel(on_message, on_binary=binary.append, max_message_size=summary.max_message_size)
    others: list[str] = []

    def on_channel(ch: RTCDataChannel) -> None:
        if not channel.accept(ch):
            others.append(ch.label)

    gateway.pc.on("datachannel", on_channel)
    channel.send({"type": "session.created"})  # before the channel exists: queued
    assert browser.channel is not None
    dc = browser.channel
    heard: list[object] = []
    dc.on("message", heard.append)
    try:
        await connect(browser, await gateway.answer(offer), gateway.pc)
        await wait_for(lambda: channel.open and dc.readyState == "open", "oai-events to open")
        await wait_for(lambda: len(heard) == 1, "session.created")
        dc.send(orjson.dumps({"type": "session.update", "session": {"instructions": "hé"}}).decode())
        dc.send("this is not JSON")
        dc.send(b"\x00\x01binary")
        dc.send('{"type": "response.create"}')
        await wait_for(lambda: len(heard) == 4 and len(binary) == 1, "the replies")
        assert [orjson.loads(m) for m in heard] == [  # type: ignore[arg-type]
            {"type": "session.created"},
            {"type": "echo", "of": {"type": "session.update", "session": {"instructions": "hé"}}},
            {"type": "error", "error": {"type": "invalid_request_error", "code": "invalid_json"}},
            {"type": "echo", "of": {"type": "response.create"}},
        ]
        assert from_browser[1] == "this is not JSON" and binary == [b"\x00\x01binary"]
        extra = browser.pc.createDataChannel("something-else")
        await wait_for(lambda: others == ["something-else"], "the other channel to be refused")
        assert extra.label == "something-else" and channel.channel is not None and channel.channel.label == "oai-events"
        with pytest.raises(MessageTooLarge):
            channel.send({"type": "x", "pad": "x" * summary.max_message_size})
        assert channel.open  # refused before it reached SCTP
    finally:
        await browser.close()
        await gateway.close()


async def test_an_offer_without_audio_is_refused_before_any_media(factory: PeerFactory) -> None:
    browser, offer = await make_browser(audio=False)
    try:
        with pytest.raises(OfferError) as info:
            check_offer(offer)
        assert info.value.code == OFFER_NO_AUDIO
    finally:
        await browser.close()


async def test_an_offer_aiortc_cannot_apply_is_an_invalid_offer(factory: PeerFactory) -> None:
    browser, offer = await make_browser()
    broken = offer.replace("a=rtpmap:96 opus/48000/2", "a=rtpmap:96 opus/48000/2\r\na=extmap:x urn:bogus")
    pc = factory.create()
    try:
        check_offer(broken)  # our checks let it through...
        with pytest.raises(OfferError) as info:
            await factory.answer(pc, broken)
        assert info.value.code == "invalid_offer" and "could not be applied" in info.value.message
    finally:
        await pc.close()
        await browser.close()


async def test_the_port_range_and_the_loopback_advertised_in_replace_mode_are_honoured() -> None:
    # (add mode's server-reflexive candidates: test_sdp.py; a machine's own addresses are never used here)
    factory = await started_factory(PeerFactory(loopback_config(udp_port_range=(45100, 45139))))
    assert factory.warnings == [] and factory.port_range == (45100, 45139)
    calls = []
    try:
        for _ in range(2):
            browser, offer = await make_browser()
            gateway = Gateway(factory)
            answer = await gateway.answer(offer)
            calls.append((gateway, browser))
            ports = host_candidate_ports(answer)
            assert ports and all(45100 <= p <= 45139 for p in ports)
            assert {address for address, _ in host_candidates(answer)} == {"127.0.0.1"} and "typ srflx" not in answer
            await connect(browser, answer, gateway.pc)  # reached on loopback, on a port of the range
        first, second = (set(host_candidates(g.pc.localDescription.sdp)) for g, _ in calls)
        assert not first & second  # each call its own sockets (a port may serve two addresses)
    finally:
        for gateway, browser in calls:
            await browser.close()
            await gateway.close()


async def test_an_exhausted_port_range_answers_without_candidates_not_an_exception(factory: PeerFactory) -> None:
    import socket

    held = []
    try:
        for port in (45200, 45201):
            for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
                sock = socket.socket(family, socket.SOCK_DGRAM)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind((host, port))
                held.append(sock)
        tight = PeerFactory(loopback_config(udp_port_range=(45200, 45201)))
        tight.port_range = (45200, 45201)  # start() would probe and keep it: the range is valid, just full
        browser, offer = await make_browser()
        pc = tight.create()
        try:
            answer = await tight.answer(pc, offer)
            assert host_candidate_ports(answer) == []
        finally:
            await pc.close()
            await browser.close()
    finally:
        for sock in held:
            sock.close()


async def test_the_receive_buffer_is_tuned_or_left_alone(factory: PeerFactory) -> None:
    assert factory.receive_prefetch == 1 and factory.warnings == []  # start() found aiortc as expected
    pc = RTCPeerConnection()
    try:
        assert tune_receive_buffer(pc.addTransceiver("audio").receiver, 1)
        assert not tune_receive_buffer(object(), 1)  # type: ignore[arg-type]  # not aiortc's: untouched
    finally:
        await pc.close()
    keep = await started_factory(PeerFactory(loopback_config(receive_prefetch_frames=None)))
    assert keep.receive_prefetch is None and keep.warnings == []


def test_the_port_range_holds_on_uvloop_too() -> None:
    # ``omni-gateway serve`` runs on uvloop: its loop must take the hook as asyncio's does.
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> list[int]:
        factory = await started_factory(PeerFactory(loopback_config(udp_port_range=(45300, 45319))))
        assert factory.warnings == [] and factory.port_range == (45300, 45319)
        browser, offer = await make_browser()
        gateway = Gateway(factory)
        try:
            answer = await gateway.answer(offer)
            await connect(browser, answer, gateway.pc)
            return host_candidate_ports(answer)
        finally:
            await browser.close()
            await gateway.close()

    ports = uvloop.run(scenario())
    assert ports and all(45300 <= p <= 45319 for p in ports)
