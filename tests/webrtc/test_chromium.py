"""A real Chromium (Debian's, driven by Playwright) calls the gateway's media layer the way
the OpenAI Agents SDK does: ``oai-events`` created first, the fake microphone playing a
spoken WAV, and the offer posted straight from ``createOffer`` (trickle ICE, no candidate
in it: the gateway's ICE agent must learn the browser's address from its checks).

The page is served by Playwright's router (no web server); signaling goes through
``page.evaluate``. Skips without Chromium or Playwright (scripts/install_browser.sh).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from rtc_support import (
    aligned_correlation,
    envelope,
    loopback_config,
    nominated,
    silence,
    started_factory,
    tone,
    wait_for,
    write_wav,
)

from gateway.transport.webrtc.audio_in import AudioIn
from gateway.transport.webrtc.audio_out import AudioOutTrack
from gateway.transport.webrtc.datachannel import EventChannel
from gateway.transport.webrtc.peer import PeerFactory, PeerWatchdog
from gateway.transport.webrtc.sdp import check_offer

CHROMIUM = os.environ.get("OMNI_TEST_CHROMIUM", "/usr/bin/chromium")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not os.access(CHROMIUM, os.X_OK) or importlib.util.find_spec("playwright") is None,
        reason=f"needs Chromium at {CHROMIUM} and Python Playwright (scripts/install_browser.sh)",
    ),
]
ORIGIN = "http://127.0.0.1:9"  # a loopback origin is a secure context: getUserMedia works
PAGE = """<!doctype html><html><body><audio id="out" autoplay></audio><script>
window.messages = [];
window.offer = async () => {
  const pc = window.pc = new RTCPeerConnection();
  const dc = window.dc = pc.createDataChannel('oai-events');
  dc.onopen = () => dc.send(JSON.stringify({type: 'session.update', session: {instructions: 'be brief'}}));
  dc.onmessage = (e) => window.messages.push(e.data);
  pc.ontrack = (e) => { document.getElementById('out').srcObject = e.streams[0]; };
  // no echo cancellation, noise suppression or gain control: the test compares what arrives with the WAV
  const mic = await navigator.mediaDevices.getUserMedia(
    {audio: {echoCancellation: false, noiseSuppression: false, autoGainControl: false}});
  pc.addTrack(mic.getAudioTracks()[0]);
  const offer = await pc.createOffer();
  await pc.setLocalDescription(offer);
  return offer.sdp;  // as the Agents SDK posts it: before any candidate was gathered
};
window.answer = (sdp) => window.pc.setRemoteDescription({type: 'answer', sdp});
window.inbound = async () => {
  let out = null;
  (await window.pc.getStats()).forEach((s) => {
    if (s.type === 'inbound-rtp' && s.kind === 'audio')
      out = {packets: s.packetsReceived, energy: s.totalAudioEnergy || 0, samples: s.totalSamplesReceived || 0};
  });
  return out;
};
</script></body></html>"""


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright
    from support.speech import speak

    speech = await speak("Hello there. What is the weather like today?", rate=48000)
    wav = write_wav(tmp_path / "mic.wav", speech + silence(1500, 48000), 48000)
    async with async_playwright() as p:
        browser = await p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--use-fake-ui-for-media-stream",
                "--allow-loopback-in-peer-connection",  # loopback candidates: the gateway offers 127.0.0.1 alone
                "--use-fake-device-for-media-stream",
                f"--use-file-for-fake-audio-capture={wav}",
                "--autoplay-policy=no-user-gesture-required",
            ],
        )
        try:
            page = await browser.new_page()
            await page.route(f"{ORIGIN}/", lambda route: route.fulfill(body=PAGE, content_type="text/html"))
            await page.goto(f"{ORIGIN}/")
            page.speech = speech  # type: ignore[attr-defined]
            yield page
        finally:
            await browser.close()


async def test_chromium_holds_a_call_with_the_media_layer(page: Any) -> None:
    factory = await started_factory(PeerFactory(loopback_config()))
    offer = await page.evaluate("window.offer()")
    summary = check_offer(offer)
    assert summary.candidates == 0 and summary.has_data_channel

    pc = factory.create()
    chunks: list[bytes] = []
    pc.on("track", lambda track: AudioIn(track, lambda chunk, fmt: chunks.append(chunk)).start())
    events: list[dict[str, Any]] = []
    channel = EventChannel(lambda text: events.append(orjson.loads(text)), max_message_size=summary.max_message_size)
    pc.on("datachannel", channel.accept)
    out = AudioOutTrack(24000)
    dead: list[str] = []
    dog = PeerWatchdog(pc, dead.append, connect_timeout_s=20.0, peer_timeout_s=10.0)
    try:
        answer = await factory.answer(pc, offer, audio_track=out)
        dog.start()
        await page.evaluate("(sdp) => window.answer(sdp)", answer)
        await wait_for(lambda: pc.connectionState == "connected", "Chromium to connect (ICE from its checks alone)")
        # The gateway's media socket is on loopback (127.0.0.1 advertised in replace mode). Chromium
        # checks from sockets of its own choosing (loopback allowed, but it may pick the machine's
        # own address): to 127.0.0.1, which never leaves the machine.
        pairs = nominated(pc)
        assert pairs and all(local[0] == "127.0.0.1" for local, _ in pairs), pairs

        # events, both ways
        await wait_for(lambda: bool(events), "the page's session.update")
        assert events[0] == {"type": "session.update", "session": {"instructions": "be brief"}}
        channel.send({"type": "session.updated", "event_id": "event_1"})
        await page.wait_for_function("window.messages.length === 1", timeout=20000)
        assert orjson.loads(await page.evaluate("window.messages[0]")) == {
            "type": "session.updated",
            "event_id": "event_1",
        }

        # the fake microphone's speech reaches the gateway as PCM16 at Opus's 48 kHz (unconverted)
        speech16 = np.frombuffer(page.speech, dtype="<i2")[::3].tobytes()
        want = len(speech16) // 640 + 40
        await wait_for(lambda: len(chunks) >= want, "the spoken sentence from Chromium's microphone")
        sent, got = envelope(speech16, 16000), envelope(b"".join(chunks), 48000)
        # Chromium's fake device loops the file from when getUserMedia opened it: the call
        # hears it from some point on, so the envelopes are compared at their best alignment.
        assert aligned_correlation(sent, got) > 0.8

        # the answer's audio reaches Chromium's playout
        before = await page.evaluate("window.inbound()")
        assert before is not None and before["packets"] > 0 and before["energy"] < 0.001  # silence so far
        out.feed(tone(600, 1000, 24000), response_id="r1", item_id="i1")
        out.end_response("r1")
        await wait_for(lambda: out.playing is None and out.sent_ms("i1") == 1000, "the answer to go out")
        await page.wait_for_function("window.inbound().then(s => s.energy > 0.005)", timeout=20000, polling=100)
        assert dead == []
    finally:
        await dog.stop()
        await pc.close()
