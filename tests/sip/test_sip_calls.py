"""Calls from a SIP trunk (sipp) answered by the gateway's default session on the embedded
default engine (the CPU cascade: VAD, pocketsphinx, the echo thinker, eSpeak NG), with the
caller's media played by a Python RTP peer on 127.0.0.1:

- the caller speaks (eSpeak NG's words as μ-law at 8 kHz, paced), the answer comes back as
  paced RTP μ-law, and the caller's BYE ends the session for good;
- DTMF (RFC 4733) reaches the call's sideband as ``input_audio_buffer.dtmf_event_received``;
- a REST hangup (``POST /v1/realtime/calls/{id}/hangup``) sends the caller BYE, over TCP;
- an INVITE from outside ``sip_allowed_sources`` is answered 403 and no session opens;
- a REST refer (``POST /v1/realtime/calls/{id}/refer``) sends REFER; once the trunk's NOTIFY
  says the transfer was answered, the gateway hangs up (BYE).
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import websockets
from support.gateway import Client, connect, free_port, run_gateway
from support.sip_peer import RtpPeer, post_json, sipp, sipp_uas
from support.speech import speak

from gateway.settings import Settings

pytestmark = pytest.mark.timeout(240)


def _settings(**kw: object) -> Settings:
    return Settings(video_engine="none", webrtc=False, sip_port=free_port(), **kw)  # type: ignore[arg-type]


async def _closed(client: Client) -> None:
    with pytest.raises(websockets.ConnectionClosed):
        while True:
            await client.recv(30)


def _post(url: str) -> int:
    req = urllib.request.Request(url, data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


async def test_a_call_is_answered_with_speech_and_the_callers_bye_ends_it(tmp_path: Path) -> None:
    settings = _settings()
    async with run_gateway(settings) as gw:
        peer = RtpPeer()
        await peer.open()
        try:
            async with sipp("caller_hangs_up.xml", settings.sip_port, peer.port, tmp_path) as call:
                await peer.wait_remote()  # the gateway's RTP (silence between answers) reached us
                call_id = await call.wait_omni_call_id()
                async with connect(f"{gw.url}?call_id={call_id}") as sideband:
                    speech = await speak("what is your name", rate=8000)
                    await peer.play(speech + bytes(2 * 8000))  # then a second of silence: the turn ends
                    # (A pause inside the words may start an answer that the rest of them cuts: the
                    # completed one is the answer to what was said.)
                    done = await sideband.wait_for(
                        lambda e: e["type"] == "response.done" and e["response"]["status"] == "completed", 120
                    )
                    (answer,) = done["response"]["output"]
                    # The echo thinker says what it heard: words, so the caller's speech was heard.
                    assert answer["content"][0]["transcript"].strip(), "the cascade heard nothing over the call"
                    await peer.wait_answer_audio()  # the answer, as μ-law RTP
                    call.send_info()  # the scenario's cue: the caller hangs up (BYE)
                    assert await call.wait() == 0, call.text()
                    await _closed(sideband)  # the session ended: its sideband is closed
                # The session is gone for good: a hangup finds no call.
                status = await asyncio.to_thread(_post, f"{gw.http}/v1/realtime/calls/{call_id}/hangup")
                assert status == 404
        finally:
            peer.close()


async def test_dtmf_reaches_the_sideband_and_a_rest_hangup_sends_bye_over_tcp(tmp_path: Path) -> None:
    settings = _settings()
    async with run_gateway(settings) as gw:
        peer = RtpPeer()
        await peer.open()
        try:
            async with sipp("gateway_hangs_up.xml", settings.sip_port, peer.port, tmp_path, transport="t1") as call:
                await peer.wait_remote()
                call_id = await call.wait_omni_call_id()
                async with connect(f"{gw.url}?call_id={call_id}") as sideband:
                    for key in "5#":
                        await peer.press(key)
                    first = await sideband.wait_for("input_audio_buffer.dtmf_event_received", 30)
                    second = await sideband.wait_for(
                        lambda e: e["type"] == "input_audio_buffer.dtmf_event_received" and e is not first, 30
                    )
                    assert (first["event"], second["event"]) == ("5", "#")
                    assert isinstance(first["received_at"], int) and first["received_at"] > 1_600_000_000
                    status = await asyncio.to_thread(_post, f"{gw.http}/v1/realtime/calls/{call_id}/hangup")
                    assert status == 200
                    assert await call.wait() == 0, call.text()  # the gateway's BYE came, and was answered
        finally:
            peer.close()


async def test_an_invite_from_outside_the_allow_list_is_refused_403(tmp_path: Path) -> None:
    settings = _settings(sip_allowed_sources=("127.0.0.2/32",))
    async with run_gateway(settings) as gw:
        async with sipp("refused.xml", settings.sip_port, 9, tmp_path) as call:
            assert await call.wait() == 0, call.text()
        assert "SIP/2.0 403 Forbidden" in call.messages.read_text()
        assert gw.runtime.sip.guard.forbidden == 1 and not gw.runtime.sip.dialogs


async def test_a_rest_refer_transfers_the_call_and_the_gateway_hangs_up_once_it_is_answered(tmp_path: Path) -> None:
    settings = _settings(engine="passthrough")
    async with run_gateway(settings) as gw:
        peer = RtpPeer()
        await peer.open()
        try:
            async with sipp("gateway_transfers.xml", settings.sip_port, peer.port, tmp_path) as call:
                call_id = await call.wait_omni_call_id()
                refer = f"{gw.http}/v1/realtime/calls/{call_id}/refer"
                status, body = await asyncio.to_thread(post_json, refer, {"target_uri": "sip:agent 2@pbx"})
                assert status == 400 and body["error"]["param"] == "target_uri"  # type: ignore[index]
                unknown = f"{gw.http}/v1/realtime/calls/rtc_0000/refer"
                status, body = await asyncio.to_thread(post_json, unknown, {"target_uri": "tel:+15551234567"})
                assert status == 404 and body["error"]["code"] == "call_id_not_found"  # type: ignore[index]
                status, body = await asyncio.to_thread(post_json, refer, {"target_uri": "tel:+15551234567"})
                assert (status, body) == (200, {})
                assert await call.wait() == 0, call.text()  # NOTIFY 200 sent, then the gateway's BYE came
                assert "Refer-To: <tel:+15551234567>" in call.messages.read_text()
            for _ in range(200):
                if gw.runtime.session_count() == 0:
                    break
                await asyncio.sleep(0.05)
            assert gw.runtime.session_count() == 0
        finally:
            peer.close()


async def test_an_outbound_call_to_a_sipp_trunk_connects_and_speaks(tmp_path: Path) -> None:
    settings = _settings(engine="passthrough")
    async with run_gateway(settings) as gw:
        peer = RtpPeer()
        await peer.open()
        try:
            async with sipp_uas("answers_outbound.xml", peer.port, tmp_path) as trunk:
                dial = f"{gw.http}/v1/realtime/sip/calls"
                request = {
                    "destination": "tel:+15551234567",
                    "trunk": {"provider_url": f"sip:127.0.0.1:{trunk.port}", "caller_number": "+15550100"},
                }
                status, body = await asyncio.to_thread(post_json, dial, {**request, "destination": "mailto:x"})
                assert status == 400 and body["error"]["param"] == "destination"  # type: ignore[index]
                status, body = await asyncio.to_thread(post_json, dial, request)
                assert status == 200 and body["status"] == "answered" and body["codec"] == "PCMU", body
                call_id = str(body["call_id"])
                async with connect(f"{gw.url}?call_id={call_id}") as sideband:
                    await sideband.send({"type": "response.create"})  # the agent speaks first
                    await sideband.wait_for("response.done", 60)
                    await peer.wait_answer_audio()  # ... and the trunk's end hears it, paced μ-law
                    status = await asyncio.to_thread(_post, f"{gw.http}/v1/realtime/calls/{call_id}/hangup")
                    assert status == 200
                    assert await trunk.wait() == 0, trunk.text()  # the gateway's BYE came, and was answered
                text = trunk.messages.read_text()
                assert "INVITE sip:+15551234567@127.0.0.1 SIP/2.0" in text and "From: <sip:+15550100@" in text
        finally:
            peer.close()


async def test_a_trunk_with_digest_credentials_is_challenged_then_answered(tmp_path: Path) -> None:
    settings = _settings(engine="passthrough", sip_trunk_credentials=("trunk1:s3cret",))
    async with run_gateway(settings) as gw:
        peer = RtpPeer()
        await peer.open()
        try:
            async with sipp("caller_authenticates.xml", settings.sip_port, peer.port, tmp_path,
                            extra=("-au", "trunk1", "-ap", "s3cret")) as call:  # fmt: skip
                assert await call.wait() == 0, call.text()
            text = call.messages.read_text()
            assert "SIP/2.0 401 Unauthorized" in text and "X-Omni-Call-Id: rtc_" in text
            assert gw.runtime.sip.guard.unauthenticated == 1
        finally:
            peer.close()


async def test_an_outbound_call_answers_the_trunk_s_digest_challenge(tmp_path: Path) -> None:
    settings = _settings(engine="passthrough")
    async with run_gateway(settings) as gw:
        peer = RtpPeer()
        await peer.open()
        try:
            async with sipp_uas("authenticates_outbound.xml", peer.port, tmp_path) as trunk:
                request = {"destination": "sip:+15551234567@127.0.0.1",
                           "trunk": {"provider_url": f"sip:127.0.0.1:{trunk.port}",
                                     "auth": {"type": "digest", "username": "gw", "password": "s3cret"}}}  # fmt: skip
                status, body = await asyncio.to_thread(post_json, f"{gw.http}/v1/realtime/sip/calls", request)
                assert status == 200 and body["status"] == "answered", body  # sipp checked the digest (else 403)
                call_id = str(body["call_id"])
                await peer.wait_remote()
                status = await asyncio.to_thread(_post, f"{gw.http}/v1/realtime/calls/{call_id}/hangup")
                assert status == 200 and await trunk.wait() == 0, trunk.text()
            assert 'Authorization: Digest username="gw"' in trunk.messages.read_text()
        finally:
            peer.close()
