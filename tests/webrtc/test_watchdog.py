"""Calls whose peer is gone end within the configured timeouts: a peer that vanishes (its
process killed), one that never completes ICE, one that hangs up."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest
from rtc_support import connect, loopback_config, make_browser, started_factory, wait_for

from gateway.transport.webrtc.audio_in import AudioIn
from gateway.transport.webrtc.audio_out import AudioOutTrack
from gateway.transport.webrtc.peer import PeerFactory, PeerWatchdog
from gateway.transport.webrtc.sdp import check_offer

HERE = Path(__file__).parent
PEER = HERE / "rtc_peer_process.py"
SDK_OFFER = (HERE / "data" / "chromium_sdk_offer.sdp").read_text()


@pytest.fixture
async def factory() -> PeerFactory:
    return await started_factory(PeerFactory(loopback_config()))


def watch(
    pc: object, dead: list[str], *, connect_timeout_s: float = 15.0, peer_timeout_s: float = 10.0
) -> PeerWatchdog:
    dog = PeerWatchdog(
        pc,  # type: ignore[arg-type]
        dead.append,
        connect_timeout_s=connect_timeout_s,
        peer_timeout_s=peer_timeout_s,
        poll_s=0.25,
    )
    dog.start()
    return dog


async def test_a_peer_that_vanishes_is_detected_within_the_timeout(factory: PeerFactory) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(PEER), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    pc = factory.create()
    chunks: list[bytes] = []
    pc.on("track", lambda track: AudioIn(track, lambda chunk, fmt: chunks.append(chunk)).start())
    dead: list[str] = []
    try:
        assert proc.stdout is not None and proc.stdin is not None
        offer = json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))["sdp"]
        check_offer(offer)
        answer = await factory.answer(pc, offer, audio_track=AudioOutTrack(24000))
        dog = watch(pc, dead, peer_timeout_s=2.0)
        proc.stdin.write(json.dumps({"sdp": answer}).encode() + b"\n")
        await proc.stdin.drain()
        await wait_for(lambda: pc.connectionState == "connected", "the call to connect")
        # a healthy call outlives the peer timeout (the caller's audio keeps it fresh)
        await wait_for(lambda: len(chunks) >= 150, "3 s of the caller's audio")
        assert dead == [] and dog.reason is None
        proc.kill()
        killed = time.monotonic()
        await wait_for(lambda: bool(dead), "the watchdog to notice")
        elapsed = time.monotonic() - killed
        assert dead == ["peer_timeout"]
        assert 1.5 <= elapsed <= 2.0 + 3.0  # the timeout, give or take a poll and a busy loop
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        await pc.close()


async def test_a_peer_that_never_completes_ice_is_dropped_after_the_connect_timeout(factory: PeerFactory) -> None:
    # The SDK's offer has no candidates (trickle) and nobody behind it: no check ever comes.
    pc = factory.create()
    dead: list[str] = []
    try:
        await factory.answer(pc, SDK_OFFER, audio_track=AudioOutTrack(24000))
        started = time.monotonic()
        watch(pc, dead, connect_timeout_s=2.0)
        await wait_for(lambda: bool(dead), "the watchdog to give up")
        assert dead == ["ice_timeout"] and 1.9 <= time.monotonic() - started <= 2.0 + 3.0
    finally:
        await pc.close()


async def test_unreachable_candidates_end_the_call_too(factory: PeerFactory) -> None:
    browser, offer = await make_browser()
    unreachable = []
    for line in offer.split("\r\n"):
        if line.startswith("a=candidate:"):
            parts = line.split()
            parts[4], parts[5] = "198.51.100.1", "9"  # TEST-NET-2: nothing answers there
            line = " ".join(parts)
        unreachable.append(line)
    pc = factory.create()
    dead: list[str] = []
    try:
        await factory.answer(pc, "\r\n".join(unreachable), audio_track=AudioOutTrack(24000))
        started = time.monotonic()
        watch(pc, dead, connect_timeout_s=2.0)
        await wait_for(lambda: bool(dead), "the watchdog to give up")
        assert dead[0] in ("ice_timeout", "ice_failed") and time.monotonic() - started <= 2.0 + 3.0
    finally:
        await pc.close()
        await browser.close()


async def test_a_hangup_by_the_peer_ends_the_call(factory: PeerFactory) -> None:
    browser, offer = await make_browser()
    pc = factory.create()
    dead: list[str] = []
    try:
        answer = await factory.answer(pc, offer, audio_track=AudioOutTrack(24000))
        watch(pc, dead, peer_timeout_s=30.0)
        await connect(browser, answer, pc)
        await browser.close()  # DTLS close_notify: seen at once, not after a timeout
        await wait_for(lambda: bool(dead), "the watchdog to see the hangup", timeout=10.0)
        assert dead[0] in ("closed", "ice_failed")
    finally:
        await pc.close()
