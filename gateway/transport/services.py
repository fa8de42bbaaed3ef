"""What the transport needs of the process it runs in, as protocols.

The runtime (the composition root) provides them; the transport never imports
it. Each endpoint names the little more it needs (``RealtimeServices`` in
realtime.py, ``VideoServices`` in video.py).
"""

from __future__ import annotations

from typing import Protocol

from gateway.auth import Authenticator
from gateway.hosting.context import HostContext
from gateway.origins import OriginPolicy
from gateway.quotas import Quotas
from gateway.settings import Settings


class Services(Protocol):
    """What the handshake needs: settings, auth, admission, and hosting (whose metrics it reports to)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def auth(self) -> Authenticator: ...

    @property
    def origins(self) -> OriginPolicy:
        """Which web pages may open sockets (checked at the upgrade)."""

    @property
    def hosting(self) -> HostContext:
        """The sessions served here (and the metrics every part reports to)."""

    @property
    def quotas(self) -> Quotas:
        """Tenant limits on this replica (admission at connect, budgets as sessions go)."""

    @property
    def draining(self) -> bool:
        """Shutting down: new sessions are refused (close 1012)."""

    def session_count(self) -> int:
        """Sessions open on this replica, realtime and video (bounded by ``max_sessions``)."""
