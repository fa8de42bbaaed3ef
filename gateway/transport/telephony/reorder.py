"""The caller's audio put back in order (pure), for a carrier that may deliver it out of order.

Each chunk carries its number (``MediaIn.chunk``). A chunk that arrives early is held until
the ones before it came; a missing one is waited for while at most ``REORDER_WINDOW``
chunks are held (100 ms of 20 ms chunks), then skipped (the session hears a gap, as a
jitter buffer would play one). A chunk older than the one expected (a duplicate, or one
later than the window) is dropped. The count starts at ``first`` (the carriers number the
caller's chunks from 1); a stream whose numbers start elsewhere loses its first window.
"""

from __future__ import annotations

REORDER_WINDOW = 5  # chunks held while one is missing; one more and the missing one is skipped


class Reorder:
    def __init__(self, window: int = REORDER_WINDOW, first: int | None = 1) -> None:
        self.window = window
        self._next: int | None = first
        self._held: dict[int, bytes] = {}
        self.dropped = 0  # chunks too late or repeated
        self.skipped = 0  # chunks never received, given up on

    def push(self, chunk: int | None, audio: bytes) -> list[bytes]:
        """The chunks that may go to the session now, in order."""
        if chunk is None:
            return [audio]
        if self._next is None:
            self._next = chunk
        if chunk < self._next or chunk in self._held:
            self.dropped += 1
            return []
        self._held[chunk] = audio
        out: list[bytes] = []
        while self._held:
            if self._next in self._held:
                out.append(self._held.pop(self._next))
                self._next += 1
            elif len(self._held) > self.window:
                first = min(self._held)
                self.skipped += first - self._next
                self._next = first
            else:
                break
        return out
