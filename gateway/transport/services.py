"""What the transport needs of the process it runs in, as protocols.

The runtime (the composition root) provides them; the transport never imports
it. Each endpoint names the little more it needs (``RealtimeServices`` in
realtime.py, ``VideoServices`` in video.py).
"""

from __future__ import annotations

from typing import Protocol

from gateway.auth import Authenticator
from gateway.settings import Settings
from orchestrator.metrics import Metrics


class Services(Protocol):
    """What the handshake needs: settings, auth, metrics, admission."""

    @property
    def settings(self) -> Settings: ...

    @property
    def auth(self) -> Authenticator: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def draining(self) -> bool:
        """Shutting down: new sessions are refused (close 1012)."""

    def session_count(self) -> int:
        """Sessions open on this replica, realtime and video (bounded by ``max_sessions``)."""
