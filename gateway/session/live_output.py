"""GPT-Live's output, paced to real time (Sans-I/O: the time is passed in).

The Live API has no truncate: a client plays every ``session.output_audio.delta``
it receives, and a barge-in can only stop what the gateway has not sent yet. So
a Live session on a WebSocket does not send an answer's audio as fast as the
engine makes it: ``PacedOutput`` queues it and lets it go in real time, at most
``lead_ms`` ahead of the client's ear (``LeadClock``, gateway/audio/pacing.py:
the phone bridge's clock). A barge-in ``drop``s the queue: the client has at
most ``lead_ms`` of the interrupted answer left to play.

The transcript goes with the audio: each piece of an answer's transcript text
belongs to the audio that follows it (up to the next piece, or the answer's end),
and goes out as that audio is sent, in proportion (whole words; all of it once
its audio has gone, or once the answer ended and all its audio went). What a
barge-in drops of the audio, it drops of the text: the transcript a client holds
is of the audio it was sent.

``due(now)`` says what to send now, in order: ``("audio", answer, bytes)``,
``("text", answer, str)`` and ``("end", answer, "")`` (an ended answer is all
out); the session's spelling writes them as Live events.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from gateway.audio.codecs import AudioFormat
from gateway.audio.pacing import LeadClock

CHUNK_MS = 100  # an engine's delta longer than this goes out in pieces of this length
_CUT_KEPT = 32  # answers dropped by a barge-in whose late audio is still refused

Out = tuple[Literal["audio", "text", "end"], str, "bytes | str"]


@dataclass(slots=True)
class _Text:
    at: int  # bytes of the answer's audio queued before this text came
    text: str
    said: int = 0  # characters of it sent


@dataclass(slots=True)
class _Answer:
    fed: int = 0  # bytes of its audio queued
    sent: int = 0  # ... and sent
    ended: bool = False
    texts: deque[_Text] = field(default_factory=deque)


class PacedOutput:
    """The queue of a Live session's output (see the module docstring)."""

    def __init__(self, fmt: Callable[[], AudioFormat], lead_ms: float, chunk_ms: int = CHUNK_MS) -> None:
        """``fmt()``: the session's output format (pieces and durations are of it)."""
        self._fmt = fmt
        self.clock = LeadClock(lead_ms)
        self.chunk_ms = min(chunk_ms, int(lead_ms))
        self._queue: deque[tuple[str, bytes]] = deque()  # (answer, audio piece)
        self._answers: dict[str, _Answer] = {}
        self._cut: deque[str] = deque(maxlen=_CUT_KEPT)

    @property
    def lead_ms(self) -> float:
        return self.clock.lead_ms

    @property
    def queued(self) -> bool:
        """Audio waits to go out."""
        return bool(self._queue)

    def holds(self, answer: str) -> bool:
        """Whether audio of ``answer`` waits to go out."""
        return any(rid == answer for rid, _ in self._queue)

    def feed(self, answer: str, audio: bytes) -> None:
        if answer in self._cut or not audio:
            return
        state = self._answers.setdefault(answer, _Answer())
        fmt = self._fmt()
        piece = max(fmt.bytes_per_sample, fmt.rate * fmt.bytes_per_sample * self.chunk_ms // 1000)
        for at in range(0, len(audio), piece):
            self._queue.append((answer, audio[at : at + piece]))
        state.fed += len(audio)

    def text(self, answer: str, text: str) -> None:
        """Transcript text of ``answer``: it speaks the audio that comes after it."""
        if answer in self._cut or not text:
            return
        state = self._answers.setdefault(answer, _Answer())
        state.texts.append(_Text(state.fed, text))

    def end(self, answer: str) -> list[Out]:
        """``answer`` has made all its audio (what is out of it already: its rest, now)."""
        state = self._answers.get(answer)
        if state is None:
            return []
        state.ended = True
        return self._finish(answer, state) if not self.holds(answer) else []

    def knows(self, answer: str) -> bool:
        """Whether ``answer`` has audio or text here (queued, or to come)."""
        return answer in self._answers

    def drop(self) -> list[str]:
        """A barge-in: nothing queued goes out, nor the text of it, nor the rest of those answers
        (returned)."""
        dropped = list(self._answers)
        self._cut.extend(dropped)
        self._queue.clear()
        self._answers.clear()
        return dropped

    def due(self, now: float) -> list[Out]:
        """What to send now (nothing while the lead is taken up)."""
        out: list[Out] = []
        fmt = self._fmt()
        while self._queue:
            answer, audio = self._queue[0]
            ms = fmt.duration_ms(len(audio))
            if not self.clock.room(now, ms):
                break
            self._queue.popleft()
            self.clock.sent(now, ms)
            out.append(("audio", answer, audio))
            state = self._answers[answer]
            state.sent += len(audio)
            out.extend(("text", answer, text) for text in self._release(state, final=False))
            if state.ended and not self.holds(answer):
                out.extend(self._finish(answer, state))
        return out

    def wait_s(self, now: float) -> float | None:
        """How long until the next piece may go (None: nothing queued)."""
        if not self._queue:
            return None
        return self.clock.wait_s(now, self._fmt().duration_ms(len(self._queue[0][1])))

    def _finish(self, answer: str, state: _Answer) -> list[Out]:
        out: list[Out] = [("text", answer, text) for text in self._release(state, final=True)]
        del self._answers[answer]
        out.append(("end", answer, ""))
        return out

    @staticmethod
    def _release(state: _Answer, *, final: bool) -> list[str]:
        """The text whose audio has gone out (in proportion, whole words); ``final``: all of it."""
        out: list[str] = []
        texts = list(state.texts)
        for i, piece in enumerate(texts):
            if final:
                upto = len(piece.text)
            else:
                if state.sent <= piece.at:
                    break  # none of its audio went yet (nor of those after it)
                end = texts[i + 1].at if i + 1 < len(texts) else state.fed
                span = end - piece.at
                if span <= 0 or state.sent >= end:
                    upto = len(piece.text)
                else:
                    upto = len(piece.text) * (state.sent - piece.at) // span
                    upto = piece.text.rfind(" ", piece.said, upto) + 1  # whole words (0: none yet)
            if upto > piece.said:
                out.append(piece.text[piece.said : upto])
                piece.said = upto
        while state.texts and state.texts[0].said == len(state.texts[0].text):
            state.texts.popleft()
        return out
