"""Auth at the edge, over real sockets: a wildcard origin's port, a token's lifetime, and a
JWKS fetched over plain http (refused at start)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import jwt
import orjson
import pytest
import websockets
from support.gateway import connect, run_gateway
from support.jwt_issuer import HS_SECRET

from gateway.cli import main, problems, settings_from_args
from gateway.protocol.errors import Code
from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(60)

KEY = "sk-edge-auth-7c2f19"


def gateway(**kwargs: Any) -> Any:
    settings = Settings(engine="passthrough", video_engine="none", api_keys=(KEY,), detach_grace_s=0.2, **kwargs)
    return run_gateway(settings, engine=PassthroughEngine(paced=False), vad_factory=None)


async def refusal(url: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(websockets.InvalidStatus) as info:
        async with connect(url, **kwargs):
            raise AssertionError("the upgrade was accepted")
    return info.value.response.status_code, orjson.loads(info.value.response.body)["error"]


async def test_a_wildcard_origin_admits_its_default_port_only_unless_it_names_one() -> None:
    allowed = ("https://*.tenant.example", "https://*.ports.example:8443", "https://app.example.com")
    async with gateway(allowed_origins=allowed) as gw:
        ok = ("https://a.tenant.example", "https://a.tenant.example:443", "https://b.ports.example:8443")
        for origin in ok:
            async with connect(gw.url, headers={"Origin": origin, "Authorization": f"Bearer {KEY}"}) as c:
                await c.wait_for("session.created")
        refused = ("https://a.tenant.example:8443", "https://a.tenant.example:444", "https://b.ports.example",
                   "https://app.example.com:8443")  # fmt: skip
        for origin in refused:  # as an exact entry: another port is another origin
            status, err = await refusal(gw.url, headers={"Origin": origin, "Authorization": f"Bearer {KEY}"})
            assert (status, err["code"]) == (403, Code.ORIGIN_NOT_ALLOWED), origin


def token(lifetime_s: int, *, iat: bool = True) -> str:
    now = int(time.time())
    claims: dict[str, Any] = {"sub": "user-1", "exp": now + lifetime_s, **({"iat": now} if iat else {})}
    return jwt.encode(claims, HS_SECRET, algorithm="HS256")


async def test_a_token_living_longer_than_the_maximum_is_refused_401_saying_so() -> None:
    async with gateway(jwt_secret=HS_SECRET, jwt_max_lifetime_s=600) as gw:
        async with connect(gw.url, headers={"Authorization": f"Bearer {token(300)}"}) as c:
            await c.wait_for("session.created")
        for long_lived in (token(3600), token(3600, iat=False)):  # exp - iat, and exp - now without iat
            status, err = await refusal(gw.url, headers={"Authorization": f"Bearer {long_lived}"})
            assert (status, err["code"]) == (401, Code.UNAUTHORIZED)
            assert "at most 600 s" in err["message"]
        async with httpx.AsyncClient(base_url=gw.http) as http:  # the HTTP endpoints say it too
            minted = await http.post("/v1/realtime/client_secrets", json={},
                                     headers={"Authorization": f"Bearer {token(3600)}"})  # fmt: skip
        assert minted.status_code == 401
        assert "at most 600 s" in minted.json()["error"]["message"]


async def test_by_default_a_token_for_more_than_a_day_is_refused() -> None:
    async with gateway(jwt_secret=HS_SECRET) as gw:
        async with connect(gw.url, headers={"Authorization": f"Bearer {token(86_000)}"}) as c:
            await c.wait_for("session.created")
        status, err = await refusal(gw.url, headers={"Authorization": f"Bearer {token(2 * 86_400)}"})
        assert status == 401 and "at most 86400 s" in err["message"]


@pytest.mark.parametrize(
    ("url", "allow", "refused"),
    [
        ("http://keys.example.com/jwks.json", False, True),
        ("http://keys.example.com/jwks.json", True, False),  # the operator says that network is theirs
        ("https://keys.example.com/jwks.json", False, False),
        ("http://127.0.0.1:9/jwks.json", False, False),  # loopback: nothing on the path
        ("http://localhost:9/jwks.json", False, False),
    ],
)
def test_a_plain_http_jwks_url_is_refused_at_start_unless_allowed(
    url: str, allow: bool, refused: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {"OMNI_GATEWAY_JWT_JWKS": url, "OMNI_GATEWAY_JWT_JWKS_ALLOW_HTTP": str(allow).lower()}
    said = [p for p in problems(settings_from_args(["serve"], environ=env)) if "JWKS URL" in p]
    assert bool(said) is refused
    if refused:
        assert "plain http" in said[0] and "OMNI_GATEWAY_JWT_JWKS_ALLOW_HTTP" in said[0]


def test_serve_with_a_plain_http_jwks_url_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OMNI_GATEWAY_JWT_JWKS", "http://keys.example.com/jwks.json")
    assert main(["serve", "--engine", "passthrough", "--video-engine", "none"]) == 2
    assert "plain http" in capsys.readouterr().err


def test_an_app_built_without_the_cli_refuses_it_too() -> None:
    from gateway.app import create_app

    with pytest.raises(ValueError, match="plain http"):
        create_app(Settings(engine="passthrough", video_engine="none", jwt_jwks="http://keys.example.com/j.json"))
