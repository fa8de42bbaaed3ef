"""Incoming calls announced to the operator's backend, the way OpenAI does SIP: written once,
for every transport that carries a phone call.

With ``call_webhook_url`` set, a call that arrives without a client secret is announced:
the replica holding its media POSTs ``realtime.call.incoming`` (its ``call_id`` and what
the carrier said of it) to the webhook, signed per the Standard Webhooks scheme with
``call_webhook_secret`` (``gateway/protocol/webhooks.py``), and the call waits, at most
``call_accept_timeout_s``, for the backend's answer on any replica:

- ``POST /v1/realtime/calls/{call_id}/accept`` with a session configuration: the call's
  session opens with it, for the accepting credential;
- ``POST /v1/realtime/calls/{call_id}/reject``: the call ends.

Whichever replica the answer reaches, it is delivered once: the waiting call is recorded in
the store as a single-use token naming its replica (``incoming:{call_id}``), which the
answer takes; the answer then reaches the waiting call on its replica directly, or over
the bus (``call.accept``, ``call.reject``). After the answer, the call is an ordinary
call: its sideband (``/v1/realtime?call_id=``) and ``/hangup`` work from any replica.
An accept answers once the call's session is open and in the store, where those look for
it (the backend's next step, at once): the call's transport settles it
(``IncomingCall.settle``), which answers the accept's ``ref`` (over the bus as an ``ask``'s
``answer``, ``ask.py``) after the session's first commit.

**GPT-Live** (a SIP call, with ``call_webhook_live``): the same call is also announced as
``live.transport.incoming`` (openai-python 3.63.0's ``LiveTransportIncomingWebhookEvent``:
``session_id`` ``live_<x>`` for the call ``rtc_<x>``, ``type: "sip"``, the same
``sip_headers``), as OpenAI announces one pending SIP session on both surfaces: the first
accept that succeeds, ``/v1/realtime/calls/rtc_<x>/accept`` or
``/v1/live/sessions/live_<x>/accept``, takes the call's single-use token and so chooses the
dialect its session speaks (``Accepted.dialect``); the other answers 404.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.auth import Grant
from gateway.hosting.ask import answered
from gateway.hosting.calls import CALL_PREFIX, SESSION_PREFIX, session_id_of
from gateway.hosting.context import HostContext
from gateway.hosting.host import SessionHost
from gateway.hosting.webhook_client import WebhookFailure, post_json
from gateway.protocol.dialects import GA, Dialect, by_name
from gateway.protocol.live_events import LIVE_PREFIX
from gateway.protocol.webhooks import sign_headers
from gateway.store.base import StoreError, replica_channel

log = logging.getLogger("omni.incoming")

_TOKEN = "incoming:"  # (the store's single-use token of a call waiting for its answer)

# How long an accept waits for the call's session to open and be stored (``IncomingCall.settle``).
# Past it the 200 goes anyway, the answer delivered: the call's replica died, or is too slow, and
# a sideband or hangup for the call may then answer call_id_not_found for a while.
ACCEPT_OPEN_WAIT_S = 5.0


@dataclass(frozen=True, slots=True)
class Webhook:
    """Where and how incoming calls are announced (the settings)."""

    url: str
    secret: str | None  # ``whsec_`` + base64 key; None: unsigned
    timeout_s: float  # the POST, connect to answer
    accept_timeout_s: float  # how long a call waits for accept or reject
    live: bool = False  # a SIP call is also announced as GPT-Live's ``live.transport.incoming``


@dataclass(frozen=True, slots=True)
class Accepted:
    grant: Grant  # the accepting credential's: the session is its
    session: dict[str, Any]  # the session configuration it sent
    dialect: Dialect = GA  # what the call's session speaks (the accept endpoint's: Realtime or Live)
    session_id: str | None = None  # the session's id where the endpoint names it (Live: ``live_<x>``)


@dataclass(frozen=True, slots=True)
class Rejected:
    reason: str
    status_code: int | None = None  # the reject's SIP status (a SIP call's final response), if it gave one


Answer = Accepted | Rejected


class IncomingCall:
    """One call waiting for its answer on this replica."""

    def __init__(self, ctx: HostContext, call_id: str) -> None:
        self.ctx = ctx
        self.call_id = call_id
        self._answer: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._reply: tuple[str, str] | None = None  # the accept's (ref, replica), until settled

    def on_bus(self, body: dict[str, Any]) -> None:
        """An answer another replica took for this call."""
        kind = body.get("type")
        if kind == "call.accept" and isinstance(body.get("session"), dict) and isinstance(body.get("grant"), dict):
            session_id, ref, reply_to = body.get("session_id"), body.get("ref"), body.get("reply_to")
            try:
                dialect = by_name(str(body.get("dialect", GA.name)))
            except KeyError:
                return
            accepted = Accepted(Grant.from_dict(body["grant"]), body["session"], dialect,
                                session_id if isinstance(session_id, str) else None)  # fmt: skip
            self.answer(accepted, (ref, reply_to) if isinstance(ref, str) and isinstance(reply_to, str) else None)
        elif kind == "call.reject":
            status = body.get("status_code")
            self.answer(Rejected("rejected", status if isinstance(status, int) else None))

    def answer(self, answer: Answer, reply: tuple[str, str] | None = None) -> None:
        """``answer`` for the call; ``reply``: the accept's (ref, replica), told when it settles."""
        if not self._answer.done():
            self._answer.set_result(answer)
            self._reply = reply

    async def settle(self, opened: bool) -> None:
        """The accepted call's session opened here (``opened``) or never will: the accept that
        chose it answers now, once an opened session's first commit is in the store (where a
        sideband or hangup on any replica looks for it). Again: nothing."""
        reply, self._reply = self._reply, None
        if reply is None:
            return
        answer = self._answer.result()
        if opened and isinstance(answer, Accepted):
            host = self.ctx.hosts.get(answer.session_id or session_of(self.call_id))
            if isinstance(host, SessionHost):
                with contextlib.suppress(StoreError):  # (the store's trouble is then the sideband's to meet)
                    await host.writer.flush()
        ref, replica = reply
        message = {"type": "answer", "ref": ref, "answer": {"opened": opened}}
        if replica == self.ctx.replica_id:
            answered(self.ctx, message)
            return
        try:
            await self.ctx.store.publish(replica_channel(replica), orjson.dumps(message))
        except StoreError as exc:  # (the accept's wait runs out)
            log.warning("call %s: cannot tell its accept on %s that it settled: %s", self.call_id, replica, exc)

    async def wait(self, timeout_s: float) -> Answer:
        try:
            return await asyncio.wait_for(asyncio.shield(self._answer), timeout_s)
        except TimeoutError:
            return Rejected(f"no accept or reject within {timeout_s:g} s")


def new_call_id() -> str:
    """A call id whose session id is the one the call's session will have (``rtc_x`` -> ``sess_x``)."""
    return CALL_PREFIX + secrets.token_hex(10)


def session_of(call_id: str) -> str:
    return SESSION_PREFIX + call_id.removeprefix(CALL_PREFIX)


def live_session_of(call_id: str) -> str:
    """The GPT-Live session id a SIP call is announced with (``rtc_x`` -> ``live_x``)."""
    return LIVE_PREFIX + call_id.removeprefix(CALL_PREFIX)


def call_of_live(session_id: str) -> str | None:
    """The call a Live session id names while it waits (``live_x`` -> ``rtc_x``); None: not one."""
    if not session_id.startswith(LIVE_PREFIX):
        return None
    call_id = CALL_PREFIX + session_id.removeprefix(LIVE_PREFIX)
    return call_id if session_id_of(call_id) is not None else None


async def announce(ctx: HostContext, webhook: Webhook, call_id: str, data: dict[str, Any], *,
                   live: dict[str, Any] | None = None) -> IncomingCall | str:  # fmt: skip
    """Record the call as waiting here and POST ``realtime.call.incoming`` (and, with ``live``
    and ``webhook.live``, ``live.transport.incoming`` with those fields: a SIP call); the
    waiting call, or why the announcement failed (a log line; the call is then refused)."""
    incoming = IncomingCall(ctx, call_id)
    ctx.incoming[call_id] = incoming
    try:
        await ctx.store.put_token(_TOKEN + call_id, orjson.dumps({"replica": ctx.replica_id}),
                                  webhook.accept_timeout_s)  # fmt: skip
    except StoreError as exc:
        ctx.incoming.pop(call_id, None)
        return f"the store cannot record the call: {exc}"
    posts = [_post(webhook, "realtime.call.incoming", {"call_id": call_id, **data})]
    if live is not None and webhook.live:
        posts.append(_post(webhook, "live.transport.incoming", {"session_id": live_session_of(call_id), **live}))
    for failure in await asyncio.gather(*posts):
        if failure is not None:
            forget(ctx, call_id)
            return failure
    return incoming


async def _post(webhook: Webhook, kind: str, data: dict[str, Any]) -> str | None:
    """POST one announcement (``kind``, ``data``); None, or why it failed."""
    now = int(time.time())
    event_id = "evt_" + secrets.token_hex(12)
    event: dict[str, Any] = {"object": "event", "id": event_id, "type": kind, "created_at": now, "data": data}
    body = orjson.dumps(event)
    headers = {"webhook-id": event_id, "webhook-timestamp": str(now)}
    if webhook.secret:
        try:
            headers.update(sign_headers(webhook.secret, event_id, now, body))
        except ValueError as exc:
            return f"call_webhook_secret cannot sign: {exc}"
    try:
        status = await post_json(webhook.url, body, headers, timeout_s=webhook.timeout_s)
    except WebhookFailure as exc:
        return f"the call webhook failed ({kind}): {exc}"
    if not 200 <= status < 300:
        return f"the call webhook answered {status} ({kind})"
    return None


def forget(ctx: HostContext, call_id: str) -> None:
    """The call is answered, refused or gone: it waits here no more."""
    ctx.incoming.pop(call_id, None)


async def answer_call(ctx: HostContext, call_id: str, answer: Answer) -> bool:
    """Deliver the backend's answer to the call, wherever it waits; False: no such call waits
    (never announced, answered already, or its wait is over). Raises StoreError."""
    if session_id_of(call_id) is None:
        return False
    taken = await ctx.store.take_token(_TOKEN + call_id)
    if taken is None:
        return False
    replica = str(orjson.loads(taken).get("replica"))
    if not isinstance(answer, Accepted):
        return await _deliver(ctx, call_id, replica, answer, None)
    # An accept waits (bounded) for the call's transport to settle it: its session open and stored.
    ref = secrets.token_hex(8)
    settled: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    ctx.asks[ref] = settled
    try:
        if not await _deliver(ctx, call_id, replica, answer, ref):
            return False
        try:
            outcome = await asyncio.wait_for(settled, ACCEPT_OPEN_WAIT_S)
        except TimeoutError:
            log.warning("call %s: accepted, but not settled within %g s", call_id, ACCEPT_OPEN_WAIT_S)
        else:
            if not outcome.get("opened"):
                log.info("call %s: accepted, but its session did not open (see the call's replica)", call_id)
        return True
    finally:
        ctx.asks.pop(ref, None)


async def _deliver(ctx: HostContext, call_id: str, replica: str, answer: Answer, ref: str | None) -> bool:
    """``answer`` to the call waiting on ``replica`` (``ref``: where an accept waits to be
    settled); False: it waits there no more. Raises StoreError."""
    if replica == ctx.replica_id:
        local = ctx.incoming.get(call_id)
        if not isinstance(local, IncomingCall):
            return False
        local.answer(answer, (ref, replica) if ref is not None else None)
        return True
    message: dict[str, Any]
    if isinstance(answer, Accepted):
        message = {"type": "call.accept", "call_id": call_id, "session": answer.session,
                   "grant": answer.grant.to_dict(), "dialect": answer.dialect.name,
                   "session_id": answer.session_id, "ref": ref, "reply_to": ctx.replica_id}  # fmt: skip
    else:
        message = {"type": "call.reject", "call_id": call_id, "status_code": answer.status_code}
    return await ctx.store.publish(replica_channel(replica), orjson.dumps(message)) > 0
