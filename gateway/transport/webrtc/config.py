"""WebRTC deployment settings: ICE servers (STUN/TURN), the UDP port range media may bind,
the addresses advertised to peers, and the timeouts that end calls whose peer is gone.

Pure: aiortc is imported only by :meth:`WebRTCConfig.rtc_configuration`. The string forms
(``parse_ice_servers``, ``parse_port_range``) are what environment variables carry, so the
gateway's flat settings can hold them as plain strings.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import unquote

import orjson

from gateway.transport.webrtc.sdp import MAX_OFFER_CANDIDATES, MAX_OFFER_SECTIONS, PeerNetworks

if TYPE_CHECKING:
    from aiortc import RTCConfiguration

# scheme:[user:credential@]host[:port][?transport=udp|tcp]; IPv6 hosts in brackets.
_URI = re.compile(
    r"^(?P<scheme>stuns?|turns?):(?:(?P<user>[^:@/]*):(?P<cred>[^@/]*)@)?"
    r"(?P<host>\[[0-9A-Fa-f:.]+\]|[^:?\[\]/@]+)(?::(?P<port>\d{1,5}))?(?:\?transport=(?P<transport>udp|tcp))?$"
)


@dataclass(frozen=True, slots=True)
class IceServer:
    """One STUN or TURN server, as the browser's ``RTCIceServer`` has it."""

    urls: tuple[str, ...]
    username: str | None = None
    credential: str | None = None

    def __post_init__(self) -> None:
        if not self.urls:
            raise ValueError("an ICE server needs at least one URL")
        for url in self.urls:
            scheme = _scheme(url)
            if scheme in ("turn", "turns") and (self.username is None or self.credential is None):
                raise ValueError(f"TURN server {url!r} needs a username and a credential")

    def to_client(self) -> dict[str, Any]:
        """The ``RTCIceServer`` dictionary a browser's ``RTCPeerConnection`` takes."""
        out: dict[str, Any] = {"urls": list(self.urls)}
        if self.username is not None:
            out["username"] = self.username
        if self.credential is not None:
            out["credential"] = self.credential
        return out


def _scheme(url: str) -> str:
    m = _URI.match(url)
    if m is None:
        raise ValueError(f"not a STUN/TURN URL: {url!r} (stun:host[:port], turn:host[:port][?transport=udp|tcp])")
    scheme = m.group("scheme")
    if scheme.startswith("stun") and m.group("transport"):
        raise ValueError(f"a STUN URL takes no transport: {url!r}")
    return scheme


def parse_ice_servers(raw: str | Sequence[str] | None) -> tuple[IceServer, ...]:
    """ICE servers from a setting: a JSON array of ``RTCIceServer`` objects
    (``[{"urls": "turn:t.example.com:3478", "username": "u", "credential": "p"}]``), or
    comma-separated URLs where a TURN URL carries its credentials as
    ``turn:user:credential@host:port`` (both percent-decoded, so ``%3A`` is a colon).
    """
    if raw is None:
        return ()
    if isinstance(raw, str):
        text = raw.strip()
        if not text:
            return ()
        if text.startswith("["):
            return _from_json(text)
        items: Sequence[str] = [part.strip() for part in text.split(",") if part.strip()]
    else:
        items = [part.strip() for part in raw if part.strip()]
    servers = []
    for item in items:
        m = _URI.match(item)
        if m is None:
            raise ValueError(f"not a STUN/TURN URL: {item!r}")
        user, cred = m.group("user"), m.group("cred")
        # The browser's form keeps the credentials apart from the URL.
        url = item if user is None else item.replace(f"{user}:{cred}@", "", 1)
        _scheme(url)
        servers.append(
            IceServer(
                urls=(url,),
                username=None if user is None else unquote(user),
                credential=None if cred is None else unquote(cred),
            )
        )
    return tuple(servers)


def _from_json(text: str) -> tuple[IceServer, ...]:
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"ICE servers: not JSON ({exc})") from None
    if not isinstance(data, list):
        raise ValueError("ICE servers: a JSON array of {urls, username, credential} objects")
    out = []
    for entry in data:
        if not isinstance(entry, dict) or "urls" not in entry:
            raise ValueError("ICE servers: every entry needs urls")
        urls = entry["urls"]
        urls = (urls,) if isinstance(urls, str) else tuple(urls)
        if not all(isinstance(u, str) for u in urls):
            raise ValueError("ICE servers: urls must be strings")
        username, credential = entry.get("username"), entry.get("credential")
        for value in (username, credential):
            if value is not None and not isinstance(value, str):
                raise ValueError("ICE servers: username and credential must be strings")
        for url in urls:
            _scheme(url)
        out.append(IceServer(urls=urls, username=username, credential=credential))
    return tuple(out)


def parse_port_range(raw: str | None) -> tuple[int, int] | None:
    """``"40000-40199"`` (inclusive) -> ``(40000, 40199)``; empty or None: any port."""
    if raw is None or not raw.strip():
        return None
    m = re.fullmatch(r"\s*(\d{1,5})\s*[-:]\s*(\d{1,5})\s*", raw)
    if m is None:
        raise ValueError(f"UDP port range {raw!r}: expected LOW-HIGH, e.g. 40000-40199")
    return _check_range((int(m.group(1)), int(m.group(2))))


def _check_range(ports: tuple[int, int]) -> tuple[int, int]:
    low, high = ports
    if not 1 <= low <= high <= 65535:
        raise ValueError(f"UDP port range {low}-{high}: need 1 <= low <= high <= 65535")
    return ports


@dataclass(frozen=True, slots=True)
class WebRTCConfig:
    ice_servers: tuple[IceServer, ...] = ()  # given to clients; the gateway uses one STUN and one TURN
    #   of them (aioice takes no more: see gateway_ice_servers)
    udp_port_range: tuple[int, int] | None = None  # host candidates bind here (inclusive); None: any
    advertised_addresses: tuple[str, ...] = ()  # public IPs peers should reach us at (NAT, containers)
    # "add": the advertised addresses join the host candidates (as server-reflexive ones, so a peer
    # on the same network still prefers the direct path); "replace": they stand in for them (the
    # host addresses are private and only leak). A loopback address in "replace" mode is gathered
    # on directly (gather_addresses): media stays on loopback, whatever else the machine has.
    advertise_mode: Literal["add", "replace"] = "add"
    ice_connect_timeout_s: float = 15.0  # answer sent -> connected within this, else the call ends
    peer_timeout_s: float = 10.0  # no packet at all from the peer this long -> the call ends
    #   (a browser sends audio every 20 ms and RTCP every few seconds, even when muted)
    # Frames aiortc's audio receiver holds before releasing the oldest: aiortc holds 4 (80 ms),
    # a playout buffer's worth; the gateway plays nothing, its VAD and STT take audio as it
    # comes, so 1 (release a frame once the next one arrived: reordering is still put right)
    # saves 60 ms of every turn. None: aiortc's own. See peer.tune_receive_buffer.
    receive_prefetch_frames: int | None = 1
    # Where the gateway's ICE agent may send checks: the offer's candidates elsewhere are left
    # out ("public": any globally routable address; CIDR ranges; see sdp.screen_candidates).
    peer_networks: tuple[str, ...] = ("public",)
    max_offer_sections: int = MAX_OFFER_SECTIONS  # m-lines in an offer; more: 400 offer_too_many_sections
    max_offer_candidates: int = MAX_OFFER_CANDIDATES  # candidates; more: 400 offer_too_many_candidates

    def __post_init__(self) -> None:
        PeerNetworks.parse(self.peer_networks)  # (raises ValueError naming a bad entry)
        if self.udp_port_range is not None:
            _check_range(self.udp_port_range)
        for address in self.advertised_addresses:
            try:
                ipaddress.ip_address(address)
            except ValueError:
                raise ValueError(f"advertised address {address!r} is not an IP address") from None
        if self.advertise_mode not in ("add", "replace"):
            raise ValueError("advertise_mode: 'add' or 'replace'")
        if self.ice_connect_timeout_s <= 0 or self.peer_timeout_s <= 0:
            raise ValueError("WebRTC timeouts must be positive")
        if self.receive_prefetch_frames is not None and not 0 <= self.receive_prefetch_frames <= 8:
            raise ValueError("receive_prefetch_frames: 0 to 8 (None: aiortc's default)")

    @property
    def gather_addresses(self) -> tuple[str, ...] | None:
        """Where the gateway's ICE agent gathers its host candidates: the loopback addresses
        advertised in ``replace`` mode (aioice gathers none on loopback by itself, and a
        candidate rewritten to 127.0.0.1 must have its socket there); None: every address of
        the machine but loopback (aioice's choice)."""
        if self.advertise_mode != "replace":
            return None
        loopback = tuple(a for a in self.advertised_addresses if ipaddress.ip_address(a).is_loopback)
        return loopback or None

    @classmethod
    def from_strings(
        cls,
        *,
        ice_servers: str | Sequence[str] | None = None,
        udp_ports: str | None = None,
        advertised_addresses: str | Sequence[str] | None = None,
        advertise_mode: Literal["add", "replace"] = "add",
        ice_connect_timeout_s: float = 15.0,
        peer_timeout_s: float = 10.0,
        peer_networks: Sequence[str] = ("public",),
        max_offer_sections: int = MAX_OFFER_SECTIONS,
        max_offer_candidates: int = MAX_OFFER_CANDIDATES,
    ) -> WebRTCConfig:
        """From setting strings (what ``OMNI_GATEWAY_*`` variables hold); raises ValueError."""
        if isinstance(advertised_addresses, str):
            advertised_addresses = [a for a in advertised_addresses.split(",")]
        return cls(
            ice_servers=parse_ice_servers(ice_servers),
            udp_port_range=parse_port_range(udp_ports),
            advertised_addresses=tuple(a.strip() for a in advertised_addresses or () if a.strip()),
            advertise_mode=advertise_mode,
            ice_connect_timeout_s=ice_connect_timeout_s,
            peer_timeout_s=peer_timeout_s,
            peer_networks=tuple(peer_networks),
            max_offer_sections=max_offer_sections,
            max_offer_candidates=max_offer_candidates,
        )

    @property
    def peers(self) -> PeerNetworks:
        return PeerNetworks.parse(self.peer_networks)

    def client_ice_servers(self) -> list[dict[str, Any]]:
        """What a client's ``RTCPeerConnection({iceServers})`` should get: all of them."""
        return [server.to_client() for server in self.ice_servers]

    def gateway_ice_servers(self) -> tuple[IceServer, ...]:
        """The servers the gateway's own ICE agent uses: the first ``stun:`` URL and the first
        TURN URL. aioice takes one of each; aiortc skips the others without a word (and
        ``stuns:`` always), so the choice is made here, visibly; the rest still go to clients."""
        stun: IceServer | None = None
        turn: IceServer | None = None
        for server in self.ice_servers:
            for url in server.urls:
                scheme = _scheme(url)
                if scheme == "stun" and stun is None:
                    stun = IceServer(urls=(url,))
                elif scheme in ("turn", "turns") and turn is None:
                    turn = IceServer(urls=(url,), username=server.username, credential=server.credential)
        return tuple(s for s in (stun, turn) if s is not None)

    def rtc_configuration(self) -> RTCConfiguration:
        """aiortc's configuration. An empty server list is passed explicitly: with None, aiortc
        falls back to Google's public STUN server (a DNS lookup and up to 5 s of gathering per
        call on a host that cannot reach it)."""
        from aiortc import RTCConfiguration, RTCIceServer

        servers = [
            RTCIceServer(urls=list(s.urls), username=s.username, credential=s.credential)
            for s in self.gateway_ice_servers()
        ]
        # No bundlePolicy (aiortc >= 1.12 only): answering, aiortc bundles as the offer's
        # BUNDLE group says, so audio and data share one ICE transport either way.
        return RTCConfiguration(iceServers=servers)


__all__ = ["IceServer", "WebRTCConfig", "parse_ice_servers", "parse_port_range"]
