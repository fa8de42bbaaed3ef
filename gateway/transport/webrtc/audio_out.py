"""The answer's audio as an outgoing WebRTC track, paced at 20 ms on the wall clock, with a
ledger of what was actually sent.

Engines produce audio faster than real time; over a WebSocket the client buffers and plays
it, so the client knows what was heard. Over WebRTC the gateway plays it: the sender asks
the track for a frame, encodes it and sends it at once, so the track itself must hold the
pace. This track hands out one 20 ms frame per 20 ms of wall clock, composed only when due,
so the gateway always knows how much of each item has left (``sent_ms``), and ``clear()``
(barge-in, ``output_audio_buffer.clear``) takes effect from the very next frame.

Between answers the track sends silence rather than nothing: the browser's jitter buffer
and playout clock stay in their steady state, so an answer's first syllable is not eaten by
a re-buffering after a gap, and the RTP timestamps stay continuous (which is also what a
browser's own muted microphone does). The cost is one Opus encode of silence per 20 ms,
measured in ``bench/webrtc_media.py``.

Never a burst: after an event-loop stall the schedule catches up by at most
``max_catchup_frames`` frames, then re-anchors on the clock; the frames' timestamps skip
the lost time (the receiver conceals it, as it would a network gap), the queued audio is
not dropped. ``started`` fires as a response's first frame is handed to the sender,
``stopped`` once the response was ended (``end_response``) and its last frame has gone:
what ``output_audio_buffer.started``/``.stopped`` report.
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame

FRAME_MS = 20
_LEDGER_ITEMS = 64  # items whose sent audio is remembered (truncation asks about recent ones)


@dataclass(frozen=True, slots=True)
class ClearResult:
    """What ``clear()`` cut: the item that was playing and how much of it had been sent."""

    response_id: str
    item_id: str
    audio_end_ms: int  # of ``item_id``'s audio, sent before the cut: conversation.item.truncate's value
    dropped_ms: int  # queued audio (all items) that will never be sent


@dataclass(slots=True)
class _Segment:
    response_id: str
    item_id: str
    pcm: bytearray
    offset: int = 0  # bytes already taken

    @property
    def left(self) -> int:
        return len(self.pcm) - self.offset


class AudioOutTrack(MediaStreamTrack):
    """An outgoing audio track fed with PCM16 mono at ``sample_rate`` in chunks of any size.

    Single event loop; ``feed``/``end_response``/``clear`` are plain calls from the session's
    side, ``recv`` is called by aiortc's sender.
    """

    kind = "audio"

    def __init__(
        self,
        sample_rate: int = 24000,
        *,
        on_started: Callable[[str], None] | None = None,
        on_stopped: Callable[[str], None] | None = None,
        max_catchup_frames: int = 2,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        super().__init__()
        if sample_rate % (1000 // FRAME_MS):
            raise ValueError("sample_rate must hold a whole number of samples per 20 ms")
        self.sample_rate = sample_rate
        self.frame_samples = sample_rate * FRAME_MS // 1000
        self._frame_bytes = 2 * self.frame_samples
        self._frame_s = FRAME_MS / 1000
        self._time_base = fractions.Fraction(1, sample_rate)
        self.on_started = on_started
        self.on_stopped = on_stopped
        self._max_catchup = max_catchup_frames
        self._clock = clock
        self._sleep = sleep
        self._queue: deque[_Segment] = deque()
        self._queued_bytes = 0
        self._odd: tuple[str, int] | None = None  # (item_id, byte) waiting for its partner
        self._sent_items: OrderedDict[str, int] = OrderedDict()  # item_id -> samples sent
        self._sent_responses: OrderedDict[str, int] = OrderedDict()  # response_id -> samples sent
        self._started: set[str] = set()  # responses whose first frame went out, not yet stopped/cleared
        self._ended: set[str] = set()  # responses that will get no more audio
        self._cut: OrderedDict[str, None] = OrderedDict()  # cleared responses: late audio is dropped
        self._playing: tuple[str, str] | None = None  # (response_id, item_id) of the last audio sent
        self._next: float | None = None  # when the next frame is due
        self._pts = 0
        # counters
        self.frames_sent = 0
        self.audio_frames_sent = 0  # frames that held some answer audio
        self.stalls = 0  # re-anchors after the loop fell behind
        self.max_late_s = 0.0

    # --- the session's side ---

    def feed(self, pcm16: bytes, *, response_id: str, item_id: str) -> None:
        """Queue answer audio. Audio for a response already cleared is dropped (the engine may
        still deliver some before the cancel reaches it)."""
        if response_id in self._cut or not pcm16:
            return
        self._ended.discard(response_id)  # more audio: not ended after all
        data = pcm16
        if self._odd is not None:
            odd_item, byte = self._odd
            self._odd = None
            if odd_item == item_id:
                data = bytes([byte]) + data
        if len(data) % 2:
            self._odd = (item_id, data[-1])
            data = data[:-1]
        if not data:
            return
        tail = self._queue[-1] if self._queue else None
        if tail is not None and tail.item_id == item_id and tail.response_id == response_id:
            tail.pcm += data
        else:
            self._queue.append(_Segment(response_id, item_id, bytearray(data)))
        self._queued_bytes += len(data)

    def end_response(self, response_id: str) -> None:
        """No more audio for ``response_id``: ``stopped`` fires once what is queued has gone."""
        if response_id not in self._cut:
            self._ended.add(response_id)

    def clear(self) -> ClearResult | None:
        """Drop every queued sample: the next frame is silence. Returns the item that was
        playing (or about to) and how much of it was sent; None if nothing was playing or
        queued. No ``stopped`` follows for the cut responses."""
        target = self._playing
        if target is not None and target[0] not in self._started:
            target = None  # that response already stopped: nothing is playing
        if target is None and self._queue:
            head = self._queue[0]
            target = (head.response_id, head.item_id)
        dropped = self._queued_bytes // 2
        for seg in self._queue:
            self._mark_cut(seg.response_id)
        self._queue.clear()
        self._queued_bytes = 0
        self._odd = None
        if target is None:
            return None
        self._mark_cut(target[0])
        self._playing = None
        return ClearResult(target[0], target[1], self.sent_ms(target[1]), dropped * 1000 // self.sample_rate)

    def _mark_cut(self, response_id: str) -> None:
        self._cut[response_id] = None
        while len(self._cut) > _LEDGER_ITEMS:
            self._cut.popitem(last=False)
        self._started.discard(response_id)
        self._ended.discard(response_id)

    def sent_samples(self, item_id: str) -> int:
        return self._sent_items.get(item_id, 0)

    def sent_ms(self, item_id: str) -> int:
        """Milliseconds of ``item_id``'s audio handed to the sender (floor)."""
        return self._sent_items.get(item_id, 0) * 1000 // self.sample_rate

    def response_sent_ms(self, response_id: str) -> int:
        return self._sent_responses.get(response_id, 0) * 1000 // self.sample_rate

    @property
    def playing(self) -> tuple[str, str] | None:
        """(response_id, item_id) whose audio is going out: started, not stopped or cleared."""
        if self._playing is not None and self._playing[0] in self._started:
            return self._playing
        return None

    @property
    def queued_ms(self) -> int:
        return self._queued_bytes // 2 * 1000 // self.sample_rate

    # --- aiortc's side ---

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = self._clock()
        if self._next is None:
            self._next = now
        else:
            wait = self._next - now
            if wait > 0:
                await self._sleep(wait)
                if self.readyState != "live":
                    raise MediaStreamError
                now = self._clock()
            late = now - self._next
            self.max_late_s = max(self.max_late_s, late)
            if late > self._max_catchup * self._frame_s:
                # Fell behind (a stalled loop): skip the lost schedule instead of bursting. The
                # schedule moves by the whole frames skipped, as the timestamps do: re-anchoring on
                # the clock instead would lose the fraction of a frame each time, and the RTP
                # time would drift behind the wall clock stall after stall.
                skipped = int(late / self._frame_s)
                self._pts += skipped * self.frame_samples
                self._next += skipped * self._frame_s
                self.stalls += 1
        frame = self._compose()  # composed when due, so a clear() before now is honoured
        frame.pts = self._pts
        self._pts += self.frame_samples
        self._next += self._frame_s
        self.frames_sent += 1
        return frame

    def _compose(self) -> AudioFrame:
        out = bytearray()
        taken: list[tuple[str, str, int]] = []
        while len(out) < self._frame_bytes and self._queue:
            seg = self._queue[0]
            n = min(seg.left, self._frame_bytes - len(out))
            out += seg.pcm[seg.offset : seg.offset + n]
            seg.offset += n
            self._queued_bytes -= n
            taken.append((seg.response_id, seg.item_id, n // 2))
            if seg.left == 0:
                self._queue.popleft()
        if len(out) < self._frame_bytes:
            out += bytes(self._frame_bytes - len(out))  # silence: between answers, or an underrun
        for response_id, item_id, samples in taken:
            self._credit(self._sent_items, item_id, samples)
            self._credit(self._sent_responses, response_id, samples)
            self._playing = (response_id, item_id)
            if response_id not in self._started:
                self._started.add(response_id)
                if self.on_started is not None:
                    self.on_started(response_id)
        if taken:
            self.audio_frames_sent += 1
        self._check_stopped()
        frame = AudioFrame(format="s16", layout="mono", samples=self.frame_samples)
        frame.planes[0].update(bytes(out))
        frame.sample_rate = self.sample_rate
        frame.time_base = self._time_base
        return frame

    def _credit(self, ledger: OrderedDict[str, int], key: str, samples: int) -> None:
        ledger[key] = ledger.get(key, 0) + samples
        ledger.move_to_end(key)
        while len(ledger) > _LEDGER_ITEMS:
            ledger.popitem(last=False)

    def _check_stopped(self) -> None:
        if not self._ended:
            return
        queued = {seg.response_id for seg in self._queue}
        for response_id in [r for r in self._ended if r not in queued]:
            self._ended.discard(response_id)
            if response_id in self._started:  # a response with no audio gets neither event
                self._started.discard(response_id)
                if self.on_stopped is not None:
                    self.on_stopped(response_id)
