"""An offer's ICE candidates cannot make the gateway probe the network (issue 33, finding 8).

Against the gateway on this machine, with ``webrtc_peer_networks`` naming only 127.0.0.1
(loopback is what tests may use): a candidate outside it gets no packet, even one the ICE
agent would check first, while one inside it is checked; an offer with more candidates or
media sections than the caps is refused before any media, credentials first. Two UDP
sockets on 127.0.0.0/8 stand for the probed hosts: nothing leaves loopback.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from rtc_support import make_browser, wait_for
from support.gateway import RunningGateway, run_gateway

from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(120)

KEY = "sk-ice-candidates"
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/sdp"}
STUN_COOKIE = bytes.fromhex("2112a442")


class Listener(asyncio.DatagramProtocol):
    """A UDP socket that counts the STUN requests it receives."""

    def __init__(self) -> None:
        self.stun = 0

    def datagram_received(self, data: bytes, addr: Any) -> None:
        if len(data) >= 20 and data[4:8] == STUN_COOKIE:
            self.stun += 1


async def listen(host: str) -> tuple[asyncio.DatagramTransport, Listener, int]:
    transport, listener = await asyncio.get_running_loop().create_datagram_endpoint(Listener, local_addr=(host, 0))
    return transport, listener, transport.get_extra_info("sockname")[1]


@pytest.fixture
async def gw() -> AsyncIterator[RunningGateway]:
    settings = Settings(engine="passthrough", video_engine="none", api_keys=(KEY,),
                        webrtc_peer_networks=("127.0.0.1/32",))  # fmt: skip
    async with run_gateway(settings, engine=PassthroughEngine(paced=False), vad_factory=False) as gw:
        yield gw


def with_candidates(offer: str, lines: list[str]) -> str:
    head, sep, rest = offer.partition("a=mid:")
    mid_line, _, tail = rest.partition("\n")
    return head + sep + mid_line + "\n" + "".join(line + "\r\n" for line in lines) + tail


async def test_a_candidate_outside_the_allowed_networks_is_never_sent_a_packet(gw: RunningGateway) -> None:
    allowed_t, allowed, allowed_port = await listen("127.0.0.1")
    refused_t, refused, refused_port = await listen("127.0.0.3")
    browser, offer = await make_browser()
    try:
        # The refused one has the higher priority: the ICE agent would check it first.
        offer = with_candidates(offer, [
            f"a=candidate:7 1 udp 2130706431 127.0.0.3 {refused_port} typ host",
            f"a=candidate:8 1 udp 2113937151 127.0.0.1 {allowed_port} typ host",
        ])  # fmt: skip
        async with httpx.AsyncClient(timeout=30) as http:
            r = await http.post(f"{gw.http}/v1/realtime/calls", content=offer, headers=AUTH)
        assert r.status_code == 201, r.text
        await wait_for(lambda: allowed.stun > 0, "a STUN check of the allowed candidate")
        assert refused.stun == 0
    finally:
        await browser.close()
        allowed_t.close()
        refused_t.close()


@pytest.mark.parametrize("what", ["candidates", "sections"])
async def test_an_offer_past_the_caps_is_refused_before_any_media(gw: RunningGateway, what: str) -> None:
    _, offer = await make_browser()
    if what == "candidates":
        offer = with_candidates(offer, [f"a=candidate:9 1 udp 1 127.0.0.1 {20000 + i} typ host" for i in range(600)])
    else:
        offer = offer.rstrip("\r\n") + "\r\n" + "m=video 9 UDP/TLS/RTP/SAVPF 96\r\na=rtpmap:96 VP8/90000\r\n" * 190
    async with httpx.AsyncClient(timeout=30) as http:
        refused = await http.post(f"{gw.http}/v1/realtime/calls", content=offer, headers=AUTH)
        anonymous = await http.post(f"{gw.http}/v1/realtime/calls", content=offer,
                                    headers={"Content-Type": "application/sdp"})  # fmt: skip
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == f"offer_too_many_{what}"
    assert anonymous.status_code == 401  # the credential first: nothing of it is parsed for a stranger
    assert not gw.runtime.calls or not gw.runtime.calls.calls
