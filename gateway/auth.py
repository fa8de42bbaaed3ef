"""Credentials: API keys, keys-file tenants, bearer JWTs and short-lived client secrets.

A client proves itself with one credential, sent either as ``Authorization:
Bearer <value>`` or, from a browser that cannot set headers, as the WebSocket
subprotocol ``openai-insecure-api-key.<value>``:

- an API key from ``api_keys`` (the operator's: principal ``key:<first 12 hex
  of sha256(key)>``, admin), compared in constant time;
- a key whose sha256 is in the keys file (``gateway/tenants.py``: principal
  ``tenant:<name>``, that tenant's limits and models);
- a JWT the user's backend minted (``gateway/jwt_auth.py``: principal ``jwt:<sub>``);
- a client secret minted by ``POST /v1/realtime/client_secrets``: random
  ``ek_`` tokens, kept in the store (so any replica takes them) only as their
  sha256, valid for ``ttl`` seconds and for one connection (taken atomically).
  It carries the grant of the principal that minted it.

Keys are never logged: a caller is known by its principal.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.jwt_auth import JwtVerifier, looks_like_jwt
from gateway.jwt_auth import TokenRefused as TokenRefused  # raised by authenticate*, for the transports
from gateway.store.base import SessionStore, StoreError
from gateway.store.memory import MemoryStore
from gateway.tenants import KeysFile, Tenant, TenantLimits

KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
SECRET_PREFIX = "ek_"
MAX_SECRET_TTL_S = 7200  # OpenAI's own upper bound for client secrets
DEFAULT_SECRET_TTL_S = 600
MAX_CREDENTIAL_CHARS = 8192  # a longer credential is refused unread


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def principal_of_key(key: str) -> str:
    return "key:" + _digest(key)[:12]


@dataclass(frozen=True, slots=True)
class Grant:
    """Who connected, what they may do, and the session settings their client secret carries."""

    principal: str
    session: dict[str, Any] | None = None
    tenant: Tenant = field(default_factory=Tenant)

    def to_dict(self) -> dict[str, Any]:
        return {"principal": self.principal, "session": self.session, "tenant": self.tenant.to_dict()}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Grant:
        return cls(raw["principal"], raw.get("session"), Tenant.from_dict(raw.get("tenant") or {}))


class SecretBox:
    """Single-use client secrets, held in the store (hashes only) so that a secret
    minted on one replica opens a socket on any; the store's TTL forgets them."""

    def __init__(self, store: SessionStore | None = None) -> None:
        self.store = store or MemoryStore()  # default: this process only

    async def mint(self, grant: Grant, ttl_s: int, now: float | None = None) -> tuple[str, int]:
        now = time.time() if now is None else now
        token = SECRET_PREFIX + secrets.token_urlsafe(32)
        expires_at = int(now + ttl_s)
        payload = orjson.dumps({"expires_at": expires_at, "grant": grant.to_dict()})
        await self.store.put_token(_digest(token), payload, ttl_s)
        return token, expires_at

    async def take(self, token: str, now: float | None = None) -> Grant | None:
        now = time.time() if now is None else now
        data = await self.store.take_token(_digest(token))
        if data is None:
            return None
        entry = orjson.loads(data)
        if entry["expires_at"] < now:
            return None
        return Grant.from_dict(entry["grant"])


class CredentialsUnavailable(Exception):
    """A client secret that cannot be checked now (the store cannot say): worth retrying."""


class Authenticator:
    def __init__(
        self,
        api_keys: Iterable[str],
        *,
        required: bool,
        store: SessionStore | None = None,
        keys_file: KeysFile | None = None,
        jwt: JwtVerifier | None = None,
        defaults: TenantLimits | None = None,
    ) -> None:
        self._keys = [k.encode() for k in api_keys if k]
        self.required = required
        self.secrets = SecretBox(store)
        self.keys_file = keys_file or KeysFile({})
        self.jwt = jwt
        defaults = defaults or TenantLimits()
        self._operator = Tenant(limits=defaults, admin=True)  # api_keys, and everyone when auth is off
        self._anonymous = Grant("anonymous", tenant=self._operator)

    def _check_key(self, value: str) -> Grant | None:
        candidate = value.encode()
        # Compare against every key so timing does not reveal which one matched.
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(candidate, key)
        if matched:
            return Grant(principal_of_key(value), tenant=self._operator)
        entry = self.keys_file.lookup(value)
        return Grant(entry.principal, tenant=entry.tenant) if entry is not None else None

    async def _check(self, credential: str, *, secrets_ok: bool) -> Grant | None:
        if len(credential) > MAX_CREDENTIAL_CHARS:
            return None
        if credential.startswith(SECRET_PREFIX):
            return await self.secrets.take(credential) if secrets_ok else None
        if looks_like_jwt(credential) and self.jwt is not None:
            verified = await self.jwt.verify(credential)
            return Grant(verified.principal, tenant=verified.tenant) if verified is not None else None
        return self._check_key(credential)

    async def authenticate(self, headers: Mapping[str, str], subprotocols: Iterable[str]) -> Grant | None:
        """The caller's grant, or None when refused. Consumes a client secret; raises
        ``CredentialsUnavailable`` when the store cannot check one now."""
        credential = _bearer(headers)
        for proto in subprotocols:
            if proto.startswith(KEY_SUBPROTOCOL_PREFIX):
                credential = proto[len(KEY_SUBPROTOCOL_PREFIX) :]
        if credential:
            try:
                grant = await self._check(credential, secrets_ok=True)
            except StoreError as exc:
                raise CredentialsUnavailable(str(exc)) from exc
            if grant is not None:
                return grant
        # Without required auth (loopback, no keys) any credential is accepted:
        # OpenAI SDKs always send one.
        return None if self.required else self._anonymous

    async def authenticate_http(self, headers: Mapping[str, str]) -> Grant | None:
        """For HTTP endpoints: keys and tokens (a client secret cannot mint another)."""
        credential = _bearer(headers)
        if credential:
            grant = await self._check(credential, secrets_ok=False)
            if grant is not None:
                return grant
        return None if self.required else self._anonymous


def _bearer(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return None
