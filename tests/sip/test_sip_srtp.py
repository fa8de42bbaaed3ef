"""SDES-SRTP and Opus calls through the real SIP listener on 127.0.0.1, answered by the default
session on the passthrough engine (server VAD on: Silero hears the caller's speech, and the
engine answers with its tone). sipp cannot encrypt media, so a minimal Python caller
(``support.sip_peer.SipUac``) sends the INVITE with the offer, and the test's RTP peer
protects and unprotects its packets with pylibsrtp (the caller's key, and the gateway's key
read from the 200 OK), speaking eSpeak NG's words:

- an SRTP call: the gateway's answer audio decrypts with the key of its SDP answer, the
  caller's encrypted speech reaches the session (``input_audio_buffer.speech_started``), and a
  packet with a wrong authentication tag is dropped and counted, the call going on;
- an Opus call (``opus/48000/2``): speech both ways, the peer's Opus being aiortc's codec;
- an outbound call with ``sip_outbound_srtp`` offers SRTP: a trunk (sipp, its RTP the test's
  peer) answering with its key connects and speaks both ways; one answering plain RTP is hung
  up: the dial answers 502, SIP 488.
"""

from __future__ import annotations

import asyncio
import base64
import re
import secrets
from pathlib import Path

import numpy as np
import pytest
from support.gateway import connect, free_port, run_gateway
from support.sip_peer import OpusPeerCodec, RtpPeer, SipUac, post_json, sipp_uas, srtp_session
from support.speech import speak

from gateway.settings import Settings
from gateway.transport.sip.codec import Opus

pytestmark = pytest.mark.timeout(180)


def _settings(**kw: object) -> Settings:
    return Settings(video_engine="none", webrtc=False, engine="passthrough", sip_port=free_port(), **kw)  # type: ignore[arg-type]


def _sdp(port: int, profile: str, formats: str, *attributes: str) -> str:
    lines = ["v=0", "o=caller 1 1 IN IP4 127.0.0.1", "s=-", "c=IN IP4 127.0.0.1", "t=0 0",
             f"m=audio {port} {profile} {formats}", *attributes]  # fmt: skip
    return "\r\n".join(lines) + "\r\n"


def _tag(message: str) -> str:
    match = re.search(r"^To: .*;tag=([^;\s]+)", message, re.M)
    assert match is not None, message
    return match.group(1)


async def _until(check: object, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():  # type: ignore[operator]
        assert loop.time() < deadline, "timed out waiting"
        await asyncio.sleep(0.02)


async def test_an_srtp_call_speaks_both_ways_and_a_packet_with_a_bad_tag_is_dropped() -> None:
    settings = _settings()
    async with run_gateway(settings) as gw:
        peer = RtpPeer()
        await peer.open()
        ours = secrets.token_bytes(30)
        peer.srtp_tx = srtp_session(ours, inbound=False)
        uac = await SipUac.open(settings.sip_port)
        try:
            inline = base64.b64encode(ours).decode()
            offer = _sdp(peer.port, "RTP/SAVP", "0 101", "a=rtpmap:0 PCMU/8000", "a=rtpmap:101 telephone-event/8000",
                         f"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:{inline}|2^31")  # fmt: skip
            uac.request("INVITE", body=offer)
            status, message = await uac.response()
            assert status == 200, message
            assert re.search(r"^m=audio \d+ RTP/SAVP 0 101\r$", message, re.M), message
            found = re.search(r"^a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:(\S+)\r$", message, re.M)
            assert found is not None, message
            theirs = base64.b64decode(found.group(1))
            assert len(theirs) == 30 and theirs != ours
            peer.srtp_rx = srtp_session(theirs, inbound=True)
            uac.ack(_tag(message))
            call_id = re.search(r"X-Omni-Call-Id: (rtc_\w+)", message).group(1)  # type: ignore[union-attr]
            await peer.wait_remote()  # the gateway's RTP (silence) decrypted with its answer's key
            media = gw.runtime.sip.dialogs[uac.call_id].media
            assert media.srtp is not None
            async with connect(f"{gw.url}?call_id={call_id}") as sideband:
                speech = await speak("hello, can you hear me", rate=8000)
                await peer.play(speech + bytes(2 * 8000))
                await sideband.wait_for("input_audio_buffer.speech_started", 60)  # the caller's speech was heard
                await peer.wait_answer_audio()  # the answer's tone, decrypted
            # A packet whose authentication tag is wrong (a forged or corrupted one): dropped, counted.
            taken = media.packets_in
            forged = bytearray(peer.packet(0, bytes(160)))
            forged[-1] ^= 0x01
            peer.send_raw(bytes(forged))
            await _until(lambda: media.srtp.auth_failures == 1)  # type: ignore[union-attr]
            assert media.packets_in == taken
            # A plain RTP packet is no better (its last bytes are no tag); the call goes on.
            peer.send_raw(peer.packet(0, bytes(160), protect=False))
            await peer.play(bytes(2 * 800))
            await _until(lambda: media.packets_in >= taken + 5)
            assert media.srtp.auth_failures == 2 and gw.runtime.session_count() == 1
        finally:
            uac.close()
            peer.close()


async def test_an_opus_call_speaks_both_ways() -> None:
    settings = _settings()
    async with run_gateway(settings) as gw:
        peer = RtpPeer(payload_type=111, opus=OpusPeerCodec())
        await peer.open()
        uac = await SipUac.open(settings.sip_port)
        try:
            offer = _sdp(peer.port, "RTP/AVP", "111 0 101", "a=rtpmap:111 opus/48000/2",
                         "a=fmtp:111 minptime=10;useinbandfec=1", "a=rtpmap:0 PCMU/8000",
                         "a=rtpmap:101 telephone-event/8000")  # fmt: skip
            uac.request("INVITE", body=offer)
            status, message = await uac.response()
            assert status == 200, message
            assert re.search(r"^m=audio \d+ RTP/AVP 111 101\r$", message, re.M), message
            assert "a=rtpmap:111 opus/48000/2\r\n" in message
            uac.ack(_tag(message))
            call_id = re.search(r"X-Omni-Call-Id: (rtc_\w+)", message).group(1)  # type: ignore[union-attr]
            await peer.wait_remote()
            media = gw.runtime.sip.dialogs[uac.call_id].media
            assert media.rate == 48000
            async with connect(f"{gw.url}?call_id={call_id}") as sideband:
                speech = await speak("hello, can you hear me", rate=48000)
                await peer.play(speech + bytes(2 * 48000))
                await sideband.wait_for("input_audio_buffer.speech_started", 60)
                await peer.wait_answer_audio()  # the tone, Opus-decoded by aiortc
            assert media.timeline.filled == 0 and media.packets_in > 50
        finally:
            uac.close()
            peer.close()


async def test_an_srtp_offer_with_no_suite_the_gateway_takes_is_refused_488_naming_why() -> None:
    settings = _settings()
    async with run_gateway(settings) as gw:
        uac = await SipUac.open(settings.sip_port)
        try:
            key = base64.b64encode(bytes(46)).decode()
            uac.request("INVITE", body=_sdp(40000, "RTP/SAVP", "0", f"a=crypto:1 AES_256_CM_HMAC_SHA1_80 inline:{key}"))
            status, message = await uac.response()
            assert status == 488, message
            assert ('Warning: 304 omni-gateway "SRTP: no a=crypto the gateway takes (the crypto suite '
                    "AES_256_CM_HMAC_SHA1_80 is not taken; taken: AES_CM_128_HMAC_SHA1_80, "
                    'AES_CM_128_HMAC_SHA1_32)"') in message  # fmt: skip
            assert gw.runtime.metrics.registry.get_sample_value("omni_sip_refusals_total", {"status": "488"}) == 1
            assert not gw.runtime.sip.dialogs and gw.runtime.session_count() == 0
        finally:
            uac.close()


def test_the_gateway_s_opus_keeps_a_tone_s_pitch() -> None:
    """Opus at 48 kHz through the gateway's codec: a 440 Hz tone encoded and decoded is still
    a 440 Hz tone (libopus's look-ahead delays it; its pitch and level are what matter)."""
    opus = Opus()
    t = np.arange(48000) / 48000
    tone = (np.sin(2 * np.pi * 440 * t) * 8000).astype("<i2").tobytes()
    out = b"".join(opus.decode(opus.encode(tone[i : i + 1920])) for i in range(0, len(tone), 1920))
    assert len(out) == len(tone)
    pcm = np.frombuffer(out, dtype="<i2")[4800:].astype(np.float64)
    spectrum = np.abs(np.fft.rfft(pcm))
    peak_hz = np.argmax(spectrum) * 48000 / len(pcm)
    assert abs(peak_hz - 440) < 5 and np.sqrt(np.mean(pcm**2)) > 3000
    assert isinstance(opus.decode(b"\xff\xff\xff\xff"), bytes)  # a corrupt packet: never raises


async def test_an_outbound_call_offers_srtp_and_a_plain_rtp_answer_is_refused(tmp_path: Path) -> None:
    settings = _settings(sip_outbound_srtp=True)
    async with run_gateway(settings) as gw:
        async with sipp_uas("answers_outbound.xml", 9, tmp_path) as trunk:
            request = {"destination": "tel:+15551234567", "trunk": {"provider_url": f"sip:127.0.0.1:{trunk.port}"}}
            status, body = await asyncio.to_thread(post_json, f"{gw.http}/v1/realtime/sip/calls", request)
            assert status == 502 and "SIP 488" in body["error"]["message"], body  # type: ignore[index]
            assert await trunk.wait() == 0, trunk.text()  # the gateway's ACK, then its BYE, answered
        text = trunk.messages.read_text()
        assert re.search(r"^m=audio \d+ RTP/SAVP 0 8 101$", text, re.M), text
        assert re.search(r"^a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:[A-Za-z0-9+/]{40}$", text, re.M), text
        assert 'text="no acceptable media"' in text and gw.runtime.session_count() == 0


async def test_an_outbound_srtp_call_connects_and_speaks_both_ways(tmp_path: Path) -> None:
    settings = _settings(sip_outbound_srtp=True)
    async with run_gateway(settings) as gw:
        peer = RtpPeer()
        await peer.open()
        trunk_key = secrets.token_bytes(30)
        peer.srtp_tx = srtp_session(trunk_key, inbound=False)
        extra = ("-key", "srtp_key", base64.b64encode(trunk_key).decode())
        try:
            async with sipp_uas("answers_outbound_srtp.xml", peer.port, tmp_path, extra=extra) as trunk:
                request = {"destination": "tel:+15551234567", "trunk": {"provider_url": f"sip:127.0.0.1:{trunk.port}"}}
                status, body = await asyncio.to_thread(post_json, f"{gw.http}/v1/realtime/sip/calls", request)
                assert status == 200 and body["status"] == "answered", body
                offered = re.search(r"^a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:(\S+)$", trunk.messages.read_text(),
                                    re.M)  # fmt: skip
                assert offered is not None, trunk.text()
                peer.srtp_rx = srtp_session(base64.b64decode(offered.group(1)), inbound=True)
                await peer.wait_remote()  # the gateway's RTP, decrypted with the key it offered
                async with connect(f"{gw.url}?call_id={body['call_id']}") as sideband:
                    speech = await speak("hello, can you hear me", rate=8000)
                    await peer.play(speech + bytes(2 * 8000))  # the trunk's side speaks, encrypted with its key
                    await sideband.wait_for("input_audio_buffer.speech_started", 60)
                    await peer.wait_answer_audio()
                media = gw.runtime.sip.dialogs[next(iter(gw.runtime.sip.dialogs))].media
                assert media.srtp is not None and media.srtp.auth_failures == 0
                hangup = f"{gw.http}/v1/realtime/calls/{body['call_id']}/hangup"
                assert (await asyncio.to_thread(post_json, hangup, {}))[0] == 200
                assert await trunk.wait() == 0, trunk.text()
        finally:
            peer.close()
