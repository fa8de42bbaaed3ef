"""The SDP of a SIP call (RFC 4566 / RFC 3264 offer-answer), Sans-I/O.

The gateway answers an offer with one audio stream: G.711 μ-law (PCMU, payload type 0) or
A-law (PCMA, 8), whichever the offer lists first, at 8 kHz and 20 ms packets, and RFC 4733
``telephone-event`` when the offer has it (at its payload type). Opus is not offered: a
trunk's G.711 is what every carrier sends, and transcoding Opus here would add a codec for no
caller that needs it (docs/telephony-sip.md). An offer without PCMU or PCMA, without an audio
stream, or with only an encrypted profile (RTP/SAVP: SDES-SRTP is not done yet) is refused
with 488 Not Acceptable Here.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

G711 = {0: "PCMU", 8: "PCMA"}  # the static payload types we take
MAX_SDP_BYTES = 8 * 1024
MAX_SDP_LINES = 128


class SdpError(ValueError):
    """An offer the gateway cannot answer (488)."""


@dataclass(frozen=True, slots=True)
class Offer:
    address: str  # where the caller wants the audio (c=)
    port: int  # (m=audio)
    payload_type: int  # the G.711 type chosen: 0 PCMU, 8 PCMA
    dtmf_type: int | None  # the offer's telephone-event payload type (8 kHz), if any
    ptime_ms: int

    @property
    def codec(self) -> str:
        return G711[self.payload_type]


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
    if not seen_audio:
        raise SdpError("the offer has no audio stream")
    if profile != "RTP/AVP":
        raise SdpError(f"the media profile {profile!r} is not taken (RTP/AVP only; SRTP is not done yet)")
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
    chosen = next((f for f in formats if f in G711 and rtpmap.get(f, G711[f].lower() + "/8000").startswith(
        G711[f].lower() + "/8000")), None)  # fmt: skip
    if chosen is None:
        raise SdpError("the offer has neither PCMU nor PCMA at 8 kHz")
    dtmf = next((f for f in formats if rtpmap.get(f, "").startswith("telephone-event/8000")), None)
    return Offer(address, port, chosen, dtmf, ptime if ptime in (10, 20, 30, 40) else 20)


def build_answer(offer: Offer, *, address: str, port: int, session_id: int) -> bytes:
    """Our answer: one audio stream at ``address``:``port``, the offer's G.711 and DTMF types."""
    family = "IP6" if ":" in address else "IP4"
    formats = [offer.payload_type] + ([offer.dtmf_type] if offer.dtmf_type is not None else [])
    lines = [
        "v=0",
        f"o=omni-gateway {session_id} {session_id} IN {family} {address}",
        "s=omni-gateway",
        f"c=IN {family} {address}",
        "t=0 0",
        f"m=audio {port} RTP/AVP {' '.join(str(f) for f in formats)}",
        f"a=rtpmap:{offer.payload_type} {offer.codec}/8000",
    ]
    if offer.dtmf_type is not None:
        lines += [f"a=rtpmap:{offer.dtmf_type} telephone-event/8000", f"a=fmtp:{offer.dtmf_type} 0-15"]
    lines += ["a=ptime:20", "a=sendrecv"]
    return ("\r\n".join(lines) + "\r\n").encode()


DTMF_TYPE = 101  # the telephone-event payload type of the gateway's own offers


def build_offer(*, address: str, port: int, session_id: int) -> bytes:
    """The gateway's offer for an outbound call: PCMU, PCMA, telephone-event, 20 ms."""
    family = "IP6" if ":" in address else "IP4"
    lines = [
        "v=0",
        f"o=omni-gateway {session_id} {session_id} IN {family} {address}",
        "s=omni-gateway",
        f"c=IN {family} {address}",
        "t=0 0",
        f"m=audio {port} RTP/AVP 0 8 {DTMF_TYPE}",
        "a=rtpmap:0 PCMU/8000",
        "a=rtpmap:8 PCMA/8000",
        f"a=rtpmap:{DTMF_TYPE} telephone-event/8000",
        f"a=fmtp:{DTMF_TYPE} 0-15",
        "a=ptime:20",
        "a=sendrecv",
    ]
    return ("\r\n".join(lines) + "\r\n").encode()
