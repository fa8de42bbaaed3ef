"""Who answers an incoming SIP call: the seam between the SIP floor and call control.

The SIP server asks a ``CallControl`` what to do with each INVITE it admitted (the guard let it
through, its SDP can be answered), while the call rings (180 Ringing, at most
``sip_ring_timeout_s``: then 480 Temporarily Unavailable). The answer is an ``Accept`` (the
call is answered 200 OK and a session opens, with ``session`` settings over the default ones)
or a ``Reject`` (its ``status_code`` is the SIP final response: 486 Busy Here, 603 Decline...).
An accepted call is then admitted against its tenant's session limits (the accepting
credential's, ``Accept.grant``; the default session's: the operator's), as a socket is: over
one, 486 Busy Here (``server.admit``).

``DefaultAnswer`` is the control used when no webhook is configured: every admitted call is
answered with the configured default session (``sip_session``). With ``call_webhook_url``
set, ``WebhookControl`` is OpenAI's call control (the ``realtime.call.incoming`` webhook,
then ``POST /v1/realtime/calls/{call_id}/accept`` or ``/reject``; with ``call_webhook_live``
also GPT-Live's ``live.transport.incoming``, then ``/v1/live/sessions/{id}/accept`` or
``/reject``: the accept that comes first chooses the dialect), written once for every
transport that carries a phone call (``gateway/hosting/incoming.py``).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.auth import Grant
from gateway.hosting.context import HostContext
from gateway.hosting.incoming import Rejected, Webhook, announce, forget, new_call_id, session_of
from gateway.protocol.dialects import GA, Dialect

log = logging.getLogger("omni.sip")

_AUTHORIZATION = frozenset({"authorization", "proxy-authorization"})
REFER_TIMEOUT_S = 8.0  # the trunk's answer to a REFER; none: the REST refer is told 504
REFER_ASK = "sip.refer"  # a /refer relayed to the replica holding the call (gateway/hosting/ask.py)
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
    srtp: bool = False  # its media is SDES-SRTP (the SDP answer keeps it so)


@dataclass(frozen=True, slots=True)
class Accept:
    session: dict[str, Any] | None = None  # session settings over the default session's (as ``/accept`` takes)
    principal: str | None = None  # whose session it is (the accepting credential's); None: the default's
    session_id: str | None = None  # the session's id (the one the webhook's call_id names); None: a new one
    model: str | None = None  # the model it serves; None: ``sip_model``
    dialect: Dialect = GA  # what its session speaks (GPT-Live's: opened with ``session`` as its start settings)
    call_id: str | None = None  # the id its controls and sideband name it by; None: ``rtc_`` + the session's
    grant: Grant | None = None  # the accepting credential: its tenant's limits admit the call; None: the default's
    # Told once the call's session opened (True) or will not (False): the webhook's accept answers then.
    settle: Callable[[bool], Awaitable[None]] | None = None


@dataclass(frozen=True, slots=True)
class Reject:
    status_code: int = 603  # a SIP final response code, 400-699
    reason: str = "Decline"


class CallControl(Protocol):
    async def incoming(self, call: IncomingCall) -> Accept | Reject:
        """Decide on ``call`` (awaited while it rings; cancelled if the caller gives up, or at
        the ring timeout)."""


class WebhookControl:
    """``call_webhook_url`` set: each call is announced as ``realtime.call.incoming`` (its
    ``call_id``, the one its session's sideband, hangup and refer then use, and the INVITE's
    ``sip_headers`` as name/value pairs) and rings until ``/accept`` or ``/reject`` reaches
    any replica (``gateway/hosting/incoming.py``, as for a carrier's phone call). A reject's
    ``status_code`` is the SIP final response (603 Decline without one); no answer within
    ``call_accept_timeout_s``: 480; the announcement failing: 503."""

    def __init__(self, ctx: HostContext, webhook: Webhook) -> None:
        self.ctx = ctx
        self.webhook = webhook

    async def incoming(self, call: IncomingCall) -> Accept | Reject:
        call_id = new_call_id()
        headers = [{"name": name, "value": value} for name, value in call.sip_headers]
        # (GPT-Live's names no authorization header: "excluding SIP authorization headers")
        live = {"type": "sip", "sip_headers": [h for h in headers if h["name"].lower() not in _AUTHORIZATION],
                "sip_media_security": "srtp" if call.srtp else "rtp"}  # fmt: skip
        waiting = await announce(self.ctx, self.webhook, call_id, {"sip_headers": headers}, live=live)
        if isinstance(waiting, str):
            log.warning("sip: call %s from %s refused: %s", call.call_id, call.source, waiting)
            return Reject(503, "Service Unavailable")
        log.info("sip: call %s from %s announced as %s", call.call_id, call.source, call_id)
        try:
            answer = await waiting.wait(self.webhook.accept_timeout_s)
        finally:
            forget(self.ctx, call_id)
        if isinstance(answer, Rejected):
            if answer.reason != "rejected":  # (no answer in time)
                return Reject(480, "Temporarily Unavailable")
            return Reject(answer.status_code or 603, "Decline" if answer.status_code is None else "Rejected")
        model = answer.session.get("model")
        return Accept(session=answer.session, principal=answer.grant.principal,
                      session_id=answer.session_id or session_of(call_id),
                      model=model if isinstance(model, str) and model else None, dialect=answer.dialect,
                      call_id=answer.session_id, grant=answer.grant, settle=waiting.settle)  # fmt: skip


class DefaultAnswer:
    """No webhook: every admitted call is answered with the default session."""

    async def incoming(self, call: IncomingCall) -> Accept | Reject:
        return Accept()
