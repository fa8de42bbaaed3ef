"""Server VAD turn detection (pure): speech probabilities in, turn events out.

The speech model (silero) gives one probability per 32 ms frame. A turn
starts at the first frame at or above ``threshold`` and ends once the
probability has stayed below ``threshold - HYSTERESIS`` for
``silence_duration_ms``; the reported start is moved back by
``prefix_padding_ms`` (never before the session's audio began) so that the
committed audio keeps the onset of the first word.
"""

from __future__ import annotations

from dataclasses import dataclass

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
