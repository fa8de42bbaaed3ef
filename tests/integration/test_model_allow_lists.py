"""What a caller learns of the models, and which it may use, over real sockets: the
video socket keeps a tenant's model allow-list as the realtime one does; ``/v1/models``
lists only the models the caller may use; ``/readyz`` names no model or route to a
caller without an operator credential (the threat model: no model list)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest
import websockets
from support.gateway import connect, run_gateway
from support.two_tones import ROUTES, sha

from gateway.protocol.errors import Code
from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(90)

OPERATOR, VOICE, FILM = "sk-models-operator-1", "sk-models-voice-2", "sk-models-film-3"
KEYS = orjson.dumps({"tenants": [
    {"name": "voice", "key_sha256": sha(VOICE), "models": ["tone-b"]},
    {"name": "film", "key_sha256": sha(FILM), "models": ["tone-a", "cpu-video"]},
]}).decode()  # fmt: skip


def settings(**kwargs: Any) -> Settings:
    kwargs.setdefault("video_engine", "none")
    return Settings(engine="passthrough", model="tone-a", models=ROUTES, api_keys=(OPERATOR,), keys_file=KEYS,
                    detach_grace_s=0.2, drain_window_s=0.2, **kwargs)  # fmt: skip


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_video_refuses_a_model_the_tenant_may_not_use() -> None:
    async with run_gateway(settings(video_engine="cpu"), vad_factory=None) as gw:
        video_url = gw.url + "/video"
        async with connect(video_url, headers=bearer(VOICE)) as c:  # voice: tone-b only
            first = await c.recv()
            assert first["type"] == "error" and first["code"] == Code.MODEL_NOT_ALLOWED, first
            assert "cpu-video" in first["message"]
            with pytest.raises(websockets.ConnectionClosed) as info:
                await asyncio.wait_for(c.ws.recv(), 5)
            assert info.value.rcvd is not None and info.value.rcvd.code == 4003
        async with connect(video_url, headers=bearer(FILM)) as c:  # film may
            await c.send({"type": "session.start", "prompt": "a fox", "width": 64, "height": 48, "num_frames": 2})
            assert (await c.wait_for("video.start"))["type"] == "video.start"
        async with httpx.AsyncClient(base_url=gw.http) as http:  # nor can it mint a secret for it
            r = await http.post(
                "/v1/realtime/client_secrets", headers=bearer(VOICE), json={"session": {"type": "video"}}
            )
        assert r.status_code == 403 and r.json()["error"]["code"] == Code.MODEL_NOT_ALLOWED


async def test_v1_models_lists_only_the_models_the_caller_may_use() -> None:
    async with run_gateway(settings(), vad_factory=None) as gw, httpx.AsyncClient(base_url=gw.http) as http:
        listed = {key: [m["id"] for m in (await http.get("/v1/models", headers=bearer(key))).json()["data"]]
                  for key in (VOICE, FILM, OPERATOR)}  # fmt: skip
        assert listed == {VOICE: ["tone-b"], FILM: ["tone-a"], OPERATOR: ["tone-a", "tone-b"]}


class DownEngine(PassthroughEngine):
    """Engine double: an engine that reports itself unhealthy."""

    def healthy(self) -> bool:
        return False


async def test_readyz_names_no_model_without_an_operator_credential() -> None:
    async with run_gateway(settings(), vad_factory=None) as gw, httpx.AsyncClient(base_url=gw.http) as http:
        for headers in ({}, bearer(VOICE), bearer("sk-wrong")):
            r = await http.get("/readyz", headers=headers)
            assert r.status_code == 200
            assert r.json() == {"status": "ready", "engines_ok": 2, "engines_total": 2}  # counts, no names
        r = await http.get("/readyz", headers=bearer(OPERATOR))
        assert r.json() == {"status": "ready", "engines_ok": 2, "engines_total": 2,
                            "engines": {"tone-a": "ok", "tone-b": "ok"}}  # fmt: skip
    s = Settings(engine="passthrough", api_keys=(OPERATOR,), video_engine="none")
    async with run_gateway(s, engine=DownEngine(), vad_factory=None) as gw, httpx.AsyncClient(base_url=gw.http) as http:
        r = await http.get("/readyz")
        assert r.status_code == 503
        assert r.json() == {"status": "not_ready", "engines_ok": 0, "engines_total": 1, "reason": "engine_unhealthy"}
        r = await http.get("/readyz", headers=bearer(OPERATOR))
        assert r.status_code == 503
        assert r.json() == {"status": "omni-cascade: unhealthy", "engines_ok": 0, "engines_total": 1,
                            "reason": "engine_unhealthy", "engines": {"omni-cascade": "unhealthy"}}  # fmt: skip
