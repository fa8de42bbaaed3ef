"""Pure text/audio stream helpers for the cascade: sentence splitting, a word
budget for ``max_output_tokens``, fixed-size audio re-chunking, and the
word-level diffing of partial transcripts."""

from __future__ import annotations

import re

# A sentence ends at . ! ? … (plus closing quotes/brackets) followed by
# whitespace, or at a newline. The whitespace must have arrived, so "3.5" or
# a dot at the very end of a delta is not yet a boundary.
_SENTENCE_END = re.compile(r"[.!?…]+[\"'”’)\]]*(?=\s)|\n")
_CLAUSE_END = re.compile(r"[,;:—–]+(?=\s)")
MIN_CLAUSE_CHARS = 24  # a shorter clause waits for more text (no choppy prosody)
MAX_SEGMENT_CHARS = 240  # a run-on segment is cut at a space past this length,
# which bounds the delay to first audio and the size of one TTS job.


class SentenceSplitter:
    """Cuts a stream of text deltas into speakable segments as soon as each is
    complete. Segments concatenate back to exactly the input text (the
    whitespace after a boundary starts the next segment)."""

    def __init__(self) -> None:
        self._buf = ""

    def push(self, delta: str) -> list[str]:
        self._buf += delta
        out: list[str] = []
        while True:
            cut = self._boundary()
            if cut is None:
                break
            out.append(self._buf[:cut])
            self._buf = self._buf[cut:]
        return out

    def flush(self) -> str:
        rest, self._buf = self._buf, ""
        return rest

    def _boundary(self) -> int | None:
        buf = self._buf
        lead = len(buf) - len(buf.lstrip())
        m = _SENTENCE_END.search(buf, lead)
        best = m.end() if m else None
        for c in _CLAUSE_END.finditer(buf, lead, best if best is not None else len(buf)):
            if c.end() - lead >= MIN_CLAUSE_CHARS:
                best = c.end()
                break
        if best is None and len(buf) - lead > MAX_SEGMENT_CHARS:
            space = buf.rfind(" ", lead, lead + MAX_SEGMENT_CHARS)
            best = space if space > lead else lead + MAX_SEGMENT_CHARS
        return best


class WordBudget:
    """Counts output words as tokens and cuts the stream after ``limit`` words.

    ``take(delta)`` returns the part of ``delta`` within the budget; once a
    word beyond the limit starts, ``exhausted`` is True and the text is cut
    just before it. ``limit=None``: no limit.
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.words = 0
        self.exhausted = False
        self._in_word = False

    def take(self, delta: str) -> str:
        if self.exhausted:
            return ""
        for m in re.finditer(r"\S+", delta):
            if m.start() == 0 and self._in_word:
                continue  # continues the word the previous delta ended in
            if self.limit is not None and self.words >= self.limit:
                self.exhausted = True
                return delta[: m.start()].rstrip()
            self.words += 1
        if delta:
            self._in_word = not delta[-1].isspace()
        return delta


class Rechunker:
    """Re-cuts a byte stream into pieces of exactly ``size`` bytes (the last
    piece, from ``flush``, may be shorter)."""

    def __init__(self, size: int) -> None:
        if size <= 0 or size % 2:
            raise ValueError("chunk size must be a positive even number of bytes")
        self.size = size
        self._buf = bytearray()

    def push(self, data: bytes) -> list[bytes]:
        self._buf += data
        n = len(self._buf) // self.size * self.size
        if n == 0:
            return []
        out = [bytes(self._buf[i : i + self.size]) for i in range(0, n, self.size)]
        del self._buf[:n]
        return out

    def flush(self) -> bytes:
        rest = bytes(self._buf)
        self._buf.clear()
        return rest


def new_stable_words(emitted: list[str], hypothesis: str, *, final: bool = False) -> list[str]:
    """Words of a hypothesis that extend what was already emitted.

    A partial hypothesis's last word is held back (the decoder often revises
    it); a word is emitted once another follows it, or when ``final``. If the
    hypothesis no longer starts with the emitted words (a revision), nothing
    is emitted until it extends them again.
    """
    stable = hypothesis.split() if final else hypothesis.split()[:-1]
    if len(stable) > len(emitted) and stable[: len(emitted)] == emitted:
        return stable[len(emitted) :]
    return []


def join_words(emitted_before: int, words: list[str]) -> str:
    """Words as a delta: space-separated, with a leading space unless first."""
    text = " ".join(words)
    return " " + text if emitted_before and text else text
