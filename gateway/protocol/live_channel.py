"""GPT-Live's data-channel allow-lists (pure): what an untrusted WebRTC frontend may send and see.

A Live session started over WebRTC (``POST /v1/live/sessions``) may carry
``client.data_channel`` (openai-python 3.63.0's ``DataChannelConfig``):

- ``allowed_client_events``: the client event types the browser's ``oai-events``
  channel may send (``"all"``, or a list; an empty list allows none). Any other
  is refused with ``client_event_not_allowed`` (the session goes on);
- ``allowed_server_events``: the server events the channel is sent (``"all"``, or
  selectors ``{"type"}``, and for ``response.event`` ``{"type": "response.event",
  "response_event": <the Responses event's type>}``); any other is withheld from
  the channel (the sideband and the journal still have it).

Omitted, either list allows everything (the API's "existing allow-all behavior").
The lists bind the frontend's channel only: a sideband (``/attach``) is trusted and
sees and sends everything. ``ChannelPolicy.of`` builds the policy from the session's
validated ``data_channel`` (``live_config._client``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.protocol import client_events as ce
from gateway.protocol import live_events as le
from gateway.protocol.errors import ProtocolError

CLIENT_EVENT_NOT_ALLOWED = "client_event_not_allowed"
PERMISSIONS_INFO = "data_channel_permissions"  # the ``info`` code that tells the channel what applies


def client_type(event: Any) -> str | None:
    """The wire type of a decoded Live client event (None: one of the gateway's extensions,
    ``session.resume`` and ``session.event_ack``, which no allow-list names)."""
    match event:
        case ce.AudioAppend():
            return "session.input_audio.append"
        case le.InputMute():
            return "session.input_audio.mute" if event.muted else "session.input_audio.unmute"
        case le.ContextAppend():
            return f"session.{event.kind}.append"
        case ce.SessionResume() | ce.EventAck():
            return None
    return le.EVENT_NAMES.get(type(event))


@dataclass(frozen=True, slots=True)
class ChannelPolicy:
    """The allow-lists of one session's frontend channel (None in a field: everything)."""

    client: frozenset[str] | None = None
    server: frozenset[str] | None = None  # plain types
    responses: frozenset[str] | None = None  # response.event's allowed nested types (with ``server``)

    @classmethod
    def of(cls, data_channel: dict[str, Any] | None) -> ChannelPolicy:
        dc = data_channel or {}
        client = dc.get("allowed_client_events")
        server = dc.get("allowed_server_events")
        if server is None or server == "all":
            return cls(client=None if client in (None, "all") else frozenset(client))
        plain = frozenset(s["type"] for s in server if s["type"] != "response.event")
        nested = frozenset(s["response_event"] for s in server if s["type"] == "response.event")
        return cls(client=None if client in (None, "all") else frozenset(client), server=plain, responses=nested)

    @property
    def open(self) -> bool:
        """Nothing is restricted."""
        return self.client is None and self.server is None

    def allows_client(self, event: Any) -> bool:
        if self.client is None:
            return True
        kind = client_type(event)
        return kind is None or kind in self.client

    def refusal(self, event: Any) -> ProtocolError:
        kind = client_type(event)
        allowed = ", ".join(sorted(self.client or ())) or "none"
        return ProtocolError(
            CLIENT_EVENT_NOT_ALLOWED,
            f"This session's data channel may not send {kind}: its client.data_channel.allowed_client_events "
            f"allow {allowed}. Send it from your server's sideband (/v1/live/sessions/{{id}}/attach) instead.",
            param="type", event_id=getattr(event, "event_id", None),
        )  # fmt: skip

    def allows_server(self, event: dict[str, Any] | None, data: bytes) -> bool:
        """Whether the channel is sent this server event (``event``: as hosting has it, or None:
        read from ``data``, a replay's or a connection event's JSON)."""
        if self.server is None:
            return True
        if event is None:
            event = orjson.loads(data)
        kind = event.get("type")
        if kind == "response.event":
            nested = event.get("event")
            return self.responses is not None and isinstance(nested, dict) and nested.get("type") in self.responses
        return kind in self.server

    def describe(self) -> str:
        """The ``info`` message that tells the frontend what applies to its channel."""
        sent = "every client event" if self.client is None else (", ".join(sorted(self.client)) or "no client event")
        if self.server is None:
            seen = "every server event"
        else:
            names = sorted(self.server) + [f"response.event ({r})" for r in sorted(self.responses or ())]
            seen = ", ".join(names) or "no server event"
        return f"This data channel may send {sent}, and is sent {seen}."
