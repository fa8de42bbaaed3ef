"""What every host on this replica shares, and what every host is to the rest of hosting.

A host is one session served here (``SessionHost``: realtime, any dialect;
``VideoHost``: a streaming video). Each one holds the session's ownership
lease in the store; the lease loop (``leases.py``) renews all of them in one
round trip and the bus listener (``bus.py``) hands each the messages other
replicas send about its session. Both know a host only as ``Hosted``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.hosting.mcp import McpConnector
from gateway.hosting.responses_backend import ResponsesBackend
from gateway.store.base import SessionStore
from gateway.telemetry import Telemetry
from orchestrator.metrics import Metrics


class Hosted(Protocol):
    """A session served here, as the lease loop and the bus listener see it."""

    @property
    def id(self) -> str: ...

    @property
    def fence(self) -> int:
        """The fencing token of the lease this host holds (what renewals present)."""

    @property
    def ended(self) -> bool: ...

    async def renewal_refused(self, fence: int) -> None:
        """The store would not renew the lease taken with ``fence``: sort it out (another
        replica took the session, or the lease was lost and is ours to take again)."""

    def on_bus(self, body: dict[str, Any]) -> None:
        """A message another replica sent about this session (``{"type": ...}``)."""


class Linked(Protocol):
    """A relayed sideband socket (``calls.Relay``), as the bus listener sees it."""

    def on_bus(self, body: dict[str, Any]) -> None: ...


class Restoring(Protocol):
    """The store watch (``store_watch.StoreWatch``), as a resume sees it."""

    async def restoring(self) -> bool:
        """Whether a session the store lacks may be one its owner is writing back (the store
        came back empty or from an outage a moment ago): a resume is then told to try again."""


class Closable(Protocol):
    """An open connection's door, as a drain sees it."""

    def close(self, code: int, reason: str) -> None: ...


@dataclass(slots=True)
class HostContext:
    """What every host on this replica shares."""

    store: SessionStore
    metrics: Metrics
    replica_id: str  # this process in the cluster: the owner its leases name
    lease_ttl_ms: int  # ownership lease; the lease loop renews it every third of this
    detach_grace_s: float  # a session whose connection dropped keeps running here this long
    telemetry: Telemetry | None = None  # traces (gateway/telemetry.py); None: off
    max_message_bytes: int = 15 << 20  # a client message larger than this: message_too_large (settings)
    relay_max_bytes: int = 1 << 20  # a relayed sideband's message, and its bytes in flight on the bus each
    #   way (sideband_relay_max_bytes; calls.py)
    relay_queue_bytes: int = 16 << 20  # what the owner keeps for a relayed sideband beyond that: more, 4010
    mcp: McpConnector | None = None  # reaches the sessions' MCP servers (settings mcp_*); None: MCP off
    responses: ResponsesBackend | None = None  # GPT-Live's Responses backend (live_responses_*); None: none
    # The sessions served here, by id, realtime and video: the lease loop renews their
    # leases and the bus listener finds them. A host adds itself when it takes its lease
    # and leaves when it ends.
    hosts: dict[str, Hosted] = field(default_factory=dict)
    # Every connection's door, of every transport (a drain closes them all).
    doors: set[Closable] = field(default_factory=set)
    # Sideband sockets here relayed to a session on another replica, by link id (calls.py).
    links: dict[str, Linked] = field(default_factory=dict)
    # Phone calls here waiting for the backend's accept or reject, by call id (incoming.py).
    incoming: dict[str, Linked] = field(default_factory=dict)
    # Requests another replica asked of the sessions served here, answered by the transport that
    # registered their kind (ask.py; ``sip.refer``: the SIP server's), and this replica's own
    # requests waiting for their owner's answer, by ref.
    answerers: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = field(default_factory=dict)
    asks: dict[str, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    # Fire-and-forget tasks (trims, commits before a release, re-acquires), kept
    # referenced until done.
    background: set[asyncio.Task[Any]] = field(default_factory=set)
    # Set to have the lease loop renew every lease now rather than at its period (the store
    # came back, maybe empty: what it lost is written back at once).
    renew_now: asyncio.Event = field(default_factory=asyncio.Event)
    # The store watch (store_watch.py); None: none runs (a resume that finds no session is
    # then always session_not_found).
    watch: Restoring | None = None

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task
