"""A GPT-Live session on a carrier's media stream: the Twilio simulator
(``tests/support/twilio_sim.py``, Twilio's cloud cannot run here) over a real loopback
WebSocket, the gateway on the embedded CPU cascade (silero VAD, pocketsphinx, eSpeak NG), a
real local HTTP receiver for the call webhook.

With ``call_webhook_live`` the stream is announced as both ``realtime.call.incoming`` and
``live.transport.incoming`` (the SIP call's mechanism, ``gateway/hosting/incoming.py``);
``/v1/live/sessions/{id}/accept`` answers it (the Realtime accept then finds nothing), and the
call is the Live session's media: the answer's ``session.output_audio.delta`` is paced out
with a mark after each chunk, the caller's speech over it sends ``clear`` (and nothing more of
the cut answer is heard), a key press is ``transport.dtmf.received`` on the Live sideband
(``/v1/live/sessions/{id}/attach``, every event checked against the SDK's
``ConnectServerEvent``), and the carrier's ``stop`` ends it cleanly.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from functools import partial

import orjson
import pytest
import websockets
from openai.types.webhooks import LiveTransportIncomingWebhookEvent
from support.gateway import post as gateway_post
from support.gateway import run_gateway
from support.live_sideband import Sideband
from support.speech import silence, speak
from support.twilio_sim import TwilioCall, mulaw
from support.waiting import until
from support.webhook_receiver import receiver

from gateway.hosting.host import SessionHost
from gateway.settings import Settings
from gateway.transport.telephony.call import PhoneCall
from orchestrator.engine import Message
from orchestrator.engines.cascade import CascadeEngine
from orchestrator.engines.cascade.thinker import EchoThinker
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(180)

SECRET = "whsec_" + base64.b64encode(b"a-webhook-key-of-32-bytes-exact!").decode()
KEY = {"Authorization": "Bearer k"}
post = partial(gateway_post, headers=KEY)  # the API key's POST
TAIL = " ".join(["I am still talking about this and that, so you can interrupt me."] * 4)


class LongFirstAnswer:
    """The first answer: an echo and a long tail (some 15 s of speech, written at once, the
    call's to pace out); later ones: the echo alone (a few seconds)."""

    description = "long first echo (test)"

    def __init__(self) -> None:
        self.answers = 0

    async def think(self, messages: tuple[Message, ...], instructions: str) -> AsyncIterator[str]:
        self.answers += 1
        async for word in EchoThinker().think(messages, instructions):
            assert isinstance(word, str)
            yield word
        if self.answers == 1:
            yield ". " + TAIL


async def test_a_live_session_answers_a_twilio_stream_accepted_through_the_webhook() -> None:
    utterance = mulaw(await speak("what is your name", 8000))
    quiet = mulaw(silence(100, 8000))
    async with receiver(SECRET) as hooks:
        settings = Settings(engine="cascade", video_engine="none", api_keys=("k",), call_webhook_url=hooks.url,
                            call_webhook_secret=SECRET, call_webhook_live=True)  # fmt: skip
        thinker = LongFirstAnswer()
        async with run_gateway(settings, engine=CascadeEngine(thinker=thinker)) as gw:
            call = TwilioCall(f"ws://127.0.0.1:{gw.port}/v1/telephony/twilio", None)
            await call.connect()
            try:
                await until(lambda: len(hooks.received) == 2, "both announcements", 30)
                by_type = {hook.body["type"]: hook.body for hook in hooks.received}
                assert all(hook.verified for hook in hooks.received)  # signed per Standard Webhooks
                body = by_type["live.transport.incoming"]
                data = body["data"]
                # The SDK's model types `type` as "sip" only: a carrier's stream says its carrier (the
                # gateway's, docs/telephony.md); every other field is the SDK's, checked by it.
                assert data["type"] == "twilio" and data["sip_headers"] == []
                live = LiveTransportIncomingWebhookEvent.model_validate({**body, "data": {**data, "type": "sip"}})
                assert data["carrier_call_id"] == call.call_sid and data["stream_id"] == call.stream_sid
                realtime = by_type["realtime.call.incoming"]["data"]
                session_id = live.data.session_id
                assert session_id.removeprefix("live_") == realtime["call_id"].removeprefix("rtc_")
                accepted = await post(gw, f"/v1/live/sessions/{session_id}/accept",
                                      {"session": {"type": "live", "model": "gpt-live-1",
                                                   "instructions": "Answer the phone."}})  # fmt: skip
                assert accepted.status_code == 200, accepted.text
                late = await post(gw, f"/v1/realtime/calls/{realtime['call_id']}/accept", {})
                assert late.status_code == 404  # the first accept chose the dialect
                await until(lambda: session_id in gw.runtime.hosting.hosts, "the call's Live session")
                host = gw.runtime.hosting.hosts[session_id]
                assert isinstance(host, SessionHost) and host.session.config.instructions == "Answer the phone."
                phone = next(d.media for d in host.doors if isinstance(d.media, PhoneCall))
                url = f"ws://127.0.0.1:{gw.port}/v1/live/sessions/{session_id}/attach"
                async with websockets.connect(url, max_size=None, additional_headers=KEY) as ws:
                    sideband = Sideband(ws)
                    reader = asyncio.get_running_loop().create_task(sideband.read())
                    try:
                        await until(lambda: bool(host.sidebands), "the sideband to join")
                        # The caller asks; the Live answer is paced out, a mark after each chunk.
                        await call.speak(quiet * 5 + utterance + quiet * 15)
                        await until(lambda: call.heard_ms() > 1500 and len(call.marks_echoed) > 5,
                                       "the answer to play")  # fmt: skip
                        assert sideband.count("session.output_audio.delta") > 0
                        assert not call.clears
                        # The caller talks over it: clear, and the rest of the 15 s answer is never heard.
                        began = time.monotonic()
                        await call.speak(utterance + quiet * 15)
                        await until(lambda: bool(call.clears), "the clear")
                        heard_at_clear = call.heard_ms()
                        print(f"barge-in: clear {1000 * (call.clears[0] - began):.0f} ms after the caller began")
                        await until(lambda: thinker.answers >= 2, "the second answer")
                        await until(lambda: phone.playout.playing is None and not call.buffered_ms,
                                       "the second answer to play out")  # fmt: skip
                        # What was heard after the clear: the lead at most, then the short second answer.
                        assert call.heard_ms() - heard_at_clear < 8000, (heard_at_clear, call.heard_ms())
                        # A key press: transport.dtmf.received on the Live sideband.
                        await call.dtmf("5")
                        await until(lambda: sideband.count("transport.dtmf.received") > 0, "the key")
                        key = next(e for e in sideband.events if e["type"] == "transport.dtmf.received")
                        assert key["event"] == "5"
                        # A carrier's stream sends no keys: transport.dtmf.send is refused, the call goes on.
                        send = {"type": "transport.dtmf.send", "event": "9", "event_id": "k1"}
                        await ws.send(orjson.dumps(send).decode())
                        await until(lambda: sideband.count("error") > 0, "the refusal")
                        refused = next(e for e in sideband.events if e["type"] == "error")
                        assert refused["error"]["code"] == "unsupported" and not call.closed.is_set()
                        # A clean stop: the gateway closes the stream normally.
                        await call.stop()
                        await asyncio.wait_for(call.closed.wait(), 10)
                        assert call.close_code == 1000
                    finally:
                        reader.cancel()
            finally:
                await call.close()


async def test_a_live_reject_ends_the_stream_and_a_live_hangup_ends_the_accepted_call() -> None:
    async with receiver(SECRET) as hooks:
        settings = Settings(engine="passthrough", video_engine="none", api_keys=("k",), call_webhook_url=hooks.url,
                            call_webhook_secret=SECRET, call_webhook_live=True)  # fmt: skip
        async with run_gateway(settings, engine=PassthroughEngine(audio_chunks=5), vad_factory=None) as gw:
            url = f"ws://127.0.0.1:{gw.port}/v1/telephony/twilio"

            async def announced(call: TwilioCall) -> str:
                before = len(hooks.received)
                await call.connect()
                await until(lambda: len(hooks.received) == before + 2, "both announcements", 30)
                (live,) = [h.body for h in hooks.received[before:] if h.body["type"] == "live.transport.incoming"]
                return str(live["data"]["session_id"])

            rejected = TwilioCall(url, None)
            try:
                session_id = await announced(rejected)
                res = await post(gw, f"/v1/live/sessions/{session_id}/reject", {"status_code": 486})
                assert res.status_code == 200, res.text
                await asyncio.wait_for(rejected.closed.wait(), 10)
                assert rejected.close_code == 1000 and session_id not in gw.runtime.hosting.hosts
                assert not [m for m in rejected.received if m.get("event") == "media"]
            finally:
                await rejected.close()
            call = TwilioCall(url, None, call_sid="CA2")
            try:
                session_id = await announced(call)
                res = await post(gw, f"/v1/live/sessions/{session_id}/accept",
                                 {"session": {"type": "live", "model": "gpt-live-1"}})  # fmt: skip
                assert res.status_code == 200, res.text
                await until(lambda: session_id in gw.runtime.hosting.hosts, "the call's Live session")
                host = gw.runtime.hosting.hosts[session_id]
                hung = await post(gw, f"/v1/live/sessions/{session_id}/hangup")
                assert hung.status_code == 200, hung.text
                await asyncio.wait_for(call.closed.wait(), 10)
                assert call.close_code == 1000 and host.ended
            finally:
                await call.close()
