"""Who answers an incoming SIP call: the seam between the SIP floor and call control.

The SIP server asks a ``CallControl`` what to do with each INVITE it admitted (the guard let it
through, its SDP can be answered), while the call rings (180 Ringing, at most
``sip_ring_timeout_s``: then 480 Temporarily Unavailable). The answer is an ``Accept`` (the
call is answered 200 OK and a session opens, with ``session`` settings over the default ones)
or a ``Reject`` (its ``status_code`` is the SIP final response: 486 Busy Here, 603 Decline...).

``DefaultAnswer`` is the control used when no webhook is configured: every admitted call is
answered with the configured default session (``sip_session``). OpenAI's call control (the
``realtime.call.incoming`` webhook, then ``POST /v1/realtime/calls/{call_id}/accept`` or
``/reject``) plugs in here as another ``CallControl``: it sends the webhook with
``IncomingCall.call_id`` and ``sip_headers``, and resolves the call's awaitable when the
backend accepts or rejects it.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any, Protocol

RINGING_PREFIX = "sip_"  # a ringing call's id (the session's own call id, rtc_..., comes once it is accepted)


def ringing_id() -> str:
    return RINGING_PREFIX + secrets.token_hex(10)


@dataclass(frozen=True, slots=True)
class IncomingCall:
    call_id: str  # this ringing call's id, for the control to name it by (``sip_<hex>``)
    sip_call_id: str  # the INVITE's Call-ID
    source: str  # the trunk's IP address
    from_uri: str
    to_uri: str
    sip_headers: tuple[tuple[str, str], ...] = field(default=())  # every header of the INVITE, in order


@dataclass(frozen=True, slots=True)
class Accept:
    session: dict[str, Any] | None = None  # session settings over the default session's (as ``/accept`` takes)


@dataclass(frozen=True, slots=True)
class Reject:
    status_code: int = 603  # a SIP final response code, 400-699
    reason: str = "Decline"


class CallControl(Protocol):
    async def incoming(self, call: IncomingCall) -> Accept | Reject:
        """Decide on ``call`` (awaited while it rings; cancelled if the caller gives up, or at
        the ring timeout)."""


class DefaultAnswer:
    """No webhook: every admitted call is answered with the default session."""

    async def incoming(self, call: IncomingCall) -> Accept | Reject:
        return Accept()
