"""What a SIP call meets besides a plain answer, each through the real listener on 127.0.0.1
with a minimal Python caller (``support.sip_peer.SipUac``): the call control's own status
(the ``CallControl`` seam the webhook flow plugs into), the ring and call length caps, a
CANCEL while ringing, an offer that cannot be answered, the INVITE rate, OPTIONS, and a
scanner outside the allow-list that gets no answer at all."""

from __future__ import annotations

import asyncio
import re

import pytest
from support.gateway import free_port, run_gateway
from support.sip_peer import RtpPeer, SipUac

from gateway.settings import Settings
from gateway.transport.sip import digest
from gateway.transport.sip.control import Accept, IncomingCall, Reject

pytestmark = pytest.mark.timeout(120)


def _settings(**kw: object) -> Settings:
    return Settings(video_engine="none", webrtc=False, engine="passthrough", sip_port=free_port(), **kw)  # type: ignore[arg-type]


class Rejecting:
    def __init__(self, status: int) -> None:
        self.status = status
        self.calls: list[IncomingCall] = []

    async def incoming(self, call: IncomingCall) -> Accept | Reject:
        self.calls.append(call)
        return Reject(self.status, "Busy Here")


class Undecided:
    """A call control that never decides (a webhook nobody answers)."""

    def __init__(self) -> None:
        self.ringing = asyncio.Event()

    async def incoming(self, call: IncomingCall) -> Accept | Reject:
        self.ringing.set()
        await asyncio.Future()
        raise AssertionError("unreachable")


def _tag(message: str) -> str | None:
    match = re.search(r"^To: .*;tag=([^;\s]+)", message, re.M)
    return match.group(1) if match else None


async def test_the_call_control_s_rejection_is_the_sip_final_response() -> None:
    settings = _settings()
    async with run_gateway(settings) as gw:
        control = Rejecting(486)
        gw.runtime.sip.control = control  # where the webhook's /reject answers
        uac = await SipUac.open(settings.sip_port)
        try:
            uac.invite()
            status, message = await uac.response()
            assert status == 486 and "CSeq: 1 INVITE" in message
            uac.ack(_tag(message))
            (call,) = control.calls
            assert call.sip_call_id == uac.call_id and call.source == "127.0.0.1"
            assert call.call_id.startswith("sip_") and ("Call-ID", uac.call_id) in call.sip_headers
            assert gw.runtime.session_count() == 0
            assert gw.runtime.metrics.registry.get_sample_value("omni_sip_refusals_total", {"status": "486"}) == 1.0
        finally:
            uac.close()


async def test_a_call_nobody_decides_on_gets_480_at_the_ring_timeout() -> None:
    settings = _settings(sip_ring_timeout_s=0.5)
    async with run_gateway(settings) as gw:
        gw.runtime.sip.control = Undecided()
        uac = await SipUac.open(settings.sip_port)
        try:
            uac.invite()
            assert (await uac.response(final=False))[0] == 100
            assert (await uac.response(final=False))[0] == 180
            status, _ = await uac.response()
            assert status == 480
        finally:
            uac.close()


async def test_a_cancel_while_ringing_is_answered_and_the_invite_gets_487() -> None:
    settings = _settings()
    async with run_gateway(settings) as gw:
        control = Undecided()
        gw.runtime.sip.control = control
        uac = await SipUac.open(settings.sip_port)
        try:
            uac.invite()
            await control.ringing.wait()
            uac.request("CANCEL")
            finals = [await uac.response(), await uac.response()]
            by_method = {re.search(r"^CSeq: 1 (\w+)", m, re.M).group(1): s for s, m in finals}  # type: ignore[union-attr]
            assert by_method == {"CANCEL": 200, "INVITE": 487}
            assert gw.runtime.session_count() == 0
        finally:
            uac.close()


async def test_an_srtp_offer_is_refused_488_saying_why() -> None:
    settings = _settings()
    async with run_gateway(settings):
        uac = await SipUac.open(settings.sip_port)
        try:
            uac.invite(profile="RTP/SAVP")
            status, message = await uac.response()
            assert status == 488 and "Warning: 304 omni-gateway" in message and "SRTP" in message
        finally:
            uac.close()


async def test_invites_over_the_rate_are_refused_503_with_retry_after() -> None:
    settings = _settings(sip_invites_per_source_per_min=1)
    async with run_gateway(settings) as gw:
        gw.runtime.sip.control = Rejecting(603)
        first, second = await SipUac.open(settings.sip_port), await SipUac.open(settings.sip_port)
        try:
            first.invite()
            assert (await first.response())[0] == 603
            second.invite()
            status, message = await second.response()
            assert status == 503 and "Retry-After: 10" in message
            assert gw.runtime.sip.guard.rate_limited == 1
        finally:
            first.close()
            second.close()


async def test_an_answered_call_is_hung_up_at_the_call_length_cap() -> None:
    settings = _settings(sip_max_call_s=1.0)
    async with run_gateway(settings) as gw:
        peer = RtpPeer()
        await peer.open()
        uac = await SipUac.open(settings.sip_port)
        try:
            uac.invite(rtp_port=peer.port)
            status, message = await uac.response()
            assert status == 200 and "X-Omni-Call-Id: rtc_" in message and "m=audio " in message
            uac.ack(_tag(message))
            assert gw.runtime.session_count() == 1
            assert gw.runtime.metrics.registry.get_sample_value("omni_sip_calls_total", {"direction": "inbound"}) == 1
            bye = await uac.request_in("BYE")
            assert 'Reason: SIP;cause=200;text="call length cap"' in bye
            assert f"Call-ID: {uac.call_id}" in bye
            await peer.wait_remote()  # its RTP came (silence), paced
            for _ in range(200):
                if gw.runtime.session_count() == 0:
                    break
                await asyncio.sleep(0.05)
            assert gw.runtime.session_count() == 0
        finally:
            uac.close()
            peer.close()


async def test_options_is_answered_but_a_scanner_outside_the_allow_list_hears_nothing() -> None:
    settings = _settings()
    async with run_gateway(settings):
        uac = await SipUac.open(settings.sip_port)
        try:
            uac.request("OPTIONS")
            status, message = await uac.response()
            assert status == 200 and "Allow: INVITE, ACK, BYE, CANCEL, OPTIONS" in message
        finally:
            uac.close()
    settings = _settings(sip_allowed_sources=("127.0.0.2",))
    async with run_gateway(settings):
        uac = await SipUac.open(settings.sip_port)
        try:
            uac.request("OPTIONS")  # unanswered ...
            uac.request("REGISTER")  # ... and so is this
            uac.invite()  # an INVITE is told: 403, and it is the first thing that came back
            status, message = await uac.response(final=False)
            assert status == 403 and "CSeq: 1 INVITE" in message
        finally:
            uac.close()


async def test_with_trunk_credentials_an_invite_without_a_right_digest_answer_gets_401() -> None:
    settings = _settings(sip_trunk_credentials=("trunk1:s3cret",))
    async with run_gateway(settings) as gw:
        uac = await SipUac.open(settings.sip_port)
        try:
            uac.invite()
            status, message = await uac.response()
            assert status == 401
            challenge = re.search(r"^WWW-Authenticate: (.+)$", message, re.M).group(1).strip()  # type: ignore[union-attr]
            assert 'realm="omni-gateway"' in challenge and 'qop="auth"' in challenge
            uri = f"sip:agent@127.0.0.1:{settings.sip_port}"
            wrong = digest.answer(challenge, username="trunk1", password="guess", method="INVITE", uri=uri)
            uac.branch += "x"
            uac.invite(cseq=2, headers=(f"Authorization: {wrong}",))
            assert (await uac.response())[0] == 401
            forged = (wrong or "").replace('nonce="', 'nonce="1')  # a nonce the gateway never gave
            right = digest.answer(challenge, username="trunk1", password="s3cret", method="INVITE", uri=uri)
            assert right is not None
            uac.branch += "y"
            uac.invite(cseq=3, headers=(f"Authorization: {forged}",))
            assert (await uac.response())[0] == 401
            assert gw.runtime.sip.guard.unauthenticated == 3 and gw.runtime.session_count() == 0
        finally:
            uac.close()
