"""API keys and short-lived client secrets.

A client proves itself with an API key or a client secret minted by
``POST /v1/realtime/client_secrets`` (the GA shape), sent either as
``Authorization: Bearer <value>`` or, from a browser that cannot set headers,
as the WebSocket subprotocol ``openai-insecure-api-key.<value>``.

Keys are compared in constant time and never logged: a caller is known by its
*principal*, ``key:<first 12 hex of sha256(key)>``. Client secrets are random
``ek_`` tokens, kept in the session store (so a secret minted on one replica
connects on any), only as their sha256, valid for ``ttl`` seconds and for one
connection (taken atomically on use: ``SessionStore.take_token``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.store.base import SessionStore
from gateway.store.memory import MemoryStore

KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
SECRET_PREFIX = "ek_"
MAX_SECRET_TTL_S = 7200  # OpenAI's own upper bound for client secrets
DEFAULT_SECRET_TTL_S = 600


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def principal_of_key(key: str) -> str:
    return "key:" + _digest(key)[:12]


@dataclass(frozen=True, slots=True)
class Grant:
    """Who connected, and the session settings their client secret carries."""

    principal: str
    session: dict[str, Any] | None = None


class SecretBox:
    """Single-use client secrets in the session store (hashes only).

    The store drops a secret ``ttl`` seconds after it was minted (its own TTL)
    and hands it out once (``take_token``); ``take`` also checks the expiry the
    secret was minted with. Store failures raise ``StoreError``.
    """

    def __init__(self, store: SessionStore | None = None) -> None:
        self.store = store or MemoryStore()  # default: this process only

    async def mint(self, grant: Grant, ttl_s: int, now: float | None = None) -> tuple[str, int]:
        now = time.time() if now is None else now
        token = SECRET_PREFIX + secrets.token_urlsafe(32)
        expires_at = int(now + ttl_s)
        payload = orjson.dumps({"principal": grant.principal, "session": grant.session, "expires_at": expires_at})
        await self.store.put_token(_digest(token), payload, ttl_s)
        return token, expires_at

    async def take(self, token: str, now: float | None = None) -> Grant | None:
        now = time.time() if now is None else now
        payload = await self.store.take_token(_digest(token))
        if payload is None:
            return None
        entry = orjson.loads(payload)
        if entry["expires_at"] < now:
            return None
        return Grant(entry["principal"], entry["session"])


class Authenticator:
    def __init__(self, api_keys: Iterable[str], *, required: bool, secrets_box: SecretBox | None = None) -> None:
        self._keys = [k.encode() for k in api_keys if k]
        self.required = required
        self.secrets = secrets_box or SecretBox()

    def check_key(self, value: str) -> str | None:
        candidate = value.encode()
        # Compare against every key so timing does not reveal which one matched.
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(candidate, key)
        return principal_of_key(value) if matched else None

    async def authenticate(self, headers: Mapping[str, str], subprotocols: Iterable[str]) -> Grant | None:
        """The caller's grant, or None when refused. Consumes a client secret (from the
        store: raises ``StoreError`` when the store cannot say)."""
        credential = None
        auth = headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            credential = auth[7:].strip()
        for proto in subprotocols:
            if proto.startswith(KEY_SUBPROTOCOL_PREFIX):
                credential = proto[len(KEY_SUBPROTOCOL_PREFIX) :]
        if credential:
            if credential.startswith(SECRET_PREFIX):
                grant = await self.secrets.take(credential)
                if grant is not None:
                    return grant
            else:
                principal = self.check_key(credential)
                if principal is not None:
                    return Grant(principal)
        # Without required auth (loopback, no keys) any credential is accepted:
        # OpenAI SDKs always send one.
        return None if self.required else Grant("anonymous")

    def authenticate_http(self, headers: Mapping[str, str]) -> Grant | None:
        """For HTTP endpoints: API keys only (a client secret cannot mint another)."""
        auth = headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            principal = self.check_key(auth[7:].strip())
            if principal is not None:
                return Grant(principal)
        return None if self.required else Grant("anonymous")
