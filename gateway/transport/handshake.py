"""The WebSocket handshake both endpoints share: origin, credentials, accept, refuse.

Two kinds of refusal, told apart by what the client can do about them:

- **At the upgrade** (before any 101), with an HTTP status and a JSON body in
  OpenAI's error shape (``{"error": {"type", "code", "message", "param"}}``):
  an ``Origin`` not allowed (403 ``origin_not_allowed``, checked first, so a
  refused page never consumes a client secret) and refused credentials (401
  ``unauthorized``). This needs ASGI's ``websocket.http.response`` extension
  (uvicorn has it; older releases, 0.35 among them, put their own ``text/plain``
  Content-Type ahead of ours); on a server without it the socket is accepted,
  gets the same ``error`` event and closes 4003 / 4001. A browser never sees an
  upgrade's status: its ``WebSocket`` only reports a failed connection (close
  1006), so the browser SDK probes ``/healthz`` and says ``refused`` (the
  gateway is up) or ``connect_failed``. A client secret the store cannot check
  just now is accepted and closed 1013 ``store_unavailable``, to be retried.
- **After accepting** (``common_refusal`` and the endpoints' own): an ``error``
  event and a close code any client can read, for what is worth retrying or
  fixing in the request (drain 1012, replica full 1013, unknown model 4004,
  a model the credential may not use 4003 (a client secret's other model or
  endpoint too: ``minted_refusal``), tenant limits 4029: ``admit_seat``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import orjson

from gateway.auth import CredentialsUnavailable, Grant, TokenRefused
from gateway.protocol.errors import CloseCode, Code
from gateway.quotas import AdmissionUnavailable, ConnectRefusal, Seat
from gateway.transport.services import Services

Refusal = tuple[str, str, int]  # code, message, close code
HTTP_RESPONSE_EXTENSION = "websocket.http.response"  # ASGI: answer the upgrade with a plain HTTP response

UNAUTHORIZED_MESSAGE = (
    "Missing or invalid credentials: send 'Authorization: Bearer <API key or token>' or the "
    "subprotocol 'openai-insecure-api-key.<API key, client secret or token>'."
)


@dataclass(frozen=True, slots=True)
class UpgradeRefusal:
    """A refusal answered at the HTTP upgrade (or, without the extension, after accepting)."""

    status: int
    code: str
    message: str
    close_code: int

    def body(self) -> bytes:
        return orjson.dumps(
            {"error": {"type": "invalid_request_error", "code": self.code, "message": self.message, "param": None}}
        )


@dataclass(frozen=True, slots=True)
class Handshake:
    headers: dict[str, str]  # lower-cased names
    offered: list[str]  # subprotocols the client offered
    query: dict[str, list[str]]
    grant: Grant  # who connected

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None


ErrorEncoder = Callable[[str, str], bytes]  # (code, message) -> the endpoint's error event


def offered_subprotocols(scope: dict[str, Any]) -> list[str]:
    """The subprotocols a socket's client offered. One Sec-WebSocket-Protocol header may list
    several, comma separated: uvicorn before 0.51 hands the header over unsplit."""
    return [name.strip() for entry in scope.get("subprotocols") or [] for name in entry.split(",") if name.strip()]


def request_headers(scope: dict[str, Any]) -> dict[str, str]:
    """The request's headers, names lower-cased."""
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


async def accept(
    runtime: Services,
    scope: dict[str, Any],
    receive: Any,
    send: Any,
    choose: Callable[[list[str]], str | None],
    error_event: ErrorEncoder,
) -> Handshake | None:
    """Check the origin and the credentials, then accept the socket (echoing
    ``choose(offered)``). None: not a connect, or refused (already answered). A draining
    replica refuses every upgrade with 503 (``Retry-After: 0``), before anything else:
    a balancer that retries a 503 (nginx's ``proxy_next_upstream http_503``) takes the
    connection to another replica, and the client never sees this one."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return None
    offered = offered_subprotocols(scope)
    headers = request_headers(scope)
    refusal: UpgradeRefusal | None = None
    grant: Grant | None = None
    origin = headers.get("origin")
    if runtime.draining:
        refusal = UpgradeRefusal(503, Code.SERVER_BUSY, DRAINING_MESSAGE, CloseCode.SERVICE_RESTART)
    elif not runtime.origins.allows(origin, headers.get("host")):
        refusal = UpgradeRefusal(
            403,
            Code.ORIGIN_NOT_ALLOWED,
            f"Pages from {origin!r} may not open sockets here (see the allowed_origins setting).",
            CloseCode.FORBIDDEN,
        )
    else:
        try:
            grant = await runtime.auth.authenticate(headers, offered)
        except TokenRefused as exc:  # a good signature, but not acceptable here: the holder learns why
            runtime.hosting.metrics.auth_failures.inc()
            refusal = UpgradeRefusal(401, Code.UNAUTHORIZED, exc.message, CloseCode.UNAUTHORIZED)
        except CredentialsUnavailable:
            # A client secret that cannot be checked now: worth retrying, so a readable close.
            await send({"type": "websocket.accept", "subprotocol": None})
            message = "Client secrets cannot be checked now (session state is unavailable); try again shortly."
            refusal_ = (Code.STORE_UNAVAILABLE, message, CloseCode.TRY_AGAIN_LATER)
            await refuse(runtime, send, refusal_, error_event(Code.STORE_UNAVAILABLE, message))
            return None
        if grant is None and refusal is None:
            runtime.hosting.metrics.auth_failures.inc()
            refusal = UpgradeRefusal(401, Code.UNAUTHORIZED, UNAUTHORIZED_MESSAGE, CloseCode.UNAUTHORIZED)
    if refusal is not None:
        await refuse_upgrade(runtime, scope, send, refusal, error_event)
        return None
    assert grant is not None
    await send({"type": "websocket.accept", "subprotocol": choose(offered)})
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    return Handshake(headers, offered, query, grant)


async def refuse_upgrade(
    runtime: Services, scope: dict[str, Any], send: Any, refusal: UpgradeRefusal, error_event: ErrorEncoder
) -> None:
    if HTTP_RESPONSE_EXTENSION in scope.get("extensions", {}):
        headers = [(b"content-type", b"application/json")]
        if refusal.status == 401:
            headers.append((b"www-authenticate", b'Bearer realm="omni-gateway"'))
        if refusal.status == 503:
            headers.append((b"retry-after", b"0"))  # (another replica can take it now)
        await send({"type": "websocket.http.response.start", "status": refusal.status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": refusal.body()})
        runtime.hosting.metrics.upgrade_refusals.labels(refusal.code).inc()
        return
    # A server without the extension: the same refusal, as an event and a close code.
    await send({"type": "websocket.accept", "subprotocol": None})
    event = error_event(refusal.code, refusal.message)
    await refuse(runtime, send, (refusal.code, refusal.message, refusal.close_code), event)


DRAINING_MESSAGE = "This replica is shutting down; reconnect (another replica takes the session)."

VIDEO_SECRET_ON_REALTIME = (
    "This client secret was minted for /v1/realtime/video (session.type 'video'); mint one for a realtime "
    "session, or connect with an API key or token."
)


def bound_model_message(model: str) -> str:
    return f"This client secret was minted for the model {model!r}: connect with ?model={model}, or without ?model."


SIDEBAND_SECRET = (
    "A client secret opens the session it was minted for, never a call's sideband (?call_id=): connect the "
    "sideband with the key or token of the call's owner."
)


def minted_refusal(grant: Grant, *, video: bool, model: str | None, sideband: bool = False) -> Refusal | None:
    """What a client secret refuses: the other endpoint (realtime or video), a ``model``
    other than the one it was minted for (close 4003, as a model the credential may not use),
    and any ``sideband`` (a call's session is not one a secret was minted to open)."""
    minted = grant.minted
    if minted is None:
        return None
    if sideband:
        return Code.CLIENT_SECRET_WRONG_TYPE, SIDEBAND_SECRET, CloseCode.FORBIDDEN
    if video != (minted.type == "video"):
        message = (
            f"This client secret was minted for a {minted.type} session; /v1/realtime/video takes one minted "
            "with session.type 'video', or an API key or token."
            if video
            else VIDEO_SECRET_ON_REALTIME
        )
        return Code.CLIENT_SECRET_WRONG_TYPE, message, CloseCode.FORBIDDEN
    if model is not None and model != minted.model:
        return Code.MODEL_NOT_ALLOWED, bound_model_message(minted.model), CloseCode.FORBIDDEN
    return None


def common_refusal(runtime: Services, hs: Handshake) -> Refusal | None:
    """What refuses any session here after the upgrade: a drain that began since (``accept``
    refuses the upgrade itself once it has), the session limit."""
    if runtime.draining:
        return Code.SERVER_BUSY, DRAINING_MESSAGE, CloseCode.SERVICE_RESTART
    limit = runtime.settings.max_sessions
    if runtime.session_count() >= limit:
        return (
            Code.SERVER_BUSY,
            f"This replica is at its limit of {limit} sessions; try again later.",
            (CloseCode.TRY_AGAIN_LATER),
        )
    return None


async def refuse(runtime: Services, send: Any, refusal: Refusal, event: bytes) -> None:
    """Send the refusal's error event (in the endpoint's own shape) and close."""
    code, _, close_code = refusal
    await send({"type": "websocket.send", "text": event.decode()})
    await send({"type": "websocket.close", "code": int(close_code), "reason": code})
    runtime.hosting.metrics.closes.labels(str(int(close_code))).inc()


async def admit_seat(runtime: Services, hs: Handshake, send: Any, error_event: ErrorEncoder) -> Seat | None:
    """The socket's seat under its principal's limits (one store round trip when the
    principal has connect limits); None: refused and closed (4029, or 1013 when the
    store cannot say)."""
    try:
        admitted = await runtime.quotas.admit(hs.grant)
    except AdmissionUnavailable:
        message = "Session state is unavailable; try again shortly."
        await refuse(runtime, send, (Code.STORE_UNAVAILABLE, message, CloseCode.TRY_AGAIN_LATER),
                     error_event(Code.STORE_UNAVAILABLE, message))  # fmt: skip
        return None
    if isinstance(admitted, ConnectRefusal):
        refusal = (admitted.code, admitted.message, CloseCode.RATE_LIMITED)
        await refuse(runtime, send, refusal, error_event(admitted.code, admitted.message))
        return None
    return admitted
