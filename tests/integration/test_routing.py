"""Model routing: the model a client names picks the engine; unknown names are refused."""

from __future__ import annotations

import json
from dataclasses import replace

import httpx
import pytest
from support.gateway import connect, run_gateway

from gateway.routing import Router, RoutingError, parse_routes
from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

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
        assert all(m["takes_turns"] is False for m in body["data"])  # the gateway's speech detector takes them
        ready = (await http.get("/readyz")).json()
        assert ready["engines"] == {"tone-fast": "ok", "tone-long": "ok"}


@pytest.mark.parametrize("name", ["gpt-realtime", "gpt-realtime-2.1", "gpt-4o-realtime-preview", "gpt-live-1"])
async def test_without_a_models_setting_openai_model_names_reach_the_engine(name: str) -> None:
    """What OpenAI's SDKs and the agent frameworks send when the user names no model."""
    async with run_gateway(replace(SETTINGS, models=None), vad_factory=None) as gw:
        assert await answer_chunks(f"{gw.url}?model={name}") > 0


async def test_without_a_models_setting_a_misspelt_model_is_refused() -> None:
    async with run_gateway(replace(SETTINGS, models=None), vad_factory=None) as gw:
        async with connect(gw.url + "?model=tone-fats") as c:
            err = await c.wait_for("error")
            assert err["error"]["code"] == "model_not_found"
            assert "'tone-fats'" in err["error"]["message"] and "/v1/models" in err["error"]["message"]
        async with httpx.AsyncClient(base_url=gw.http) as http:  # the aliases are not listed as models
            assert [m["id"] for m in (await http.get("/v1/models")).json()["data"]] == ["tone-fast"]


def test_a_longer_prefix_wins_and_an_exact_name_wins_over_both() -> None:
    routes = [
        {"name": "*", "engine": "passthrough", "audio_chunks": 1},
        {"name": "gpt-*", "engine": "passthrough", "audio_chunks": 2},
        {"name": "gpt-live*", "engine": "passthrough", "audio_chunks": 3},
        {"name": "gpt-live-x", "engine": "passthrough", "audio_chunks": 4},
    ]
    router = Router(parse_routes(json.dumps(routes), SETTINGS), lambda spec: PassthroughEngine(**spec.options))
    chunks = {m: router.resolve(m)[0].options["audio_chunks"] for m in ("other", "gpt-4o", "gpt-live-1", "gpt-live-x")}
    assert chunks == {"other": 1, "gpt-4o": 2, "gpt-live-1": 3, "gpt-live-x": 4}
    assert [s.name for s in router.named()] == ["gpt-live-x"]
    without_catch_all = Router(parse_routes(json.dumps(routes[1:]), SETTINGS), lambda s: PassthroughEngine(**s.options))
    assert without_catch_all.resolve("other") is None


def test_bad_route_documents_are_refused_with_a_clear_reason() -> None:
    with pytest.raises(RoutingError, match="duplicate"):
        parse_routes('[{"name": "a", "engine": "cascade"}, {"name": "a", "engine": "cascade"}]', SETTINGS)
    with pytest.raises(RoutingError, match="name"):
        parse_routes('{"models": [{"engine": "cascade"}]}', SETTINGS)
    with pytest.raises(RoutingError, match="JSON"):
        parse_routes("{nope", SETTINGS)
