"""Tenants: who a principal is, what it may use, and its limits.

Every caller is a *principal* (``key:<12 hex>`` for a key from ``api_keys``,
``tenant:<name>`` for a key from the keys file, ``jwt:<sub>`` for a bearer
token, ``anonymous`` when auth is off); a client secret carries the principal
that minted it. A principal's ``Tenant`` says what it may do:

- ``limits`` (``TenantLimits``): enforced across every replica through the
  store (``gateway/quotas.py``); ``0`` means no limit;
- ``models``: the models it may open sessions on (None: any);
- ``admin``: whether it may call ``/admin/*`` and read ``/metrics`` (keys from
  ``api_keys``, and keys-file entries marked ``"admin": true``);
- ``label``: its name on per-tenant metrics, from a bounded set: the keys
  file's names, and ``other`` for everyone else.

The keys file (setting ``keys_file``: a path, or the JSON itself) lists
tenants, each with the sha256 (hex) of one or more keys, so it holds no key:

```json
{"tenants": [
  {"name": "acme", "key_sha256": ["<sha256 hex of the key>"],
   "limits": {"max_sessions": 20, "session_starts_per_min": 60, "audio_in_s_per_min": 600,
              "audio_out_s_per_min": 600, "events_per_s": 100, "max_secrets": 100, "max_state_mib": 256,
              "max_kept_sessions": 100, "kept_session_ttl_s": 600},
   "models": ["omni-cascade"], "admin": false}
]}
```

A limit a tenant does not name is the settings' default (``tenant_*``).

The keys file is read at start: a key or tenant removed from it (then a restart)
is revoked, with the client secrets it minted (``gateway/auth.py`` records the
minting key's hash in each secret and checks it when the secret is used).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import orjson

OTHER = "other"  # the metrics label of every principal that is not a keys-file tenant
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class TenantConfigError(ValueError):
    """A keys file, a limits object or a token's claims that cannot be used, and why."""


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """One principal's limits, summed over every replica. 0: no limit. When hit:
    ``error`` ``rate_limit_exceeded`` (docs/tenants.md)."""

    max_sessions: int = 0  # open sockets (realtime and video) at once; more: refused at connect, close 4029
    session_starts_per_min: int = 0  # sockets opened in any 60 s (a reconnect to resume counts); more:
    #   refused at connect, close 4029
    audio_in_s_per_min: float = 0.0  # input audio appended per clock minute; more: the append is dropped
    audio_out_s_per_min: float = 0.0  # output audio generated per clock minute; more: new responses fail,
    #   a running one is ended ``failed``
    events_per_s: int = 0  # client messages per clock second; more: the message is dropped
    # Client secrets (POST /v1/realtime/client_secrets), bounded by default: each is stored until
    # it is used or expires (up to 2 h), so these bound what one principal can leave in the store.
    max_secret_bytes: int = 65_536  # the minted ``session`` object, as JSON; more: HTTP 400
    #   ``client_secret_too_large``
    max_secrets: int = 1000  # minted and neither used nor expired; more: HTTP 429 ``rate_limit_exceeded``
    secret_mints_per_min: int = 600  # mints in any 60 s (a refused one is not counted); more: HTTP 429
    # The session state the store keeps for the principal (gateway/store/base.py StateQuota):
    max_state_mib: float = 0.0  # bytes of its sessions' snapshots, item records and journals, served or
    #   kept; past it a new session forgets kept ones (oldest first), and if that is not enough it is
    #   refused at open: rate_limit_exceeded, close 4029
    max_kept_sessions: int = 0  # sessions kept resumable after their close (no replica serves them);
    #   beyond it the oldest are forgotten (a resume of one: session_not_found)
    kept_session_ttl_s: float = 0.0  # how long a session's state outlives its last use: after its
    #   close (and grace) it is forgotten this much later (at least 60 s; at most journal_ttl_s)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def merged(self, raw: Any, where: str) -> TenantLimits:
        """These limits with ``raw`` (a JSON object of some of them) applied on top."""
        if raw is None:
            return self
        if not isinstance(raw, Mapping):
            raise TenantConfigError(f"{where} must be an object of limits ({', '.join(self.names())})")
        changes: dict[str, Any] = {}
        for name, value in raw.items():
            if name not in self.names():
                raise TenantConfigError(f"{where}.{name}: unknown limit; use one of {', '.join(self.names())}")
            floating = isinstance(getattr(self, name), float)
            ok = isinstance(value, int | float) if floating else isinstance(value, int)
            if isinstance(value, bool) or not ok or value < 0:
                kind = "a number" if floating else "an integer"
                raise TenantConfigError(f"{where}.{name} must be {kind} >= 0 (0: no limit), not {value!r}")
            changes[name] = float(value) if floating else value
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class Tenant:
    label: str = OTHER
    limits: TenantLimits = TenantLimits()
    models: frozenset[str] | None = None  # None: every model
    admin: bool = False

    def allows_model(self, model: str) -> bool:
        return self.models is None or model in self.models

    def to_dict(self) -> dict[str, Any]:
        """For a client secret's stored grant (``from_dict`` reads it back)."""
        limits = {f: getattr(self.limits, f) for f in TenantLimits.names()}
        models = sorted(self.models) if self.models is not None else None
        return {"label": self.label, "limits": limits, "models": models, "admin": self.admin}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Tenant:
        models = raw.get("models")
        return cls(
            label=str(raw.get("label", OTHER)),
            limits=TenantLimits().merged(raw.get("limits"), "limits"),
            models=frozenset(models) if models is not None else None,
            admin=bool(raw.get("admin", False)),
        )


def parse_models(raw: Any, where: str) -> frozenset[str] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(m, str) and m for m in raw):
        raise TenantConfigError(f"{where} must be a list of model names")
    return frozenset(raw)


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class KeyEntry:
    principal: str
    tenant: Tenant


class KeysFile:
    """The keys file's tenants, looked up by the sha256 of a presented key."""

    def __init__(self, by_digest: dict[str, KeyEntry]) -> None:
        self._by_digest = by_digest
        self.labels = frozenset(e.tenant.label for e in by_digest.values())

    def __len__(self) -> int:
        return len(self._by_digest)

    def lookup(self, key: str) -> KeyEntry | None:
        # A dict lookup by digest: what an attacker could time is the digest of its own guess.
        return self._by_digest.get(key_digest(key))

    def lookup_digest(self, digest: str) -> KeyEntry | None:
        """By the sha256 of a key (a client secret records its minter's): None once it is removed."""
        return self._by_digest.get(digest)

    @classmethod
    def parse(cls, source: str | None, defaults: TenantLimits) -> KeysFile:
        """From a path or inline JSON (``None``: no tenants). Raises TenantConfigError."""
        if not source:
            return cls({})
        text = source if source.lstrip().startswith(("{", "[")) else _read(source)
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise TenantConfigError(f"keys_file is not valid JSON: {exc}") from None
        entries = data.get("tenants") if isinstance(data, dict) else data
        if not isinstance(entries, list):
            raise TenantConfigError('keys_file must be {"tenants": [...]} (or a list of tenants)')
        by_digest: dict[str, KeyEntry] = {}
        names: set[str] = set()
        for i, raw in enumerate(entries):
            where = f"tenants[{i}]"
            if not isinstance(raw, dict):
                raise TenantConfigError(f"{where} must be an object")
            unknown = set(raw) - {"name", "key_sha256", "limits", "models", "admin"}
            if unknown:
                raise TenantConfigError(f"{where}: unknown fields {sorted(unknown)}")
            name = raw.get("name")
            if not isinstance(name, str) or not _NAME.match(name) or name == OTHER:
                raise TenantConfigError(
                    f"{where}.name must be 1-64 letters, digits, '_', '.', '-' (and not {OTHER!r}), not {name!r}"
                )
            if name in names:
                raise TenantConfigError(f"{where}.name {name!r} appears twice: list all its keys in one entry")
            names.add(name)
            digests = raw.get("key_sha256")
            digests = [digests] if isinstance(digests, str) else digests
            if not isinstance(digests, list) or not digests:
                raise TenantConfigError(f"{where}.key_sha256 must be the sha256 hex of a key, or a list of them")
            tenant = Tenant(
                label=name,
                limits=defaults.merged(raw.get("limits"), f"{where}.limits"),
                models=parse_models(raw.get("models"), f"{where}.models"),
                admin=raw.get("admin", False) is True,
            )
            for digest in digests:
                if not isinstance(digest, str) or not _HEX64.match(digest.lower()):
                    raise TenantConfigError(f"{where}.key_sha256: {digest!r} is not 64 hex digits")
                if digest.lower() in by_digest:
                    raise TenantConfigError(f"{where}.key_sha256: a key hash listed twice")
                by_digest[digest.lower()] = KeyEntry("tenant:" + name, tenant)
        return cls(by_digest)


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise TenantConfigError(f"cannot read keys_file {path!r}: {exc.strerror}") from None
