"""A SIP call's RTP: one UDP socket on the configured port range, G.711 both ways.

In: each packet from the caller's address (the offer's IP; the port is latched from the first
packet, as symmetric RTP behind NAT needs) is decoded to PCM16 at 8 kHz and handed on
(``on_audio``), in order on the caller's clock (``rtp.Timeline``: late or repeated packets
dropped, gaps filled with silence up to 1 s; no jitter buffer: a packet that comes after
the next one is dropped); telephone-events become key presses (``on_dtmf``). Packets from
any other address are dropped.

Out: the answer's audio (PCM16 at 8 kHz) goes through the same paced track as a WebRTC call's
(``webrtc/audio_out.py``: 20 ms a frame on the wall clock, the ledger of what was sent, a
cut within a frame), each frame G.711-encoded into one RTP packet. Silence is sent between
answers, so the trunk's jitter buffer and any NAT on the path stay open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
from collections.abc import Callable

from gateway.audio.codecs import AudioFormat, decode_to_pcm16, encode_from_pcm16
from gateway.transport.sip.rtp import DtmfReceiver, Timeline, build_rtp, parse_rtp
from gateway.transport.sip.sdp import Offer
from gateway.transport.webrtc.audio_out import AudioOutTrack

log = logging.getLogger("omni.sip")

RATE = 8000
_FORMATS = {0: AudioFormat("pcmu", RATE), 8: AudioFormat("pcma", RATE)}


class PortsExhausted(RuntimeError):
    """No free UDP port in ``sip_rtp_ports``."""


def bind_rtp(host: str, ports: tuple[int, int] | None) -> socket.socket:
    """A UDP socket on ``host``, on an even port of ``ports`` (inclusive; None: any port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if ports is None:
        sock = socket.socket(family, socket.SOCK_DGRAM)
        sock.bind((host, 0))
        sock.setblocking(False)
        return sock
    low, high = ports
    candidates = list(range(low + (low % 2), high + 1, 2))
    start = random.randrange(len(candidates)) if candidates else 0
    for port in candidates[start:] + candidates[:start]:
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.bind((host, port))
        except OSError:
            sock.close()
            continue
        sock.setblocking(False)
        return sock
    raise PortsExhausted(f"no free UDP port in sip_rtp_ports {low}-{high}")


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, media: RtpMedia) -> None:
        self.media = media

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.media.received(data, addr)


class RtpMedia:
    def __init__(
        self,
        sock: socket.socket,
        offer: Offer,
        *,
        on_audio: Callable[[bytes], None],
        on_dtmf: Callable[[str], None],
        on_started: Callable[[str], None] | None = None,
        on_stopped: Callable[[str], None] | None = None,
    ) -> None:
        self.sock = sock
        self.port = int(sock.getsockname()[1])
        self.offer = offer
        self.remote = (offer.address, offer.port)
        self.on_audio = on_audio
        self.on_dtmf = on_dtmf
        self.track = AudioOutTrack(RATE, on_started=on_started, on_stopped=on_stopped)
        self.format = _FORMATS[offer.payload_type]
        self.dtmf = DtmfReceiver()
        self.timeline = Timeline()
        self.ssrc = random.getrandbits(32)
        self._seq = random.getrandbits(16)
        self._latched = False
        self._transport: asyncio.DatagramTransport | None = None
        self._sender: asyncio.Task[None] | None = None
        # counters
        self.packets_in = 0
        self.packets_out = 0
        self.dropped_in = 0  # from another address, not RTP, or another payload type

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: _Protocol(self), sock=self.sock)
        self._transport = transport
        self._sender = loop.create_task(self._send_loop(), name=f"sip-rtp-out {self.port}")

    def received(self, data: bytes, addr: tuple[str, int]) -> None:
        if addr[0] != self.offer.address:
            self.dropped_in += 1
            return
        packet = parse_rtp(data)
        if packet is None:
            self.dropped_in += 1
            return
        if not self._latched:
            self.remote = (addr[0], addr[1])  # symmetric RTP: answer where the caller sends from
            self._latched = True
        self.packets_in += 1
        if packet.payload_type == self.offer.payload_type:
            gap = self.timeline.push(packet, len(packet.payload))  # (G.711: a byte a sample)
            if gap is None:
                return  # late, reordered or repeated: already past
            if gap:
                self.on_audio(bytes(2 * gap))  # lost packets or silence suppression: silence, in time
            self.on_audio(decode_to_pcm16(self.format, packet.payload))
        elif self.offer.dtmf_type is not None and packet.payload_type == self.offer.dtmf_type:
            key = self.dtmf.push(packet)
            if key is not None:
                self.on_dtmf(key)
        else:
            self.dropped_in += 1

    async def _send_loop(self) -> None:
        first = True
        while True:
            frame = await self.track.recv()  # paced: one 20 ms frame per 20 ms of wall clock
            pcm = frame.to_ndarray().tobytes()
            payload = encode_from_pcm16(self.format, pcm)
            self._seq = (self._seq + 1) & 0xFFFF
            packet = build_rtp(self.offer.payload_type, self._seq, int(frame.pts or 0), self.ssrc, payload,
                               marker=first)  # fmt: skip
            first = False
            if self._transport is not None and not self._transport.is_closing():
                self._transport.sendto(packet, self.remote)
                self.packets_out += 1

    async def stop(self) -> None:
        self.track.stop()
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._sender
        if self._transport is not None:
            self._transport.close()
        else:
            self.sock.close()
