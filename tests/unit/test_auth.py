"""API keys, keys-file tenants, client secrets and the settings that decide whether auth is on."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from gateway.auth import (
    KEY_SUBPROTOCOL_PREFIX,
    SECRET_PREFIX,
    Authenticator,
    Grant,
    Minted,
    MintRefused,
    SecretBox,
    principal_of_key,
)
from gateway.settings import Settings, from_env, is_loopback
from gateway.store import MemoryStore
from gateway.tenants import OTHER, KeysFile, Tenant, TenantConfigError, TenantLimits

KEYS = ("sk-first-key-0001", "sk-second-key-0002")
TENANT_KEY = "sk-tenant-acme-0003"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture
def auth() -> Authenticator:
    return Authenticator(KEYS, required=True, store=MemoryStore())


def bearer(value: str) -> dict[str, str]:
    return {"authorization": f"Bearer {value}"}


def operator(key: str) -> Grant:
    return Grant(principal_of_key(key), tenant=Tenant(admin=True), key_sha256=sha(key))


# --- principals -------------------------------------------------------------------


def test_principal_names_a_key_without_revealing_it() -> None:
    principal = principal_of_key(KEYS[0])
    assert principal.startswith("key:")
    assert len(principal) == len("key:") + 12
    assert KEYS[0] not in principal
    assert principal == principal_of_key(KEYS[0])
    assert principal != principal_of_key(KEYS[1])


async def test_no_credentials_are_refused_when_auth_is_required(auth: Authenticator) -> None:
    assert await auth.authenticate({}, []) is None


async def test_wrong_key_is_refused(auth: Authenticator) -> None:
    assert await auth.authenticate(bearer("sk-wrong"), []) is None
    assert await auth.authenticate(bearer(KEYS[0] + "x"), []) is None
    assert await auth.authenticate(bearer(KEYS[0][:-1]), []) is None


@pytest.mark.parametrize("key", KEYS)
async def test_every_configured_key_is_accepted_as_bearer_with_admin_rights(auth: Authenticator, key: str) -> None:
    grant = await auth.authenticate(bearer(key), [])
    assert grant == operator(key)
    assert grant.tenant.admin and grant.tenant.label == OTHER


async def test_bearer_scheme_is_case_insensitive(auth: Authenticator) -> None:
    assert await auth.authenticate({"authorization": f"bearer {KEYS[0]}"}, []) is not None
    assert await auth.authenticate({"authorization": f"BEARER {KEYS[0]}"}, []) is not None


async def test_other_authorization_schemes_are_refused(auth: Authenticator) -> None:
    assert await auth.authenticate({"authorization": f"Basic {KEYS[0]}"}, []) is None
    assert await auth.authenticate({"authorization": KEYS[0]}, []) is None


async def test_key_in_the_browser_subprotocol_is_accepted(auth: Authenticator) -> None:
    grant = await auth.authenticate({}, ["realtime", KEY_SUBPROTOCOL_PREFIX + KEYS[1]])
    assert grant == operator(KEYS[1])


async def test_wrong_key_in_the_subprotocol_is_refused(auth: Authenticator) -> None:
    assert await auth.authenticate({}, [KEY_SUBPROTOCOL_PREFIX + "nope"]) is None
    assert await auth.authenticate({}, [KEY_SUBPROTOCOL_PREFIX]) is None


async def test_empty_configured_key_never_matches() -> None:
    auth = Authenticator(["", KEYS[0]], required=True, store=MemoryStore())
    assert await auth.authenticate(bearer(""), []) is None
    assert await auth.authenticate({"authorization": "Bearer "}, []) is None


async def test_a_credential_longer_than_8192_characters_is_refused_unread(auth: Authenticator) -> None:
    assert await auth.authenticate(bearer("k" * 8193), []) is None


async def test_without_required_auth_anything_is_accepted_as_anonymous() -> None:
    auth = Authenticator((), required=False, store=MemoryStore())
    assert (await auth.authenticate({}, [])).principal == "anonymous"  # type: ignore[union-attr]
    assert (await auth.authenticate(bearer("sk-whatever-an-sdk-sends"), [])).principal == "anonymous"  # type: ignore[union-attr]


async def test_without_required_auth_a_real_key_still_names_its_principal() -> None:
    auth = Authenticator(KEYS, required=False, store=MemoryStore())
    assert await auth.authenticate(bearer(KEYS[0]), []) == operator(KEYS[0])


async def test_http_auth_takes_keys(auth: Authenticator) -> None:
    assert await auth.authenticate_http(bearer(KEYS[0])) == operator(KEYS[0])
    assert await auth.authenticate_http({}) is None
    assert await auth.authenticate_http(bearer("bad")) is None


async def test_http_auth_refuses_a_client_secret(auth: Authenticator) -> None:
    token, _ = await auth.secrets.mint(operator(KEYS[0]), 60)
    assert await auth.authenticate_http(bearer(token)) is None
    assert await auth.authenticate(bearer(token), []) is not None  # it was not spent by the refusal


# --- keys-file tenants ------------------------------------------------------------------


def keys_file(**entry: object) -> str:
    import orjson

    base = {"name": "acme", "key_sha256": sha(TENANT_KEY)}
    return orjson.dumps({"tenants": [{**base, **entry}]}).decode()


async def test_a_keys_file_key_is_its_tenant_with_its_limits_models_and_no_admin() -> None:
    defaults = TenantLimits(max_sessions=9, events_per_s=50)
    keys = KeysFile.parse(keys_file(limits={"max_sessions": 2}, models=["tone"]), defaults)
    auth = Authenticator(KEYS, required=True, store=MemoryStore(), keys_file=keys, defaults=defaults)
    grant = await auth.authenticate(bearer(TENANT_KEY), [])
    assert grant is not None
    assert grant.principal == "tenant:acme"
    assert grant.tenant.label == "acme"
    assert grant.tenant.limits == TenantLimits(max_sessions=2, events_per_s=50)  # the rest from the defaults
    assert grant.tenant.allows_model("tone") and not grant.tenant.allows_model("omni-cascade")
    assert not grant.tenant.admin
    assert await auth.authenticate(bearer(TENANT_KEY + "x"), []) is None
    assert (await auth.authenticate_http(bearer(TENANT_KEY))) == grant


def test_a_keys_file_can_be_a_path_and_list_several_keys_of_one_tenant(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "keys.json"
    path.write_text(keys_file(key_sha256=[sha("a"), sha("b")], admin=True))
    keys = KeysFile.parse(str(path), TenantLimits())
    a, b = keys.lookup("a"), keys.lookup("b")
    assert a is not None and b is not None and a == b and a.tenant.admin
    assert keys.lookup("c") is None
    assert keys.labels == {"acme"}


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"name": "bad name"}, "name must be"),
        ({"name": OTHER}, "name must be"),
        ({"key_sha256": "abc"}, "not 64 hex digits"),
        ({"key_sha256": []}, "key_sha256 must be"),
        ({"limits": {"max_sesions": 1}}, "unknown limit"),
        ({"limits": {"max_sessions": -1}}, "must be an integer >= 0"),
        ({"limits": {"max_sessions": 1.5}}, "must be an integer >= 0"),
        ({"limits": {"audio_in_s_per_min": "60"}}, "must be a number >= 0"),
        ({"models": "tone"}, "models must be a list"),
        ({"colour": "red"}, "unknown fields"),
    ],
)
def test_a_bad_keys_file_is_refused_with_what_to_fix(entry: dict[str, object], says: str) -> None:
    with pytest.raises(TenantConfigError, match=says):
        KeysFile.parse(keys_file(**entry), TenantLimits())


def test_a_tenant_named_twice_or_a_hash_listed_twice_is_refused() -> None:
    one = {"name": "acme", "key_sha256": sha("a")}
    import orjson

    with pytest.raises(TenantConfigError, match="appears twice"):
        KeysFile.parse(orjson.dumps([one, one]).decode(), TenantLimits())
    with pytest.raises(TenantConfigError, match="listed twice"):
        KeysFile.parse(orjson.dumps([one, {"name": "b", "key_sha256": sha("a")}]).decode(), TenantLimits())


def test_a_keys_file_that_is_not_json_or_not_there_is_refused() -> None:
    with pytest.raises(TenantConfigError, match="not valid JSON"):
        KeysFile.parse("{nope", TenantLimits())
    with pytest.raises(TenantConfigError, match="cannot read keys_file"):
        KeysFile.parse("/nonexistent/keys.json", TenantLimits())


# --- client secrets ------------------------------------------------------------------


async def test_minted_secret_is_an_ek_token_with_its_expiry() -> None:
    box = SecretBox(MemoryStore())
    token, expires_at = await box.mint(Grant("key:abc"), 600, now=1_000.0)
    assert token.startswith(SECRET_PREFIX)
    assert len(token) > 40
    assert expires_at == 1_600
    assert (await box.mint(Grant("key:abc"), 600, now=1_000.0))[0] != token


async def test_secret_is_good_for_one_use_and_carries_the_minting_grant() -> None:
    box = SecretBox(MemoryStore())
    minted = Minted("realtime", "omni-cascade", {"instructions": "be brief"})
    grant = Grant("tenant:acme", Tenant("acme", TenantLimits(max_sessions=2)), minted, sha(TENANT_KEY))
    token, _ = await box.mint(grant, 600, now=1_000.0)
    assert await box.take(token, now=1_001.0) == grant
    assert await box.take(token, now=1_002.0) is None


async def test_a_secret_minted_on_one_replica_is_taken_on_another() -> None:
    store = MemoryStore()  # the shared store (Redis in a cluster): two boxes, one per replica
    token, _ = await SecretBox(store).mint(Grant("key:abc"), 600)
    assert await SecretBox(MemoryStore()).take(token) is None  # another store knows nothing of it
    assert await SecretBox(store).take(token) == Grant("key:abc")
    assert await SecretBox(store).take(token) is None


async def test_the_store_forgets_a_secret_after_its_lifetime() -> None:
    now = [1_000.0]
    store = MemoryStore(clock=lambda: now[0])
    token, _ = await SecretBox(store).mint(Grant("key:abc"), 10)
    now[0] += 11
    assert await store.take_token(hashlib.sha256(token.encode()).hexdigest()) is None


async def test_expired_secret_is_refused() -> None:
    box = SecretBox(MemoryStore())
    token, _ = await box.mint(Grant("key:abc"), 10, now=1_000.0)
    assert await box.take(token, now=1_011.0) is None


async def test_secret_is_valid_until_its_expiry_second() -> None:
    box = SecretBox(MemoryStore())
    token, expires_at = await box.mint(Grant("key:abc"), 10, now=1_000.0)
    assert await box.take(token, now=float(expires_at)) is not None


async def test_unknown_secret_is_refused() -> None:
    assert await SecretBox(MemoryStore()).take(SECRET_PREFIX + "forged") is None


async def test_secrets_are_stored_as_hashes_only() -> None:
    store = MemoryStore()
    token, _ = await SecretBox(store).mint(Grant("key:abc"), 600)
    assert token not in repr(vars(store))
    assert token[len(SECRET_PREFIX) :] not in repr(vars(store))


async def test_authenticate_with_a_secret_returns_its_grant_once(auth: Authenticator) -> None:
    grant = replace(operator(KEYS[0]), minted=Minted("realtime", "omni-cascade", {"instructions": "pirate"}))
    token, _ = await auth.secrets.mint(grant, 60)
    assert await auth.authenticate({}, [KEY_SUBPROTOCOL_PREFIX + token]) == grant
    assert await auth.authenticate({}, [KEY_SUBPROTOCOL_PREFIX + token]) is None
    token2, _ = await auth.secrets.mint(grant, 60)
    assert await auth.authenticate(bearer(token2), []) == grant
    assert await auth.authenticate(bearer(token2), []) is None


async def test_a_secret_dies_with_the_key_that_minted_it() -> None:
    store = MemoryStore()  # one store, the keys before and after a restart
    before = Authenticator(KEYS, required=True, store=store, keys_file=KeysFile.parse(keys_file(), TenantLimits()))
    by_operator, _ = await before.secrets.mint(operator(KEYS[1]), 60)
    tenant = await before.authenticate(bearer(TENANT_KEY), [])
    assert tenant is not None and tenant.key_sha256 == sha(TENANT_KEY)
    by_tenant, _ = await before.secrets.mint(tenant, 60)
    kept, _ = await before.secrets.mint(operator(KEYS[0]), 60)
    after = Authenticator(KEYS[:1], required=True, store=store)  # KEYS[1] and the tenant removed
    assert await after.authenticate(bearer(by_operator), []) is None
    assert await after.authenticate(bearer(by_tenant), []) is None
    assert await after.authenticate(bearer(kept), []) == operator(KEYS[0])


async def test_a_secret_minted_with_auth_off_is_refused_once_auth_is_on() -> None:
    store = MemoryStore()
    off = Authenticator((), required=False, store=store)
    anonymous = await off.authenticate({}, [])
    assert anonymous is not None
    kept, _ = await off.secrets.mint(anonymous, 60)
    refused, _ = await off.secrets.mint(anonymous, 60)
    assert await off.authenticate(bearer(kept), []) == anonymous
    assert await Authenticator(KEYS, required=True, store=store).authenticate(bearer(refused), []) is None


async def test_a_key_principal_without_its_key_hash_is_not_trusted(auth: Authenticator) -> None:
    token, _ = await auth.secrets.mint(Grant(principal_of_key(KEYS[0]), tenant=Tenant(admin=True)), 60)
    assert await auth.authenticate(bearer(token), []) is None


async def test_a_secret_expires_no_later_than_the_token_that_minted_it() -> None:
    box = SecretBox(MemoryStore())
    _, expires_at = await box.mint(Grant("jwt:u", expires_at=1_030.0), 600, now=1_000.0)
    assert expires_at == 1_030
    _, expires_at = await box.mint(Grant("jwt:u", expires_at=9_999.0), 600, now=1_000.0)
    assert expires_at == 1_600


async def test_minting_is_bounded_per_principal() -> None:
    box = SecretBox(MemoryStore())
    limits = TenantLimits(max_secret_bytes=100, max_secrets=2, secret_mints_per_min=3)
    grant = Grant("tenant:acme", Tenant("acme", limits))
    with pytest.raises(MintRefused) as big:
        await box.mint(replace(grant, minted=Minted("realtime", "m", {"instructions": "x" * 100})), 60)
    assert big.value.limit == "max_secret_bytes"
    first, _ = await box.mint(grant, 60)
    await box.mint(grant, 60)
    with pytest.raises(MintRefused) as outstanding:
        await box.mint(grant, 60)
    assert outstanding.value.limit == "max_secrets"
    assert await box.take(first) is not None  # used: no longer outstanding
    third, _ = await box.mint(grant, 60)
    assert await box.take(third) is not None
    with pytest.raises(MintRefused) as rate:
        await box.mint(grant, 60)  # three minted in the minute, however many were used
    assert rate.value.limit == "secret_mints_per_min" and rate.value.retry_after_s
    await box.mint(Grant("tenant:beta", Tenant("beta", limits)), 60)  # another principal's count


# --- when auth is on ------------------------------------------------------------------


def test_auth_is_required_when_keys_are_set() -> None:
    assert Settings(api_keys=("k1",)).requires_auth


def test_auth_is_required_beyond_loopback() -> None:
    assert Settings(host="0.0.0.0").requires_auth
    assert Settings(host="10.1.2.3").requires_auth


def test_auth_is_optional_on_loopback_without_keys() -> None:
    assert not Settings(host="127.0.0.1").requires_auth
    assert not Settings(host="::1").requires_auth
    assert not Settings(host="localhost").requires_auth


def test_explicit_auth_setting_wins() -> None:
    assert Settings(host="127.0.0.1", auth_required=True).requires_auth
    assert not Settings(host="0.0.0.0", auth_required=False).requires_auth


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.8.8", True),
        ("::1", True),
        ("localhost", True),
        ("", False),
        ("example.com", False),
        ("0.0.0.0", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_api_keys_come_from_the_environment_comma_separated() -> None:
    settings = from_env({"OMNI_GATEWAY_API_KEYS": " k1, k2 ,,"})
    assert settings.api_keys == ("k1", "k2")
    assert settings.requires_auth
