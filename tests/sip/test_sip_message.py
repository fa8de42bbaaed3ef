"""The Sans-I/O parts of the SIP floor: SIP messages, the SDP offer and answer, RTP and
RFC 4733 key presses, the allow-list and the INVITE caps (no sockets, no PyAV)."""

from __future__ import annotations

import pytest

from gateway.transport.sip import digest
from gateway.transport.sip import message as sipmsg
from gateway.transport.sip.guard import Guard
from gateway.transport.sip.rtp import DtmfReceiver, RtpPacket, Timeline, build_dtmf, build_rtp, parse_rtp
from gateway.transport.sip.sdp import SdpError, build_answer, parse_offer

INVITE = (
    b"INVITE sip:agent@127.0.0.1:5060 SIP/2.0\r\n"
    b"v: SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bKa, SIP/2.0/UDP 10.0.0.2;branch=z9hG4bKb\r\n"
    b'f: "Caller" <sip:+1555@10.0.0.1>;tag=abc\r\n'
    b"t: <sip:agent@127.0.0.1>\r\n"
    b"i: call-1@10.0.0.1\r\n"
    b"CSeq: 7 INVITE\r\n"
    b"m: <sip:caller@10.0.0.1:5060>\r\n"
    b"X-Custom: one\r\n"
    b" two\r\n"
    b"c: application/sdp\r\n"
    b"l: 4\r\n\r\nbodyEXTRA"
)


def test_a_message_parses_with_compact_headers_folding_and_its_content_length() -> None:
    msg = sipmsg.parse(INVITE)
    assert (msg.method, msg.uri, msg.call_id, msg.cseq, msg.branch) == (
        "INVITE", "sip:agent@127.0.0.1:5060", "call-1@10.0.0.1", (7, "INVITE"), "z9hG4bKa",
    )  # fmt: skip
    assert msg.get_all("via") == ["SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bKa", "SIP/2.0/UDP 10.0.0.2;branch=z9hG4bKb"]
    assert msg.get("X-Custom") == "one two" and msg.body == b"body"
    assert sipmsg.tag_of(msg.get("From")) == "abc" and sipmsg.tag_of(msg.get("To")) is None
    assert sipmsg.uri_of(msg.get("Contact") or "") == "sip:caller@10.0.0.1:5060"
    again = sipmsg.parse(msg.encode())
    assert again.headers == msg.headers and again.body == b"body"


def test_a_response_copies_the_transaction_and_adds_the_tag() -> None:
    resp = sipmsg.response_to(sipmsg.parse(INVITE), 180, "Ringing", to_tag="xyz")
    text = resp.encode().decode()
    assert text.startswith("SIP/2.0 180 Ringing\r\n")
    assert "To: <sip:agent@127.0.0.1>;tag=xyz\r\n" in text and text.count("Via: ") == 2
    assert "CSeq: 7 INVITE\r\n" in text and text.endswith("Content-Length: 0\r\n\r\n")
    parsed = sipmsg.parse(resp.encode())
    assert (parsed.status, parsed.reason) == (180, "Ringing")


@pytest.mark.parametrize(
    "data",
    [
        b"INVITE sip:a SIP/2.0\r\nVia: x\r\n\r\n",  # no From, To, Call-ID, CSeq
        b"HELLO\r\n\r\n",
        b"INVITE sip:a SIP/2.0\r\nVia: x\r\nFrom: a\r\nTo: b\r\nCall-ID: c\r\nCSeq: x INVITE\r\n\r\n",
        b"INVITE sip:a SIP/2.0\r\nVia: x\r\nFrom: a\r\nTo: b\r\nCall-ID: c\r\nCSeq: 1 INVITE\r\n"
        b"Content-Length: 9\r\n\r\nab",
        b"INVITE sip:a SIP/2.0\r\n" + b"X: y\r\n" * 100 + b"\r\n",
        b"\xff\xfe INVITE",
        b"A" * (sipmsg.MAX_MESSAGE_BYTES + 1),
    ],
)
def test_what_is_not_a_sip_message_is_refused(data: bytes) -> None:
    with pytest.raises(sipmsg.SipParseError):
        sipmsg.parse(data)


def test_a_stream_is_cut_into_messages_by_content_length() -> None:
    framer = sipmsg.StreamFramer()
    assert framer.feed(b"\r\n\r\n" + INVITE[:50]) == []
    out = framer.feed(INVITE[50:-5])
    assert out == [INVITE[:-5]]  # "EXTRA" is not part of it: Content-Length 4
    with pytest.raises(sipmsg.SipParseError):
        sipmsg.StreamFramer().feed(b"INVITE sip:a SIP/2.0\r\nVia: x\r\n\r\n")  # no Content-Length on a stream


OFFER = b"""v=0\r
o=- 1 1 IN IP4 10.0.0.1\r
s=-\r
c=IN IP4 10.0.0.9\r
t=0 0\r
m=audio 40000 RTP/AVP 8 0 101\r
a=rtpmap:8 PCMA/8000\r
a=rtpmap:0 PCMU/8000\r
a=rtpmap:101 telephone-event/8000\r
a=fmtp:101 0-15\r
"""


def test_the_offer_s_first_g711_and_its_telephone_event_are_answered() -> None:
    offer = parse_offer(OFFER)
    assert (offer.address, offer.port, offer.codec, offer.dtmf_type) == ("10.0.0.9", 40000, "PCMA", 101)
    answer = build_answer(offer, address="127.0.0.1", port=20000, session_id=5).decode()
    assert "m=audio 20000 RTP/AVP 8 101\r\n" in answer and "c=IN IP4 127.0.0.1\r\n" in answer
    assert "a=rtpmap:101 telephone-event/8000\r\n" in answer and "a=sendrecv" in answer
    no_dtmf = parse_offer(OFFER.replace(b" 101\r\n", b"\r\n").replace(b"a=rtpmap:101 telephone-event/8000\r\n", b""))
    assert no_dtmf.dtmf_type is None
    assert "telephone-event" not in build_answer(no_dtmf, address="::1", port=2, session_id=1).decode()


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ((b"RTP/AVP 8 0 101", b"RTP/AVP 9 101"), "neither PCMU nor PCMA"),
        ((b"RTP/AVP", b"RTP/SAVP"), "SRTP"),
        ((b"m=audio 40000", b"m=audio 0"), "disabled"),
        ((b"m=audio 40000", b"m=audio 99999"), "not a port"),
        ((b"m=audio", b"m=video"), "no audio"),
        ((b"c=IN IP4 10.0.0.9", b"c=IN IP4 host.example"), "not an IP address"),
        ((b"a=rtpmap:0 PCMU/8000", b"a=rtpmap:0 PCMU/16000"), None),  # still PCMA: the first G.711 at 8 kHz
    ],
)
def test_an_offer_that_cannot_be_answered_is_refused_saying_why(change: tuple[bytes, bytes], why: str | None) -> None:
    body = OFFER.replace(*change)
    if why is None:
        assert parse_offer(body).codec == "PCMA"
        return
    with pytest.raises(SdpError, match=why):
        parse_offer(body)


def test_rtp_round_trips_and_key_presses_are_reported_once() -> None:
    data = build_rtp(0, 65535, 4294967295, 7, b"\x01\x02", marker=True)
    packet = parse_rtp(data)
    assert packet is not None and (packet.payload_type, packet.sequence, packet.marker, packet.payload) == (
        0, 65535, True, b"\x01\x02",
    )  # fmt: skip
    assert parse_rtp(b"\x00" * 12) is None and parse_rtp(b"\x80") is None
    padded = bytearray(build_rtp(0, 1, 1, 1, b"ab\x00\x03"))
    padded[0] |= 0x20
    assert parse_rtp(bytes(padded)) is not None and parse_rtp(bytes(padded)).payload == b"a"  # type: ignore[union-attr]
    receiver = DtmfReceiver()
    keys = []
    for ts, key in ((160, "5"), (960, "#")):
        for end in (False, False, True, True, True):
            found = receiver.push(parse_rtp(build_rtp(101, 1, ts, 9, build_dtmf(key, end=end, duration=160))))  # type: ignore[arg-type]
            if found:
                keys.append(found)
    assert keys == ["5", "#"]


def test_the_guard_refuses_outsiders_and_bounds_invites() -> None:
    guard = Guard(("10.1.0.0/16", "192.0.2.7"), per_source_per_min=2, per_min=3, max_calls=1)
    assert guard.invite("203.0.113.1", 0.0, 0) == "forbidden"
    assert guard.invite("not-an-ip", 0.0, 0) == "forbidden"
    assert [guard.invite("10.1.2.3", 0.0, 0) for _ in range(3)] == ["ok", "ok", "rate_limited"]
    assert guard.invite("192.0.2.7", 0.0, 0) == "ok"
    assert guard.invite("10.1.9.9", 0.0, 0) == "rate_limited"  # the overall bucket (3 a minute) is spent
    assert guard.invite("10.1.2.3", 30.0, 0) == "ok"  # half a minute refills one of each
    assert guard.invite("192.0.2.7", 60.0, 1) == "busy"  # sip_max_calls
    assert Guard((), per_source_per_min=0, per_min=0, max_calls=0).allows("127.0.0.1")  # empty: loopback only
    assert not Guard((), per_source_per_min=0, per_min=0, max_calls=0).allows("10.0.0.1")
    assert Guard(("10.0.0.0/8",), per_source_per_min=0, per_min=0, max_calls=0).allows("::ffff:10.0.0.1")  # v4-mapped
    with pytest.raises(ValueError, match="not an IP address"):
        Guard(("trunk.example.com",), per_source_per_min=0, per_min=0, max_calls=0)


def test_the_rtp_port_range_is_checked() -> None:
    pytest.importorskip("av")  # (the server module plays RTP through PyAV)
    from gateway.transport.sip.media import parse_port_range

    assert parse_port_range(None) is None and parse_port_range("20000-20199") == (20000, 20199)
    for bad in ("20000", "20199-20000", "80-90", "a-b"):
        with pytest.raises(ValueError):
            parse_port_range(bad)


def test_digest_answers_rfc_2617_s_example_and_the_challenger_s_nonces_expire() -> None:
    assert digest.response(username="Mufasa", password="Circle Of Life", realm="testrealm@host.com", method="GET",
                           uri="/dir/index.html", nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093", qop="auth",
                           nc="00000001", cnonce="0a4f113b") == "6629fae49393a05397450978507c4ef1"  # fmt: skip
    now = [1_000_000.0]
    challenger = digest.Challenger({"trunk": "pw"}, clock=lambda: now[0])
    challenge = challenger.challenge()
    good = digest.answer(challenge, username="trunk", password="pw", method="INVITE", uri="sip:a@b")
    assert challenger.check(good, "INVITE")
    assert not challenger.check(good, "BYE")  # the method is in the digest
    assert not challenger.check(digest.answer(challenge, username="trunk", password="x", method="INVITE", uri="u"),
                                "INVITE")  # fmt: skip
    assert not challenger.check(None, "INVITE") and not challenger.check("Basic dHJ1bms6cHc=", "INVITE")
    other = digest.Challenger({"trunk": "pw"}, clock=lambda: now[0])  # another process's key: its nonces are not ours
    assert not other.check(good, "INVITE")
    now[0] += digest.NONCE_TTL_S + 1
    assert not challenger.check(good, "INVITE")  # stale
    assert digest.answer('Digest realm="r", nonce="n", algorithm=SHA-256', username="u", password="p",
                         method="INVITE", uri="u") is None  # fmt: skip


def test_the_caller_s_timeline_drops_late_packets_and_fills_gaps_with_silence() -> None:
    def packet(seq: int, ts: int) -> RtpPacket:
        return RtpPacket(0, seq & 0xFFFF, ts & 0xFFFFFFFF, 1, False, b"")

    line = Timeline(max_gap=8000)
    assert line.push(packet(65534, 4294967136), 160) == 0  # the first, just before both counters wrap
    assert line.push(packet(65535, 0), 160) == 0  # the timestamp wrapped: on time
    assert line.push(packet(65535, 0), 160) is None  # a repeat
    assert line.push(packet(2, 480), 160) == 320  # seq 0 and 1 lost: 40 ms of silence first
    assert line.push(packet(1, 320), 160) is None  # ... and one of them, late, is not played after
    assert line.push(packet(3, 480 + 160 + 80_000), 160) == 0  # a 10 s jump: a new timeline, not filled
    assert (line.dropped, line.filled) == (2, 320)
