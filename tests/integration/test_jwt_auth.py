"""Bearer JWTs from the user's own backend (a test issuer), over real sockets:
HS256 with a shared secret, RS256/ES256 with a JWKS file or URL (refreshed,
rotated, failing, slow), the claims (subject, expiry, issuer, audience,
models), and what the gateway refuses at the upgrade."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import orjson
import pytest
import websockets
from cryptography.hazmat.primitives import serialization
from support.gateway import Client, RunningGateway, connect, run_gateway
from support.jwt_issuer import HS_SECRET, TestIssuer

from gateway import jwt_auth
from gateway.protocol.errors import Code
from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(60)

KEY = "sk-jwt-test-operator"
KEY_PROTO = "openai-insecure-api-key."


def settings(**kwargs: Any) -> Settings:
    kwargs.setdefault("api_keys", (KEY,))
    return Settings(engine="passthrough", video_engine="none", detach_grace_s=0.2, drain_window_s=0.2, **kwargs)


@pytest.fixture
def issuer() -> TestIssuer:
    return TestIssuer()


def gateway(s: Settings) -> Any:
    return run_gateway(s, engine=PassthroughEngine(audio_chunks=2, paced=False), vad_factory=None)


@pytest.fixture
async def hs_gw() -> AsyncIterator[RunningGateway]:
    async with gateway(settings(jwt_secret=HS_SECRET)) as gw:
        yield gw


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def opened(c: Client) -> dict[str, Any]:
    created = await c.wait_for("session.created")
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    await c.send({"type": "conversation.item.create", "item": item})
    await c.wait_for("conversation.item.added")
    return created


async def refused_at_upgrade(url: str, **kwargs: Any) -> dict[str, Any]:
    with pytest.raises(websockets.InvalidStatus) as info:
        async with connect(url, **kwargs):
            raise AssertionError("the upgrade was accepted")
    assert info.value.response.status_code == 401
    err: dict[str, Any] = orjson.loads(info.value.response.body)["error"]
    assert err["code"] == Code.UNAUTHORIZED
    return err


def principals(gw: RunningGateway) -> set[str]:
    return {h.principal for h in gw.runtime.hosts.values()}


# --- HS256 ---------------------------------------------------------------------------


async def test_an_hs256_token_opens_a_session_as_its_subject_by_bearer_or_subprotocol(
    hs_gw: RunningGateway, issuer: TestIssuer
) -> None:
    token = issuer.hs256("user-42")
    async with connect(hs_gw.url, headers=bearer(token)) as c:
        await opened(c)
        assert principals(hs_gw) == {"jwt:user-42"}
    async with connect(hs_gw.url, subprotocols=["realtime", KEY_PROTO + token]) as c:  # a browser's way
        assert c.ws.subprotocol == "realtime"  # never the token
        await opened(c)
    async with connect(hs_gw.url, headers=bearer(token)) as c:  # not single use: good until exp
        await opened(c)


async def test_a_token_that_is_expired_forged_or_unsigned_is_refused_at_the_upgrade(
    hs_gw: RunningGateway, issuer: TestIssuer
) -> None:
    await refused_at_upgrade(hs_gw.url, headers=bearer(issuer.hs256("u", ttl_s=-120)))  # past the 30 s leeway
    await refused_at_upgrade(hs_gw.url, headers=bearer(issuer.hs256("u", secret="another-secret-" * 3)))
    unsigned = jwt.encode(issuer.claims("u", 300), None, algorithm="none")  # type: ignore[arg-type]
    await refused_at_upgrade(hs_gw.url, headers=bearer(unsigned))
    no_sub = jwt.encode({"exp": int(time.time()) + 300}, HS_SECRET, algorithm="HS256")
    await refused_at_upgrade(hs_gw.url, headers=bearer(no_sub))
    no_exp = jwt.encode({"sub": "u"}, HS_SECRET, algorithm="HS256")
    await refused_at_upgrade(hs_gw.url, headers=bearer(no_exp))
    await refused_at_upgrade(hs_gw.url, headers=bearer(issuer.hs256("x" * 201)))  # sub too long
    tampered = issuer.hs256("alice")
    head, _, sig = tampered.split(".")
    forged_body = jwt.utils.base64url_encode(json.dumps(issuer.claims("mallory", 300)).encode()).decode()
    await refused_at_upgrade(hs_gw.url, headers=bearer(f"{head}.{forged_body}.{sig}"))
    assert not hs_gw.runtime.hosts
    assert hs_gw.runtime.metrics.registry.get_sample_value("omni_auth_failures_total") == 7.0


async def test_api_keys_still_work_beside_tokens(hs_gw: RunningGateway) -> None:
    async with connect(hs_gw.url, headers=bearer(KEY)) as c:
        await opened(c)


async def test_the_models_claim_limits_what_a_token_opens(hs_gw: RunningGateway, issuer: TestIssuer) -> None:
    token = issuer.hs256("u", models=["gpt-realtime"])  # served: an alias of the default model
    async with connect(hs_gw.url + "?model=gpt-realtime", headers=bearer(token)) as c:
        await opened(c)
    async with connect(hs_gw.url + "?model=omni-cascade", headers=bearer(token)) as c:
        err = await c.recv()
        assert err["type"] == "error" and err["error"]["code"] == Code.MODEL_NOT_ALLOWED
        with pytest.raises(websockets.ConnectionClosed) as info:
            await asyncio.wait_for(c.ws.recv(), 5)
        assert info.value.rcvd is not None and info.value.rcvd.code == 4003
    assert "session.created" not in c.types()


async def test_bad_claims_are_refused(hs_gw: RunningGateway, issuer: TestIssuer) -> None:
    await refused_at_upgrade(hs_gw.url, headers=bearer(issuer.hs256("u", models="tone")))
    await refused_at_upgrade(hs_gw.url, headers=bearer(issuer.hs256("u", limits={"max_sesions": 1})))
    await refused_at_upgrade(hs_gw.url, headers=bearer(issuer.hs256("u", limits={"max_sessions": -1})))


async def test_issuer_and_audience_are_checked_when_set(issuer: TestIssuer) -> None:
    async with gateway(settings(jwt_secret=HS_SECRET, jwt_issuer="https://backend.example",
                                jwt_audience="omni-gateway")) as gw:  # fmt: skip
        good = issuer.hs256("u", iss="https://backend.example", aud="omni-gateway")
        async with connect(gw.url, headers=bearer(good)) as c:
            await opened(c)
        await refused_at_upgrade(gw.url, headers=bearer(issuer.hs256("u", aud="omni-gateway")))  # no iss
        await refused_at_upgrade(gw.url, headers=bearer(issuer.hs256("u", iss="https://evil.example",
                                                                     aud="omni-gateway")))  # fmt: skip
        await refused_at_upgrade(gw.url, headers=bearer(issuer.hs256("u", iss="https://backend.example",
                                                                     aud="someone-else")))  # fmt: skip


async def test_a_token_with_an_audience_is_refused_when_none_is_configured(
    hs_gw: RunningGateway, issuer: TestIssuer
) -> None:
    await refused_at_upgrade(hs_gw.url, headers=bearer(issuer.hs256("u", aud="another-service")))


async def test_tokens_work_on_http_endpoints_but_never_grant_admin(hs_gw: RunningGateway, issuer: TestIssuer) -> None:
    token = issuer.hs256("u")
    async with httpx.AsyncClient(base_url=hs_gw.http) as http:
        assert (await http.get("/v1/models", headers=bearer(token))).status_code == 200
        r = await http.post("/admin/pause", headers=bearer(token))
        assert r.status_code == 403 and r.json()["error"]["code"] == Code.FORBIDDEN
        assert not hs_gw.runtime.orchestrator.paused
        minted = await http.post("/v1/realtime/client_secrets", headers=bearer(token), json={})
        assert minted.status_code == 200
    secret = minted.json()["value"]
    async with connect(hs_gw.url, subprotocols=["realtime", KEY_PROTO + secret]) as c:
        await opened(c)
        assert principals(hs_gw) == {"jwt:u"}  # the secret carries the token's principal


# --- RS256 / ES256 through a JWKS ----------------------------------------------------------


async def test_rs256_and_es256_tokens_verify_against_a_jwks_url(issuer: TestIssuer) -> None:
    with issuer.serve() as url:
        async with gateway(settings(jwt_jwks=url)) as gw:
            for token in (issuer.rs256("rsa-user"), issuer.es256("ec-user")):
                async with connect(gw.url, headers=bearer(token)) as c:
                    await opened(c)
            # HS256 is not accepted where only the JWKS is trusted.
            await refused_at_upgrade(gw.url, headers=bearer(issuer.hs256("u")))


async def test_an_hs256_token_signed_with_the_public_key_is_refused(issuer: TestIssuer) -> None:
    """The classic algorithm confusion: the public key used as an HMAC secret."""
    pem = issuer.rsa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    header = jwt.utils.base64url_encode(json.dumps({"alg": "HS256", "typ": "JWT", "kid": issuer.rsa_kid}).encode())
    payload = jwt.utils.base64url_encode(json.dumps(issuer.claims("mallory", 300)).encode())
    import hashlib
    import hmac

    signing_input = header + b"." + payload
    sig = jwt.utils.base64url_encode(hmac.new(pem, signing_input, hashlib.sha256).digest())
    with issuer.serve() as url:
        async with gateway(settings(jwt_jwks=url)) as gw:
            await refused_at_upgrade(gw.url, headers=bearer((signing_input + b"." + sig).decode()))


async def test_a_rotated_key_is_fetched_when_a_token_names_it(
    issuer: TestIssuer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jwt_auth, "JWKS_MIN_REFETCH_S", 0.0)
    with issuer.serve() as url:
        async with gateway(settings(jwt_jwks=url)) as gw:
            hits = issuer.hits
            async with connect(gw.url, headers=bearer(issuer.rs256("before"))) as c:
                await opened(c)
            assert issuer.hits == hits  # a known key: no fetch
            issuer.rotate()
            async with connect(gw.url, headers=bearer(issuer.rs256("after"))) as c:  # a new kid: refetched
                await opened(c)
            assert issuer.hits == hits + 1
            await refused_at_upgrade(gw.url, headers=bearer(issuer.rs256("u", kid="never-published")))


async def test_unknown_kids_refetch_at_most_once_per_interval(issuer: TestIssuer) -> None:
    with issuer.serve() as url:
        async with gateway(settings(jwt_jwks=url)) as gw:
            hits = issuer.hits
            for _ in range(5):
                await refused_at_upgrade(gw.url, headers=bearer(issuer.rs256("u", kid="nope")))
            assert issuer.hits <= hits + 1


async def test_a_failing_jwks_url_refuses_tokens_but_not_the_gateway(
    issuer: TestIssuer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jwt_auth, "JWKS_MIN_REFETCH_S", 0.0)
    issuer.fail = True
    with issuer.serve() as url:
        async with gateway(settings(jwt_jwks=url)) as gw:  # starts anyway
            await refused_at_upgrade(gw.url, headers=bearer(issuer.rs256("u")))
            async with connect(gw.url, headers=bearer(KEY)) as c:  # keys are unaffected
                await opened(c)
                issuer.fail = False
                async with connect(gw.url, headers=bearer(issuer.rs256("u"))) as c2:  # the next fetch works
                    await opened(c2)
                issuer.fail = True
                gw.runtime.auth.jwt.jwks._fetched_at = 0.0  # type: ignore[union-attr]
                await gw.runtime.auth.jwt.jwks.refresh()  # type: ignore[union-attr]  # a failed refresh keeps the keys
                async with connect(gw.url, headers=bearer(issuer.rs256("still"))) as c3:
                    await opened(c3)
                # and the first session was never disturbed
                await c.send({"type": "response.create"})
                await c.wait_for("response.done")


async def test_a_slow_jwks_url_never_blocks_the_event_loop(issuer: TestIssuer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jwt_auth, "JWKS_MIN_REFETCH_S", 0.0)
    monkeypatch.setattr(jwt_auth, "JWKS_FETCH_TIMEOUT_S", 1.0)
    with issuer.serve() as url:
        async with gateway(settings(jwt_jwks=url)) as gw, httpx.AsyncClient(base_url=gw.http) as http:
            issuer.rotate()
            issuer.delay_s = 3.0  # the refetch for the new kid hangs
            loop = asyncio.get_running_loop()
            handshake = asyncio.ensure_future(refused_at_upgrade(gw.url, headers=bearer(issuer.rs256("u"))))
            await asyncio.sleep(0.2)
            worst = 0.0
            while not handshake.done():
                started = loop.time()
                assert (await http.get("/healthz")).status_code == 200
                worst = max(worst, loop.time() - started)
                await asyncio.sleep(0.05)
            await handshake  # refused after the 1 s wait, not 3 s
            assert worst < 0.5, worst
            issuer.delay_s = 0.0


async def test_a_jwks_file_works_too(issuer: TestIssuer, tmp_path: Path) -> None:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(issuer.jwks()))
    async with gateway(settings(jwt_jwks=str(path))) as gw:
        async with connect(gw.url, headers=bearer(issuer.es256("file-user"))) as c:
            await opened(c)
            assert principals(gw) == {"jwt:file-user"}


async def test_tokens_never_reach_the_log(
    hs_gw: RunningGateway, issuer: TestIssuer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    good, bad = issuer.hs256("u"), issuer.hs256("u", ttl_s=-120)
    async with connect(hs_gw.url, headers=bearer(good)) as c:
        await opened(c)
    await refused_at_upgrade(hs_gw.url, headers=bearer(bad))
    server = [r for r in caplog.records if not r.name.startswith(("websockets.client", "httpx", "httpcore"))]
    text = "\n".join(caplog.handler.format(r) for r in server)
    assert "bearer token refused" in text  # the refusal was logged, with its reason
    assert HS_SECRET not in text
    for token in (good, bad):
        assert token not in text
        assert token.split(".")[2] not in text  # not even the signature
