"""A SIP call's RTP: one UDP socket on the configured port range, G.711 or Opus both ways,
SRTP-protected where the SDP said so (``srtp.py``).

In: each packet from the caller's address (the offer's IP; the port is latched from the first
packet that passes, as symmetric RTP behind NAT needs) is unprotected (SRTP: a packet whose
authentication tag fails, or a replay, is dropped and counted on ``srtp``), decoded to PCM16
at the codec's rate (8 kHz for G.711, 48 kHz for Opus: ``codec.py``) and handed on
(``on_audio``), in order on the caller's clock (``rtp.Timeline``: late or repeated packets
dropped, gaps filled with silence up to 1 s; no jitter buffer: a packet that comes after
the next one is dropped); telephone-events become key presses (``on_dtmf``). Packets from
any other address are dropped.

Out: a key the session sends (GPT-Live's ``transport.dtmf.send``) goes as RFC 4733
telephone-events on the payload type the SDP negotiated, beside the audio (same SSRC and
sequence, protected as it is): ``DTMF_PACKETS`` packets 20 ms apart, then its end three
times; keys wait their turn, at most ``MAX_KEYS_QUEUED``. The answer's audio (PCM16 at the
codec's rate) goes through the same paced track as a
WebRTC call's (``webrtc/audio_out.py``: 20 ms a frame on the wall clock, the ledger of what
was sent, a cut within a frame), each frame encoded into one RTP packet (then protected).
Silence is sent between answers, so the trunk's jitter buffer and any NAT on the path stay
open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
from collections import deque
from collections.abc import Callable

from gateway.transport.sip.codec import codec_for
from gateway.transport.sip.rtp import DtmfReceiver, Timeline, build_dtmf, build_rtp, parse_rtp
from gateway.transport.sip.sdp import Offer
from gateway.transport.sip.srtp import Crypto, SrtpContext, answer_key
from gateway.transport.webrtc.audio_out import AudioOutTrack

log = logging.getLogger("omni.sip")

DTMF_PACKETS = 5  # a key sent lasts 5 packets of 20 ms (100 ms), then its end is sent 3 times
DTMF_GAP_S = 0.05  # between two keys sent
MAX_KEYS_QUEUED = 32  # keys waiting to be sent; more: refused


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


def parse_port_range(raw: str | None) -> tuple[int, int] | None:
    """``"20000-20199"`` -> (20000, 20199); None/empty: any port. Raises ValueError."""
    if not raw:
        return None
    low, sep, high = raw.partition("-")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit():
        raise ValueError(f"sip_rtp_ports {raw!r}: give a range, as 20000-20199")
    a, b = int(low), int(high)
    if not 1024 <= a < b <= 65535:
        raise ValueError(f"sip_rtp_ports {raw!r}: two ports from 1024 to 65535, the first below the second")
    return a, b


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
        local_crypto: Crypto | None = None,
    ) -> None:
        """``offer.crypto`` (the caller's SRTP key) set: SRTP, with ``local_crypto`` as ours (an
        outbound call's offered key) or a fresh key for the answer."""
        self.sock = sock
        self.port = int(sock.getsockname()[1])
        self.offer = offer
        self.remote = (offer.address, offer.port)
        self.on_audio = on_audio
        self.on_dtmf = on_dtmf
        self.codec = codec_for(offer.codec)
        self.rate = self.codec.rate
        self.track = AudioOutTrack(self.rate, on_started=on_started, on_stopped=on_stopped)
        self.srtp: SrtpContext | None = None
        if offer.crypto is not None:
            self.srtp = SrtpContext(local_crypto or answer_key(offer.crypto), offer.crypto)
        self.dtmf = DtmfReceiver()
        self.timeline = Timeline(max_gap=self.rate)  # 1 s
        self.ssrc = random.getrandbits(32)
        self._seq = random.getrandbits(16)
        self._latched = False
        self._transport: asyncio.DatagramTransport | None = None
        self._sender: asyncio.Task[None] | None = None
        self._ts = random.getrandbits(32)  # the last audio timestamp sent (a key's events carry it)
        self._keys: deque[tuple[str, Callable[[], None] | None]] = deque()
        self._key_sender: asyncio.Task[None] | None = None
        # counters
        self.packets_in = 0
        self.packets_out = 0
        self.dropped_in = 0  # from another address, not RTP, or another payload type

    @property
    def local_crypto(self) -> Crypto | None:
        """Our SRTP key (for the SDP answer), or None: plain RTP."""
        return self.srtp.local if self.srtp is not None else None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: _Protocol(self), sock=self.sock)
        self._transport = transport
        self._sender = loop.create_task(self._send_loop(), name=f"sip-rtp-out {self.port}")

    def received(self, data: bytes, addr: tuple[str, int]) -> None:
        if addr[0] != self.offer.address:
            self.dropped_in += 1
            return
        if self.srtp is not None:
            clear = self.srtp.unprotect(data)
            if clear is None:
                return  # (counted there)
            data = clear
        packet = parse_rtp(data)
        if packet is None:
            self.dropped_in += 1
            return
        if not self._latched:
            self.remote = (addr[0], addr[1])  # symmetric RTP: answer where the caller sends from
            self._latched = True
        self.packets_in += 1
        if packet.payload_type == self.offer.payload_type:
            gap = self.timeline.push(packet, self.codec.samples(packet.payload))
            if gap is None:
                return  # late, reordered or repeated: already past
            if gap:
                self.on_audio(bytes(2 * gap))  # lost packets or silence suppression: silence, in time
            self.on_audio(self.codec.decode(packet.payload))
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
            payload = self.codec.encode(pcm)
            if not payload:
                continue
            self._seq = (self._seq + 1) & 0xFFFF
            self._ts = int(frame.pts or 0)
            packet = build_rtp(self.offer.payload_type, self._seq, self._ts, self.ssrc, payload,
                               marker=first)  # fmt: skip
            first = False
            if self.srtp is not None:
                packet = self.srtp.protect(packet)
            if self._transport is not None and not self._transport.is_closing():
                self._transport.sendto(packet, self.remote)
                self.packets_out += 1

    def send_dtmf(self, key: str, on_sent: Callable[[], None] | None = None) -> str | None:
        """Send ``key`` (one of ``0-9A-D*#``) to the far end as telephone-events (``on_sent``:
        called once its end is sent); None, or why not."""
        if self.offer.dtmf_type is None:
            return "The call's SDP negotiated no telephone-event (RFC 4733): its far end takes no keys."
        if self._transport is None or self._transport.is_closing():
            return "The call's media is not running."
        if len(self._keys) >= MAX_KEYS_QUEUED:
            return f"{MAX_KEYS_QUEUED} keys are waiting to be sent already; send the next once they are sent."
        self._keys.append((key, on_sent))
        if self._key_sender is None or self._key_sender.done():
            self._key_sender = asyncio.get_running_loop().create_task(self._send_keys(), name=f"sip-dtmf {self.port}")
        return None

    async def _send_keys(self) -> None:
        pt = self.offer.dtmf_type
        assert pt is not None
        step = self.offer.dtmf_rate * 20 // 1000  # (the telephone-event's clock: the SDP's, 8 or 48 kHz)
        while self._keys:
            key, on_sent = self._keys.popleft()
            ts = self._ts  # (the audio's timestamp now: same SSRC, same timeline)
            for i in range(1, DTMF_PACKETS + 1):
                self._send_event(pt, ts, build_dtmf(key, end=False, duration=step * i), marker=i == 1)
                await asyncio.sleep(0.02)
            for _ in range(3):  # the end, three times (RFC 4733 2.5.1.4)
                self._send_event(pt, ts, build_dtmf(key, end=True, duration=step * DTMF_PACKETS))
            if on_sent is not None:
                on_sent()
            await asyncio.sleep(DTMF_GAP_S)

    def _send_event(self, pt: int, ts: int, payload: bytes, *, marker: bool = False) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._seq = (self._seq + 1) & 0xFFFF
            packet = build_rtp(pt, self._seq, ts, self.ssrc, payload, marker=marker)
            if self.srtp is not None:
                packet = self.srtp.protect(packet)
            self._transport.sendto(packet, self.remote)
            self.packets_out += 1

    async def stop(self) -> None:
        self.track.stop()
        if self._key_sender is not None:
            self._key_sender.cancel()
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._sender
        if self._transport is not None:
            self._transport.close()
        else:
            self.sock.close()
