"""The SDP of SDES-SRTP (RFC 4568 ``a=crypto``) and Opus (RFC 7587), Sans-I/O: which keys and
suites are taken, what the answer says, what is refused (488) and why. No sockets, no PyAV:
collected with the pure SIP tests."""

from __future__ import annotations

import base64

import pytest

from gateway.transport.sip import srtp
from gateway.transport.sip.codec import opus_samples
from gateway.transport.sip.sdp import SdpError, build_answer, build_offer, parse_answer, parse_offer

KEY = bytes(range(30))
INLINE = base64.b64encode(KEY).decode()
OTHER = base64.b64encode(bytes(range(100, 130))).decode()


def _offer(profile: str = "RTP/SAVP", *cryptos: str, formats: str = "0 101", maps: str = "") -> bytes:
    lines = [
        "v=0", "o=trunk 1 1 IN IP4 10.0.0.9", "s=-", "c=IN IP4 10.0.0.9", "t=0 0",
        f"m=audio 40000 {profile} {formats}", "a=rtpmap:0 PCMU/8000", "a=rtpmap:101 telephone-event/8000",
        *(m for m in maps.split("|") if m), *(f"a=crypto:{c}" for c in cryptos),
    ]  # fmt: skip
    return ("\r\n".join(lines) + "\r\n").encode()


@pytest.mark.parametrize(
    ("value", "suite"),
    [
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{INLINE}", "AES_CM_128_HMAC_SHA1_80"),
        (f"1 AES_CM_128_HMAC_SHA1_32 inline:{INLINE}", "AES_CM_128_HMAC_SHA1_32"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{INLINE}|2^31", "AES_CM_128_HMAC_SHA1_80"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{INLINE}|2147483648 WSH=64 KDR=0", "AES_CM_128_HMAC_SHA1_80"),
    ],
)
def test_a_crypto_attribute_the_gateway_takes(value: str, suite: str) -> None:
    crypto = srtp.parse_crypto(value)
    assert (crypto.tag, crypto.suite, crypto.key) == (1, suite, KEY)
    assert srtp.parse_crypto(crypto.attribute().removeprefix("crypto:")) == crypto  # written back as read


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (f"1 AES_256_CM_HMAC_SHA1_80 inline:{INLINE}", "suite AES_256_CM_HMAC_SHA1_80 is not taken"),
        (f"1 AEAD_AES_128_GCM inline:{INLINE}", "suite AEAD_AES_128_GCM is not taken"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{INLINE}|2^20|1:4", "MKI"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{INLINE};inline:{OTHER}", "several keys"),
        ("1 AES_CM_128_HMAC_SHA1_80 inline:" + base64.b64encode(bytes(16)).decode(), "16 bytes, not 30"),
        ("1 AES_CM_128_HMAC_SHA1_80 inline:not*base64", "not base64"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{INLINE} UNENCRYPTED_SRTP", "UNENCRYPTED_SRTP is not taken"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{INLINE} UNAUTHENTICATED_SRTP", "UNAUTHENTICATED_SRTP"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{INLINE} KDR=24", "KDR is not taken"),
        (f"1 AES_CM_128_HMAC_SHA1_80 uri:https://keys.example/{INLINE}", "inline only"),
        ("x AES_CM_128_HMAC_SHA1_80", "malformed"),
    ],
)
def test_a_crypto_attribute_the_gateway_does_not_take_says_why(value: str, why: str) -> None:
    with pytest.raises(srtp.CryptoError, match=why):
        srtp.parse_crypto(value)


def test_an_srtp_offer_is_answered_with_the_first_suite_taken_and_a_fresh_key_of_ours() -> None:
    lines = (f"1 AES_256_CM_HMAC_SHA1_80 inline:{INLINE}{INLINE}", f"2 AES_CM_128_HMAC_SHA1_32 inline:{INLINE}",
             f"3 AES_CM_128_HMAC_SHA1_80 inline:{OTHER}")  # fmt: skip
    offer = parse_offer(_offer("RTP/SAVP", *lines))
    assert offer.crypto == srtp.Crypto(2, "AES_CM_128_HMAC_SHA1_32", KEY)  # the first one taken, in order
    ours = srtp.answer_key(offer.crypto)
    assert (ours.tag, ours.suite) == (2, "AES_CM_128_HMAC_SHA1_32") and len(ours.key) == 30 and ours.key != KEY
    assert srtp.answer_key(offer.crypto).key != ours.key  # fresh random bytes every call
    answer = build_answer(offer, address="127.0.0.1", port=20000, session_id=1, crypto=ours).decode()
    assert "m=audio 20000 RTP/SAVP 0 101\r\n" in answer
    (line,) = [x for x in answer.split("\r\n") if x.startswith("a=crypto:")]
    assert line == f"a=crypto:2 AES_CM_128_HMAC_SHA1_32 inline:{base64.b64encode(ours.key).decode()}"


def test_crypto_lines_of_a_plain_rtp_offer_are_not_looked_at() -> None:
    offer = parse_offer(_offer("RTP/AVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{INLINE}"))
    assert offer.crypto is None
    answer = build_answer(offer, address="127.0.0.1", port=2, session_id=1).decode()
    assert "RTP/AVP 0 101" in answer and "a=crypto" not in answer


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (_offer("RTP/SAVP"), "SRTP: RTP/SAVP without an a=crypto attribute"),
        (_offer("RTP/SAVP", f"1 AES_256_CM_HMAC_SHA1_80 inline:{INLINE}{INLINE}"),
         "no a=crypto the gateway takes .*AES_256_CM_HMAC_SHA1_80 is not taken.*taken: AES_CM_128_HMAC_SHA1_80"),
        (_offer("RTP/SAVPF", f"1 AES_CM_128_HMAC_SHA1_80 inline:{INLINE}"), "RTP/SAVPF"),
        (_offer("UDP/TLS/RTP/SAVP"), "UDP/TLS/RTP/SAVP"),
    ],
)  # fmt: skip
def test_an_srtp_offer_the_gateway_cannot_answer_is_refused_saying_why(body: bytes, why: str) -> None:
    with pytest.raises(SdpError, match=why):
        parse_offer(body)


def test_an_outbound_offer_with_srtp_takes_only_an_answer_with_the_offered_suite() -> None:
    ours = srtp.offer_key()
    offer = build_offer(address="127.0.0.1", port=30000, session_id=1, crypto=ours).decode()
    assert "m=audio 30000 RTP/SAVP 0 8 101\r\n" in offer
    assert f"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:{base64.b64encode(ours.key).decode()}\r\n" in offer
    answer = parse_answer(_offer("RTP/SAVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{INLINE}"), ours)
    assert answer.crypto == srtp.Crypto(1, "AES_CM_128_HMAC_SHA1_80", KEY)
    with pytest.raises(SdpError, match="refused SRTP"):
        parse_answer(_offer("RTP/AVP"), ours)
    with pytest.raises(SdpError, match="not the one offered"):
        parse_answer(_offer("RTP/SAVP", f"2 AES_CM_128_HMAC_SHA1_32 inline:{INLINE}"), ours)
    with pytest.raises(SdpError, match="the offer had none"):
        parse_answer(_offer("RTP/SAVP", f"1 AES_CM_128_HMAC_SHA1_80 inline:{INLINE}"), None)
    assert "RTP/AVP 0 8 101" in build_offer(address="127.0.0.1", port=1, session_id=1).decode()


OPUS = "a=rtpmap:111 opus/48000/2|a=fmtp:111 minptime=10;useinbandfec=1|a=rtpmap:102 telephone-event/48000"


def test_opus_is_answered_when_the_offer_lists_it_first_with_its_telephone_event() -> None:
    offer = parse_offer(_offer("RTP/AVP", formats="111 0 102 101", maps=OPUS))
    assert (offer.codec, offer.payload_type, offer.rate, offer.dtmf_type, offer.dtmf_rate) == ("opus", 111, 48000,
                                                                                                102, 48000)  # fmt: skip
    answer = build_answer(offer, address="127.0.0.1", port=20000, session_id=1).decode()
    assert "m=audio 20000 RTP/AVP 111 102\r\n" in answer and "a=rtpmap:111 opus/48000/2\r\n" in answer
    assert "a=fmtp:111 useinbandfec=1;stereo=0;sprop-stereo=0\r\n" in answer
    assert "a=rtpmap:102 telephone-event/48000\r\n" in answer
    # Listed after PCMU: PCMU, as the offerer prefers. Without a 48 kHz telephone-event: the 8 kHz one.
    assert parse_offer(_offer("RTP/AVP", formats="0 111 101", maps=OPUS)).codec == "PCMU"
    only_8k = parse_offer(_offer("RTP/AVP", formats="111 101", maps=OPUS.rsplit("|", 1)[0]))
    assert (only_8k.codec, only_8k.dtmf_type, only_8k.dtmf_rate) == ("opus", 101, 8000)
    # Opus alone, at another rate or a static type, is no codec the gateway takes.
    with pytest.raises(SdpError, match="Opus"):
        parse_offer(_offer("RTP/AVP", formats="111", maps="a=rtpmap:111 opus/16000/1"))


@pytest.mark.parametrize(
    ("payload", "samples"),
    [
        (bytes([15 << 3, 0]), 960),  # hybrid FB 20 ms, one frame
        (bytes([(3 << 3) | 1, 0]), 2 * 2880),  # SILK 60 ms, two frames (code 1)
        (bytes([(19 << 3) | 3, 4]), 4 * 960),  # CELT 20 ms, code 3: four frames
        (bytes([(16 << 3) | 0]), 120),  # CELT 2.5 ms
        (bytes([(3 << 3) | 3, 3]), 0),  # 180 ms: more than RFC 6716 allows
        (b"", 0),
    ],
)
def test_the_samples_of_an_opus_packet_are_read_from_its_toc(payload: bytes, samples: int) -> None:
    assert opus_samples(payload) == samples
