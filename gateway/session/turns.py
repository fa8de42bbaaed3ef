"""Server VAD turn detection (pure): speech probabilities in, turn events out.

The speech model (silero) gives one probability per 32 ms frame. A turn
starts at the first frame at or above ``threshold`` and ends once the
probability has stayed below ``threshold - HYSTERESIS`` for
``silence_duration_ms``; the reported start is moved back by
``prefix_padding_ms`` (never before the session's audio began) so that the
committed audio keeps the onset of the first word.

``semantic_vad`` uses the same detector with a silence that follows the live
transcript of the turn (``semantic_silence_ms``): shorter once what was said
sounds finished, longer while it trails off, bounded by ``eagerness``.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.protocol.session_config import TurnDetection

FRAME_MS = 32.0  # silero's frame: 512 samples at 16 kHz
HYSTERESIS = 0.15  # a dip just under threshold inside a word is not silence
MIN_SPEECH_MS = 64.0  # shorter blips (clicks, breath) never start a turn


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    audio_start_ms: int


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    audio_end_ms: int


TurnEvent = SpeechStarted | SpeechStopped


class TurnDetector:
    def __init__(
        self, threshold: float, prefix_padding_ms: int, silence_duration_ms: int, origin_ms: float = 0.0
    ) -> None:
        self.origin_ms = origin_ms  # session audio time at which this detector's first frame starts
        self.threshold = threshold
        self.prefix_padding_ms = prefix_padding_ms
        self.silence_duration_ms = silence_duration_ms
        self.in_speech = False
        self._frames = 0  # frames seen, the clock of the detector
        self._candidate_ms: float | None = None  # onset of a run above threshold
        self._silence_since_ms: float | None = None

    def reset(self) -> None:
        self.in_speech = False
        self._candidate_ms = None
        self._silence_since_ms = None

    def process(self, probabilities: list[float]) -> list[TurnEvent]:
        events: list[TurnEvent] = []
        for p in probabilities:
            start = self.origin_ms + self._frames * FRAME_MS
            self._frames += 1
            end = start + FRAME_MS
            if not self.in_speech:
                if p >= self.threshold:
                    if self._candidate_ms is None:
                        self._candidate_ms = start
                    if end - self._candidate_ms >= MIN_SPEECH_MS:
                        self.in_speech = True
                        self._silence_since_ms = None
                        onset = max(0.0, self._candidate_ms - self.prefix_padding_ms)
                        events.append(SpeechStarted(int(onset)))
                        self._candidate_ms = None
                else:
                    self._candidate_ms = None
            elif p < self.threshold - HYSTERESIS:
                if self._silence_since_ms is None:
                    self._silence_since_ms = start
                if end - self._silence_since_ms >= self.silence_duration_ms:
                    self.in_speech = False
                    events.append(SpeechStopped(int(self._silence_since_ms)))
                    self._silence_since_ms = None
            else:
                self._silence_since_ms = None
        return events


# --- semantic VAD ---------------------------------------------------------------------

# eagerness -> (silence after a complete-sounding phrase, before any words are
# recognised, after a phrase that trails off), in ms. The last is OpenAI's
# documented maximum wait (low 8 s, medium 4 s, high 2 s; auto is medium).
SEMANTIC_WAITS = {
    "low": (1200, 2400, 8000),
    "medium": (600, 1200, 4000),
    "auto": (600, 1200, 4000),
    "high": (300, 600, 2000),
}
# A phrase ending in one of these is not finished: a filler, or a word that needs what follows.
TRAILING = frozenset(
    """um umm uh uhm uhh er erm hmm mm and or but so because cause if when while that which who whose
    than then to of for with without from into onto about at by in on the a an my your his her its our
    their this these those is are was were be been am do does did can could will would should shall may
    might must have has had not no very really just like also plus whether although though unless until""".split()
)


def semantic_silence_ms(transcript: str, eagerness: str) -> int:
    """How long a pause must last to end the turn, given what was said so far.

    What it computes: a rule on the live transcript, not a language model. A
    phrase that ends in a filler ("um") or in a word that needs a continuation
    ("and", "the", "to", ...) waits the longest; a phrase that ends otherwise
    (or with . ? !) waits the shortest; before any word is recognised, the
    middle value."""
    complete, unknown, trailing = SEMANTIC_WAITS.get(eagerness, SEMANTIC_WAITS["auto"])
    text = transcript.strip()
    if not text:
        return unknown
    if text[-1] in ".?!":
        return complete
    last = text.split()[-1].strip(",;:-").lower()
    return trailing if last in TRAILING or text[-1] in ",;:-" else complete


def make_detector(td: TurnDetection, origin_ms: float) -> TurnDetector:
    """A detector for ``td``: ``server_vad`` waits ``silence_duration_ms``; ``semantic_vad``
    starts at the middle wait and follows the transcript (``semantic_silence_ms``)."""
    if td.type == "semantic_vad":
        return TurnDetector(0.5, 300, semantic_silence_ms("", td.eagerness), origin_ms=origin_ms)
    return TurnDetector(td.threshold, td.prefix_padding_ms, td.silence_duration_ms, origin_ms=origin_ms)
