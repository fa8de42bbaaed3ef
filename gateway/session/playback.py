"""Playback truth (pure): what the client played of each assistant answer.

A duplex client reports, with ``playback.ack``, how much of an answer's audio
it has played (``played_ms``) and how much of it belongs in the conversation
(``committed_ms``: what the user heard). The ledger of an answer keeps those
cursors next to what was generated, and the answer's full transcript with its
marks (the audio offset at which each piece of text was produced), so that the
assistant item can be cut back to any point and grown again: the item holds
the text whose audio had started before ``committed_ms``, and exactly
``committed_ms`` of audio, to the millisecond.

``Playback`` keeps the ledgers of the last ``MAX_LEDGERS`` answers and decides,
around the end of an answer, what its item keeps (``playback_commit_policy``).
It also knows whether the last answer, though it has ended, is still playing
on the client (``playing``): each audio delta extends the ledger's playout
schedule (``sent``: a chunk starts when the one before it has played, or when
it arrives), and an answer plays until the client has acknowledged all of it
or its schedule, plus ``PLAYBACK_MARGIN_MS`` of the client's buffering, has
run out. A barge-in then still interrupts it (``interrupted``). The schedule
is kept in wall-clock seconds, so that it means the same on another replica.
It knows the answer's content part, never the session or the conversation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.protocol.errors import Code, ProtocolError
from gateway.session.conversation import Marks, Part

MAX_LEDGERS = 16  # answers whose playback a client may still acknowledge; older ones are forgotten
# How long after its audio would have played out, at real time, an ended answer still counts
# as playing (the client's jitter buffer and the network): a barge-in then still stops it.
PLAYBACK_MARGIN_MS = 500


@dataclass(slots=True)
class Ledger:
    response_id: str
    item_id: str
    generated_ms: float = 0.0  # audio produced (and sent: the gateway sends as it generates)
    played_ms: float = 0.0
    committed_ms: float = 0.0
    acked: bool = False  # a playback.ack reached this answer
    done: bool = False  # the answer ended (response.done)
    interrupted: bool = False  # cancelled, or stopped by a barge-in while it played
    play_end_at: float = 0.0  # wall-clock s at which the client has played what was sent, at real time
    transcript: str = ""  # the whole transcript, kept when the item is cut back
    marks: Marks = field(default_factory=Marks)

    def capture(self, part: Part) -> None:
        """Take the answer's output as generated (before any cut)."""
        self.generated_ms = max(self.generated_ms, part.audio_ms)
        if len(part.transcript or "") >= len(self.transcript):
            self.transcript = part.transcript or ""
            self.marks = part.marks.copy()

    def sent(self, audio_ms: float, now: float) -> None:
        """The answer's audio reached ``audio_ms`` with a delta sent at ``now`` (wall clock)."""
        chunk_s = max(0.0, audio_ms - self.generated_ms) / 1000.0
        self.play_end_at = max(self.play_end_at, now) + chunk_s
        self.generated_ms = audio_ms

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
        kept = self.marks.kept_before(self.committed_ms)
        part.transcript = self.transcript[:kept]
        part.marks = self.marks.upto(kept)
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
            "interrupted": self.interrupted,
            "play_end_at": self.play_end_at,
            "transcript": self.transcript,
            "marks": self.marks.to_list(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Ledger:
        return cls(**{**d, "marks": Marks((m[0], m[1]) for m in d["marks"])})


EMPTY_VIEW = {"generated_ms": 0, "sent_ms": 0, "played_ms": 0, "committed_ms": 0}


class Playback:
    """The playback ledgers of the last ``MAX_LEDGERS`` answers, by response id, oldest first."""

    def __init__(self) -> None:
        self.ledgers: dict[str, Ledger] = {}

    def open(self, response_id: str, item_id: str) -> Ledger:
        """A new answer (response.created): its ledger; the oldest beyond the bound is forgotten."""
        ledger = self.ledgers[response_id] = Ledger(response_id, item_id)
        while len(self.ledgers) > MAX_LEDGERS:
            del self.ledgers[next(iter(self.ledgers))]
        return ledger

    def latest(self) -> Ledger | None:
        return next(reversed(self.ledgers.values()), None)

    def playing(self, now: float) -> Ledger | None:
        """The last answer, if it has ended but still plays on the client (module docstring)."""
        latest = self.latest()
        if latest is None or not latest.done or latest.interrupted or latest.played_ms >= latest.generated_ms:
            return None
        return latest if now < latest.play_end_at + PLAYBACK_MARGIN_MS / 1000.0 else None

    def view(self) -> dict[str, int]:
        """The latest answer's cursors (the duplex session object's ``playback``)."""
        latest = self.latest()
        return latest.view() if latest else dict(EMPTY_VIEW)

    def find(self, response_id: str | None, item_id: str | None) -> Ledger:
        """The ledger a ``playback.ack`` names (by response, else by item, else the latest)."""
        if response_id is not None:
            ledger = self.ledgers.get(response_id)
        elif item_id is not None:
            ledger = next((x for x in self.ledgers.values() if x.item_id == item_id), None)
        else:
            ledger = self.latest()
        if ledger is None:
            named = response_id or item_id
            raise ProtocolError(
                Code.ITEM_NOT_FOUND,
                f"No answer {named!r} to acknowledge (the last {MAX_LEDGERS} answers are kept)."
                if named
                else "No answer has played yet.",
                param="response_id" if response_id else "item_id" if item_id else None,
            )
        return ledger

    def answer_ending(self, response_id: str, part: Part, status: str, policy: str) -> None:
        """Before the answer's closing events: take what it generated; a cancelled answer's
        item is cut back to what the user heard once the client acknowledged any playback
        (``ack_only``: always)."""
        ledger = self.ledgers.get(response_id)
        if ledger is None:
            return
        ledger.capture(part)
        if part.type == "output_audio" and status == "cancelled" and (ledger.acked or policy == "ack_only"):
            ledger.cut(part)  # history holds what the user heard

    def answer_ended(self, response_id: str, part: Part, status: str, policy: str) -> None:
        """After response.done: the ledger is final; ``ack_only`` keeps in the history
        only what is acknowledged."""
        ledger = self.ledgers.get(response_id)
        if ledger is None:
            return
        ledger.done = True
        ledger.interrupted = status == "cancelled"  # (the client stops playing it)
        if part.type == "output_audio" and status != "cancelled" and policy == "ack_only":
            ledger.cut(part)  # only what is acknowledged enters the history

    def to_list(self) -> list[dict[str, Any]]:
        return [ledger.to_dict() for ledger in self.ledgers.values()]

    def restore(self, entries: list[dict[str, Any]]) -> None:
        for entry in entries:
            ledger = Ledger.from_dict(entry)
            self.ledgers[ledger.response_id] = ledger
