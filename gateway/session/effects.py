"""What the session asks its I/O shell to do (the session itself does no I/O).

The shell executes effects in the order they were produced. Request ids are
the session's: ``input_<item id>`` for the transcription of a user item,
``<response id>`` for a response.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.engine import ConversationRequest, EngineInput, ResponseRequest, TranscriptionRequest


@dataclass(frozen=True, slots=True)
class StartTranscription:
    request: TranscriptionRequest


@dataclass(frozen=True, slots=True)
class StartResponse:
    request: ResponseRequest
    turn_started_at: float | None  # clock() when the user's speech stopped (metrics)


@dataclass(frozen=True, slots=True)
class StartConversation:
    """Start a conversation with an engine that takes its own turns (``Engine.converse``):
    ``Feed`` gives it the caller's audio, and its outputs go to ``session.on_turn``, its
    failure to ``session.on_turns_failed(code, message)``; ``Cancel`` ends it."""

    request: ConversationRequest


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


@dataclass(frozen=True, slots=True)
class ListMcpTools:
    """List the tools of the MCP server ``server`` (its validated tool spec, credentials
    included); the host answers ``session.mcp_listed(item_id, ...)``."""

    item_id: str  # the server's mcp_list_tools item
    server: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CallMcpTool:
    """Call tool ``name`` of the MCP server ``server`` with ``arguments`` (JSON text);
    the host answers ``session.mcp_called(item_id, ...)``. A ``Cancel`` of
    ``response_id`` cancels the call too."""

    response_id: str
    item_id: str  # the mcp_call item
    server: dict[str, Any]
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class RunResponses:
    """POST ``body`` (a Responses API request, ``stream: true``) to the gateway's Responses
    backend (the ``live_responses_*`` settings) and hand each event of its stream to
    ``session.backend_event(request_id, event)``, then the end to
    ``session.backend_ended(request_id, failure)`` (None, or its code and message). A
    ``Cancel`` of ``request_id`` drops the request: nothing more is handed back."""

    request_id: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Wake:
    """Call ``session.wake(key)`` in ``after_s`` seconds (the session keeps no clock of its
    own that runs: a dialect's timed events, such as the end of an audio fixture's playback
    or a periodic usage report). A session that ends first is not woken."""

    after_s: float
    key: str


@dataclass(frozen=True, slots=True)
class CutAudio:
    """The caller spoke (server VAD's speech start): a connection that plays the answers'
    audio itself (a WebRTC call) cuts what it still has queued, now, even of an answer
    already written. For a dialect that hears nothing back of what was played (GPT-Live:
    no items to truncate); the Realtime API's calls cut on ``speech_started`` themselves."""


@dataclass(frozen=True, slots=True)
class SendDtmf:
    """A sideband asked that ``digit`` be sent on the call (GPT-Live's ``transport.dtmf.send``): a
    connection that carries a SIP call sends it as RFC 4733 telephone-events on the call's RTP;
    the host answers ``session.dtmf_sent`` (sent, or why not)."""

    digit: str
    event_id: str | None


Effect = (
    StartTranscription
    | StartResponse
    | StartConversation
    | Feed
    | EndInput
    | Cancel
    | CloseSocket
    | ListMcpTools
    | CallMcpTool
    | RunResponses
    | Wake
    | CutAudio
    | SendDtmf
)
