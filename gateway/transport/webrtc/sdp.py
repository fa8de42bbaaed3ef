"""SDP offers checked before any media is set up, and the answer's candidates rewritten for
the addresses the gateway is reachable at. Pure text work: no aiortc, no sockets.

``check_offer`` answers the questions ``POST /v1/realtime/calls`` must settle before it
spends a port or a DTLS handshake on a caller: is this SDP at all, does it carry an audio
m-line the gateway can take (Opus, DTLS-SRTP, ICE credentials, a fingerprint), and is there
a data channel. A refusal is an :class:`OfferError` with a stable ``code``, a ``message``
and the ``param``, which the endpoint turns into OpenAI's error body with HTTP 400
(OpenAI itself answers a bad offer with 400 ``invalid_offer``).

A data channel is optional: OpenAI's clients always open ``oai-events``, but a call driven
only by a sideband connection needs none; ``require_data_channel`` makes it mandatory.

Before anything is parsed, the offer's media sections and ICE candidates are counted
(``max_sections``, ``max_candidates``: more is refused, ``offer_too_many_sections`` /
``offer_too_many_candidates``), and its ICE credentials must be what RFC 8839 allows
(4 to 256 of ``A-Z a-z 0-9 + /``: they go into every STUN check the gateway sends).
``screen_candidates`` then leaves out the candidates the gateway may not send to
(``PeerNetworks``): the ICE agent never sends a packet to an address or port the
operator did not allow; a peer that can reach the gateway still connects, through the
checks it sends (peer-reflexive candidates).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Literal

MAX_OFFER_BYTES = 64 * 1024  # Chromium's offers are 3-6 KB; more is not an offer we want to parse
MAX_OFFER_SECTIONS = 16  # m-lines (a call has two: audio and the data channel; a camera adds one)
MAX_OFFER_CANDIDATES = 64  # a=candidate lines (a browser on a few interfaces offers a dozen or two)
MIN_PEER_PORT = 1024  # a candidate port below this is never a peer's (they are ephemeral): left out
_ICE_CHARS = re.compile(r"^[A-Za-z0-9+/]{4,256}$")  # RFC 8839 ice-char, 4 to 256 of them
_DIRECTIONS = ("sendrecv", "sendonly", "recvonly", "inactive")
_SETUP = ("actpass", "active", "passive", "holdconn")
_FINGERPRINT = re.compile(r"^(sha-1|sha-224|sha-256|sha-384|sha-512) [0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2})+$", re.IGNORECASE)


class OfferError(ValueError):
    """An offer the gateway refuses, before any media exists. HTTP 400."""

    status = 400

    def __init__(self, code: str, message: str, param: str | None = "sdp") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param

    def body(self) -> dict[str, dict[str, str | None]]:
        """OpenAI's error shape."""
        return {
            "error": {"message": self.message, "type": "invalid_request_error", "code": self.code, "param": self.param}
        }


# Codes (stable: clients and tests match on them).
INVALID_OFFER = "invalid_offer"  # not SDP, or SDP the WebRTC stack cannot take (OpenAI's code)
OFFER_TOO_LARGE = "offer_too_large"
OFFER_TOO_MANY_SECTIONS = "offer_too_many_sections"  # more m-lines than max_sections
OFFER_TOO_MANY_CANDIDATES = "offer_too_many_candidates"  # more a=candidate lines than max_candidates
OFFER_NO_AUDIO = "offer_no_audio"  # no usable audio m-line (none, rejected, or inactive)
OFFER_NO_OPUS = "offer_no_opus"  # audio, but Opus is not among its codecs
OFFER_NO_DATA_CHANNEL = "offer_no_data_channel"  # only with require_data_channel
OFFER_UNSUPPORTED_TRANSPORT = "offer_unsupported_transport"  # plain RTP (no DTLS-SRTP) or the like


@dataclass(frozen=True, slots=True)
class AudioSection:
    index: int  # the m-line's position (0-based)
    mid: str | None
    direction: str  # as offered: sendrecv (the usual), sendonly, recvonly
    opus_payload_type: int


@dataclass(frozen=True, slots=True)
class OfferSummary:
    audio: AudioSection
    data_channel_mid: str | None  # None: the offer has no data channel
    data_channel_index: int | None
    other_sections: int  # video and anything else: answered as rejected/inactive
    candidates: int  # 0 is normal: browsers' first offer has none (trickle; the Agents SDK posts it so)
    trickle: bool
    max_message_size: int = 65536  # the peer's a=max-message-size (RFC 8841: 64 KiB if absent; 0: no limit)

    @property
    def has_data_channel(self) -> bool:
        return self.data_channel_mid is not None or self.data_channel_index is not None


@dataclass(slots=True)
class _Section:
    index: int
    kind: str
    port: int
    proto: str
    formats: list[str]
    attrs: list[tuple[str, str]]

    def attr(self, name: str) -> str | None:
        return next((v for k, v in self.attrs if k == name), None)

    def has(self, name: str) -> bool:
        return any(k == name for k, _ in self.attrs)


def _fail(code: str, why: str) -> OfferError:
    return OfferError(code, f"Invalid SDP offer: {why}")


def _decode(offer: str | bytes, max_bytes: int) -> str:
    if isinstance(offer, bytes):
        if len(offer) > max_bytes:
            raise _fail(OFFER_TOO_LARGE, f"it is over {max_bytes} bytes.")
        try:
            return offer.decode("utf-8")
        except UnicodeDecodeError:
            raise _fail(INVALID_OFFER, "not UTF-8 text.") from None
    if len(offer) > max_bytes:  # characters, not bytes: close enough for a size guard
        raise _fail(OFFER_TOO_LARGE, f"it is over {max_bytes} bytes.")
    return offer


def _parse(text: str) -> tuple[list[tuple[str, str]], list[_Section]]:
    lines = [line.rstrip("\r") for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines or lines[0].strip() != "v=0":
        raise _fail(INVALID_OFFER, "it must begin with v=0.")
    session: list[tuple[str, str]] = []
    sections: list[_Section] = []
    for number, line in enumerate(lines, 1):
        if not line:
            continue  # tolerated: some stacks leave blank lines
        if len(line) < 2 or line[1] != "=" or not line[0].isalpha():
            raise _fail(INVALID_OFFER, f"line {number} is not type=value.")
        kind, value = line[0], line[2:]
        if kind == "m":
            parts = value.split()
            if len(parts) < 4 or not parts[1].split("/")[0].isdigit():
                raise _fail(INVALID_OFFER, f"line {number}: a media line needs <media> <port> <proto> <fmt>...")
            sections.append(_Section(len(sections), parts[0], int(parts[1].split("/")[0]), parts[2], parts[3:], []))
        elif kind == "a":
            name, _, val = value.partition(":")
            (sections[-1].attrs if sections else session).append((name, val))
    if not sections:
        raise _fail(OFFER_NO_AUDIO, "it has no media line (m=audio with Opus is required).")
    mids = [s.attr("mid") for s in sections if s.has("mid")]
    if len(set(mids)) != len(mids):
        raise _fail(INVALID_OFFER, "two media sections share one a=mid.")
    return session, sections


def _opus_payload_type(section: _Section) -> int | None:
    for name, value in section.attrs:
        if name != "rtpmap":
            continue
        pt, _, codec = value.partition(" ")
        codec_name, _, rest = codec.strip().partition("/")
        if codec_name.lower() == "opus" and rest.startswith("48000") and pt in section.formats:
            try:
                return int(pt)
            except ValueError:
                continue
    return None


def _direction(section: _Section, session: list[tuple[str, str]]) -> str:
    for name, _ in section.attrs:
        if name in _DIRECTIONS:
            return name
    for name, _ in session:
        if name in _DIRECTIONS:
            return name
    return "sendrecv"


def _check_security(section: _Section, session: list[tuple[str, str]], what: str) -> None:
    session_has = {name for name, _ in session}
    for needed, label in (("ice-ufrag", "ICE username fragment"), ("ice-pwd", "ICE password")):
        if not section.has(needed) and needed not in session_has:
            raise _fail(INVALID_OFFER, f"the {what} section has no {label} (a={needed}).")
        for value in [v for k, v in section.attrs if k == needed] + [v for k, v in session if k == needed]:
            if not _ICE_CHARS.match(value.strip()):
                raise _fail(INVALID_OFFER, f"the {what} section's a={needed} is not 4 to 256 of A-Z a-z 0-9 + /.")
    fingerprints = [v for k, v in section.attrs if k == "fingerprint"] or [v for k, v in session if k == "fingerprint"]
    if not fingerprints:
        raise _fail(INVALID_OFFER, f"the {what} section has no DTLS fingerprint (a=fingerprint).")
    if not all(_FINGERPRINT.match(f.strip()) for f in fingerprints):
        raise _fail(INVALID_OFFER, f"the {what} section's a=fingerprint is not <hash> <hex:hex:...>.")
    setup = section.attr("setup") or next((v for k, v in session if k == "setup"), None)
    if setup is not None and setup.strip() not in _SETUP:
        raise _fail(INVALID_OFFER, f"the {what} section's a=setup is {setup.strip()!r} (actpass, active or passive).")


def _count(text: str, prefix: str) -> int:
    """Lines of ``text`` that start with ``prefix`` (counted without splitting it)."""
    return text.count("\n" + prefix) + text.startswith(prefix)


def check_offer(
    offer: str | bytes,
    *,
    require_data_channel: bool = False,
    max_bytes: int = MAX_OFFER_BYTES,
    max_sections: int = MAX_OFFER_SECTIONS,
    max_candidates: int = MAX_OFFER_CANDIDATES,
) -> OfferSummary:
    """Check an SDP offer; returns what it offers or raises :class:`OfferError`."""
    text = _decode(offer, max_bytes)
    if not text.strip():
        raise _fail(INVALID_OFFER, "the body is empty.")
    if max_sections and (n := _count(text, "m=")) > max_sections:
        raise _fail(OFFER_TOO_MANY_SECTIONS, f"it has {n} media sections; at most {max_sections} are taken.")
    if max_candidates and (n := _count(text, "a=candidate")) > max_candidates:
        raise _fail(OFFER_TOO_MANY_CANDIDATES, f"it has {n} ICE candidates; at most {max_candidates} are taken.")
    session, sections = _parse(text)

    def live(s: _Section) -> bool:
        return s.port != 0 or s.has("bundle-only")  # port 0 rejects an m-line, unless bundle-only

    audio_sections = [s for s in sections if s.kind == "audio" and live(s)]
    if not audio_sections:
        raise _fail(OFFER_NO_AUDIO, "it has no audio m-line (a voice call needs the microphone's track).")
    usable = [s for s in audio_sections if _direction(s, session) != "inactive"]
    if not usable:
        raise _fail(OFFER_NO_AUDIO, "its audio m-line is inactive.")
    audio = usable[0]
    if "SAVPF" not in audio.proto or ("TLS" not in audio.proto and "DTLS" not in audio.proto):
        raise OfferError(
            OFFER_UNSUPPORTED_TRANSPORT,
            f"Invalid SDP offer: the audio m-line's transport is {audio.proto}; WebRTC needs UDP/TLS/RTP/SAVPF.",
        )
    opus = _opus_payload_type(audio)
    if opus is None:
        raise OfferError(OFFER_NO_OPUS, "Invalid SDP offer: the audio m-line offers no Opus (opus/48000/2).")
    _check_security(audio, session, "audio")

    data = next(
        (s for s in sections if s.kind == "application" and live(s) and "SCTP" in s.proto.upper()),
        None,
    )
    if data is not None:
        _check_security(data, session, "data channel")
    elif require_data_channel:
        raise OfferError(
            OFFER_NO_DATA_CHANNEL,
            "Invalid SDP offer: it has no data channel (m=application ... webrtc-datachannel) for oai-events.",
        )
    candidates = sum(1 for s in sections for name, _ in s.attrs if name == "candidate")
    trickle = any(name == "ice-options" and "trickle" in value.split() for name, value in session) or any(
        name == "ice-options" and "trickle" in value.split() for s in sections for name, value in s.attrs
    )
    max_message_size = 65536
    raw_size = None if data is None else data.attr("max-message-size")
    if raw_size is not None and raw_size.strip().isdigit():
        max_message_size = int(raw_size.strip())
    return OfferSummary(
        audio=AudioSection(audio.index, audio.attr("mid"), _direction(audio, session), opus),
        data_channel_mid=None if data is None else data.attr("mid"),
        data_channel_index=None if data is None else data.index,
        other_sections=sum(1 for s in sections if s is not audio and s is not data),
        candidates=candidates,
        trickle=trickle,
        max_message_size=max_message_size,
    )


# --- the offer's candidates ---


@dataclass(frozen=True, slots=True)
class PeerNetworks:
    """Where the gateway's ICE agent may send checks: the networks given, and with
    ``public`` every globally routable unicast address (``ipaddress``'s ``is_global``)."""

    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    public: bool = True

    @classmethod
    def parse(cls, entries: tuple[str, ...] | list[str]) -> PeerNetworks:
        """``("public", "10.0.0.0/8", "127.0.0.1")``; raises ValueError naming a bad entry."""
        networks = []
        public = False
        for entry in (e.strip() for e in entries):
            if entry.lower() == "public":
                public = True
            elif entry:
                try:
                    networks.append(ipaddress.ip_network(entry, strict=False))
                except ValueError:
                    raise ValueError(f"peer network {entry!r}: 'public' or an address or CIDR range") from None
        return cls(tuple(networks), public)

    def allows(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        if self.public and address.is_global and not address.is_multicast:
            return True
        return any(address in network for network in self.networks)


def screen_candidates(offer: str, peers: PeerNetworks) -> tuple[str, int]:
    """The offer without the candidates the gateway may not send to (an address outside
    ``peers``, a port below ``MIN_PEER_PORT``, a name such as mDNS's ``.local``, which
    would resolve to an address nobody checked, anything but UDP), and how many were
    left out. When any was, ``a=end-of-candidates`` goes too: the ICE agent then waits
    for the peer's own checks (peer-reflexive candidates) instead of failing at once."""
    newline = "\r\n" if "\r\n" in offer else "\n"
    kept: list[str] = []
    dropped = 0
    for line in offer.split(newline):
        if line.startswith("a=candidate:") and not _allowed_candidate(line, peers):
            dropped += 1
            continue
        kept.append(line)
    if dropped:
        kept = [line for line in kept if line.strip() != "a=end-of-candidates"]
    return newline.join(kept), dropped


def _allowed_candidate(line: str, peers: PeerNetworks) -> bool:
    fields = line[len("a=candidate:") :].split()
    if len(fields) < 8 or fields[2].lower() != "udp" or fields[6] != "typ" or not fields[5].isdigit():
        return False
    try:
        address = ipaddress.ip_address(fields[4])
    except ValueError:
        return False
    return MIN_PEER_PORT <= int(fields[5]) <= 65535 and peers.allows(address)


# --- the answer's candidates ---


def _priority(type_preference: int, component: int, local_preference: int = 65535) -> int:
    return (type_preference << 24) + (local_preference << 8) + (256 - component)


def advertise(answer: str, addresses: tuple[str, ...] | list[str], mode: Literal["add", "replace"] = "add") -> str:
    """The answer with ``addresses`` offered to the peer for the gateway's host candidates.

    A container's host candidates name its private address; packets the peer sends to the
    advertised (public) address reach the same socket through the NAT's port mapping (which
    must keep the port: publish the UDP port range one to one). ``add`` appends a
    server-reflexive candidate per host candidate of the same IP family (lower priority, so
    a peer that can reach the host address directly still does); ``replace`` rewrites the
    host candidates and ``c=`` lines in place. UDP candidates only: aiortc has no others.
    """
    if not addresses:
        return answer
    parsed = [ipaddress.ip_address(a) for a in addresses]
    newline = "\r\n" if "\r\n" in answer else "\n"
    out: list[str] = []
    replaced: dict[str, str] = {}  # host address -> advertised address (replace mode)
    seen: set[tuple[str, int]] = set()
    for line in answer.split(newline):
        if not line.startswith("a=candidate:"):
            out.append(line)
            continue
        fields = line[len("a=candidate:") :].split()
        if len(fields) < 8 or fields[6] != "typ" or fields[7] != "host" or fields[2].lower() != "udp":
            out.append(line)
            continue
        foundation, component, host, port = fields[0], int(fields[1]), fields[4], int(fields[5])
        try:
            family = ipaddress.ip_address(host).version
        except ValueError:
            out.append(line)  # an mDNS name: not ours to rewrite
            continue
        same_family = [str(a) for a in parsed if a.version == family]
        if mode == "replace":
            if same_family:
                replaced[host] = same_family[0]
                fields[4] = same_family[0]
            out.append("a=candidate:" + " ".join(fields))
            continue
        out.append(line)
        for index, public in enumerate(same_family):
            if (public, port) in seen or public == host:
                continue
            seen.add((public, port))
            # srflx: type preference 100 (host is 126); a foundation of its own per base and address
            out.append(
                f"a=candidate:{foundation}{index + 1}0 {component} udp {_priority(100, component)} {public} {port} "
                f"typ srflx raddr {host} rport {port}"
            )
    if replaced:
        out = [_replace_connection(line, replaced) for line in out]
    return newline.join(out)


def _replace_connection(line: str, replaced: dict[str, str]) -> str:
    if line.startswith("c=IN "):
        parts = line.split()
        if len(parts) == 3 and parts[2] in replaced:
            family = "IP6" if ":" in replaced[parts[2]] else "IP4"
            return f"c=IN {family} {replaced[parts[2]]}"
    return line
