"""GPT-Live over WebRTC from a real Chromium (docs/live.md, *WebRTC*): a page makes its own
``RTCPeerConnection`` with the fake microphone playing a spoken WAV and an ``oai-events``
data channel, its backend (here, the test) creates the session with ``POST
/v1/live/sessions`` and the page's offer, the page applies the answer. Against the
gateway on its embedded CPU cascade: the speech is heard, the answer's transcript comes
on the channel and its audio on the track (its level measured in the page with
WebAudio); every event the page received is checked against the SDK's Live models.

The gateway gathers ICE on 127.0.0.1 only and advertises it (``replace``), and checks no
candidate outside 127.0.0.0/8: Chromium reaches it there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser_support import PageLog, browser
from support.gateway import run_gateway
from support.sdk_shapes import check_live_event
from voice_support import speech_wav

from gateway.settings import Settings

pytestmark = pytest.mark.timeout(150)

KEY = "sk-live-chromium"

SCRIPT = """
window.live = { events: [], level: 0, state: "new" };
window.offer = async () => {
  const pc = new RTCPeerConnection();
  window.pc = pc;
  const mic = await navigator.mediaDevices.getUserMedia({ audio: true });
  pc.addTrack(mic.getAudioTracks()[0], mic);
  const channel = pc.createDataChannel("oai-events");
  channel.onmessage = (m) => window.live.events.push(JSON.parse(m.data));
  window.channel = channel;
  pc.ontrack = (e) => {
    const ctx = new AudioContext();
    const source = ctx.createMediaStreamSource(new MediaStream([e.track]));
    const analyser = ctx.createAnalyser();
    source.connect(analyser);
    const data = new Float32Array(analyser.fftSize);
    const tick = () => {
      analyser.getFloatTimeDomainData(data);
      let sum = 0;
      for (const x of data) sum += x * x;
      window.live.level = Math.max(window.live.level, Math.sqrt(sum / data.length));
      setTimeout(tick, 20);
    };
    tick();
    const out = new Audio();
    out.srcObject = new MediaStream([e.track]);
    out.play();
  };
  pc.onconnectionstatechange = () => { window.live.state = pc.connectionState; };
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise((done) => {
    if (pc.iceGatheringState === "complete") return done();
    pc.onicegatheringstatechange = () => pc.iceGatheringState === "complete" && done();
  });
  return pc.localDescription.sdp;
};
window.answer = async (sdp) => { await window.pc.setRemoteDescription({ type: "answer", sdp }); };
window.ready = true;
"""


@pytest.fixture(autouse=True)
def loopback_ice(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The gateway's ICE host candidates on 127.0.0.1 only (aioice leaves loopback out)."""
    import aioice.ice

    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])
    yield


async def until(page: Any, condition: str, what: str, log: PageLog, timeout_s: float = 60.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = await page.evaluate(f"() => {{ const l = window.live; return ({condition}); }}")
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            seen = await page.evaluate("() => window.live")
            raise AssertionError(f"timed out waiting for {what}\nseen: {seen}\n{log}")
        await asyncio.sleep(0.1)


async def test_a_spoken_exchange_over_live_webrtc_in_chromium(tmp_path: Path) -> None:
    wav = await speech_wav(tmp_path / "speech.wav", lead_ms=1500, tail_ms=15000)
    settings = Settings(engine="cascade", video_engine="none", api_keys=(KEY,),
                        webrtc_advertised_addresses=("127.0.0.1",), webrtc_advertise_mode="replace",
                        webrtc_peer_networks=("127.0.0.0/8",))  # fmt: skip
    async with run_gateway(settings) as gateway, browser(wav) as context:
        page = await context.new_page()
        log = PageLog(page)
        await page.goto(gateway.http + "/")
        await page.add_script_tag(content=SCRIPT)
        await page.wait_for_function("() => window.ready === true")
        offer = await page.evaluate("() => window.offer()")
        async with httpx.AsyncClient(timeout=30) as http:  # the page's backend, with its key
            body = {"session": {"model": "gpt-live-1"}, "transport": {"type": "webrtc", "sdp": offer}}
            r = await http.post(f"{gateway.http}/v1/live/sessions", headers={"Authorization": f"Bearer {KEY}"},
                                json=body)  # fmt: skip
        assert r.status_code == 201, r.text
        created = r.json()
        await page.evaluate("(sdp) => window.answer(sdp)", created["transport"]["sdp"])
        await until(page, "l.events.some((e) => e.type === 'session.started')", "session.started", log)
        await until(page, "l.events.some((e) => e.type === 'session.input_transcript.delta')", "the speech heard", log)
        await until(page, "l.events.some((e) => e.type === 'session.output_transcript.delta')", "the answer", log)
        await until(page, "l.level > 0.02", "the answer's audio on the track", log)
        events = await page.evaluate("() => window.live.events")
        for event in events:
            check_live_event(event, extensions=True)
        assert events[0]["type"] == "session.started" and events[0]["session"]["id"] == created["session"]["id"]
        heard = "".join(e["delta"] for e in events if e["type"] == "session.input_transcript.delta")
        said = "".join(e["delta"] for e in events if e["type"] == "session.output_transcript.delta")
        assert "what" in heard.lower() and said.startswith("You said"), (heard, said)
        assert not any(e["type"] in ("error", "session.output_audio.delta") for e in events), events
        assert not log.errors, log
