"""SDP offers checked before any media is set up, and the answer's advertised candidates.

The two Chromium offers in ``data/`` are real: one as the OpenAI Agents SDK posts it (right
after ``createOffer``, so trickle ICE with no candidate at all), one after gathering.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.transport.webrtc import sdp
from gateway.transport.webrtc.sdp import OfferError, advertise, check_offer

DATA = Path(__file__).parent / "data"
SDK_OFFER = (DATA / "chromium_sdk_offer.sdp").read_text()
GATHERED_OFFER = (DATA / "chromium_gathered_offer.sdp").read_text()


def _refused(offer: str | bytes, **kw: object) -> OfferError:
    with pytest.raises(OfferError) as info:
        check_offer(offer, **kw)  # type: ignore[arg-type]
    err = info.value
    assert err.status == 400 and err.param == "sdp" and err.message.startswith("Invalid SDP offer")
    return err


def test_the_sdk_offer_passes() -> None:
    summary = check_offer(SDK_OFFER)
    assert summary.audio.index == 0 and summary.audio.mid == "0"
    assert summary.audio.direction == "sendrecv" and summary.audio.opus_payload_type == 111
    assert summary.has_data_channel and summary.data_channel_mid == "1"
    assert summary.candidates == 0 and summary.trickle  # what the gateway's ICE must cope with
    assert summary.max_message_size == 262144
    assert summary.other_sections == 0


def test_a_gathered_offer_passes_with_crlf_and_bytes() -> None:
    offer = GATHERED_OFFER.replace("\n", "\r\n").encode()
    summary = check_offer(offer)
    assert summary.candidates == 8 and summary.has_data_channel


@pytest.mark.parametrize(
    ("offer", "code"),
    [
        ("", sdp.INVALID_OFFER),
        ("   \r\n", sdp.INVALID_OFFER),
        ("hello, I am not SDP", sdp.INVALID_OFFER),
        ('{"sdp": "v=0"}', sdp.INVALID_OFFER),
        (b"\xff\xfe\x00v=0", sdp.INVALID_OFFER),
        ("v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n", sdp.OFFER_NO_AUDIO),  # no media at all
        ("v=0\nthis line is broken\n", sdp.INVALID_OFFER),
        ("v=0\nm=audio\n", sdp.INVALID_OFFER),
    ],
)
def test_what_is_not_sdp_is_refused(offer: str | bytes, code: str) -> None:
    assert _refused(offer).code == code


def test_the_error_body_is_openais_shape() -> None:
    err = _refused("nonsense")
    assert err.body() == {
        "error": {"message": err.message, "type": "invalid_request_error", "code": "invalid_offer", "param": "sdp"}
    }


def test_too_large() -> None:
    assert _refused(SDK_OFFER, max_bytes=1000).code == sdp.OFFER_TOO_LARGE
    assert _refused(SDK_OFFER.encode() + b"a=x\r\n" * 20000).code == sdp.OFFER_TOO_LARGE


def _without_audio(offer: str) -> str:
    head, _, rest = offer.partition("m=audio")
    return head + "m=" + rest.partition("\nm=")[2]


def test_an_offer_with_no_audio_is_refused() -> None:
    data_only = _without_audio(SDK_OFFER)
    assert "m=audio" not in data_only and "m=application" in data_only
    assert _refused(data_only).code == sdp.OFFER_NO_AUDIO


def test_a_rejected_or_inactive_audio_line_is_no_audio() -> None:
    rejected = SDK_OFFER.replace("m=audio 9 ", "m=audio 0 ")
    assert _refused(rejected).code == sdp.OFFER_NO_AUDIO
    bundle_only = rejected.replace("a=mid:0", "a=mid:0\na=bundle-only")
    assert check_offer(bundle_only).audio.mid == "0"  # port 0 + bundle-only is not a rejection
    assert _refused(SDK_OFFER.replace("a=sendrecv", "a=inactive")).code == sdp.OFFER_NO_AUDIO
    assert check_offer(SDK_OFFER.replace("a=sendrecv", "a=recvonly")).audio.direction == "recvonly"


def test_audio_without_opus() -> None:
    no_opus = SDK_OFFER.replace("a=rtpmap:111 opus/48000/2", "a=rtpmap:111 speex/16000")
    assert _refused(no_opus).code == sdp.OFFER_NO_OPUS
    # Opus mapped to a payload type the m-line does not list does not count either
    unlisted = SDK_OFFER.replace("UDP/TLS/RTP/SAVPF 111 63", "UDP/TLS/RTP/SAVPF 63")
    assert _refused(unlisted).code == sdp.OFFER_NO_OPUS


def test_plain_rtp_is_refused() -> None:
    plain = SDK_OFFER.replace("m=audio 9 UDP/TLS/RTP/SAVPF", "m=audio 9 RTP/AVP")
    assert _refused(plain).code == sdp.OFFER_UNSUPPORTED_TRANSPORT


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda o: o.replace("a=ice-ufrag:WGns\n", ""), "ICE username fragment"),
        (lambda o: o.replace("a=ice-pwd:ARv4V4wvBqEIj848c77DV/sV\n", ""), "ICE password"),
        (
            lambda o: "\n".join(line for line in o.split("\n") if not line.startswith("a=fingerprint")),
            "no DTLS fingerprint",
        ),
        (lambda o: o.replace("a=fingerprint:sha-256 3E", "a=fingerprint:sha-256 ZZ"), "a=fingerprint is not"),
        (lambda o: o.replace("a=setup:actpass", "a=setup:sideways"), "a=setup"),
        (lambda o: o.replace("a=mid:1", "a=mid:0"), "share one a=mid"),
    ],
)
def test_offers_the_stack_could_not_take(change: object, needle: str) -> None:
    err = _refused(change(SDK_OFFER))  # type: ignore[operator]
    assert err.code == sdp.INVALID_OFFER and needle in err.message


def test_session_level_credentials_count() -> None:
    lines = SDK_OFFER.split("\n")
    moved = [line for line in lines if not line.startswith(("a=ice-ufrag", "a=ice-pwd", "a=fingerprint"))]
    at = moved.index("t=0 0") + 1
    session_level = [line for line in lines if line.startswith(("a=ice-ufrag", "a=ice-pwd", "a=fingerprint"))][:3]
    assert check_offer("\n".join(moved[:at] + session_level + moved[at:])).has_data_channel


def test_the_data_channel_is_optional_unless_required() -> None:
    audio_only = SDK_OFFER.partition("m=application")[0].replace("a=group:BUNDLE 0 1", "a=group:BUNDLE 0")
    summary = check_offer(audio_only)
    assert not summary.has_data_channel and summary.max_message_size == 65536
    assert _refused(audio_only, require_data_channel=True).code == sdp.OFFER_NO_DATA_CHANNEL
    assert check_offer(SDK_OFFER, require_data_channel=True).has_data_channel


def test_a_video_line_is_counted_not_refused() -> None:
    video = SDK_OFFER + "m=video 9 UDP/TLS/RTP/SAVPF 96\nc=IN IP4 0.0.0.0\na=mid:2\na=rtpmap:96 VP8/90000\n"
    assert check_offer(video).other_sections == 1


# --- advertised addresses ---

ANSWER = "\r\n".join(
    [
        "v=0",
        "m=audio 40001 UDP/TLS/RTP/SAVPF 96",
        "c=IN IP4 10.0.0.5",
        "a=candidate:abc 1 udp 2130706431 10.0.0.5 40001 typ host",
        "a=candidate:def 1 udp 2130706431 fd00::5 40002 typ host",
        "a=candidate:ghi 1 udp 2130706431 0f7a.local 40003 typ host",
        "a=candidate:jkl 1 udp 1694498815 198.51.100.9 40001 typ srflx raddr 10.0.0.5 rport 40001",
        "a=end-of-candidates",
        "",
    ]
)


def test_advertise_adds_a_reflexive_candidate_per_host_candidate_of_the_family() -> None:
    out = advertise(ANSWER, ["203.0.113.7"])
    lines = out.split("\r\n")
    added = [line for line in lines if "203.0.113.7" in line]
    srflx_priority = (100 << 24) + (65535 << 8) + 255
    assert added == [f"a=candidate:abc10 1 udp {srflx_priority} 203.0.113.7 40001 typ srflx raddr 10.0.0.5 rport 40001"]
    assert lines.index(added[0]) == lines.index("a=candidate:abc 1 udp 2130706431 10.0.0.5 40001 typ host") + 1
    assert "c=IN IP4 10.0.0.5" in lines and out.endswith("\r\n")  # the rest is untouched
    both = advertise(ANSWER, ["203.0.113.7", "2001:db8::7"])
    assert "2001:db8::7 40002 typ srflx raddr fd00::5 rport 40002" in both
    assert advertise(ANSWER, []) == ANSWER


def test_advertise_replace_rewrites_host_candidates_and_the_connection_line() -> None:
    out = advertise(ANSWER, ["203.0.113.7"], mode="replace")
    assert "10.0.0.5 40001 typ host" not in out
    assert "a=candidate:abc 1 udp 2130706431 203.0.113.7 40001 typ host" in out
    assert "c=IN IP4 203.0.113.7" in out
    assert "fd00::5 40002 typ host" in out  # no IPv6 address advertised: left as it was
    assert "0f7a.local" in out and "typ srflx raddr 10.0.0.5" in out


# --- caps and the candidates the gateway may send to (issue 33, finding 8) ---


def _with_candidates(offer: str, lines: list[str]) -> str:
    """``offer`` with ``lines`` added to its first media section."""
    head, sep, rest = offer.partition("a=mid:")
    mid_line, _, tail = rest.partition("\n")
    return head + sep + mid_line + "\n" + "".join(line + "\n" for line in lines) + tail


def _candidate(address: str, port: int, *, transport: str = "udp", priority: int = 2122194687) -> str:
    return f"a=candidate:1 1 {transport} {priority} {address} {port} typ host generation 0"


def test_an_offer_over_the_candidate_cap_is_refused_before_it_is_parsed() -> None:
    many = _with_candidates(SDK_OFFER, [_candidate("203.0.113.9", 20000 + i) for i in range(600)])
    err = _refused(many, max_bytes=1 << 20)
    assert err.code == sdp.OFFER_TOO_MANY_CANDIDATES and "600" in err.message
    assert check_offer(_with_candidates(SDK_OFFER, [_candidate("8.8.8.8", 40000)] * 64)).candidates == 64


def test_an_offer_over_the_section_cap_is_refused_before_it_is_parsed() -> None:
    section = "m=video 9 UDP/TLS/RTP/SAVPF 96\nc=IN IP4 0.0.0.0\na=rtpmap:96 VP8/90000\n"
    err = _refused(SDK_OFFER.rstrip("\n") + "\n" + section * 190, max_bytes=1 << 20)
    assert err.code == sdp.OFFER_TOO_MANY_SECTIONS and "192" in err.message
    assert check_offer(SDK_OFFER.rstrip("\n") + "\n" + section * 14).other_sections == 14


@pytest.mark.parametrize("ufrag", ["ab", "a b c d", "evil<text>USERNAME", "x" * 257])
def test_ice_credentials_must_be_ice_chars(ufrag: str) -> None:
    offer = SDK_OFFER.replace("a=ice-ufrag:", f"a=ice-ufrag:{ufrag}\na=x-was:", 1)
    assert _refused(offer).code == sdp.INVALID_OFFER


def test_screen_candidates_keeps_what_the_operator_allows_and_nothing_else() -> None:
    peers = sdp.PeerNetworks.parse(["public", "127.0.0.1/32"])
    lines = [
        _candidate("8.8.8.8", 40000),  # public: kept
        _candidate("127.0.0.1", 40001),  # listed: kept
        _candidate("127.0.0.3", 40002),  # loopback, not listed
        _candidate("10.1.2.3", 40003),  # private
        _candidate("169.254.169.254", 40004),  # link-local (cloud metadata)
        _candidate("192.0.2.2", 40005),  # documentation range: not global
        _candidate("8.8.4.4", 22),  # a well-known port: never a peer's
        _candidate("3b1f2c3d-1234-4c5d-9e8f-0123456789ab.local", 40006),  # mDNS: resolves to anything
        _candidate("8.8.8.8", 9, transport="tcp"),  # not UDP
        "a=candidate:broken",
        "a=end-of-candidates",
    ]
    screened, dropped = sdp.screen_candidates(_with_candidates(SDK_OFFER, lines), peers)
    assert dropped == 8
    kept = [line for line in screened.splitlines() if line.startswith("a=candidate:")]
    assert kept == [lines[0], lines[1]]
    assert "a=end-of-candidates" not in screened  # the agent waits for the peer's checks instead
    assert check_offer(screened).candidates == 2


def test_screen_candidates_leaves_an_offer_it_keeps_whole_as_it_was() -> None:
    offer = _with_candidates(SDK_OFFER, [_candidate("8.8.8.8", 40000), "a=end-of-candidates"])
    assert sdp.screen_candidates(offer, sdp.PeerNetworks.parse(["public"])) == (offer, 0)
    assert sdp.screen_candidates(offer, sdp.PeerNetworks.parse(["10.0.0.0/8"]))[1] == 1


def test_peer_networks_refuse_a_bad_entry() -> None:
    with pytest.raises(ValueError, match="publik"):
        sdp.PeerNetworks.parse(["publik"])
