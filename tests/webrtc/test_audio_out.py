"""The outgoing track on a fake clock: the 20 ms schedule, the sent-audio ledger, started and
stopped, clear(), stalls. (Real peers and the wall clock: test_loopback.py.)"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from aiortc.mediastreams import MediaStreamError

from gateway.transport.webrtc.audio_out import AudioOutTrack, ClearResult

RATE = 24000
FRAME = 2 * RATE // 50  # bytes per 20 ms


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


def pcm(ms: int, value: int = 1000) -> bytes:
    return np.full(RATE * ms // 1000, value, dtype="<i2").tobytes()


def make(clock: FakeClock, events: list[tuple[str, str]] | None = None, **kw: object) -> AudioOutTrack:
    log = events if events is not None else []
    return AudioOutTrack(
        RATE,
        on_started=lambda r: log.append(("started", r)),
        on_stopped=lambda r: log.append(("stopped", r)),
        clock=clock,
        sleep=clock.sleep,
        **kw,  # type: ignore[arg-type]
    )


def samples(frame: object) -> np.ndarray:
    return np.frombuffer(bytes(frame.planes[0])[: 2 * frame.samples], dtype="<i2")  # type: ignore[attr-defined]


async def test_frames_leave_on_a_20_ms_schedule_with_silence_between_answers() -> None:
    clock = FakeClock()
    track = make(clock)
    times, pts = [], []
    for _ in range(5):
        frame = await track.recv()
        times.append(round(clock.now - 100.0, 6))
        pts.append(frame.pts)
        assert frame.format.name == "s16" and frame.layout.name == "mono"
        assert frame.samples == 480 and frame.sample_rate == RATE and frame.time_base == pytest.approx(1 / RATE)
        assert not samples(frame).any()  # nothing queued: silence, not a pause
    assert times == [0.0, 0.02, 0.04, 0.06, 0.08]
    assert pts == [0, 480, 960, 1440, 1920]


async def test_the_ledger_counts_what_was_sent_and_stopped_follows_the_last_frame() -> None:
    clock, events = FakeClock(), list[tuple[str, str]]()
    track = make(clock, events)
    audio = pcm(1000)
    for i in range(0, len(audio), 777):  # odd chunk sizes: a sample split across feeds
        track.feed(audio[i : i + 777], response_id="r1", item_id="i1")
    track.end_response("r1")
    assert track.queued_ms == 1000 and events == []
    for n in range(1, 51):
        frame = await track.recv()
        assert (samples(frame) == 1000).all()
        assert track.sent_ms("i1") == 20 * n
        assert events == ([("started", "r1")] if n < 50 else [("started", "r1"), ("stopped", "r1")])
        assert (track.playing is None) == (n == 50)
    assert track.response_sent_ms("r1") == 1000 and track.queued_ms == 0
    assert not samples(await track.recv()).any()
    assert events == [("started", "r1"), ("stopped", "r1")] and track.audio_frames_sent == 50


async def test_a_frame_that_straddles_two_items_credits_each() -> None:
    clock = FakeClock()
    track = make(clock)
    track.feed(pcm(30, 100), response_id="r1", item_id="a")
    track.feed(pcm(30, 200), response_id="r1", item_id="b")
    await track.recv()
    second = samples(await track.recv())
    assert (second[:240] == 100).all() and (second[240:] == 200).all()
    assert track.sent_ms("a") == 30 and track.sent_ms("b") == 10
    await track.recv()
    assert track.sent_ms("b") == 30


async def test_clear_cuts_at_the_next_frame_and_reports_what_was_sent() -> None:
    clock, events = FakeClock(), list[tuple[str, str]]()
    track = make(clock, events)
    track.feed(pcm(1000), response_id="r1", item_id="i1")
    for _ in range(10):
        await track.recv()
    result = track.clear()
    assert result == ClearResult(response_id="r1", item_id="i1", audio_end_ms=200, dropped_ms=800)
    assert not samples(await track.recv()).any()  # the very next frame is silence
    # audio the engine still delivers for the cut response is dropped; no stopped for it
    track.feed(pcm(100), response_id="r1", item_id="i1")
    track.end_response("r1")
    for _ in range(3):
        assert not samples(await track.recv()).any()
    assert events == [("started", "r1")] and track.sent_ms("i1") == 200
    assert track.clear() is None  # nothing playing any more
    # the next response plays normally
    track.feed(pcm(40), response_id="r2", item_id="i2")
    track.end_response("r2")
    for _ in range(3):
        await track.recv()
    assert events == [("started", "r1"), ("started", "r2"), ("stopped", "r2")]


async def test_clear_before_the_first_frame_and_with_nothing_queued() -> None:
    clock, events = FakeClock(), list[tuple[str, str]]()
    track = make(clock, events)
    assert track.clear() is None
    track.feed(pcm(100), response_id="r1", item_id="i1")
    assert track.clear() == ClearResult("r1", "i1", 0, 100)
    await track.recv()
    assert events == []


async def test_an_underrun_plays_silence_and_keeps_the_response_going() -> None:
    clock, events = FakeClock(), list[tuple[str, str]]()
    track = make(clock, events)
    track.feed(pcm(40), response_id="r1", item_id="i1")
    got = [samples(await track.recv()).any() for _ in range(4)]
    assert got == [True, True, False, False] and events == [("started", "r1")]
    assert track.playing == ("r1", "i1")  # not ended: the engine is just behind
    track.feed(pcm(20), response_id="r1", item_id="i1")
    track.end_response("r1")
    await track.recv()
    await track.recv()
    assert events == [("started", "r1"), ("stopped", "r1")] and track.sent_ms("i1") == 60


async def test_a_response_without_audio_gets_no_events() -> None:
    clock, events = FakeClock(), list[tuple[str, str]]()
    track = make(clock, events)
    track.end_response("r1")
    track.feed(b"", response_id="r2", item_id="i2")
    for _ in range(3):
        await track.recv()
    assert events == []


async def test_a_stall_is_skipped_not_burst() -> None:
    clock = FakeClock()
    track = make(clock)
    track.feed(pcm(1000), response_id="r1", item_id="i1")
    await track.recv()
    await track.recv()  # t = 0.02, next due at 0.04
    clock.now += 0.2  # the loop stalled for 200 ms
    t0 = clock.now
    late = await track.recv()
    assert clock.now == t0  # sent at once...
    assert late.pts == 480 * 11  # ...its timestamp skips the lost schedule (9 frames' worth)
    after = await track.recv()
    assert clock.now == pytest.approx(t0 + 0.02)  # ...and the next waits a full frame: no burst
    assert after.pts == late.pts + 480
    assert track.stalls == 1 and track.sent_ms("i1") == 80  # no audio was dropped


async def test_stalls_that_are_not_whole_frames_leave_the_timestamps_on_the_clock() -> None:
    """The RTP time of every frame stays what the wall clock says, stall after stall (no
    drift of the fraction of a frame each stall would lose)."""
    clock = FakeClock()
    track = make(clock)
    start = clock.now
    await track.recv()
    for _ in range(5):
        clock.now += 0.195  # a stall of 9.75 frames
        await track.recv()
        frame = await track.recv()
        assert abs(start + frame.pts / 24000 - clock.now) < 0.020, (frame.pts, clock.now - start)
    assert track.stalls == 5


async def test_a_short_delay_is_caught_up_on_schedule() -> None:
    clock = FakeClock()
    track = make(clock, max_catchup_frames=2)
    await track.recv()
    await track.recv()  # t = 0.02
    clock.now += 0.05  # t = 0.07: 30 ms late for the frame due at 0.04 (under 2 frames)
    late = await track.recv()
    assert late.pts == 960 and track.stalls == 0
    before = clock.now
    await track.recv()  # due at 0.06: already past, sent at once
    assert clock.now == before
    await track.recv()  # due at 0.08
    assert clock.now == pytest.approx(100.08)


async def test_odd_bytes_wait_for_their_partner() -> None:
    clock = FakeClock()
    track = make(clock)
    sample = np.array([0x1234], dtype="<i2").tobytes()
    track.feed(sample[:1], response_id="r1", item_id="i1")
    track.feed(sample[1:] + pcm(20)[2:], response_id="r1", item_id="i1")
    first = samples(await track.recv())
    assert first[0] == 0x1234 and track.sent_samples("i1") == 480


async def test_recv_after_stop_ends_the_sender() -> None:
    track = make(FakeClock())
    await track.recv()
    track.stop()
    with pytest.raises(MediaStreamError):
        await track.recv()


def test_the_rate_must_hold_whole_frames() -> None:
    with pytest.raises(ValueError):
        AudioOutTrack(8001)
