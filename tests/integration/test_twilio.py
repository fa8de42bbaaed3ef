"""Phone calls through carriers' media streams, end to end: Twilio Media Streams
(``/v1/telephony/twilio``, μ-law), Telnyx Media Streaming (``/v1/telephony/telnyx``,
A-law, its media delivered out of order), Plivo Audio Streams (``/v1/telephony/plivo``,
μ-law, and L16 at 16 kHz), Vonage's Voice API WebSockets (``/v1/telephony/vonage``, binary
linear PCM16 at 16 kHz) and Exotel's Voicebot applet (``/v1/telephony/exotel``, linear
PCM16 at 8 kHz in base64).

The carrier is a simulator of ``tests/support/twilio_sim.py`` (written from each carrier's
documents: their clouds cannot run here), over a real loopback WebSocket; the gateway is
the real one on the embedded CPU cascade (silero VAD, pocketsphinx, eSpeak NG), the
caller's voice is eSpeak NG's, in the carrier's G.711 or linear PCM. A backend's sideband
(``/v1/realtime?call_id=``) watches the session's events.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import websockets
from support.gateway import RunningGateway, connect, run_gateway
from support.speech import silence, speak
from support.twilio_sim import (
    ExotelCall,
    PlivoCall,
    PlivoL16Call,
    TelnyxCall,
    TwilioCall,
    VonageCall,
    alaw,
    mulaw,
    pcm16,
    vonage_jwt,
)
from support.waiting import until

from gateway.audio.codecs import AudioFormat, Codec
from gateway.hosting.calls import call_id_of
from gateway.hosting.host import SessionHost
from gateway.settings import Settings
from gateway.transport.telephony.call import PhoneCall
from orchestrator.engine import Message
from orchestrator.engines.cascade import CascadeEngine
from orchestrator.engines.cascade.thinker import EchoThinker
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(120)

TAIL = " ".join(["I am still talking about this and that, so you can interrupt me."] * 4)
TOKEN = "twilio-test-auth-token"
VONAGE_SECRET = "vonage-test-signature-secret-of-32-bytes"


class WrittenAtOnceThinker:
    """Echo and a long tail, all at once: the answer is written within a second or so, and
    its audio (some 15 s) is the call's to pace out."""

    description = "long echo, written at once (test)"

    async def think(self, messages: tuple[Message, ...], instructions: str) -> AsyncIterator[str]:
        async for word in EchoThinker().think(messages, instructions):
            assert isinstance(word, str)
            yield word
        yield ". " + TAIL


async def mint(gw: RunningGateway, headers: dict[str, str] | None = None) -> str:
    async with httpx.AsyncClient() as http:
        res = await http.post(gw.http + "/v1/realtime/client_secrets", headers=headers or {},
                              json={"session": {"type": "realtime", "instructions": "Answer the phone."}})  # fmt: skip
    assert res.status_code == 200, res.text
    return str(res.json()["value"])


async def read_all(client: Any, arrivals: dict[int, float]) -> None:
    """Every event the sideband is sent, into its ``events`` (shapes checked as they come),
    and when each arrived."""
    with contextlib.suppress(websockets.ConnectionClosed):
        while True:
            await client.recv(timeout=3600)
            arrivals[len(client.events) - 1] = time.monotonic()


def phone_host(gw: RunningGateway) -> SessionHost | None:
    hosts = [h for h in gw.runtime.hosting.hosts.values() if isinstance(h, SessionHost) and h.call]
    return hosts[0] if hosts else None


def twilio_url(gw: RunningGateway) -> str:
    return f"ws://127.0.0.1:{gw.port}/v1/telephony/twilio"


# (carrier path, its simulator, how it encodes the caller's voice, at what rate, the session's format)
CARRIERS: dict[str, tuple[str, type[TwilioCall], Callable[[bytes], bytes], int, tuple[Codec, int]]] = {
    "twilio": ("twilio", TwilioCall, mulaw, 8000, ("pcmu", 8000)),
    "telnyx": ("telnyx", TelnyxCall, alaw, 8000, ("pcma", 8000)),
    "plivo": ("plivo", PlivoCall, mulaw, 8000, ("pcmu", 8000)),
    "plivo-l16": ("plivo", PlivoL16Call, pcm16, 16000, ("pcm16", 24000)),
    "vonage": ("vonage", VonageCall, pcm16, 16000, ("pcm16", 24000)),
    "exotel": ("exotel", ExotelCall, pcm16, 8000, ("pcm16", 24000)),
}


@pytest.mark.parametrize("carrier", sorted(CARRIERS))
async def test_a_spoken_call_answer_marks_barge_in_dtmf_and_stop(carrier: str) -> None:
    path, simulator, encode, rate, session_format = CARRIERS[carrier]
    utterance = encode(await speak("what is your name", rate))
    quiet = encode(silence(100, rate))
    engine = CascadeEngine(thinker=WrittenAtOnceThinker())
    async with run_gateway(Settings(engine="cascade", video_engine="none"), engine=engine) as gw:
        secret = await mint(gw)
        call = simulator(f"ws://127.0.0.1:{gw.port}/v1/telephony/{path}", secret)
        await call.connect()
        await until(lambda: phone_host(gw) is not None, "the call's session")
        host = phone_host(gw)
        assert host is not None
        # The session's audio is the carrier's G.711, both ways, or for linear PCM at 16 or 8 kHz the
        # session's linear PCM (24 kHz: the only rate of audio/pcm in the Realtime API's schema).
        assert host.session.config.input_format == host.output_format == AudioFormat(*session_format)
        assert host.session.config.instructions == "Answer the phone."  # the secret's session
        async with connect(gw.url + f"?call_id={call_id_of(host.id)}") as sideband:
            events = sideband.events
            arrived: dict[int, float] = {}
            reader = asyncio.get_running_loop().create_task(read_all(sideband, arrived))

            def first(kind: str, after: int = 0) -> dict[str, Any] | None:
                return next((e for e in events[after:] if e["type"] == kind), None)

            try:
                # The caller asks; the answer is written at once and paced out, a mark after each chunk.
                await call.speak(quiet * 5 + utterance + quiet * 15)
                await until(lambda: first("response.done") is not None, "the first answer")
                done = first("response.done")
                assert done is not None and done["response"]["status"] == "completed"
                item_id = done["response"]["output"][0]["id"]
                await until(lambda: call.heard_ms() > 1500 and len(call.marks_echoed) > 5, "the answer to play")
                assert first("output_audio_buffer.started") is not None
                # The caller talks over it: clear, truncated at what was played, the turn cancelled.
                mark_count = len(events)
                began = time.monotonic()
                speaking = asyncio.get_running_loop().create_task(call.speak(utterance + quiet * 15))
                await until(lambda: bool(call.clears), "the clear")
                heard_at_clear = call.heard_ms()
                print(f"barge-in: clear {1000 * (call.clears[0] - began):.0f} ms after the caller began to speak")
                await until(lambda: first("conversation.item.truncated", mark_count) is not None, "the truncation")
                truncated = first("conversation.item.truncated", mark_count)
                cleared = first("output_audio_buffer.cleared", mark_count)
                assert truncated is not None and cleared is not None
                assert truncated["item_id"] == item_id
                assert cleared["response_id"] == done["response"]["id"]
                # At what was played (mark echoes), never beyond what the caller heard, far from all of it.
                assert 0 < truncated["audio_end_ms"] <= heard_at_clear < 10_000
                speech = [e for e in events if e["type"] == "input_audio_buffer.speech_started"]
                assert len(speech) == 2 and events.index(speech[1]) < events.index(truncated)
                # Nothing of the cut answer reaches the caller after the clear: the next media is
                # the second answer's (sent after its response.created, which needs the caller's
                # whole utterance first).
                await speaking
                await until(lambda: sum(1 for e in events if e["type"] == "response.created") >= 2,
                               "the second answer")  # fmt: skip
                second = [i for i, e in enumerate(events) if e["type"] == "response.created"][1]
                clear_at = next(i for i, m in enumerate(call.received) if m["event"] == call.clear_event)
                media_after = [call.arrivals[i] for i, m in enumerate(call.received)
                               if i > clear_at and m["event"] == call.media_event]  # fmt: skip
                assert all(at > arrived[second] for at in media_after)
                # Telnyx's frames came swapped in pairs: all put back in order, none lost.
                phone = next(d.media for d in host.doors if isinstance(d.media, PhoneCall))
                if carrier == "telnyx":
                    assert phone.reorder is not None and phone.reorder.dropped == phone.reorder.skipped == 0
                # Vonage took the answer in binary messages of 20 ms each, Exotel in multiples of 320 bytes.
                if isinstance(call, VonageCall):
                    assert call.frame_sizes == {640}
                if isinstance(call, ExotelCall):
                    assert call.odd_media == 0
                # Plivo's playAudio names the stream's own format (L16: linear PCM16 at its rate, as it came).
                if isinstance(call, PlivoCall):
                    formats = {(m["media"]["contentType"], m["media"]["sampleRate"]) for m in call.received
                               if m["event"] == "playAudio"}  # fmt: skip
                    assert formats == {(call.encoding, call.rate)}
                # A key press reaches the session and its sideband.
                await call.dtmf("5")
                await until(lambda: first("input_audio_buffer.dtmf_event_received") is not None, "the key")
                key = first("input_audio_buffer.dtmf_event_received")
                assert key is not None and key["event"] == "5" and abs(key["received_at"] - time.time()) < 60
                print(f"lead: at most {call.max_buffered_ms:.0f} ms of audio waited in the carrier's buffer")
                # A clean stop: the gateway closes the stream normally.
                await call.stop()
                await asyncio.wait_for(call.closed.wait(), 10)
                assert call.close_code == 1000
            finally:
                reader.cancel()
                await call.close()


@pytest.mark.parametrize("carrier", sorted(CARRIERS))
async def test_a_bad_client_secret_is_refused_before_any_audio(carrier: str) -> None:
    path, simulator, _, _, _ = CARRIERS[carrier]
    url = f"ws://127.0.0.1:{{}}/v1/telephony/{path}"
    async with run_gateway(Settings(engine="cascade", video_engine="none")) as gw:
        for secret in ("ek_not-a-secret", None, "sk-an-api-key"):
            call = simulator(url.format(gw.port), secret)
            await call.connect()
            await asyncio.wait_for(call.closed.wait(), 15)
            await call.close()
            assert call.close_code == 4001
            assert not [m for m in call.received if m.get("event") == call.media_event]
        # A secret is spent once: the second stream with it is refused.
        secret = await mint(gw)
        first_call = simulator(url.format(gw.port), secret)
        await first_call.connect()
        await until(lambda: phone_host(gw) is not None, "the first call's session")
        again = simulator(url.format(gw.port), secret, call_sid="CA2")
        await again.connect()
        await asyncio.wait_for(again.closed.wait(), 15)
        assert again.close_code == 4001
        await again.close()
        await first_call.close()


async def test_with_the_auth_token_set_a_stream_without_a_valid_signature_is_refused_at_the_upgrade() -> None:
    settings = Settings(engine="cascade", video_engine="none", twilio_auth_token=TOKEN)
    async with run_gateway(settings) as gw:
        url = twilio_url(gw)
        for call in (TwilioCall(url, "ek_x"), TwilioCall(url, "ek_x", signature="bm90IGEgc2lnbmF0dXJl"),
                     TwilioCall(url, "ek_x", auth_token="another-account's-token")):  # fmt: skip
            with pytest.raises(websockets.InvalidStatus) as refused:
                await call.connect()
            assert refused.value.response.status_code == 403
            assert b"signature_invalid" in refused.value.response.body
        # Signed with the account's token (the URL Twilio requested), the call goes on, until a
        # backend hangs it up (POST /v1/realtime/calls/{call_id}/hangup, as a WebRTC call's).
        call = TwilioCall(url, await mint(gw), auth_token=TOKEN)
        await call.connect()
        await until(lambda: phone_host(gw) is not None, "the signed call's session")
        host = phone_host(gw)
        assert host is not None
        async with httpx.AsyncClient() as http:
            res = await http.post(f"{gw.http}/v1/realtime/calls/{call_id_of(host.id)}/hangup")
        assert res.status_code == 200, res.text
        await asyncio.wait_for(call.closed.wait(), 10)
        assert call.close_code == 1000 and host.ended
        await call.close()


@pytest.mark.parametrize("carrier", ["vonage", "exotel"])
async def test_with_the_carriers_authorization_set_an_upgrade_without_it_is_refused(carrier: str) -> None:
    """Vonage: the Authorization header the NCCO endpoint's ``authorization`` sets (type vonage);
    Exotel: the Basic Auth of the applet's URL (``wss://KEY:TOKEN@host/...``)."""
    if carrier == "vonage":  # (type vonage: the JWT of Vonage's signed webhooks, under the signature secret)
        settings = Settings(engine="cascade", video_engine="none", vonage_websocket_authorization=VONAGE_SECRET)
        now = int(time.time())
        good: dict[str, Any] = {"authorization": "Bearer " + vonage_jwt(VONAGE_SECRET, now)}
        other = "another account's signature secret, 32 bytes"
        bad: list[dict[str, Any]] = [
            {},
            {"authorization": "Bearer " + vonage_jwt(other, now)},
            {"authorization": "Bearer " + vonage_jwt(VONAGE_SECRET, now - 3600)},  # (stale)
            {"authorization": "Bearer not-a-jwt"},
        ]
    else:
        settings = Settings(engine="cascade", video_engine="none", exotel_basic_auth="key:token")
        good, bad = {"basic_auth": "key:token"}, [{}, {"basic_auth": "key:other"}, {"basic_auth": "other:token"}]
    path, simulator, _, _, _ = CARRIERS[carrier]
    async with run_gateway(settings) as gw:
        url = f"ws://127.0.0.1:{gw.port}/v1/telephony/{path}"
        for headers in bad:
            with pytest.raises(websockets.InvalidStatus) as refused:
                await simulator(url, "ek_x", **headers).connect()
            assert refused.value.response.status_code == 403
            assert b"signature_invalid" in refused.value.response.body
        call = simulator(url, await mint(gw), **good)
        await call.connect()
        await until(lambda: phone_host(gw) is not None, "the authorized call's session")
        await call.stop()
        await asyncio.wait_for(call.closed.wait(), 10)
        assert call.close_code == 1000
        await call.close()


async def test_a_drain_lets_a_phone_call_finish_while_other_sessions_are_handed_over() -> None:
    """A carrier cannot reconnect a stream: a draining replica closes its WebSocket sessions
    (1012, to resume elsewhere) at their idle moments, but leaves a phone call alone until
    it ends (up to drain_window_s), then hands its session over too."""
    settings = Settings(engine="passthrough", video_engine="none", drain_window_s=60)
    async with run_gateway(settings, engine=PassthroughEngine(audio_chunks=5), vad_factory=None) as gw:
        call = TwilioCall(twilio_url(gw), await mint(gw))
        await call.connect()
        await until(lambda: phone_host(gw) is not None, "the call's session")
        host = phone_host(gw)
        assert host is not None and host.holds_call
        async with connect(gw.url + f"?call_id={call_id_of(host.id)}") as sideband:
            async with connect(gw.url) as other:
                await other.wait_for("session.created")
                drain = asyncio.get_running_loop().create_task(gw.runtime.drain())
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await other.wait_for("never", timeout=30)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
            # The WebSocket session was handed over; the call goes on (its sideband drives an answer).
            assert not call.closed.is_set() and not drain.done()
            await sideband.send({"type": "response.create"})
            await sideband.wait_for("response.done")
            await until(lambda: any(m.get("event") == "media" for m in call.received), "the answer's audio")
            assert not drain.done()
        # The caller hangs up: the drain hands the session over and is done.
        await call.stop()
        await asyncio.wait_for(call.closed.wait(), 10)
        assert call.close_code == 1000
        await asyncio.wait_for(drain, 30)
        await call.close()


async def test_a_sidebands_output_audio_buffer_clear_silences_the_call_at_what_was_played() -> None:
    settings = Settings(engine="passthrough", video_engine="none")
    engine = PassthroughEngine(audio_chunks=250, paced=False)  # 5 s of answer, written at once
    async with run_gateway(settings, engine=engine, vad_factory=None) as gw:
        call = TwilioCall(twilio_url(gw), await mint(gw))
        await call.connect()
        await until(lambda: phone_host(gw) is not None, "the call's session")
        host = phone_host(gw)
        assert host is not None
        try:
            async with connect(gw.url + f"?call_id={call_id_of(host.id)}") as sideband:
                await sideband.send({"type": "response.create"})
                done = await sideband.wait_for("response.done")  # written; it plays on from the pacer
                await until(lambda: call.heard_ms() > 500 and len(call.marks_echoed) > 3, "the answer to play")
                await sideband.send({"type": "output_audio_buffer.clear"})
                truncated = await sideband.wait_for("conversation.item.truncated")
                cleared = await sideband.wait_for("output_audio_buffer.cleared")
                assert cleared["response_id"] == done["response"]["id"]
                assert truncated["item_id"] == done["response"]["output"][0]["id"]
                assert call.clears and 0 < truncated["audio_end_ms"] <= call.heard_ms() < 5000
        finally:
            await call.close()
