"""Model routing: the model a client names picks the engine; unknown names are refused."""

from __future__ import annotations

import json
from dataclasses import replace

import httpx
import pytest
from support.gateway import connect, run_gateway

from gateway.routing import RoutingError, parse_routes
from gateway.settings import Settings

ROUTES = json.dumps(
    {
        "models": [
            {"name": "tone-fast", "engine": "passthrough", "audio_chunks": 2, "paced": False},
            {"name": "tone-long", "engine": "passthrough", "audio_chunks": 6, "paced": False},
        ]
    }
)
SETTINGS = Settings(engine="passthrough", model="tone-fast", models=ROUTES, video_engine="none")


async def answer_chunks(url: str) -> int:
    async with connect(url) as c:
        await c.wait_for("session.created")
        await c.send({"type": "response.create"})
        done = await c.wait_for("response.done")
        assert done["response"]["status"] == "completed"
        return sum(1 for e in c.events if e["type"] == "response.output_audio.delta")


async def test_each_model_is_served_by_its_own_engine() -> None:
    async with run_gateway(SETTINGS, vad_factory=None) as gw:
        assert await answer_chunks(gw.url + "?model=tone-fast") == 2
        assert await answer_chunks(gw.url + "?model=tone-long") == 6
        assert await answer_chunks(gw.url) == 2  # no model named: the default one


async def test_unknown_model_is_refused_at_connect_with_4004() -> None:
    async with run_gateway(SETTINGS, vad_factory=None) as gw:
        async with connect(gw.url + "?model=gpt-realtime") as c:
            err = await c.wait_for("error")
            assert err["error"]["code"] == "model_not_found"
            assert "gpt-realtime" in err["error"]["message"]
            with pytest.raises(Exception):  # noqa: B017 (the close follows)
                await c.recv(timeout=5)
            assert c.ws.close_code == 4004


async def test_v1_models_lists_the_routes_with_their_health() -> None:
    async with run_gateway(SETTINGS, vad_factory=None) as gw, httpx.AsyncClient(base_url=gw.http) as http:
        body = (await http.get("/v1/models")).json()
        assert [m["id"] for m in body["data"]] == ["tone-fast", "tone-long"]
        assert {m["engine"] for m in body["data"]} == {"passthrough"}
        assert all(m["health"] == "ok" for m in body["data"])
        # what each model accepts but does not act on, and whether it takes images
        assert all("instructions" in m["ignored_fields"] and m["accepts_images"] is False for m in body["data"])
        ready = (await http.get("/readyz")).json()
        assert ready["engines"] == {"tone-fast": "ok", "tone-long": "ok"}


async def test_without_a_models_setting_any_model_name_reaches_the_engine() -> None:
    async with run_gateway(replace(SETTINGS, models=None), vad_factory=None) as gw:
        assert await answer_chunks(gw.url + "?model=gpt-realtime") > 0


def test_bad_route_documents_are_refused_with_a_clear_reason() -> None:
    with pytest.raises(RoutingError, match="duplicate"):
        parse_routes('[{"name": "a", "engine": "cascade"}, {"name": "a", "engine": "cascade"}]', SETTINGS)
    with pytest.raises(RoutingError, match="name"):
        parse_routes('{"models": [{"engine": "cascade"}]}', SETTINGS)
    with pytest.raises(RoutingError, match="JSON"):
        parse_routes("{nope", SETTINGS)
