"""What the session asks its I/O shell to do (the session itself does no I/O).

The shell executes effects in the order they were produced. Request ids are
the session's: ``input_<item id>`` for the transcription of a user item,
``<response id>`` for a response.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.engine import EngineInput, ResponseRequest, TranscriptionRequest


@dataclass(frozen=True, slots=True)
class StartTranscription:
    request: TranscriptionRequest


@dataclass(frozen=True, slots=True)
class StartResponse:
    request: ResponseRequest
    turn_started_at: float | None  # clock() when the user's speech stopped (metrics)


@dataclass(frozen=True, slots=True)
class Feed:
    """A streaming input chunk for a running request."""

    request_id: str
    chunk: EngineInput


@dataclass(frozen=True, slots=True)
class EndInput:
    """The final marker: no more input for this request."""

    request_id: str


@dataclass(frozen=True, slots=True)
class Cancel:
    """Abort the request; no final marker is sent."""

    request_id: str


@dataclass(frozen=True, slots=True)
class CloseSocket:
    """Close the client's connection (the session is over: it expired)."""

    code: int
    reason: str


Effect = StartTranscription | StartResponse | Feed | EndInput | Cancel | CloseSocket
