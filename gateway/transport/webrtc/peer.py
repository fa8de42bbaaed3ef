"""Peer connections built from :class:`~.config.WebRTCConfig`: the answer to an offer, the
UDP port range, the advertised addresses, and a watchdog that ends calls whose peer never
connects or goes silent.

The UDP port range. aioice (aiortc's ICE agent) has no option for it: it binds every host
candidate with ``loop.create_datagram_endpoint(..., local_addr=(address, 0))`` and lets the
kernel choose (aioice issue 47; PR 112 adds ``port_range`` but is not released). Rather than
patch aioice, :func:`bind_ports_in` sets a context variable around ``setLocalDescription``
(where aiortc gathers) and the running loop's public ``create_datagram_endpoint`` is wrapped
once: a call with port 0 made in that context binds the first free port of the range
instead. Context variables are per task, so nothing else on the loop is affected. Whether it
works is checked at start-up (``PeerFactory.start``: a probe gathers candidates and their
ports are read back); if not, the range is dropped with a warning and calls still work.

Loopback. aioice gathers host candidates on every address of the machine but 127.0.0.1 and
::1, and binds each socket to its address, so an answer whose host candidates are rewritten
to 127.0.0.1 (``advertise_mode`` ``replace``) would name sockets that are not there. With
a loopback address advertised in ``replace`` mode (``WebRTCConfig.gather_addresses``), the
agent gathers on that address alone: :func:`gather_on` sets a context variable around
``setLocalDescription`` and ``aioice.ice.get_host_addresses`` is wrapped once to answer it
in that context (elsewhere it answers as aioice does). A gateway and its peers on one machine
then keep their media on loopback, whatever other addresses the machine has (its tests run so).

The receive jitter buffer. aiortc's audio receiver holds 4 frames (80 ms) before it decodes
the oldest, as a playout buffer would; the gateway plays nothing, so
:func:`tune_receive_buffer` gives each call's receiver a buffer that releases a frame as
soon as the next one is there (``WebRTCConfig.receive_prefetch_frames``). aiortc offers no
option for it: the buffer is the receiver's private ``__jitter_buffer``. ``start`` checks
that it is still there and of the expected type; if not, the default stays, with a warning.

Consent freshness (RFC 7675) is aioice's: after connecting it checks the selected pair
every 4-6 s and gives up after 6 failures in a row (about 30 s), which turns the
connection ``failed``. That is too slow to free a replica's seat, and nothing at all
happens if ICE never completes (a trickle offer with no candidates waits for checks
forever), hence :class:`PeerWatchdog`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import random
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import Any

from aioice import ice as aioice_ice
from aiortc import RTCConfiguration, RTCPeerConnection, RTCRtpReceiver, RTCRtpSender, RTCSessionDescription
from aiortc.jitterbuffer import JitterBuffer
from aiortc.mediastreams import MediaStreamTrack

from .config import WebRTCConfig
from .sdp import INVALID_OFFER, OfferError, advertise

log = logging.getLogger(__name__)

_PORT_RANGE: ContextVar[tuple[int, int] | None] = ContextVar("webrtc_udp_port_range", default=None)
_HOOK_MARK = "_webrtc_port_range_hook"
_GATHER_ON: ContextVar[tuple[str, ...] | None] = ContextVar("webrtc_gather_on", default=None)
_GATHER_MARK = "_webrtc_gather_hook"
_RETRY_BIND = (errno.EADDRINUSE, errno.EACCES)
_CANDIDATE = re.compile(r"^a=candidate:\S+ \d+ udp \d+ (\S+) (\d+) typ host", re.IGNORECASE | re.MULTILINE)


def host_candidate_ports(sdp: str) -> list[int]:
    """The ports of the UDP host candidates in an SDP."""
    return [int(m.group(2)) for m in _CANDIDATE.finditer(sdp)]


_JITTER_BUFFER = "_RTCRtpReceiver__jitter_buffer"  # aiortc's private, name-mangled attribute


def tune_receive_buffer(receiver: RTCRtpReceiver, prefetch: int) -> bool:
    """Give an audio receiver a jitter buffer that holds ``prefetch`` frames. Call it before
    any packet arrives (right after the transceiver is made). False if aiortc's receiver no
    longer looks as expected: then nothing is changed."""
    current = getattr(receiver, _JITTER_BUFFER, None)
    if type(current) is not JitterBuffer or not isinstance(getattr(current, "capacity", None), int):
        return False
    setattr(receiver, _JITTER_BUFFER, JitterBuffer(capacity=current.capacity, prefetch=prefetch))
    return True


def install_port_range_hook(loop: asyncio.AbstractEventLoop | None = None) -> bool:
    """Wrap ``loop.create_datagram_endpoint`` (once) so binds to port 0 made under
    :func:`bind_ports_in` take a port of the range. False if the loop refuses the wrapper."""
    loop = loop or asyncio.get_running_loop()
    original = loop.create_datagram_endpoint
    if getattr(original, _HOOK_MARK, False):
        return True

    async def create_datagram_endpoint(
        protocol_factory: Any, local_addr: Any = None, remote_addr: Any = None, **kw: Any
    ) -> Any:
        ports = _PORT_RANGE.get()
        if ports is None or local_addr is None or remote_addr is not None or local_addr[1] != 0:
            return await original(protocol_factory, local_addr=local_addr, remote_addr=remote_addr, **kw)
        low, high = ports
        count = high - low + 1
        start = random.randrange(count)  # spread calls over the range instead of probing from low
        for step in range(count):
            port = low + (start + step) % count
            try:
                return await original(protocol_factory, local_addr=(local_addr[0], port), **kw)
            except OSError as exc:
                if exc.errno not in _RETRY_BIND:
                    raise
        raise OSError(errno.EADDRINUSE, f"no free UDP port in {low}-{high} on {local_addr[0]}")

    setattr(create_datagram_endpoint, _HOOK_MARK, True)
    try:
        loop.create_datagram_endpoint = create_datagram_endpoint  # type: ignore[method-assign]
    except (AttributeError, TypeError):
        return False
    return True


def _install_gather_hook() -> None:
    """Wrap ``aioice.ice.get_host_addresses`` (once) so that under :func:`gather_on` it
    answers the addresses given there."""
    original = aioice_ice.get_host_addresses
    if getattr(original, _GATHER_MARK, False):
        return

    def get_host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        chosen = _GATHER_ON.get()
        if chosen is None:
            return original(use_ipv4, use_ipv6)
        return [a for a in chosen if (use_ipv6 if ":" in a else use_ipv4)]

    setattr(get_host_addresses, _GATHER_MARK, True)
    aioice_ice.get_host_addresses = get_host_addresses


@contextlib.contextmanager
def gather_on(addresses: tuple[str, ...] | None) -> Iterator[None]:
    """Host candidates gathered in this context (``setLocalDescription``) are on ``addresses``
    alone, loopback included (None: aioice's own choice, every address but loopback)."""
    if addresses is None:
        yield
        return
    _install_gather_hook()
    token = _GATHER_ON.set(addresses)
    try:
        yield
    finally:
        _GATHER_ON.reset(token)


@contextlib.contextmanager
def bind_ports_in(ports: tuple[int, int] | None) -> Iterator[None]:
    token = _PORT_RANGE.set(ports)
    try:
        yield
    finally:
        _PORT_RANGE.reset(token)


class PeerFactory:
    """Builds the gateway's side of calls. ``await start()`` once per event loop (it checks
    the port range), then ``create()`` and ``answer()`` per call."""

    def __init__(self, config: WebRTCConfig) -> None:
        self.config = config
        self.port_range = config.udp_port_range
        self.receive_prefetch = config.receive_prefetch_frames
        self.warnings: list[str] = []

    def _warn(self, message: str) -> None:
        self.warnings.append(message)
        log.warning("webrtc: %s", message)

    async def start(self) -> list[str]:
        """Check what this host can do; returns (and logs) the warnings. Never raises for
        what merely degrades: a range that cannot be honoured is dropped."""
        if self.port_range is not None:
            if not self._hook():
                self._warn("the event loop refuses the UDP port-range hook: media ports are not restricted")
                self.port_range = None
            else:
                ports = await self._probe()
                low, high = self.port_range
                if not ports:
                    self._warn("no host candidates were gathered (no usable non-loopback address?)")
                elif not all(low <= p <= high for p in ports):
                    self._warn(f"host candidates bound outside {low}-{high} ({ports}): media ports are not restricted")
                    self.port_range = None
        else:
            if not await self._probe():
                self._warn("no host candidates were gathered (no usable non-loopback address?)")
        if self.receive_prefetch is not None:
            probe = RTCPeerConnection(RTCConfiguration(iceServers=[]))
            try:
                if not tune_receive_buffer(probe.addTransceiver("audio").receiver, self.receive_prefetch):
                    self._warn("aiortc's audio receiver changed: its jitter buffer keeps aiortc's default (80 ms)")
                    self.receive_prefetch = None
            finally:
                await probe.close()
        return list(self.warnings)

    def _hook(self) -> bool:
        return install_port_range_hook(asyncio.get_running_loop())  # once per loop: it checks its mark

    async def _probe(self) -> list[int]:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # host candidates only: no STUN wait
        try:
            pc.createDataChannel("probe")
            offer = await pc.createOffer()
            with bind_ports_in(self.port_range), gather_on(self.config.gather_addresses):
                await pc.setLocalDescription(offer)
            return host_candidate_ports(pc.localDescription.sdp)
        finally:
            await pc.close()

    def create(self) -> RTCPeerConnection:
        return RTCPeerConnection(self.config.rtc_configuration())

    async def answer(
        self, pc: RTCPeerConnection, offer_sdp: str, *, audio_track: MediaStreamTrack | None = None
    ) -> str:
        """Apply the offer and return the answer SDP (candidates included: aiortc answers only
        once gathering is complete). Check the offer with ``sdp.check_offer`` first; what
        aiortc still refuses becomes an ``invalid_offer`` OfferError, after which ``pc`` is
        spent: close it."""
        # The audio transceiver exists before the offer so that it takes the offered m-line
        # with our track and Opus alone (the first negotiated codec is what aiortc sends).
        transceiver = pc.addTransceiver(audio_track if audio_track is not None else "audio", direction="sendrecv")
        if self.receive_prefetch is not None and not tune_receive_buffer(transceiver.receiver, self.receive_prefetch):
            self._warn("aiortc's audio receiver changed: its jitter buffer keeps aiortc's default (80 ms)")
            self.receive_prefetch = None
        opus = [c for c in RTCRtpSender.getCapabilities("audio").codecs if c.mimeType.lower() == "audio/opus"]
        transceiver.setCodecPreferences(opus)
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        except Exception as exc:  # aiortc's parser raises ValueError, OperationError, IndexError...
            log.debug("webrtc: offer refused by aiortc", exc_info=True)
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise OfferError(INVALID_OFFER, f"Invalid SDP offer: it could not be applied ({detail}).") from None
        for t in pc.getTransceivers():
            if t.kind != "audio":
                t.direction = "inactive"  # no video is sent or decoded
        answer = await pc.createAnswer()
        if self.port_range is not None and not self._hook():
            self._warn("the event loop refuses the UDP port-range hook: media ports are not restricted")
            self.port_range = None
        with bind_ports_in(self.port_range), gather_on(self.config.gather_addresses):
            await pc.setLocalDescription(answer)
        return advertise(pc.localDescription.sdp, self.config.advertised_addresses, self.config.advertise_mode)


class PeerWatchdog:
    """Ends a call whose peer is gone: ICE/DTLS not connected ``connect_timeout_s`` after the
    answer (``ice_timeout``), the connection ``failed`` (``ice_failed``: consent expired or
    DTLS failed) or ``closed``, or no packet at all from the peer for ``peer_timeout_s``
    (``peer_timeout``: read from the transport's ``packetsReceived`` in ``getStats()``,
    which counts RTP, RTCP and SCTP alike). ``on_dead(reason)`` is called once."""

    def __init__(
        self,
        pc: RTCPeerConnection,
        on_dead: Callable[[str], Awaitable[None] | None],
        *,
        connect_timeout_s: float,
        peer_timeout_s: float,
        poll_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pc = pc
        self.on_dead = on_dead
        self.connect_timeout_s = connect_timeout_s
        self.peer_timeout_s = peer_timeout_s
        self.poll_s = poll_s
        self._clock = clock
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.reason: str | None = None
        pc.on("connectionstatechange", self._changed.set)

    @classmethod
    def for_config(
        cls, pc: RTCPeerConnection, on_dead: Callable[[str], Awaitable[None] | None], config: WebRTCConfig
    ) -> PeerWatchdog:
        return cls(pc, on_dead, connect_timeout_s=config.ice_connect_timeout_s, peer_timeout_s=config.peer_timeout_s)

    def start(self) -> asyncio.Task[None]:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="webrtc-watchdog")
        return self._task

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _packets_received(self) -> int:
        report = await self.pc.getStats()
        return sum(
            int(getattr(s, "packetsReceived", 0)) for s in report.values() if getattr(s, "type", "") == "transport"
        )

    async def run(self) -> None:
        deadline = self._clock() + self.connect_timeout_s
        last_count = -1
        last_rx = self._clock()
        reason: str
        while True:
            state = self.pc.connectionState
            now = self._clock()
            if state == "failed":
                reason = "ice_failed"
                break
            if state == "closed":
                reason = "closed"
                break
            if state == "connected":
                count = await self._packets_received()
                now = self._clock()
                if count != last_count:
                    last_count, last_rx = count, now
                elif now - last_rx >= self.peer_timeout_s:
                    reason = "peer_timeout"
                    break
                wake = min(self.poll_s, max(0.0, last_rx + self.peer_timeout_s - now))
            elif now >= deadline:
                reason = "ice_timeout"
                break
            else:
                wake = min(self.poll_s, deadline - now)
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=max(wake, 0.01))
        self.reason = reason
        result = self.on_dead(reason)
        if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
            await result
