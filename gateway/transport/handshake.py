"""The WebSocket handshake both endpoints share: accept, authenticate, refuse.

A refusal is sent *after* accepting, as an error event and a close code the
client can read (a browser cannot read an HTTP status from a failed upgrade).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from gateway.auth import Grant
from gateway.protocol.errors import CloseCode, Code
from gateway.store.base import StoreError
from gateway.transport.services import Services

Refusal = tuple[str, str, int]  # code, message, close code


@dataclass(frozen=True, slots=True)
class Handshake:
    headers: dict[str, str]  # lower-cased names
    offered: list[str]  # subprotocols the client offered
    query: dict[str, list[str]]
    grant: Grant | None  # None: refused credentials
    store_down: bool = False  # a client secret could not be checked: the store is unavailable

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None


async def accept(
    runtime: Services, scope: dict[str, Any], receive: Any, send: Any, choose: Callable[[list[str]], str | None]
) -> Handshake | None:
    """Accept the socket (echoing ``choose(offered)``) and authenticate; None if not a connect."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return None
    # One Sec-WebSocket-Protocol header may list several, comma separated: uvicorn before
    # 0.51 hands the header over unsplit.
    offered = [name.strip() for entry in scope.get("subprotocols") or [] for name in entry.split(",") if name.strip()]
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    await send({"type": "websocket.accept", "subprotocol": choose(offered)})
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    try:
        grant = await runtime.auth.authenticate(headers, offered)
    except StoreError:
        return Handshake(headers, offered, query, None, store_down=True)
    if grant is None:
        runtime.metrics.auth_failures.inc()
    return Handshake(headers, offered, query, grant)


def common_refusal(runtime: Services, hs: Handshake) -> Refusal | None:
    """What refuses any session here: credentials, a drain, the session limit."""
    if hs.store_down:
        return (
            Code.STORE_UNAVAILABLE,
            "Client secrets cannot be checked now (session state is unavailable); try again shortly.",
            CloseCode.TRY_AGAIN_LATER,
        )
    if hs.grant is None:
        return (
            Code.UNAUTHORIZED,
            "Missing or invalid credentials: send 'Authorization: Bearer <API key>' or the "
            "subprotocol 'openai-insecure-api-key.<API key or client secret>'.",
            CloseCode.UNAUTHORIZED,
        )
    if runtime.draining:
        return Code.SERVER_BUSY, "This replica is shutting down; reconnect.", CloseCode.SERVICE_RESTART
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
    runtime.metrics.closes.labels(str(int(close_code))).inc()
