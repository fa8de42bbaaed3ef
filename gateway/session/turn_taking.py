"""Turn-taking: the decisions a dialect makes about turns, behind one interface.

The parts of a session (input audio, responses) do not decide what speech over
an answer does, how a turn server VAD ended is committed, whether and when a
turn is answered, or what happens around the end of the conversation's
answer: they call the session's ``TurnTaking`` at those moments
(``InputTurns``, ``ResponseTurns``). A dialect may also spell its events its
own way (``spelling``, applied by the event log to every event).

``RealtimeTurns`` is the OpenAI Realtime API's: server VAD barges in when
``interrupt_response``, a turn is committed and answered at once, events are
sent as the parts emit them. The duplex dialect's is ``DuplexTurns``
(duplex_turns.py). A turn-taking is built before the parts it steers and given
them once (``bind``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gateway.protocol import client_events as ce
from gateway.protocol.session_config import SessionConfig
from gateway.session.events import EventLog, Spelling
from gateway.session.history import History
from gateway.session.input import InputAudio, InputTurns
from gateway.session.response import Response
from gateway.session.responses import Responses, ResponseTurns


@dataclass(frozen=True, slots=True)
class Parts:
    """The parts of one session, as a turn-taking is given them."""

    log: EventLog
    history: History
    input: InputAudio
    responses: Responses


class TurnTaking(InputTurns, ResponseTurns, Protocol):
    """What a dialect decides (see the module docstring)."""

    config: SessionConfig  # the session's, set again on every update

    @property
    def spelling(self) -> Spelling | None:
        """The dialect's spelling step, or None: events go out as emitted."""

    @property
    def lazy_message(self) -> bool:
        """A response that may call a function opens its message on its first output
        (``Responses``); False: at once."""

    def bind(self, parts: Parts, config: SessionConfig) -> None:
        """The parts it steers, given once when the session is built."""


class RealtimeTurns:
    """The OpenAI Realtime API's turn-taking (see the module docstring)."""

    spelling: Spelling | None = None
    lazy_message = True
    message_named_by_response = False  # item ids are the API's own: item_<random>
    reports_transcripts = False  # transcripts only with input_audio_transcription

    def bind(self, parts: Parts, config: SessionConfig) -> None:
        self.config = config
        self._log = parts.log
        self._input = parts.input
        self._responses = parts.responses

    def speech_during_response(self) -> None:
        """Barge in when ``interrupt_response``."""
        td = self.config.turn_detection
        if td is not None and td.interrupt_response:
            # Barge-in: the answer stops where it is; the client truncates what it played.
            self._log.epoch += 1
            self._responses.end_current("cancelled", {"type": "cancelled", "reason": "turn_detected"}, cancel=True)

    def commit_turn(self, event_id: str | None) -> bool:
        return self._input.commit(event_id, manual=False)

    def answer(self, params: ce.ResponseParams, event_id: str | None, turn_started_at: float | None = None) -> None:
        self._responses.create(params, event_id, turn_started_at)

    def answer_ending(self, resp: Response, status: str) -> None:
        pass

    def answer_ended(self, resp: Response, status: str) -> None:
        pass
