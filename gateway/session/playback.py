"""Playback truth (pure): what the client played of each assistant answer.

A duplex client reports, with ``playback.ack``, how much of an answer's audio
it has played (``played_ms``) and how much of it belongs in the conversation
(``committed_ms``: what the user heard). The ledger of an answer keeps those
cursors next to what was generated, and the answer's full transcript with its
marks (the audio offset at which each piece of text was produced), so that the
assistant item can be cut back to any point and grown again: the item holds
the text whose audio had started before ``committed_ms``, and exactly
``committed_ms`` of audio, to the millisecond.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.session.conversation import Part

MAX_LEDGERS = 16  # answers whose playback a client may still acknowledge; older ones are forgotten


@dataclass(slots=True)
class Ledger:
    response_id: str
    item_id: str
    generated_ms: float = 0.0  # audio produced (and sent: the gateway sends as it generates)
    played_ms: float = 0.0
    committed_ms: float = 0.0
    acked: bool = False  # a playback.ack reached this answer
    done: bool = False  # the answer ended (response.done)
    transcript: str = ""  # the whole transcript, kept when the item is cut back
    marks: list[tuple[float, int]] = field(default_factory=list)

    def capture(self, part: Part) -> None:
        """Take the answer's output as generated (before any cut)."""
        self.generated_ms = max(self.generated_ms, part.audio_ms)
        if len(part.transcript or "") >= len(self.transcript):
            self.transcript = part.transcript or ""
            self.marks = list(part.marks)

    def ack(self, played_ms: int, committed_ms: int | None, *, truncate: bool) -> None:
        self.acked = True
        self.played_ms = min(max(self.played_ms, float(played_ms)), self.generated_ms)
        committed = float(played_ms if committed_ms is None else committed_ms)
        if truncate:
            self.committed_ms = min(committed, self.generated_ms)  # what was heard, exactly
        else:
            self.committed_ms = min(max(self.committed_ms, committed), self.generated_ms)

    def cut(self, part: Part) -> None:
        """Make ``part`` hold what was heard: ``committed_ms`` of audio and its text."""
        kept = 0
        for offset_ms, length in self.marks:
            if offset_ms < self.committed_ms:
                kept = length
        part.transcript = self.transcript[:kept]
        part.marks = [m for m in self.marks if m[1] <= kept]
        part.audio_ms = self.committed_ms

    def view(self) -> dict[str, int]:
        return {
            "generated_ms": round(self.generated_ms),
            "sent_ms": round(self.generated_ms),
            "played_ms": round(self.played_ms),
            "committed_ms": round(self.committed_ms),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "response_id": self.response_id,
            "item_id": self.item_id,
            "generated_ms": self.generated_ms,
            "played_ms": self.played_ms,
            "committed_ms": self.committed_ms,
            "acked": self.acked,
            "done": self.done,
            "transcript": self.transcript,
            "marks": [list(m) for m in self.marks],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Ledger:
        return cls(**{**d, "marks": [(m[0], m[1]) for m in d["marks"]]})


EMPTY_VIEW = {"generated_ms": 0, "sent_ms": 0, "played_ms": 0, "committed_ms": 0}
