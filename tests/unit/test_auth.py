"""API keys, client secrets and the settings that decide whether auth is on."""

from __future__ import annotations

import pytest

from gateway.auth import (
    KEY_SUBPROTOCOL_PREFIX,
    SECRET_PREFIX,
    Authenticator,
    Grant,
    SecretBox,
    principal_of_key,
)
from gateway.settings import Settings, from_env, is_loopback

KEYS = ("sk-first-key-0001", "sk-second-key-0002")


@pytest.fixture
def auth() -> Authenticator:
    return Authenticator(KEYS, required=True)


def bearer(value: str) -> dict[str, str]:
    return {"authorization": f"Bearer {value}"}


# --- principals -------------------------------------------------------------------


def test_principal_names_a_key_without_revealing_it() -> None:
    principal = principal_of_key(KEYS[0])
    assert principal.startswith("key:")
    assert len(principal) == len("key:") + 12
    assert KEYS[0] not in principal
    assert principal == principal_of_key(KEYS[0])
    assert principal != principal_of_key(KEYS[1])


# --- API keys ------------------------------------------------------------------------


def test_no_credentials_are_refused_when_auth_is_required(auth: Authenticator) -> None:
    assert auth.authenticate({}, []) is None


def test_wrong_key_is_refused(auth: Authenticator) -> None:
    assert auth.authenticate(bearer("sk-wrong"), []) is None
    assert auth.authenticate(bearer(KEYS[0] + "x"), []) is None
    assert auth.authenticate(bearer(KEYS[0][:-1]), []) is None


@pytest.mark.parametrize("key", KEYS)
def test_every_configured_key_is_accepted_as_bearer(auth: Authenticator, key: str) -> None:
    assert auth.authenticate(bearer(key), []) == Grant(principal_of_key(key))


def test_bearer_scheme_is_case_insensitive(auth: Authenticator) -> None:
    assert auth.authenticate({"authorization": f"bearer {KEYS[0]}"}, []) is not None
    assert auth.authenticate({"authorization": f"BEARER {KEYS[0]}"}, []) is not None


def test_other_authorization_schemes_are_refused(auth: Authenticator) -> None:
    assert auth.authenticate({"authorization": f"Basic {KEYS[0]}"}, []) is None
    assert auth.authenticate({"authorization": KEYS[0]}, []) is None


def test_key_in_the_browser_subprotocol_is_accepted(auth: Authenticator) -> None:
    grant = auth.authenticate({}, ["realtime", KEY_SUBPROTOCOL_PREFIX + KEYS[1]])
    assert grant == Grant(principal_of_key(KEYS[1]))


def test_wrong_key_in_the_subprotocol_is_refused(auth: Authenticator) -> None:
    assert auth.authenticate({}, [KEY_SUBPROTOCOL_PREFIX + "nope"]) is None
    assert auth.authenticate({}, [KEY_SUBPROTOCOL_PREFIX]) is None


def test_empty_keys_are_never_configured() -> None:
    auth = Authenticator(["", KEYS[0]], required=True)
    assert auth.check_key("") is None
    assert auth.authenticate({"authorization": "Bearer "}, []) is None


def test_without_required_auth_anyone_is_anonymous() -> None:
    auth = Authenticator((), required=False)
    assert auth.authenticate({}, []) == Grant("anonymous")
    assert auth.authenticate(bearer("sk-whatever-an-sdk-sends"), []) == Grant("anonymous")


def test_without_required_auth_a_known_key_still_names_its_principal() -> None:
    auth = Authenticator(KEYS, required=False)
    assert auth.authenticate(bearer(KEYS[0]), []) == Grant(principal_of_key(KEYS[0]))


def test_http_auth_takes_keys(auth: Authenticator) -> None:
    assert auth.authenticate_http(bearer(KEYS[0])) == Grant(principal_of_key(KEYS[0]))
    assert auth.authenticate_http({}) is None
    assert auth.authenticate_http(bearer("bad")) is None


def test_http_auth_refuses_a_client_secret(auth: Authenticator) -> None:
    token, _ = auth.secrets.mint(Grant("key:abc"), 60)
    assert auth.authenticate_http(bearer(token)) is None
    assert auth.authenticate(bearer(token), []) is not None  # it was not spent by the refusal


# --- client secrets ------------------------------------------------------------------


def test_minted_secret_is_an_ek_token_with_its_expiry() -> None:
    box = SecretBox()
    token, expires_at = box.mint(Grant("key:abc"), 600, now=1_000.0)
    assert token.startswith(SECRET_PREFIX)
    assert len(token) > 40
    assert expires_at == 1_600
    assert box.mint(Grant("key:abc"), 600, now=1_000.0)[0] != token


def test_secret_is_good_for_one_use() -> None:
    box = SecretBox()
    grant = Grant("key:abc", {"instructions": "be brief"})
    token, _ = box.mint(grant, 600, now=1_000.0)
    assert box.take(token, now=1_001.0) == grant
    assert box.take(token, now=1_002.0) is None


def test_expired_secret_is_refused() -> None:
    box = SecretBox()
    token, _ = box.mint(Grant("key:abc"), 10, now=1_000.0)
    assert box.take(token, now=1_011.0) is None


def test_secret_is_valid_until_its_expiry_second() -> None:
    box = SecretBox()
    token, expires_at = box.mint(Grant("key:abc"), 10, now=1_000.0)
    assert box.take(token, now=float(expires_at)) is not None


def test_unknown_secret_is_refused() -> None:
    assert SecretBox().take(SECRET_PREFIX + "forged") is None


def test_secrets_are_stored_as_hashes_only() -> None:
    box = SecretBox()
    token, _ = box.mint(Grant("key:abc"), 600)
    assert token not in repr(vars(box))
    assert token[len(SECRET_PREFIX) :] not in repr(vars(box))


def test_minting_sweeps_expired_secrets() -> None:
    box = SecretBox()
    old, _ = box.mint(Grant("key:abc"), 10, now=1_000.0)
    box.mint(Grant("key:abc"), 10, now=2_000.0)  # sweeps the first
    assert box.take(old, now=1_005.0) is None  # gone, though it would still be valid at 1005


def test_authenticate_with_a_secret_returns_its_grant_once(auth: Authenticator) -> None:
    grant = Grant(principal_of_key(KEYS[0]), {"instructions": "pirate"})
    token, _ = auth.secrets.mint(grant, 60)
    assert auth.authenticate({}, [KEY_SUBPROTOCOL_PREFIX + token]) == grant
    assert auth.authenticate({}, [KEY_SUBPROTOCOL_PREFIX + token]) is None
    token2, _ = auth.secrets.mint(grant, 60)
    assert auth.authenticate(bearer(token2), []) == grant
    assert auth.authenticate(bearer(token2), []) is None


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
