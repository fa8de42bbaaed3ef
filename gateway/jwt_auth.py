"""Bearer JWTs minted by the user's own backend, so a browser needs no call to the
gateway to get a credential.

Validated with PyJWT. Two ways to trust an issuer (either or both):

- ``jwt_secret``: a shared secret, tokens signed **HS256**;
- ``jwt_jwks``: a JWKS (a file path or an ``https://`` URL) of **RS256** or
  **ES256** public keys; a token names its key by ``kid`` (may be left out when
  the set has one key). A URL is fetched in a worker thread (never on the
  event loop) at start, every ``jwks_refresh_s``, and when a token names a
  ``kid`` not in the set (at most once per ``JWKS_MIN_REFETCH_S``, and the
  handshake waits for it at most ``JWKS_FETCH_TIMEOUT_S``). A failed fetch keeps
  the keys already held and is logged; until a first fetch succeeds, tokens
  needing the set are refused (401), nothing else is affected.

The algorithm is fixed by where the key comes from (the header's ``alg`` must
match it), so a token cannot pick an algorithm the issuer did not mean.

Claims: ``sub`` (required; the principal is ``jwt:<sub>``, at most 200
characters), ``exp`` (required; ``jwt_leeway_s`` of clock skew allowed),
``exp`` - ``iat`` (or ``exp`` - now, without ``iat``) at most ``max_lifetime_s``
(refused past it with ``TokenRefused``, whose message the client gets with its 401),
``iss`` / ``aud`` (required and checked when ``jwt_issuer`` / ``jwt_audience``
are set; a token with an ``aud`` is refused when no audience is set),
``models`` (optional: the models it may use) and ``limits`` (optional: an
object of ``TenantLimits`` fields over the settings' defaults). A token is
accepted wherever an API key is (``Authorization: Bearer``, the subprotocol
``openai-insecure-api-key.<token>``), any number of times until it expires;
it never grants admin. A client secret it mints expires with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jwt

from gateway.origins import is_loopback_host
from gateway.tenants import OTHER, Tenant, TenantConfigError, TenantLimits, parse_models

log = logging.getLogger("omni.auth")

JWKS_FETCH_TIMEOUT_S = 5.0  # one fetch of a JWKS URL; a handshake waits at most this for a refetch
JWKS_MIN_REFETCH_S = 10.0  # an unknown kid refetches the set at most this often
JWKS_MAX_BYTES = 1 << 20  # a larger JWKS document is refused
MAX_SUBJECT_CHARS = 200
JWKS_ALGORITHMS = frozenset({"RS256", "ES256"})


def looks_like_jwt(credential: str) -> bool:
    """Three base64url segments with a JSON header: never an API key or a client secret."""
    return credential.startswith("eyJ") and credential.count(".") == 2


class TokenRefused(Exception):
    """A well-signed token the gateway still refuses, for a reason its holder can act on
    (401 with ``message``: the client learns nothing it did not send)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def jwks_url_problem(source: str, *, allow_http: bool) -> str | None:
    """Why a JWKS source cannot be trusted, or None: keys fetched over plain http can be
    swapped by anyone on the path (loopback excepted: nothing is on the path)."""
    parts = urlsplit(source)
    if parts.scheme != "http" or allow_http or is_loopback_host((parts.hostname or "").lower()):
        return None
    return (f"the JWKS URL {source} is plain http: whoever is on the path could sign tokens; use https://, "
            "or set OMNI_GATEWAY_JWT_JWKS_ALLOW_HTTP=true if that network is yours")  # fmt: skip


@dataclass(frozen=True, slots=True)
class JwtGrant:
    principal: str
    tenant: Tenant
    expires_at: float  # the token's ``exp``: a client secret it mints ends by then


class JwksCache:
    """The issuer's public keys, from a file or a URL, refreshed in the background."""

    def __init__(self, source: str, refresh_s: float) -> None:
        self.source = source
        self.refresh_s = refresh_s
        self.remote = source.startswith(("https://", "http://"))
        self._keys: dict[str | None, jwt.PyJWK] = {}
        self._fetched_at = 0.0  # monotonic time of the last attempt
        self._fetching: asyncio.Task[None] | None = None
        self._loop_task: asyncio.Task[None] | None = None

    @property
    def loaded(self) -> bool:
        return bool(self._keys)

    def get(self, kid: str | None) -> jwt.PyJWK | None:
        if kid is None and len(self._keys) == 1:
            return next(iter(self._keys.values()))
        return self._keys.get(kid)

    async def start(self) -> None:
        await self.refresh()
        self._loop_task = asyncio.get_running_loop().create_task(self._refresh_loop(), name="jwks-refresh")

    async def close(self) -> None:
        for task in (self._loop_task, self._fetching):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            await self.refresh()

    async def refresh(self) -> None:
        """Fetch the set once (concurrent callers share one fetch); never raises."""
        if self._fetching is None or self._fetching.done():
            self._fetched_at = time.monotonic()
            self._fetching = asyncio.get_running_loop().create_task(self._fetch())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._fetching), JWKS_FETCH_TIMEOUT_S)

    async def refetch_for(self, kid: str | None) -> jwt.PyJWK | None:
        """A token named a key we lack: refetch (rate-limited), then look again."""
        if self.remote and time.monotonic() - self._fetched_at >= JWKS_MIN_REFETCH_S:
            await self.refresh()
        return self.get(kid)

    async def _fetch(self) -> None:
        try:
            raw = await asyncio.to_thread(self._read)
            keys = self._parse(raw)
        except Exception as exc:  # a bad fetch keeps the keys already held
            log.warning("JWKS %s not loaded (%s); keeping %d key(s) held", self.source, exc, len(self._keys))
            return
        self._keys = keys
        log.info("JWKS %s: %d key(s)", self.source, len(keys))

    def _read(self) -> bytes:
        if not self.remote:
            return Path(self.source).read_bytes()[: JWKS_MAX_BYTES + 1]
        request = urllib.request.Request(self.source, headers={"Accept": "application/json"})
        with urllib.request.urlopen(request, timeout=JWKS_FETCH_TIMEOUT_S) as response:
            return bytes(response.read(JWKS_MAX_BYTES + 1))

    @staticmethod
    def _parse(raw: bytes) -> dict[str | None, jwt.PyJWK]:
        if len(raw) > JWKS_MAX_BYTES:
            raise ValueError(f"larger than {JWKS_MAX_BYTES} bytes")
        keys: dict[str | None, jwt.PyJWK] = {}
        for key in jwt.PyJWKSet.from_dict(json.loads(raw)):
            if key.algorithm_name in JWKS_ALGORITHMS:
                keys[key.key_id] = key
        if not keys:
            raise ValueError("no RS256 or ES256 key in the set")
        return keys


class JwtVerifier:
    def __init__(
        self,
        *,
        secret: str | None,
        jwks: str | None,
        issuer: str | None,
        audience: str | None,
        leeway_s: float,
        refresh_s: float,
        defaults: TenantLimits,
        max_lifetime_s: float = 0.0,
        allow_http: bool = False,
    ) -> None:
        if not secret and not jwks:
            raise ValueError("a JwtVerifier needs jwt_secret or jwt_jwks")
        problem = jwks_url_problem(jwks, allow_http=allow_http) if jwks else None
        if problem is not None:
            raise ValueError(problem)
        self._max_lifetime = max_lifetime_s  # 0: any
        self._secret = secret or None
        self.jwks = JwksCache(jwks, refresh_s) if jwks else None
        self._issuer = issuer or None
        self._audience = audience or None
        self._leeway = leeway_s
        self._defaults = defaults

    async def start(self) -> None:
        if self.jwks is not None:
            await self.jwks.start()

    async def close(self) -> None:
        if self.jwks is not None:
            await self.jwks.close()

    async def verify(self, token: str) -> JwtGrant | None:
        """The token's principal and tenant, or None (refused; the reason is logged, the token never)."""
        try:
            header = jwt.get_unverified_header(token)
            alg = header.get("alg")
            if alg == "HS256" and self._secret is not None:
                key: Any = self._secret
            elif alg in JWKS_ALGORITHMS and self.jwks is not None:
                kid = header.get("kid")
                jwk = self.jwks.get(kid) or await self.jwks.refetch_for(kid)
                if jwk is None or jwk.algorithm_name != alg:
                    log.info("bearer token refused: no %s key %r in the JWKS", alg, kid)
                    return None
                key = jwk.key
            else:
                log.info("bearer token refused: algorithm %r is not accepted here", alg)
                return None
            claims = jwt.decode(
                token,
                key,
                algorithms=[alg],
                issuer=self._issuer,
                audience=self._audience,
                leeway=self._leeway,
                options={"require": ["exp", "sub", *(["iss"] if self._issuer else []),
                                     *(["aud"] if self._audience else [])]},
            )  # fmt: skip
            self._check_lifetime(claims)
            return self._grant(claims)
        except (jwt.PyJWTError, TenantConfigError, ValueError) as exc:
            log.info("bearer token refused: %s", exc)
            return None

    def _check_lifetime(self, claims: dict[str, Any]) -> None:
        """Refuse a token that lives longer than ``max_lifetime_s`` (``TokenRefused``)."""
        if not self._max_lifetime:
            return
        iat = claims.get("iat")
        start = iat if isinstance(iat, int | float) and not isinstance(iat, bool) else time.time()
        lifetime = float(claims["exp"]) - start
        if lifetime > self._max_lifetime:
            log.info("bearer token refused: valid for %.0f s, over jwt_max_lifetime_s (%.0f s)", lifetime,
                     self._max_lifetime)  # fmt: skip
            raise TokenRefused(
                f"This token is valid for {lifetime:.0f} s (exp - {'iat' if start is iat else 'now'}); this "
                f"gateway accepts tokens valid for at most {self._max_lifetime:.0f} s: mint a shorter-lived one."
            )

    def _grant(self, claims: dict[str, Any]) -> JwtGrant:
        sub = claims["sub"]
        if not isinstance(sub, str) or not sub or len(sub) > MAX_SUBJECT_CHARS or not sub.isprintable():
            raise TenantConfigError(f"'sub' must be 1-{MAX_SUBJECT_CHARS} printable characters")
        tenant = Tenant(
            label=OTHER,
            limits=self._defaults.merged(claims.get("limits"), "claim limits"),
            models=parse_models(claims.get("models"), "claim models"),
        )
        return JwtGrant("jwt:" + sub, tenant, float(claims["exp"]))
