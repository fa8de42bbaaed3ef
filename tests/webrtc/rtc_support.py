"""Helpers for the WebRTC tests: a "browser" made of aiortc (its own RTCPeerConnection, a WAV
played as its microphone by aiortc's MediaPlayer, the answer's audio decoded and recorded),
waits for states, and audio measurements."""

from __future__ import annotations

import asyncio
import time
import wave
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from aiortc import RTCConfiguration, RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.contrib.media import MediaPlayer
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from gateway.transport.webrtc.config import WebRTCConfig
from gateway.transport.webrtc.peer import PeerFactory, gather_on

TIMEOUT = 30.0  # generous: the tests must pass on a busy 2-core machine
# Every test's media stays on loopback, whatever other addresses the machine has: the gateway
# advertises 127.0.0.1 in replace mode (it then gathers there: WebRTCConfig.gather_addresses) and
# the test's callers gather there too (``gather_on``).
LOOPBACK = ("127.0.0.1",)


def loopback_config(**options: Any) -> WebRTCConfig:
    """A gateway's WebRTC settings with 127.0.0.1 advertised in replace mode."""
    return WebRTCConfig(advertised_addresses=LOOPBACK, advertise_mode="replace", **options)


async def wait_for(predicate: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)


def write_wav(path: Path, pcm: bytes, rate: int) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)
    return path


def tone(hz: float, ms: int, rate: int, amp: float = 8000.0) -> bytes:
    n = rate * ms // 1000
    return (amp * np.sin(2 * np.pi * hz * np.arange(n) / rate)).astype("<i2").tobytes()


def silence(ms: int, rate: int) -> bytes:
    return bytes(2 * (rate * ms // 1000))


def rms(pcm: bytes | np.ndarray) -> float:
    x = np.frombuffer(pcm, dtype="<i2") if isinstance(pcm, bytes) else pcm
    return float(np.sqrt(np.mean(x.astype(float) ** 2))) if len(x) else 0.0


def dominant_hz(pcm: bytes | np.ndarray, rate: int) -> float:
    x = (np.frombuffer(pcm, dtype="<i2") if isinstance(pcm, bytes) else pcm).astype(float)
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1 / rate)[int(np.argmax(spectrum))])


def envelope(pcm: bytes, rate: int, ms: int = 20) -> np.ndarray:
    x = np.frombuffer(pcm, dtype="<i2").astype(float)
    step = rate * ms // 1000
    n = len(x) // step
    return np.sqrt(np.mean(x[: n * step].reshape(n, step) ** 2, axis=1))


def aligned_correlation(ref: np.ndarray, got: np.ndarray, min_overlap: float = 0.75) -> float:
    """The best Pearson correlation of two loudness envelopes over every alignment that
    overlaps at least ``min_overlap`` of ``ref`` (``got`` may start late or early)."""
    need = max(2, int(len(ref) * min_overlap))
    best = -1.0
    for lag in range(-(len(ref) - need), len(got) - need + 1):
        r0, g0 = max(0, -lag), max(0, lag)
        n = min(len(ref) - r0, len(got) - g0)
        if n < need:
            continue
        a, b = ref[r0 : r0 + n], got[g0 : g0 + n]
        if a.std() > 0 and b.std() > 0:
            best = max(best, float(np.corrcoef(a, b)[0, 1]))
    return best


@dataclass
class Received:
    """What the "browser" heard: every decoded frame, mono, with its arrival time."""

    frames: list[tuple[float, int, np.ndarray]] = field(default_factory=list)  # (monotonic, pts, mono int16)
    ended: bool = False

    def loud(self, threshold: float = 200.0) -> list[int]:
        return [i for i, (_, _, x) in enumerate(self.frames) if rms(x) > threshold]


async def record(track: MediaStreamTrack, into: Received) -> None:
    try:
        while True:
            frame = await track.recv()
            arr = frame.to_ndarray().reshape(-1, len(frame.layout.channels))  # type: ignore[union-attr]
            into.frames.append((time.monotonic(), int(frame.pts or 0), arr[:, 0].astype(np.int16)))
    except MediaStreamError:
        into.ended = True


@dataclass
class Browser:
    """The caller's side, as aiortc."""

    pc: RTCPeerConnection
    channel: RTCDataChannel | None
    received: Received
    player: MediaPlayer | None
    tasks: list[asyncio.Task[Any]]

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        if self.player is not None and self.player.audio is not None:
            self.player.audio.stop()
        await self.pc.close()


async def make_browser(
    *, wav: Path | None = None, data_channel: bool = True, audio: bool = True
) -> tuple[Browser, str]:
    """A caller with an offer ready (gathered: aiortc sends its candidates in the offer)."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    channel = pc.createDataChannel("oai-events") if data_channel else None
    player = None
    if wav is not None:
        player = MediaPlayer(str(wav))
        assert player.audio is not None
        pc.addTrack(player.audio)
    elif audio:
        pc.addTransceiver("audio", direction="sendrecv")
    received = Received()
    browser = Browser(pc, channel, received, player, [])

    @pc.on("track")
    def _track(track: MediaStreamTrack) -> None:
        browser.tasks.append(asyncio.ensure_future(record(track, received)))

    with gather_on(LOOPBACK):
        await pc.setLocalDescription(await pc.createOffer())
    return browser, pc.localDescription.sdp


async def connect(browser: Browser, answer_sdp: str, gateway: RTCPeerConnection) -> None:
    await browser.pc.setRemoteDescription(RTCSessionDescription(sdp=answer_sdp, type="answer"))
    await wait_for(lambda: gateway.connectionState == "connected", "the gateway's side to connect")
    await wait_for(lambda: browser.pc.connectionState == "connected", "the browser's side to connect")


def nominated(pc: RTCPeerConnection) -> list[tuple[tuple[str, int], tuple[str, int]]]:
    """The ICE pairs a connection uses: (local address, remote address), from aioice's agent
    (aiortc exposes none: its transports' private agent)."""
    pairs = []
    for transceiver in pc.getTransceivers():
        ice = transceiver.receiver.transport.transport
        pairs += [(p.local_addr, p.remote_addr) for p in ice._connection._nominated.values()]
    return pairs


async def started_factory(factory: PeerFactory) -> PeerFactory:
    """``factory`` started; on loopback (``loopback_config``) it always has a host candidate."""
    warnings = await factory.start()
    assert not any("no host candidates" in w for w in warnings), warnings
    return factory
