"""A connection as hosting sees it: something that writes what it is given, in order, and closes.

Every transport implements it (a WebSocket, a WebRTC call's data channel and
audio track). Hosting decides what goes out and when (journal order, holds,
the commit gate, replays, connection events); the peer only writes, so a new
transport is a new ``Peer`` and nothing else of hosting changes.
"""

from __future__ import annotations

from typing import Any, Protocol

from gateway.session.events import MediaEvent

__all__ = ["MediaEvent", "Peer"]  # MediaEvent: for the transports, which reach the session floor only through hosting


class Peer(Protocol):
    def send(self, data: bytes, event: dict[str, Any] | None = None) -> None:
        """One server message, in order, never blocking: ``data`` is its JSON as the
        client reads it; ``event`` the same event as a dict where hosting has it (a live
        session event; a replay from the journal or a connection event has only the
        bytes). A peer may carry an event its own way (an audio delta as a binary
        frame, or on an audio track), never out of order. A peer that cannot keep up
        closes itself (4010). A connection that plays the audio itself (a door's ``media``)
        is also handed ``MediaEvent``s, with empty ``data``: they are for it alone
        (session/events.py)."""

    def close(self, code: int, reason: str) -> None:
        """Close after what was sent. Also how a peer learns it was replaced
        (``CloseCode.SESSION_REPLACED``, after hosting said so in the client's dialect)."""
