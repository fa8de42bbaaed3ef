"""A client secret never outlives what minted it, over real sockets: a JWT's secret
expires with the JWT; a key removed from the keys file (or from ``api_keys``) takes its
secrets with it, on every replica of one Redis after both restart, and its sessions
can no longer be resumed with them."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import jwt
import orjson
import pytest
import websockets
from support.gateway import RunningGateway, connect, run_gateway
from support.jwt_issuer import HS_SECRET
from support.redis_server import REDIS_BINARY, RedisServer

from gateway.protocol.errors import Code
from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(90)

OPERATOR, SPARE, ACME, BETA = "sk-rev-operator-11", "sk-rev-spare-22", "sk-rev-acme-33", "sk-rev-beta-44"
KEY_PROTO = "openai-insecure-api-key."


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def keys_file(*tenants: tuple[str, str]) -> str:
    return orjson.dumps({"tenants": [{"name": n, "key_sha256": sha(k)} for n, k in tenants]}).decode()


@contextlib.asynccontextmanager
async def replicas(redis_url: str, **kwargs: Any) -> AsyncIterator[tuple[RunningGateway, RunningGateway]]:
    base = Settings(engine="passthrough", video_engine="none", redis_url=redis_url, detach_grace_s=0.2,
                    drain_window_s=0.2, **kwargs)  # fmt: skip
    engine = PassthroughEngine(audio_chunks=2, paced=False)
    async with (
        run_gateway(replace(base, replica_id="ra"), engine=engine, vad_factory=None) as a,
        run_gateway(replace(base, replica_id="rb"), engine=engine, vad_factory=None) as b,
    ):
        yield a, b


async def mint(gw: RunningGateway, key: str) -> str:
    async with httpx.AsyncClient(base_url=gw.http) as http:
        r = await http.post("/v1/realtime/client_secrets", headers={"Authorization": f"Bearer {key}"}, json={})
    assert r.status_code == 200, r.text
    value: str = r.json()["value"]
    return value


async def refused_at_upgrade(url: str, credential: str) -> None:
    with pytest.raises(websockets.InvalidStatus) as info:
        async with connect(url, subprotocols=["realtime", KEY_PROTO + credential]):
            raise AssertionError("the upgrade was accepted")
    assert info.value.response.status_code == 401
    assert orjson.loads(info.value.response.body)["error"]["code"] == Code.UNAUTHORIZED


async def test_a_removed_tenant_or_key_revokes_its_secrets_and_its_sessions_resumption() -> None:
    if not REDIS_BINARY:
        pytest.skip("redis-server is not installed")
    with RedisServer() as server:
        before = {"api_keys": (OPERATOR, SPARE), "keys_file": keys_file(("acme", ACME), ("beta", BETA))}
        async with replicas(server.url, **before) as (a, b):
            to_open, to_resume = await mint(a, ACME), await mint(a, ACME)
            beta_secret, operator_secret = await mint(b, BETA), await mint(b, SPARE)
            async with connect(a.url, headers={"Authorization": f"Bearer {ACME}"}) as c:
                created = await c.wait_for("session.created")
        # acme leaves the keys file and SPARE leaves api_keys; both replicas restart on the same Redis.
        after = {"api_keys": (OPERATOR,), "keys_file": keys_file(("beta", BETA))}
        async with replicas(server.url, **after) as (a, b):
            await refused_at_upgrade(b.url, to_open)  # minted on A, refused on B (and on A)
            await refused_at_upgrade(a.url, to_resume)  # so the session cannot be resumed with it
            await refused_at_upgrade(a.url, ACME)
            await refused_at_upgrade(b.url, operator_secret)
            async with connect(a.url, subprotocols=["realtime", KEY_PROTO + beta_secret]) as c:
                await c.wait_for("session.created")  # a tenant still listed keeps its secrets
            # The session is still in the store: only its principal's credentials are gone.
            assert await a.runtime.store.load_snapshot(created["session"]["id"]) is not None


async def test_a_secret_expires_with_the_token_that_minted_it() -> None:
    s = Settings(engine="passthrough", video_engine="none", api_keys=(OPERATOR,), jwt_secret=HS_SECRET,
                 jwt_leeway_s=0)  # fmt: skip
    async with run_gateway(s, engine=PassthroughEngine(audio_chunks=2, paced=False), vad_factory=None) as gw:
        exp = int(time.time()) + 3
        token = jwt.encode({"sub": "u", "exp": exp}, HS_SECRET, algorithm="HS256")
        async with httpx.AsyncClient(base_url=gw.http) as http:
            headers = {"Authorization": f"Bearer {token}"}
            minted = await http.post("/v1/realtime/client_secrets", headers=headers, json={})
            assert minted.status_code == 200, minted.text
            assert minted.json()["expires_at"] <= exp  # not the default 600 s
            spare = await http.post("/v1/realtime/client_secrets", headers=headers, json={})
            while (await http.get("/v1/models", headers=headers)).status_code == 200:  # noqa: ASYNC110
                await asyncio.sleep(0.1)  # until the token itself is refused (a state, polled)
        await refused_at_upgrade(gw.url, minted.json()["value"])
        await refused_at_upgrade(gw.url, spare.json()["value"])
