"""What the caller hears, paced and accounted for (pure: the time is passed in).

The carrier plays what it is sent as it arrives, from its own buffer; what is in
that buffer when the caller talks over the answer is what a ``clear`` must
silence, and what was *played* of it is where the assistant's item must be cut.
So the gateway keeps the carrier's buffer short and knows what left it:

- **Paced**: the answer's audio goes out in chunks of ``CHUNK_MS`` (each one
  ``media`` message), and a chunk goes only while what was sent is at most
  ``LEAD_MS`` ahead of the caller's ear, by the wall clock (a chunk plays in its
  own duration from when the one before it has played, or from when it arrives).
  An engine that writes a 15 s answer in one second still has at most
  ``LEAD_MS`` of it in the carrier's buffer.
- **Accounted for by marks**: a ``mark`` follows each chunk; the carrier echoes it
  once the audio before it has played. The item's played audio is the end of
  the last chunk whose mark came back: never more than the caller heard, and
  behind it by at most one chunk.
- **Cleared**: ``clear()`` drops the queue and forgets the marks still out (the
  carrier echoes them when it empties its buffer: they say nothing was played)
  and returns the item to cut and where: the played position.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from gateway.audio.pacing import LeadClock

CHUNK_MS = 100  # the answer's audio per media message, each followed by a mark
LEAD_MS = 300  # at most this much audio sent beyond what the caller's ear has reached (by the clock)
MIN_CHUNK_MS = 20  # a shorter chunk waits for more audio, unless its answer has ended
_LEDGER_ITEMS = 64  # items whose played audio is remembered


@dataclass(frozen=True, slots=True)
class Chunk:
    """One media message and the mark after it."""

    audio: bytes
    mark: str
    response_id: str
    item_id: str
    first: bool  # the response's first audio: output_audio_buffer.started


@dataclass(frozen=True, slots=True)
class Cut:
    """What ``clear()`` cut: the item playing and how much of it the caller heard."""

    response_id: str
    item_id: str
    audio_end_ms: int  # the played position (conversation.item.truncated's audio_end_ms)
    dropped_ms: int  # queued or in the carrier's buffer, never played


@dataclass(slots=True)
class _Segment:
    response_id: str
    item_id: str
    audio: bytearray
    sent_ms: float  # of the item's audio, before this segment's first byte left


@dataclass(frozen=True, slots=True)
class _Pending:
    response_id: str
    item_id: str
    end_ms: int  # the item's audio up to the end of the chunk before the mark
    last: bool  # the response's last chunk (it ended and nothing of it is queued)


class Playout:
    """The queue of one call's answer audio (``bytes_per_ms`` of the carrier's format)."""

    def __init__(
        self,
        bytes_per_ms: int = 8,
        *,
        chunk_ms: int = CHUNK_MS,
        lead_ms: int = LEAD_MS,
        min_chunk_ms: int = MIN_CHUNK_MS,
    ) -> None:
        if lead_ms < chunk_ms:
            raise ValueError("lead_ms must hold at least one chunk")
        self.bytes_per_ms = bytes_per_ms
        self.chunk_ms = chunk_ms
        self.lead_ms = lead_ms
        self.min_chunk_ms = min_chunk_ms
        self._queue: deque[_Segment] = deque()
        self._sent_ms: dict[str, float] = {}  # item id -> its audio sent so far
        self._played: OrderedDict[str, int] = OrderedDict()  # item id -> its audio played (marks echoed)
        self._pending: OrderedDict[str, _Pending] = OrderedDict()  # marks out, in the order sent
        self._ended: set[str] = set()
        self._cut: OrderedDict[str, None] = OrderedDict()  # cleared responses: late audio is dropped
        self._started: set[str] = set()  # responses whose first chunk went out
        self._ear = LeadClock(lead_ms)  # when the caller will have heard all that was sent
        self._marks = 0
        self.chunks_sent = 0

    # --- the session's side ---

    def feed(self, audio: bytes, *, response_id: str, item_id: str) -> None:
        if response_id in self._cut or not audio:
            return
        self._ended.discard(response_id)
        tail = self._queue[-1] if self._queue else None
        if tail is not None and tail.item_id == item_id and tail.response_id == response_id:
            tail.audio += audio
            return
        self._queue.append(_Segment(response_id, item_id, bytearray(audio), self._sent_ms.get(item_id, 0.0)))

    def end_response(self, response_id: str) -> None:
        if response_id not in self._cut:
            self._ended.add(response_id)

    @property
    def queued_ms(self) -> float:
        return sum(len(s.audio) for s in self._queue) / self.bytes_per_ms

    @property
    def playing(self) -> tuple[str, str] | None:
        """(response id, item id) of the audio queued or not yet heard; None: silence."""
        if self._queue:
            return self._queue[0].response_id, self._queue[0].item_id
        if self._pending:
            last = next(reversed(self._pending.values()))
            return last.response_id, last.item_id
        return None

    # --- the clock's side ---

    def ahead_ms(self, now: float) -> float:
        """How far what was sent is ahead of the caller's ear, by the clock."""
        return self._ear.ahead_ms(now)

    def due(self, now: float) -> list[Chunk]:
        """The chunks to send now (none while ``LEAD_MS`` is taken up)."""
        out: list[Chunk] = []
        while self._queue:
            if not self._ear.room(now, self.chunk_ms):
                break
            chunk = self._take()
            if chunk is None:
                break
            out.append(chunk)
            self._ear.sent(now, len(chunk.audio) / self.bytes_per_ms)
        return out

    def next_at(self, now: float) -> float | None:
        """When a chunk may go next (None: nothing queued that may go yet)."""
        if not self._queue:
            return None
        head = self._queue[0]
        if len(head.audio) < self.min_chunk_ms * self.bytes_per_ms and head.response_id not in self._ended:
            return None  # waits for more audio (feed or end_response)
        return now + self._ear.wait_s(now, self.chunk_ms)

    def _take(self) -> Chunk | None:
        head = self._queue[0]
        size = self.chunk_ms * self.bytes_per_ms
        if len(head.audio) < self.min_chunk_ms * self.bytes_per_ms and head.response_id not in self._ended:
            return None
        audio = bytes(head.audio[:size])
        del head.audio[:size]
        if not head.audio:
            self._queue.popleft()
        sent = self._sent_ms.get(head.item_id, head.sent_ms) + len(audio) / self.bytes_per_ms
        self._sent_ms[head.item_id] = sent
        while len(self._sent_ms) > _LEDGER_ITEMS:
            del self._sent_ms[next(iter(self._sent_ms))]
        first = head.response_id not in self._started
        self._started.add(head.response_id)
        last = head.response_id in self._ended and not any(s.response_id == head.response_id for s in self._queue)
        self._marks += 1
        name = f"{self._marks}"
        self._pending[name] = _Pending(head.response_id, head.item_id, int(sent), last)
        self.chunks_sent += 1
        return Chunk(audio, name, head.response_id, head.item_id, first)

    # --- the carrier's side ---

    def echoed(self, name: str) -> tuple[str, bool] | None:
        """A mark came back: (its response id, whether that response has now played out);
        None: not one of the marks out (cleared, or not ours)."""
        pending = self._pending.pop(name, None)
        if pending is None:
            return None
        # Marks come back in order: any sent before this one has played too.
        while self._pending:
            first = next(iter(self._pending))
            if int(first) > int(name):
                break
            self._note_played(self._pending.pop(first))
        self._note_played(pending)
        return pending.response_id, pending.last

    def _note_played(self, pending: _Pending) -> None:
        self._played[pending.item_id] = max(self._played.get(pending.item_id, 0), pending.end_ms)
        self._played.move_to_end(pending.item_id)
        while len(self._played) > _LEDGER_ITEMS:
            self._played.popitem(last=False)

    def played_ms(self, item_id: str) -> int:
        return self._played.get(item_id, 0)

    def sent_ms(self, item_id: str) -> float:
        return self._sent_ms.get(item_id, 0.0)

    def clear(self) -> Cut | None:
        """Drop everything not yet heard; the item to cut and where (None: nothing was playing)."""
        target = self.playing
        dropped = self.queued_ms
        if target is not None:
            dropped += self.sent_ms(target[1]) - self.played_ms(target[1])
        for segment in self._queue:
            self._cut[segment.response_id] = None
        for p in self._pending.values():
            self._cut[p.response_id] = None
        while len(self._cut) > _LEDGER_ITEMS:
            self._cut.popitem(last=False)
        self._queue.clear()
        self._pending.clear()
        self._ear.reset()
        if target is None:
            return None
        return Cut(target[0], target[1], self.played_ms(target[1]), int(dropped))
