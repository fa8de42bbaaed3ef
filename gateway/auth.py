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
  It carries the grant of the principal that minted it and what it was minted
  for (``Minted``: the session's type, model and settings), which is the only
  session it opens.

A secret never outlives its minter: one minted with a token expires with the
token (``exp``), and one minted with a key records the key's sha256, checked
when the secret is used: a key removed from ``api_keys`` or the keys file
(then a restart) takes its secrets with it, and the secret gets the key's
tenant as it stands now. Minting is bounded per principal (``TenantLimits``:
``max_secret_bytes``, ``max_secrets`` outstanding, ``secret_mints_per_min``),
counted in the store so that the bounds hold across replicas.

Keys are never logged: a caller is known by its principal.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import math
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from gateway.jwt_auth import JwtVerifier, looks_like_jwt
from gateway.jwt_auth import TokenRefused as TokenRefused  # raised by authenticate*, for the transports
from gateway.store.base import SessionStore, StoreError
from gateway.store.memory import MemoryStore
from gateway.tenants import KeysFile, Tenant, TenantLimits

log = logging.getLogger("omni.auth")

KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
SECRET_PREFIX = "ek_"
MAX_SECRET_TTL_S = 7200  # OpenAI's own upper bound for client secrets
DEFAULT_SECRET_TTL_S = 600
MAX_CREDENTIAL_CHARS = 8192  # a longer credential is refused unread


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def principal_of_key(key: str) -> str:
    return "key:" + _digest(key)[:12]


SECRETS_OF = "secrets:"  # a principal's outstanding secrets are counted in the store under this prefix
SECRET_TYPES = ("realtime", "transcription", "video")  # what a secret may be minted for (``video``: the
#   gateway's extension, for /v1/realtime/video)


@dataclass(frozen=True, slots=True)
class Minted:
    """What a client secret was minted for: the session it opens, and the only one."""

    type: str  # one of SECRET_TYPES: the endpoint it opens (video) or the session's type
    model: str  # the only model it opens
    session: dict[str, Any] | None = None  # the session settings it was minted with (GA shape)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "model": self.model, "session": self.session}

    def binding(self) -> str:
        """What the sessions opened with such a secret carry (sha256 of what it was minted
        for): a client secret resumes only a session whose binding is its own."""
        return hashlib.sha256(orjson.dumps(self.to_dict(), option=orjson.OPT_SORT_KEYS)).hexdigest()

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Minted:
        return cls(str(raw["type"]), str(raw["model"]), raw.get("session"))


@dataclass(frozen=True, slots=True)
class Grant:
    """Who connected, what they may do, and, for a client secret, what it was minted for."""

    principal: str
    tenant: Tenant = field(default_factory=Tenant)
    minted: Minted | None = None  # a client secret's: the session it opens
    key_sha256: str | None = None  # the key that authenticated: a secret it mints dies with it
    expires_at: float | None = None  # when the credential ends (a token's exp): a secret it mints ends then

    def to_dict(self) -> dict[str, Any]:
        return {
            "principal": self.principal,
            "tenant": self.tenant.to_dict(),
            "minted": self.minted.to_dict() if self.minted is not None else None,
            "key_sha256": self.key_sha256,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Grant:
        minted = raw.get("minted")
        return cls(
            raw["principal"],
            Tenant.from_dict(raw.get("tenant") or {}),
            Minted.from_dict(minted) if minted is not None else None,
            raw.get("key_sha256"),
        )


class MintRefused(Exception):
    """A mint over one of its principal's limits: which (a ``TenantLimits`` name) and why."""

    def __init__(self, limit: str, message: str, *, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.limit, self.message, self.retry_after_s = limit, message, retry_after_s


class SecretBox:
    """Single-use client secrets, held in the store (hashes only) so that a secret
    minted on one replica opens a socket on any; the store's TTL forgets them."""

    def __init__(self, store: SessionStore | None = None) -> None:
        self.store = store or MemoryStore()  # default: this process only

    async def mint(self, grant: Grant, ttl_s: int, now: float | None = None) -> tuple[str, int]:
        """A secret for ``grant`` (its ``minted`` says for what), valid ``ttl_s`` seconds or
        until the grant's own credential ends, whichever is first. Raises MintRefused (a
        limit of the principal) or StoreError."""
        now = time.time() if now is None else now
        limits = grant.tenant.limits
        session_bytes = len(orjson.dumps(grant.minted.session)) if grant.minted is not None else 0
        if limits.max_secret_bytes and session_bytes > limits.max_secret_bytes:
            raise MintRefused(
                "max_secret_bytes",
                f"The session is {session_bytes} bytes as JSON; a client secret holds at most "
                f"{limits.max_secret_bytes} (this credential's max_secret_bytes). Send less, or set the rest "
                "with session.update once connected.",
            )
        expires_at = int(now + ttl_s)
        if grant.expires_at is not None:
            expires_at = min(expires_at, int(grant.expires_at))  # never past the token that mints it
        ttl_s = max(1, expires_at - int(now))
        token = SECRET_PREFIX + secrets.token_urlsafe(32)
        digest = _digest(token)
        if limits.max_secrets or limits.secret_mints_per_min:
            # Outstanding secrets and recent mints are counted as a connect limit is: one
            # atomic step in the store, each entry forgotten when its secret expires.
            admission = await self.store.admit_connection(
                SECRETS_OF + grant.principal, digest, max_open=limits.max_secrets,
                starts_per_min=limits.secret_mints_per_min, ttl_ms=ttl_s * 1000,
            )  # fmt: skip
            if not admission.ok:
                raise _over_limit(limits, admission.refused, admission.reset_ms)
        payload = orjson.dumps({"expires_at": expires_at, "grant": grant.to_dict()})
        await self.store.put_token(digest, payload, ttl_s)
        return token, expires_at

    async def take(self, token: str, now: float | None = None) -> Grant | None:
        now = time.time() if now is None else now
        digest = _digest(token)
        data = await self.store.take_token(digest)
        if data is None:
            return None
        entry = orjson.loads(data)
        grant = Grant.from_dict(entry["grant"])
        with contextlib.suppress(StoreError):  # used: no longer outstanding (else it lapses at its expiry)
            await self.store.release_connection(SECRETS_OF + grant.principal, digest)
        if entry["expires_at"] < now:
            return None
        return grant


def _over_limit(limits: TenantLimits, refused: str | None, reset_ms: int) -> MintRefused:
    if refused == "max_sessions":  # (the store's name for the open-entries bound)
        message = (f"This credential has {limits.max_secrets} client secrets outstanding (minted, not used, "
                   "not expired), its limit (max_secrets); use or let one expire first.")  # fmt: skip
        return MintRefused("max_secrets", message)
    retry = max(1, math.ceil(reset_ms / 1000))
    message = (f"This credential minted {limits.secret_mints_per_min} client secrets in the last minute, its "
               f"limit (secret_mints_per_min); try again in {retry} s.")  # fmt: skip
    return MintRefused("secret_mints_per_min", message, retry_after_s=retry)


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
        self._key_digests = frozenset(_digest(k) for k in api_keys if k)
        self.required = required
        self.secrets = SecretBox(store)
        self.keys_file = keys_file or KeysFile({})
        self.jwt = jwt
        defaults = defaults or TenantLimits()
        self._operator = Tenant(limits=defaults, admin=True)  # api_keys, and everyone when auth is off
        self._anonymous = Grant("anonymous", tenant=self._operator)

    def operator(self, principal: str) -> Grant:
        """A grant of the operator's tenant (``api_keys``') for ``principal``: a session the
        gateway opens by itself (a SIP call the default session answers) is admitted as one."""
        return Grant(principal, tenant=self._operator)

    def _check_key(self, value: str) -> Grant | None:
        candidate = value.encode()
        # Compare against every key so timing does not reveal which one matched.
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(candidate, key)
        if matched:
            return Grant(principal_of_key(value), tenant=self._operator, key_sha256=_digest(value))
        entry = self.keys_file.lookup(value)
        return Grant(entry.principal, tenant=entry.tenant, key_sha256=_digest(value)) if entry is not None else None

    def _key_grant(self, key_sha256: str) -> Grant | None:
        """The grant of the key with this sha256 as configured now; None: no such key any more."""
        if key_sha256 in self._key_digests:
            return Grant("key:" + key_sha256[:12], tenant=self._operator, key_sha256=key_sha256)
        entry = self.keys_file.lookup_digest(key_sha256)
        return Grant(entry.principal, tenant=entry.tenant, key_sha256=key_sha256) if entry is not None else None

    async def _take_secret(self, credential: str) -> Grant | None:
        """A client secret's grant, as its minter stands now: None when the key that minted
        it was revoked (a token's secret already expires with the token)."""
        grant = await self.secrets.take(credential)
        if grant is None:
            return None
        if grant.principal == self._anonymous.principal:  # minted with auth off: not once auth is on
            return None if self.required else grant
        if grant.key_sha256 is None:
            # Only a token mints without a key; a key's principal without its hash is not trusted.
            return None if grant.principal.startswith(("key:", "tenant:")) else grant
        current = self._key_grant(grant.key_sha256)
        if current is None or current.principal != grant.principal:
            log.info("client secret of %s refused: the key that minted it is no longer configured", grant.principal)
            return None
        return replace(current, minted=grant.minted)  # its tenant's limits and models as they are now

    async def _check(self, credential: str, *, secrets_ok: bool) -> Grant | None:
        if len(credential) > MAX_CREDENTIAL_CHARS:
            return None
        if credential.startswith(SECRET_PREFIX):
            return await self._take_secret(credential) if secrets_ok else None
        if looks_like_jwt(credential) and self.jwt is not None:
            verified = await self.jwt.verify(credential)
            if verified is None:
                return None
            return Grant(verified.principal, tenant=verified.tenant, expires_at=verified.expires_at)
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

    async def client_secret(self, credential: str) -> Grant | None:
        """A client secret's grant (consumed), whether or not auth is required: a phone call
        opens only the session a secret was minted for. None: not a valid secret. Raises
        ``CredentialsUnavailable`` when the store cannot check it now."""
        if not credential.startswith(SECRET_PREFIX) or len(credential) > MAX_CREDENTIAL_CHARS:
            return None
        try:
            grant = await self._take_secret(credential)
        except StoreError as exc:
            raise CredentialsUnavailable(str(exc)) from exc
        return grant if grant is not None and grant.minted is not None else None

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
