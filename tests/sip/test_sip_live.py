"""GPT-Live on SIP trunks: sipp places and answers the calls, a Python RTP peer carries their
media, all on 127.0.0.1 (the passthrough engine answers, behind the gateway's VAD).

- **Incoming**, with ``call_webhook_live``: the call is announced to a real local HTTP
  receiver as both ``realtime.call.incoming`` and ``live.transport.incoming`` (each checked
  against openai-python's webhook models), ``/v1/live/sessions/{id}/accept`` answers it (and
  the Realtime accept then finds nothing), the caller's speech gets an answer back as μ-law
  RTP, a key the caller presses reaches the Live sideband as ``transport.dtmf.received``,
  ``transport.dtmf.send`` from the sideband reaches the caller as RFC 4733 events, and
  ``/v1/live/sessions/{id}/hangup`` sends BYE.
- **Outbound**: ``POST /v1/live/sessions`` with ``transport.type: "sip"`` answers 201 before
  the callee does; a sideband attached then hears ``transport.ringing`` and
  ``transport.answered`` (sipp rings only on the test's cue, so the sideband is there
  first), the session's audio reaches the trunk's RTP peer, and a busy trunk gives
  ``transport.failed``.

Every sideband event is checked against the SDK's ``ConnectServerEvent``.
"""

from __future__ import annotations

import asyncio
import base64
import math
import struct
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import pytest
from openai.types.webhooks import LiveTransportIncomingWebhookEvent, RealtimeCallIncomingWebhookEvent
from support.docs import code_blocks
from support.gateway import free_port, run_gateway
from support.gateway import post as gateway_post
from support.live_sideband import attached
from support.sip_peer import RtpPeer, sipp, sipp_uas
from support.speech import speak
from support.waiting import until
from support.webhook_receiver import receiver

from gateway.settings import Settings

pytestmark = pytest.mark.timeout(240)

SECRET = "whsec_" + base64.b64encode(b"a-webhook-key-of-32-bytes-exact!").decode()
KEY = {"Authorization": "Bearer k"}
post = partial(gateway_post, headers=KEY)  # the API key's POST


async def test_a_live_call_accepted_through_the_webhook_speaks_takes_and_sends_keys_and_is_hung_up(
    tmp_path: Path,
) -> None:
    async with receiver(SECRET) as hooks:
        settings = Settings(engine="passthrough", api_keys=("k",), video_engine="none", webrtc=False,
                            sip_port=free_port(), call_webhook_url=hooks.url, call_webhook_secret=SECRET,
                            call_webhook_live=True)  # fmt: skip
        async with run_gateway(settings) as gw:
            peer = RtpPeer()
            await peer.open()
            try:
                async with sipp("gateway_hangs_up.xml", settings.sip_port, peer.port, tmp_path) as call:
                    await until(lambda: len(hooks.received) == 2, "both announcements")
                    by_type = {hook.body["type"]: hook for hook in hooks.received}
                    assert all(hook.verified for hook in hooks.received)  # signed per Standard Webhooks
                    live = LiveTransportIncomingWebhookEvent.model_validate(by_type["live.transport.incoming"].body)
                    realtime = RealtimeCallIncomingWebhookEvent.model_validate(by_type["realtime.call.incoming"].body)
                    session_id = live.data.session_id
                    assert session_id.startswith("live_") and live.data.type == "sip"
                    assert session_id.removeprefix("live_") == realtime.data.call_id.removeprefix("rtc_")
                    headers = {h.name: h.value for h in live.data.sip_headers}
                    assert headers["Call-ID"] == call.call_id and live.data.sip_media_security == "rtp"
                    # The accept's shape is the SDK's SessionAcceptParams (strict): a Realtime session is refused.
                    bad = await post(gw, f"/v1/live/sessions/{session_id}/accept",
                                     {"session": {"type": "realtime", "model": "gpt-live-1"}})  # fmt: skip
                    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "session.type")
                    accepted = await post(gw, f"/v1/live/sessions/{session_id}/accept",
                                          {"session": {"type": "live", "model": "gpt-live-1",
                                                       "instructions": "Be brief."}})  # fmt: skip
                    assert accepted.status_code == 200, accepted.text
                    # The first accept chose the dialect: the Realtime one finds no call waiting.
                    late = await post(gw, f"/v1/realtime/calls/{realtime.data.call_id}/accept", {})
                    assert late.status_code == 404
                    assert await call.wait_omni_call_id() == session_id
                    host = gw.runtime.hosts[session_id]
                    assert host.session.config.instructions == "Be brief."
                    await peer.wait_remote()
                    async with attached(gw, session_id, KEY) as sideband:
                        # A key the caller presses: transport.dtmf.received.
                        await peer.press("7")
                        received = await sideband.wait_for("transport.dtmf.received")
                        assert received["event"] == "7"
                        # A key the sideband sends: RFC 4733 events on the call's RTP, then transport.dtmf.sent.
                        await sideband.send({"type": "transport.dtmf.send", "event": "9", "event_id": "k1"})
                        assert await peer.wait_key() == "9"
                        sent = await sideband.wait_for("transport.dtmf.sent", client_event_id="k1")
                        assert sent["event"] == "9"
                        await sideband.send({"type": "transport.dtmf.send", "event": "x", "event_id": "k2"})
                        refused = await sideband.wait_for("error", client_event_id="k2")
                        assert refused["error"]["param"] == "event"
                        # The caller speaks; the answer comes back as μ-law RTP (and on the sideband).
                        speech = await speak("hello there, how are you", rate=8000)
                        await peer.play(speech + bytes(2 * 8000))
                        await peer.wait_answer_audio()
                        await sideband.wait_for("session.output_audio.delta")
                        await sideband.wait_for("session.input_audio.append")  # the caller's audio, reflected
                        # The hangup: BYE to the caller, the sideband closed, the session gone.
                        hung = await post(gw, f"/v1/live/sessions/{session_id}/hangup")
                        assert hung.status_code == 200, hung.text
                        assert await call.wait() == 0, call.text()
                        await asyncio.wait_for(sideband.closed.wait(), 30)
                    await until(lambda: session_id not in gw.runtime.hosts, "the session to end")
                    again = await post(gw, f"/v1/live/sessions/{session_id}/hangup")
                    assert (again.status_code, again.json()["error"]["code"]) == (404, "session_not_found")
            finally:
                peer.close()


async def test_a_live_call_is_transferred_with_the_live_refer(tmp_path: Path) -> None:
    """``/v1/live/sessions/{id}/refer`` sends REFER in the call's dialog; the trunk's NOTIFY
    that the target answered makes the gateway hang up (BYE)."""
    async with receiver(SECRET) as hooks:
        settings = Settings(engine="passthrough", api_keys=("k",), video_engine="none", webrtc=False,
                            sip_port=free_port(), call_webhook_url=hooks.url, call_webhook_secret=SECRET,
                            call_webhook_live=True)  # fmt: skip
        async with run_gateway(settings, vad_factory=None) as gw:
            peer = RtpPeer()
            await peer.open()
            try:
                async with sipp("gateway_transfers.xml", settings.sip_port, peer.port, tmp_path) as call:
                    await until(lambda: len(hooks.received) == 2, "both announcements")
                    (live,) = [h.body for h in hooks.received if h.body["type"] == "live.transport.incoming"]
                    session_id = live["data"]["session_id"]
                    accepted = await post(gw, f"/v1/live/sessions/{session_id}/accept",
                                          {"session": {"type": "live", "model": "gpt-live-1"}})  # fmt: skip
                    assert accepted.status_code == 200, accepted.text
                    assert await call.wait_omni_call_id() == session_id
                    unknown = await post(gw, "/v1/live/sessions/live_0000/refer", {"target_uri": "tel:+15551234567"})
                    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "session_not_found")
                    bad = await post(gw, f"/v1/live/sessions/{session_id}/refer", {"target_uri": "mailto:x"})
                    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "target_uri")
                    refer = await post(gw, f"/v1/live/sessions/{session_id}/refer", {"target_uri": "tel:+15551234567"})
                    assert (refer.status_code, refer.json()) == (200, {})
                    assert await call.wait() == 0, call.text()  # NOTIFY 200 sent, then the gateway's BYE came
                    assert "Refer-To: <tel:+15551234567>" in call.messages.read_text()
                await until(lambda: session_id not in gw.runtime.hosts, "the session to end")
            finally:
                peer.close()


def _tone(seconds: float, rate: int = 24_000) -> bytes:
    """A loud 440 Hz tone, mono PCM16 (an audio fixture the session plays on the call)."""
    n = int(seconds * rate)
    return struct.pack(f"<{n}h", *(int(12000 * math.sin(2 * math.pi * 440 * i / rate)) for i in range(n)))


def _create(trunk_port: int, **trunk: Any) -> dict[str, Any]:
    """docs/telephony-sip.md's outbound GPT-Live request, its trunk the sipp one on loopback."""
    (block,) = [b for b in code_blocks("docs/telephony-sip.md") if b.lang == "json" and '"destination": "+' in b.text]
    body: dict[str, Any] = orjson.loads(block.text)
    provider = {"provider_url": f"sip:127.0.0.1:{trunk_port}"}
    body["transport"]["trunk"] = {**body["transport"]["trunk"], **provider, **trunk}
    return body


async def test_an_outbound_live_call_rings_is_answered_and_speaks_with_its_transport_events(tmp_path: Path) -> None:
    settings = Settings(engine="passthrough", video_engine="none", webrtc=False, sip_port=free_port())
    async with run_gateway(settings) as gw:
        peer = RtpPeer()
        await peer.open()
        try:
            async with sipp_uas("rings_on_cue.xml", peer.port, tmp_path) as trunk:
                bad = await post(gw, "/v1/live/sessions", _create(trunk.port, provider_url="sips:127.0.0.1"))
                assert (bad.status_code, bad.json()["error"]["code"]) == (400, "unsupported")
                bad = await post(gw, "/v1/live/sessions", {**_create(trunk.port), "extra": 1})
                assert (bad.status_code, bad.json()["error"]["param"]) == (400, "extra")
                created = await post(gw, "/v1/live/sessions", _create(trunk.port))
                assert created.status_code == 201, created.text
                body = created.json()
                session_id = body["session"]["id"]
                assert session_id.startswith("live_") and body["transport"] == {"type": "sip"}
                async with attached(gw, session_id, {}) as sideband:
                    await trunk.wait_invite()
                    trunk.send_info()  # the cue: the trunk rings, then answers
                    ringing = await sideband.wait_for("transport.ringing")
                    answered = await sideband.wait_for("transport.answered")
                    assert ringing["session_id"] == answered["session_id"] == session_id
                    kinds = [e["type"] for e in sideband.events]
                    assert kinds.index("transport.ringing") < kinds.index("transport.answered")
                    # The session speaks on the call: its audio reaches the trunk's RTP peer as μ-law.
                    fixture = base64.b64encode(_tone(1.5)).decode()
                    await sideband.send({"type": "session.output_audio.fixture.play", "audio": fixture})
                    await peer.wait_answer_audio()
                    hung = await post(gw, f"/v1/live/sessions/{session_id}/hangup")
                    assert hung.status_code == 200, hung.text
                    assert await trunk.wait() == 0, trunk.text()  # the gateway's BYE came, and was answered
                text = trunk.messages.read_text()
                assert "INVITE sip:+15551234567@127.0.0.1 SIP/2.0" in text and "From: <sip:+15550100@" in text
            async with sipp_uas("busy_on_cue.xml", peer.port, tmp_path) as trunk:
                created = await post(gw, "/v1/live/sessions", _create(trunk.port))
                assert created.status_code == 201, created.text
                session_id = created.json()["session"]["id"]
                async with attached(gw, session_id, {}) as sideband:
                    await trunk.wait_invite()
                    trunk.send_info()  # the cue: 486 Busy Here
                    failed = await sideband.wait_for("transport.failed")
                    assert failed["session_id"] == session_id and failed["error"]["code"] == "sip_call_failed"
                    assert "486" in failed["error"]["message"]
                    await asyncio.wait_for(sideband.closed.wait(), 30)  # the session ended with its call
                assert await trunk.wait() == 0, trunk.text()
                await until(lambda: session_id not in gw.runtime.hosts, "the session to end")
        finally:
            peer.close()


async def test_an_outbound_live_call_hung_up_while_it_rings_is_cancelled(tmp_path: Path) -> None:
    """Its session ends (the REST hangup) while the trunk rings: the gateway sends CANCEL
    and ACKs the trunk's 487 (sipp's scenario ends 0 only so), not ringing on until the ring
    timeout (an hour here: without the CANCEL, sipp would wait past the test's bound); the
    sideband hears no transport.answered and the session ends."""
    settings = Settings(engine="passthrough", video_engine="none", webrtc=False, sip_port=free_port(),
                        sip_ring_timeout_s=3600)  # fmt: skip
    async with run_gateway(settings) as gw:
        peer = RtpPeer()
        await peer.open()
        try:
            async with sipp_uas("rings_until_cancelled.xml", peer.port, tmp_path) as trunk:
                created = await post(gw, "/v1/live/sessions", _create(trunk.port))
                assert created.status_code == 201, created.text
                session_id = created.json()["session"]["id"]
                async with attached(gw, session_id, {}) as sideband:
                    await trunk.wait_invite()
                    trunk.send_info()  # the cue: the trunk rings
                    await sideband.wait_for("transport.ringing")
                    hung = await post(gw, f"/v1/live/sessions/{session_id}/hangup")
                    assert hung.status_code == 200, hung.text
                    assert await trunk.wait(60) == 0, trunk.text()  # CANCEL came, and the 487 was ACKed
                    await asyncio.wait_for(sideband.closed.wait(), 30)
                    assert not sideband.count("transport.answered")
                text = trunk.messages.read_text()
                assert "CANCEL sip:+15551234567@127.0.0.1 SIP/2.0" in text
                await until(lambda: session_id not in gw.runtime.hosts, "the session to end")
        finally:
            peer.close()
