"""The SDP of a SIP call (RFC 4566 / RFC 3264 offer-answer), Sans-I/O.

The gateway answers an offer with one audio stream: G.711 μ-law (PCMU, payload type 0),
A-law (PCMA, 8) or Opus (RFC 7587, ``opus/48000/2`` at its dynamic payload type), whichever
of them the offer lists first, in 20 ms packets, and RFC 4733 ``telephone-event`` when the
offer has it (the one at the codec's clock rate, else the 8 kHz one, at its payload type).
An ``RTP/SAVP`` offer (SDES-SRTP, RFC 4568) is answered ``RTP/SAVP`` with the gateway's own
key for the first ``a=crypto`` it takes (``srtp.py``: the suites and parameters taken); its
``a=crypto`` lines in a plain ``RTP/AVP`` offer are not looked at. Refused with 488 Not
Acceptable Here (the Warning header says why): an offer without PCMU, PCMA or Opus, without
an audio stream, an ``RTP/SAVP`` one without an ``a=crypto`` the gateway takes, and any other
profile (``RTP/SAVPF``, DTLS-SRTP's ``UDP/TLS/RTP/SAVP``, ...).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from gateway.transport.sip import srtp
from gateway.transport.sip.srtp import Crypto, shown

G711 = {0: "PCMU", 8: "PCMA"}  # the static payload types we take
RATES = {"PCMU": 8000, "PCMA": 8000, "opus": 48000}
PROFILES = ("RTP/AVP", "RTP/SAVP")
MAX_SDP_BYTES = 8 * 1024
MAX_SDP_LINES = 128


class SdpError(ValueError):
    """An offer the gateway cannot answer (488)."""


@dataclass(frozen=True, slots=True)
class Offer:
    address: str  # where the caller wants the audio (c=)
    port: int  # (m=audio)
    payload_type: int  # the codec's type: 0 PCMU, 8 PCMA, Opus's dynamic one
    dtmf_type: int | None  # the offer's telephone-event payload type, if any
    ptime_ms: int
    codec: str = "PCMU"  # PCMU, PCMA or opus
    crypto: Crypto | None = None  # RTP/SAVP: the offer's key the gateway took (SDES-SRTP)
    dtmf_rate: int = 8000  # the telephone-event's clock rate

    @property
    def rate(self) -> int:
        """The RTP clock rate of the codec."""
        return RATES[self.codec]


def parse_offer(body: bytes) -> Offer:
    if len(body) > MAX_SDP_BYTES:
        raise SdpError("the SDP is too large")
    lines = body.decode("utf-8", "replace").replace("\r\n", "\n").split("\n")
    if len(lines) > MAX_SDP_LINES:
        raise SdpError("the SDP has too many lines")
    session_addr: str | None = None
    media_addr: str | None = None
    in_audio = False
    seen_audio = False
    port = 0
    formats: list[int] = []
    rtpmap: dict[int, str] = {}
    ptime = 20
    profile = ""
    cryptos: list[str] = []
    for line in lines:
        line = line.strip()
        if len(line) < 2 or line[1] != "=":
            continue
        key, value = line[0], line[2:]
        if key == "m":
            parts = value.split()
            in_audio = bool(parts) and parts[0] == "audio" and not seen_audio
            if in_audio:
                seen_audio = True
                if len(parts) < 4 or not parts[1].split("/")[0].isdigit():
                    raise SdpError("bad m=audio line")
                port = int(parts[1].split("/")[0])
                profile = parts[2]
                formats = [int(f) for f in parts[3:] if f.isdigit()]
        elif key == "c":
            parts = value.split()
            if len(parts) == 3 and parts[0] == "IN" and parts[1] in ("IP4", "IP6"):
                addr = parts[2].split("/")[0]
                if in_audio:
                    media_addr = addr
                elif not seen_audio:
                    session_addr = addr
        elif key == "a" and in_audio:
            if value.startswith("rtpmap:"):
                pt, _, enc = value[7:].partition(" ")
                if pt.isdigit():
                    rtpmap[int(pt)] = enc.strip().lower()
            elif value.startswith("ptime:") and value[6:].strip().isdigit():
                ptime = int(value[6:].strip())
            elif value.startswith("crypto:"):
                cryptos.append(value[7:].strip())
    if not seen_audio:
        raise SdpError("the offer has no audio stream")
    if profile not in PROFILES:
        raise SdpError(f"the media profile {shown(profile)} is not taken (RTP/AVP, or RTP/SAVP with SDES-SRTP keys)")
    if port == 0:
        raise SdpError("the audio stream is disabled (port 0)")
    if port > 65535:
        raise SdpError(f"the audio port {port} is not a port")
    address = media_addr or session_addr
    if address is None:
        raise SdpError("the offer has no connection address")
    try:
        ipaddress.ip_address(address)
    except ValueError:
        raise SdpError(f"the connection address {address!r} is not an IP address") from None
    chosen = next(((f, name) for f in formats if (name := _codec(f, rtpmap)) is not None), None)
    if chosen is None:
        raise SdpError("the offer has neither PCMU nor PCMA at 8 kHz nor Opus (opus/48000/2)")
    rate = RATES[chosen[1]]
    events = [f for f in formats if rtpmap.get(f, "").startswith(f"telephone-event/{rate}")]
    events += [f for f in formats if rtpmap.get(f, "").startswith("telephone-event/8000")]
    crypto = None
    if profile == "RTP/SAVP":
        try:
            crypto = srtp.choose(cryptos)
        except srtp.CryptoError as err:
            raise SdpError(f"SRTP: {err}") from None
    dtmf_rate = int(rtpmap[events[0]].split("/")[1]) if events else 8000
    return Offer(address, port, chosen[0], events[0] if events else None, ptime if ptime in (10, 20, 30, 40) else 20,
                 chosen[1], crypto, dtmf_rate)  # fmt: skip


def parse_answer(body: bytes, offered: Crypto | None) -> Offer:
    """The trunk's answer to our offer (``offered``: the SRTP key we offered, if we did): as an
    offer, and its SRTP the one offered (or none, when we offered none). Raises SdpError."""
    answer = parse_offer(body)
    if offered is None and answer.crypto is not None:
        raise SdpError("the answer has SRTP, the offer had none")
    if offered is not None:
        try:
            srtp.check_answer(offered, answer.crypto)
        except srtp.CryptoError as err:
            raise SdpError(f"SRTP: {err}") from None
    return answer


def _codec(pt: int, rtpmap: dict[int, str]) -> str | None:
    """The codec at payload type ``pt``, if the gateway takes it."""
    if pt in G711:
        name = G711[pt]
        return name if rtpmap.get(pt, name.lower() + "/8000").startswith(name.lower() + "/8000") else None
    if 96 <= pt <= 127 and rtpmap.get(pt, "").startswith("opus/48000"):
        return "opus"
    return None


def _media_lines(offer: Offer, crypto: Crypto | None) -> list[str]:
    """The ``a=`` lines of our audio stream: the codec, telephone-event, the key."""
    pt = offer.payload_type
    if offer.codec == "opus":
        lines = [f"a=rtpmap:{pt} opus/48000/2", f"a=fmtp:{pt} useinbandfec=1;stereo=0;sprop-stereo=0"]
    else:
        lines = [f"a=rtpmap:{pt} {offer.codec}/8000"]
    if offer.dtmf_type is not None:
        dt = offer.dtmf_type
        lines += [f"a=rtpmap:{dt} telephone-event/{offer.dtmf_rate}", f"a=fmtp:{dt} 0-15"]
    if crypto is not None:
        lines.append(f"a={crypto.attribute()}")
    return [*lines, "a=ptime:20", "a=sendrecv"]


def build_answer(offer: Offer, *, address: str, port: int, session_id: int, crypto: Crypto | None = None) -> bytes:
    """Our answer: one audio stream at ``address``:``port``, the offer's codec and DTMF types;
    ``crypto``: our key (SRTP, when the offer has one)."""
    family = "IP6" if ":" in address else "IP4"
    formats = [offer.payload_type] + ([offer.dtmf_type] if offer.dtmf_type is not None else [])
    lines = [
        "v=0",
        f"o=omni-gateway {session_id} {session_id} IN {family} {address}",
        "s=omni-gateway",
        f"c=IN {family} {address}",
        "t=0 0",
        f"m=audio {port} {'RTP/SAVP' if crypto else 'RTP/AVP'} {' '.join(str(f) for f in formats)}",
        *_media_lines(offer, crypto),
    ]
    return ("\r\n".join(lines) + "\r\n").encode()


DTMF_TYPE = 101  # the telephone-event payload type of the gateway's own offers


def build_offer(*, address: str, port: int, session_id: int, crypto: Crypto | None = None) -> bytes:
    """The gateway's offer for an outbound call: PCMU, PCMA, telephone-event, 20 ms;
    ``crypto``: our key (RTP/SAVP, SDES-SRTP: ``sip_outbound_srtp``)."""
    family = "IP6" if ":" in address else "IP4"
    lines = [
        "v=0",
        f"o=omni-gateway {session_id} {session_id} IN {family} {address}",
        "s=omni-gateway",
        f"c=IN {family} {address}",
        "t=0 0",
        f"m=audio {port} {'RTP/SAVP' if crypto else 'RTP/AVP'} 0 8 {DTMF_TYPE}",
        "a=rtpmap:0 PCMU/8000",
        "a=rtpmap:8 PCMA/8000",
        f"a=rtpmap:{DTMF_TYPE} telephone-event/8000",
        f"a=fmtp:{DTMF_TYPE} 0-15",
        *([f"a={crypto.attribute()}"] if crypto else []),
        "a=ptime:20",
        "a=sendrecv",
    ]
    return ("\r\n".join(lines) + "\r\n").encode()
