"""The connection a session host talks to, as narrow as the host needs it.

The transport's ``Connection`` implements it; the host never sees a socket, the
app or the runtime, so it can be driven in a unit test by any object with these
methods.
"""

from __future__ import annotations

from typing import Any, Protocol


class Peer(Protocol):
    def send(self, event: dict[str, Any], data: bytes) -> None:
        """One session event (``data``: its JSON in the client's dialect), in order.
        Never blocks; while the peer holds, the event waits behind the hold."""

    def hold(self) -> None:
        """Hold live events until ``release`` (holds nest)."""

    def release(self, after_seq: int) -> None:
        """End one hold; at the last, send what was held with a seq above ``after_seq``."""

    def replay(self, data: bytes) -> None:
        """One journaled event, sent again as it was first sent (not held)."""

    def replaced(self, session_id: str) -> None:
        """Another connection took the session: say so and close (4009)."""

    def close(self, code: int, reason: str) -> None:
        """Close after what is queued."""

    def committed(self, seq: int) -> None:
        """The store holds the session's events up to ``seq`` (a peer that sends only
        committed events, the duplex dialect's, may send those now)."""
