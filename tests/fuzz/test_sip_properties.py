"""Property tests (hypothesis) of the SIP floor's edge, without sockets: any bytes a trunk or
a scanner sends (a datagram, a TCP stream cut anywhere, an SDP body, an RTP packet) are
either read or refused with the floor's own error (``SipParseError``, ``SdpError``, None for
RTP); nothing else escapes, and a message that parses serializes into one that parses the
same. SIP is attacked constantly: the parser is what every packet meets first."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.transport.sip import message as sipmsg
from gateway.transport.sip.rtp import DtmfReceiver, parse_rtp
from gateway.transport.sip.sdp import SdpError, parse_offer

VALID = (
    b"INVITE sip:agent@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.1;branch=z9hG4bKa\r\n"
    b"From: <sip:a@b>;tag=1\r\nTo: <sip:c@d>\r\nCall-ID: x\r\nCSeq: 1 INVITE\r\n"
    b"Content-Type: application/sdp\r\nContent-Length: 0\r\n\r\n"
)
SDP = b"v=0\r\nc=IN IP4 10.0.0.1\r\nm=audio 4000 RTP/AVP 0 101\r\na=rtpmap:101 telephone-event/8000\r\n"


@st.composite
def mangled(draw: st.DrawFn, base: bytes) -> bytes:
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 6))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["flip", "cut", "insert"]))
        if op == "flip":
            data[at] = draw(st.integers(0, 255))
        elif op == "cut":
            del data[at : at + draw(st.integers(1, 20))]
        else:
            data[at:at] = draw(st.sampled_from([b"\r\n", b":", b",", b"<", b";tag=", b" ", b"\x00", b"\r\n\r\n",
                                                b"Content-Length: 99999\r\n", b"\xff"]))  # fmt: skip
    return bytes(data)


messages = st.binary(max_size=600) | mangled(VALID)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages)
def test_any_datagram_is_read_or_refused_as_sip(data: bytes) -> None:
    try:
        msg = sipmsg.parse(data)
    except sipmsg.SipParseError:
        return
    again = sipmsg.parse(msg.encode())
    assert (again.method, again.status, again.call_id, again.body) == (msg.method, msg.status, msg.call_id, msg.body)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mangled(VALID * 3), st.lists(st.integers(1, 200), max_size=8))
def test_any_stream_cut_anywhere_is_framed_or_refused(data: bytes, cuts: list[int]) -> None:
    framer = sipmsg.StreamFramer()
    at = 0
    try:
        for size in [*cuts, len(data)]:
            for raw in framer.feed(data[at : at + size]):
                assert len(raw) <= sipmsg.MAX_MESSAGE_BYTES
            at += size
    except sipmsg.SipParseError:
        return


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400) | mangled(SDP))
def test_any_sdp_body_is_answered_or_refused(body: bytes) -> None:
    try:
        offer = parse_offer(body)
    except SdpError:
        return
    assert offer.codec in ("PCMU", "PCMA", "opus") and 0 < offer.port < 65536


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_any_packet_is_rtp_or_nothing(data: bytes) -> None:
    packet = parse_rtp(data)
    if packet is not None:
        DtmfReceiver().push(packet)
