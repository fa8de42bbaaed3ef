"""Auth over real sockets (API keys, browser subprotocol, single-use client
secrets) and the HTTP endpoints: health, readiness, metrics, admin."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
import websockets
from openai.types.realtime import RealtimeSessionCreateResponse
from prometheus_client.parser import text_string_to_metric_families
from support.gateway import Client, RunningGateway, connect, run_gateway
from support.sdk_shapes import check_event

from gateway.auth import Grant, principal_of_key
from gateway.protocol.errors import Code
from gateway.settings import Settings
from orchestrator.engine import EngineError, EngineOutput, ResponseRequest
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(60)

K1 = "sk-test-k1-5a1c7e0f"
K2 = "sk-test-k2-93b2d4c6"
KEY_PROTO = "openai-insecure-api-key."


def settings(**kwargs: Any) -> Settings:
    kwargs.setdefault("detach_grace_s", 0.2)
    kwargs.setdefault("drain_window_s", 0.5)
    kwargs.setdefault("video_engine", "none")
    return Settings(engine="passthrough", **kwargs)


def passthrough() -> PassthroughEngine:
    return PassthroughEngine(audio_chunks=3, paced=False)


@pytest.fixture
async def gw() -> AsyncIterator[RunningGateway]:
    async with run_gateway(settings(api_keys=(K1, K2)), engine=passthrough(), vad_factory=None) as gw:
        yield gw


@pytest.fixture
async def open_gw() -> AsyncIterator[RunningGateway]:
    """Loopback and no keys: auth is off."""
    async with run_gateway(settings(), engine=passthrough(), vad_factory=None) as gw:
        yield gw


@pytest.fixture
async def http(gw: RunningGateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gw.http) as client:
        yield client


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def assert_refused(gw: RunningGateway, *, status: int = 401, code: str = Code.UNAUTHORIZED,
                         url: str | None = None, **connect_kwargs: Any) -> dict[str, Any]:  # fmt: skip
    """Refused at the HTTP upgrade (no 101, never a session): ``status`` and OpenAI's error
    shape as the body."""
    with pytest.raises(websockets.InvalidStatus) as info:
        async with connect(url or gw.url, **connect_kwargs):
            raise AssertionError("the upgrade was accepted")
    response = info.value.response
    assert response.status_code == status
    # (older uvicorn releases, 0.35 among them, send their own text/plain Content-Type first)
    assert "application/json" in response.headers.get_all("content-type")
    body = orjson.loads(response.body)
    assert set(body) == {"error"}
    err = body["error"]
    assert (err["type"], err["code"], err["param"]) == ("invalid_request_error", code, None)
    assert err["message"]
    return {name.lower(): value for name, value in response.headers.raw_items()}


async def assert_session(c: Client) -> dict[str, Any]:
    created = await c.wait_for("session.created")
    await c.send(
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        }
    )
    await c.wait_for("conversation.item.added")
    return created


# --- API keys on the socket -----------------------------------------------------------


async def test_no_credentials_are_refused_at_the_upgrade_with_401(gw: RunningGateway) -> None:
    headers = await assert_refused(gw)
    assert headers["www-authenticate"].startswith("Bearer")
    assert gw.runtime.metrics.registry.get_sample_value("omni_auth_failures_total") == 1.0
    assert not gw.runtime.connections


async def test_wrong_key_is_refused_at_the_upgrade_with_401(gw: RunningGateway) -> None:
    await assert_refused(gw, headers=bearer("sk-test-wrong"))
    await assert_refused(gw, subprotocols=[KEY_PROTO + "sk-test-wrong"])


def without_http_response_extension(app: Any) -> Any:
    """The app as a server without ASGI's ``websocket.http.response`` extension sees it."""

    async def stripped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            scope = {**scope, "extensions": {k: v for k, v in scope.get("extensions", {}).items()
                                             if k != "websocket.http.response"}}  # fmt: skip
        await app(scope, receive, send)

    return stripped


async def test_without_the_http_response_extension_a_refusal_is_an_error_then_close_4001() -> None:
    async with run_gateway(settings(api_keys=(K1,)), engine=passthrough(), vad_factory=None,
                           wrap=without_http_response_extension) as gw:  # fmt: skip
        for path, code in (("/v1/realtime", "unauthorized"), ("/v1/realtime/video", "unauthorized")):
            async with connect(gw.http.replace("http", "ws") + path, headers=bearer("sk-test-wrong")) as c:
                first = await c.recv()
                assert first["type"] == "error"
                assert (first["error"]["code"] if "error" in first else first["code"]) == code
                with pytest.raises(websockets.ConnectionClosed) as info:
                    await asyncio.wait_for(c.ws.recv(), 5)
                assert info.value.rcvd is not None and info.value.rcvd.code == 4001
        async with connect(gw.url, headers={"Origin": "https://evil.example"} | bearer(K1)) as c:
            assert (await c.recv())["error"]["code"] == Code.ORIGIN_NOT_ALLOWED
            with pytest.raises(websockets.ConnectionClosed) as info:
                await asyncio.wait_for(c.ws.recv(), 5)
            assert info.value.rcvd is not None and info.value.rcvd.code == 4003


async def test_the_video_socket_is_refused_at_the_upgrade_too(gw: RunningGateway) -> None:
    await assert_refused(gw, url=gw.http.replace("http", "ws") + "/v1/realtime/video", headers=bearer("sk-x"))


# --- browser origins ---------------------------------------------------------------------


async def test_a_page_from_another_origin_is_refused_403_and_its_secret_is_not_spent(
    gw: RunningGateway, http: httpx.AsyncClient
) -> None:
    secret = (await mint(http)).json()["value"]
    evil = {"Origin": "https://evil.example"}
    await assert_refused(gw, status=403, code=Code.ORIGIN_NOT_ALLOWED, headers=evil,
                         subprotocols=["realtime", KEY_PROTO + secret])  # fmt: skip
    async with connect(gw.url, subprotocols=["realtime", KEY_PROTO + secret]) as c:  # still good
        await assert_session(c)


async def test_by_default_pages_on_this_machine_and_the_gateways_own_pages_may_connect(gw: RunningGateway) -> None:
    for origin in (f"http://127.0.0.1:{gw.port}", "http://localhost:3000", "http://[::1]:5173",
                   "http://app.localhost"):  # fmt: skip
        async with connect(gw.url, headers={"Origin": origin} | bearer(K1)) as c:
            await assert_session(c)
    async with connect(gw.url, headers=bearer(K1)) as c:  # no Origin: not a browser
        await assert_session(c)


async def test_allowed_origins_admit_exactly_those_pages() -> None:
    allowed = ("https://app.example.com", "https://*.tenant.example")
    async with run_gateway(settings(api_keys=(K1,), allowed_origins=allowed), engine=passthrough(),
                           vad_factory=None) as gw:  # fmt: skip
        for origin in ("https://app.example.com", "https://APP.example.com:443", "https://a.tenant.example"):
            async with connect(gw.url, headers={"Origin": origin} | bearer(K1)) as c:
                await assert_session(c)
        for origin in ("http://app.example.com", "https://app.example.com.evil", "https://tenant.example",
                       "http://localhost:3000", "null"):  # fmt: skip
            await assert_refused(gw, status=403, code=Code.ORIGIN_NOT_ALLOWED, headers={"Origin": origin} | bearer(K1))


async def test_without_auth_only_loopback_pages_may_connect_not_a_rebound_dns_name(open_gw: RunningGateway) -> None:
    async with connect(open_gw.url, headers={"Origin": f"http://127.0.0.1:{open_gw.port}"}) as c:
        await assert_session(c)
    # DNS rebinding: a page at evil.example:<port>, its name resolved to 127.0.0.1, is same-origin
    # with what its browser sends as Host; without auth only loopback names pass.
    rebound = {"Origin": f"http://evil.example:{open_gw.port}"}
    await assert_refused(open_gw, status=403, code=Code.ORIGIN_NOT_ALLOWED, headers=rebound)
    await assert_refused(open_gw, status=403, code=Code.ORIGIN_NOT_ALLOWED, headers={"Origin": "https://evil.example"})


async def test_allowed_origins_star_admits_every_page() -> None:
    async with run_gateway(settings(api_keys=(K1,), allowed_origins=("*",)), engine=passthrough(),
                           vad_factory=None) as gw:  # fmt: skip
        async with connect(gw.url, headers={"Origin": "https://anyone.example"} | bearer(K1)) as c:
            await assert_session(c)


async def test_second_configured_key_works_as_bearer(gw: RunningGateway) -> None:
    async with connect(gw.url, headers=bearer(K2)) as c:
        await assert_session(c)


async def test_key_in_the_browser_subprotocol_works_and_is_not_echoed(gw: RunningGateway) -> None:
    async with connect(gw.url, subprotocols=[KEY_PROTO + K1]) as c:
        assert c.ws.subprotocol is None
        await assert_session(c)
    async with connect(gw.url, subprotocols=["realtime", KEY_PROTO + K1]) as c:
        assert c.ws.subprotocol == "realtime"
        await assert_session(c)


async def test_without_keys_on_loopback_no_credentials_are_needed(open_gw: RunningGateway) -> None:
    async with connect(open_gw.url) as c:
        await assert_session(c)


# --- client secrets ----------------------------------------------------------------


async def mint(http: httpx.AsyncClient, body: dict[str, Any] | None = None, key: str = K1) -> httpx.Response:
    return await http.post("/v1/realtime/client_secrets", headers=bearer(key), json=body or {})


async def test_client_secret_is_minted_in_the_ga_shape(http: httpx.AsyncClient) -> None:
    before = time.time()
    r = await mint(http, {"session": {"type": "realtime", "instructions": "Talk like a pirate."}})
    assert r.status_code == 200
    body = r.json()
    # OpenAI's three fields, and the one documented extension: the STUN/TURN servers a page
    # gives its RTCPeerConnection for a WebRTC call (docs/webrtc.md).
    assert set(body) == {"value", "expires_at", "session", "ice_servers"}
    assert body["ice_servers"] == []  # none configured
    assert body["value"].startswith("ek_")
    assert before + 600 - 2 <= body["expires_at"] <= time.time() + 600 + 1  # the default TTL
    session = body["session"]
    assert session["type"] == "realtime"
    assert session["object"] == "realtime.session"
    assert session["instructions"] == "Talk like a pirate."
    assert session["audio"]["output"]["voice"] == "alloy"


async def test_a_custom_voice_is_a_name_in_the_rest_answer_and_the_object_on_the_socket(
    gw: RunningGateway, http: httpx.AsyncClient
) -> None:
    """The SDK types the REST answer's session (``RealtimeSessionCreateResponse``) with a voice
    name only, and the socket's session.created (the request shape) with a name or ``VoiceID``."""
    r = await mint(http, {"session": {"type": "realtime", "audio": {"output": {"voice": {"id": "voice_7f3a"}}}}})
    assert r.status_code == 200
    session = r.json()["session"]
    assert session["audio"]["output"]["voice"] == "voice_7f3a"
    RealtimeSessionCreateResponse.model_validate(session, strict=True)
    async with connect(gw.url, subprotocols=["realtime", KEY_PROTO + r.json()["value"]]) as c:
        created = await c.wait_for("session.created")
        assert created["session"]["audio"]["output"]["voice"] == {"id": "voice_7f3a"}
        check_event(created)


async def test_client_secret_lifetime_follows_expires_after(http: httpx.AsyncClient) -> None:
    r = await mint(http, {"expires_after": {"anchor": "created_at", "seconds": 30}})
    assert r.status_code == 200
    assert abs(r.json()["expires_at"] - (time.time() + 30)) <= 2


@pytest.mark.parametrize("seconds", [5, 7201, "60", True, None])
async def test_client_secret_lifetime_out_of_range_is_refused(http: httpx.AsyncClient, seconds: Any) -> None:
    r = await mint(http, {"expires_after": {"anchor": "created_at", "seconds": seconds}})
    assert r.status_code == 400
    err = r.json()["error"]
    assert (err["code"], err["param"]) == (Code.INVALID_VALUE, "expires_after.seconds")


async def test_client_secret_with_a_bad_session_is_refused(http: httpx.AsyncClient) -> None:
    r = await mint(http, {"session": {"type": "realtime", "instructions": "x", "colour": "red"}})
    assert r.status_code == 400
    err = r.json()["error"]
    assert (err["code"], err["param"]) == (Code.UNKNOWN_PARAMETER, "session.colour")
    r = await mint(http, {"session": {"type": "realtime", "audio": {"output": {"voice": "nobody"}}}})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "session.audio.output.voice"


async def test_client_secret_body_must_be_json(http: httpx.AsyncClient) -> None:
    r = await http.post("/v1/realtime/client_secrets", headers=bearer(K1), content=b"{nope")
    assert r.status_code == 400
    assert r.json()["error"]["code"] == Code.INVALID_JSON


async def test_client_secret_needs_an_api_key(gw: RunningGateway, http: httpx.AsyncClient) -> None:
    r = await http.post("/v1/realtime/client_secrets", json={})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == Code.UNAUTHORIZED
    r = await mint(http, key="sk-test-wrong")
    assert r.status_code == 401
    secret = (await mint(http)).json()["value"]
    r = await mint(http, key=secret)  # a client secret cannot mint another
    assert r.status_code == 401


async def test_client_secret_connects_once(gw: RunningGateway, http: httpx.AsyncClient) -> None:
    secret = (await mint(http)).json()["value"]
    async with connect(gw.url, subprotocols=["realtime", KEY_PROTO + secret]) as c:
        assert c.ws.subprotocol == "realtime"
        await assert_session(c)
    await assert_refused(gw, subprotocols=["realtime", KEY_PROTO + secret])


async def test_client_secret_works_as_bearer_too(gw: RunningGateway, http: httpx.AsyncClient) -> None:
    secret = (await mint(http)).json()["value"]
    async with connect(gw.url, headers=bearer(secret)) as c:
        await assert_session(c)
    await assert_refused(gw, headers=bearer(secret))


async def test_expired_client_secret_is_refused(gw: RunningGateway) -> None:
    # Minted a minute ago with a 10 s lifetime (the HTTP endpoint's shortest).
    secret, _ = await gw.runtime.auth.secrets.mint(Grant(principal_of_key(K1)), 10, now=time.time() - 60)
    await assert_refused(gw, subprotocols=[KEY_PROTO + secret])


async def test_forged_client_secret_is_refused(gw: RunningGateway) -> None:
    await assert_refused(gw, subprotocols=[KEY_PROTO + "ek_forged0000000000000000000000000000000000"])


async def test_session_settings_given_when_minting_apply_to_the_session(
    gw: RunningGateway, http: httpx.AsyncClient
) -> None:
    r = await mint(
        http,
        {
            "session": {
                "type": "realtime",
                "instructions": "Talk like a pirate.",
                "output_modalities": ["text"],
                "audio": {"output": {"voice": "marin"}},
            }
        },
    )
    secret = r.json()["value"]
    async with connect(gw.url, subprotocols=[KEY_PROTO + secret]) as c:
        created = await c.wait_for("session.created")
        session = created["session"]
        assert session["instructions"] == "Talk like a pirate."
        assert session["output_modalities"] == ["text"]
        assert session["audio"]["output"]["voice"] == "marin"
        await c.send({"type": "response.create"})
        await c.wait_for("response.done")
        assert "response.output_text.delta" in c.types()
        assert "response.output_audio.delta" not in c.types()


def _comparable(session: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in session.items() if k not in ("id", "expires_at")}


async def test_minted_session_describes_the_session_the_secret_opens(
    gw: RunningGateway, http: httpx.AsyncClient
) -> None:
    minted = (await mint(http, {"session": {"type": "realtime", "instructions": "x"}})).json()
    async with connect(gw.url, subprotocols=[KEY_PROTO + minted["value"]]) as c:
        created = await c.wait_for("session.created")
    assert _comparable(minted["session"]) == _comparable(created["session"])


async def test_secret_minted_with_server_vad_on_a_gateway_without_vad_leaves_a_usable_session(
    gw: RunningGateway, http: httpx.AsyncClient
) -> None:
    r = await mint(
        http, {"session": {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad"}}}}}
    )
    if r.status_code == 400:  # refusing it when minting is as good as fixing it up later
        assert r.json()["error"]["param"] == "session.audio.input.turn_detection"
        return
    async with connect(gw.url, subprotocols=[KEY_PROTO + r.json()["value"]]) as c:
        await c.wait_for("session.created")
        await c.send({"type": "session.update", "session": {"type": "realtime", "instructions": "hello"}})
        got = await c.wait_for(lambda e: e["type"] in ("session.updated", "error"))
        assert got["type"] == "session.updated", got


# --- secrets in logs -------------------------------------------------------------------


WRONG = "sk-test-wrong-key-77"


async def run_credentialed_traffic(caplog: pytest.LogCaptureFixture, *, hook_uvicorn: bool) -> tuple[str, str]:
    """Keys and a client secret used every way they can be, logging at DEBUG.
    Returns the server-side log text and the client secret used."""
    caplog.set_level(logging.DEBUG)
    async with run_gateway(settings(api_keys=(K1, K2)), engine=passthrough(), vad_factory=None) as gw:
        # uvicorn's loggers do not propagate to the root logger: listen to them directly.
        hooked = [logging.getLogger(n) for n in ("uvicorn", "uvicorn.error", "uvicorn.access")] if hook_uvicorn else []
        levels = [lg.level for lg in hooked]
        for lg in hooked:
            lg.addHandler(caplog.handler)
            lg.setLevel(logging.DEBUG)
        try:
            async with httpx.AsyncClient(base_url=gw.http) as http:
                secret = (await mint(http, key=K1)).json()["value"]
                await http.post("/admin/pause", headers=bearer(K2))
                await http.post("/admin/resume", headers=bearer(K2))
                await http.get("/v1/models", headers=bearer(WRONG))
            async with connect(gw.url, headers=bearer(K1)) as c:
                await assert_session(c)
                await c.send({"type": "response.create"})
                await c.wait_for("response.done")
            async with connect(gw.url, subprotocols=[KEY_PROTO + K2]) as c:
                await assert_session(c)
            async with connect(gw.url, subprotocols=[KEY_PROTO + secret]) as c:
                await assert_session(c)
            await assert_refused(gw, subprotocols=[KEY_PROTO + secret])
            await assert_refused(gw, headers=bearer(WRONG))
        finally:
            for lg, level in zip(hooked, levels, strict=True):
                lg.removeHandler(caplog.handler)
                lg.setLevel(level)
    # What the gateway process logged (the test's own clients log their headers at DEBUG).
    client_side = ("websockets.client", "httpx", "httpcore")
    records = [r for r in caplog.records if not r.name.startswith(client_side)]
    assert any(r.name.startswith("omni.") for r in records)
    if hook_uvicorn:
        assert any(r.name.startswith("uvicorn") for r in records)
    text = "\n".join(caplog.handler.format(r) + repr(r.args) for r in records)
    assert f"principal={principal_of_key(K1)}" in text  # the logs were captured, and name the caller
    return text, secret


def assert_no_credentials(text: str, secret: str) -> None:
    for credential in (K1, K2, secret, secret[len("ek_") :], WRONG):
        assert credential not in text


async def test_gateway_logs_never_contain_keys_or_secrets(caplog: pytest.LogCaptureFixture) -> None:
    text, secret = await run_credentialed_traffic(caplog, hook_uvicorn=False)
    assert_no_credentials(text, secret)


async def test_server_logs_at_debug_never_contain_keys_or_secrets(caplog: pytest.LogCaptureFixture) -> None:
    text, secret = await run_credentialed_traffic(caplog, hook_uvicorn=True)
    assert_no_credentials(text, secret)


# --- HTTP endpoints ----------------------------------------------------------------------


async def test_healthz_is_200(http: httpx.AsyncClient) -> None:
    r = await http.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


async def test_readyz_is_200_when_ready(http: httpx.AsyncClient) -> None:
    r = await http.get("/readyz")
    assert r.status_code == 200
    assert r.json() == {"status": "ready", "engines_ok": 1, "engines_total": 1}  # no route names without a key
    r = await http.get("/readyz", headers=bearer(K1))
    assert r.json() == {"status": "ready", "engines_ok": 1, "engines_total": 1, "engines": {"omni-cascade": "ok"}}


class SwitchableEngine(PassthroughEngine):
    """Engine double: the passthrough engine with a health switch the test flips."""

    def __init__(self) -> None:
        super().__init__(audio_chunks=3, paced=False)
        self.up = True

    def healthy(self) -> bool:
        return self.up


class DyingEngine(PassthroughEngine):
    """Engine double: every answer fails with a fatal EngineError (the model server died)."""

    async def respond(self, request: ResponseRequest, inputs: Any) -> AsyncIterator[EngineOutput]:
        self.active.add(request.request_id)
        try:
            raise EngineError("engine_unavailable", "the model server died", fatal=True)
            yield  # an async generator, like every engine's respond
        finally:
            self.active.discard(request.request_id)


async def test_readyz_is_503_while_the_engine_is_unhealthy() -> None:
    engine = SwitchableEngine()
    async with run_gateway(settings(), engine=engine, vad_factory=None) as gw:
        async with httpx.AsyncClient(base_url=gw.http) as http:
            engine.up = False
            r = await http.get("/readyz")
            assert r.status_code == 503
            assert r.json() == {
                "status": "omni-cascade: unhealthy",
                "reason": "engine_unhealthy",
                "engines_ok": 0,
                "engines_total": 1,
                "engines": {"omni-cascade": "unhealthy"},
            }  # (auth off: every caller is the operator)
            assert (await http.get("/healthz")).status_code == 200  # alive, just not ready
            engine.up = True
            assert (await http.get("/readyz")).status_code == 200


async def test_readyz_is_503_once_the_engine_has_failed() -> None:
    async with run_gateway(settings(), engine=DyingEngine(), vad_factory=None) as gw:
        async with httpx.AsyncClient(base_url=gw.http) as http:
            assert (await http.get("/readyz")).status_code == 200
            async with connect(gw.url) as c:
                await c.wait_for("session.created")
                await c.send({"type": "response.create", "event_id": "r1"})
                err = await c.wait_for("error")
                assert err["error"]["code"] == "engine_unavailable"
                done = await c.wait_for("response.done")
                assert done["response"]["status"] == "failed"
            r = await http.get("/readyz")
            assert r.status_code == 503
            assert r.json()["status"] == "omni-cascade: failed: the model server died"


async def test_metrics_are_prometheus_text_with_the_omni_names(gw: RunningGateway, http: httpx.AsyncClient) -> None:
    async with connect(gw.url, headers=bearer(K1)) as c:
        await c.wait_for("session.created")
        await c.send({"type": "response.create"})
        await c.wait_for("response.done")
        await c.send({"type": "conversation.item.retrieve", "item_id": "ghost"})
        await c.wait_for("error")
        r = await http.get("/metrics", headers=bearer(K1))
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}

    def value(name: str, **labels: str) -> float:
        for family in families.values():
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return float(sample.value)
        raise AssertionError(f"no sample {name}{labels} in /metrics")

    assert value("omni_sessions_active") == 1.0
    assert value("omni_sessions_total") == 1.0
    assert value("omni_requests_total", kind="response", status="completed") == 1.0
    assert value("omni_request_queue_wait_seconds_count", kind="response") == 1.0
    assert value("omni_request_time_to_first_delta_seconds_count", kind="response") == 1.0
    assert value("omni_request_inter_delta_seconds_count", kind="response") >= 1.0
    assert value("omni_errors_total", code="item_not_found") == 1.0
    assert value("omni_client_events_total", type="response.create") == 1.0
    for name in (
        "omni_requests_inflight",
        "omni_speech_stopped_to_first_audio_seconds",
        "omni_session_closes",
        "omni_auth_failures",
    ):
        assert name in families, sorted(families)


async def test_metrics_count_refused_connections(gw: RunningGateway, http: httpx.AsyncClient) -> None:
    await assert_refused(gw)
    text = (await http.get("/metrics", headers=bearer(K1))).text
    assert "omni_auth_failures_total 1.0" in text
    assert 'omni_upgrade_refusals_total{code="unauthorized"} 1.0' in text


async def test_admin_needs_a_key_when_keys_are_set(gw: RunningGateway, http: httpx.AsyncClient) -> None:
    for action in ("pause", "resume"):
        r = await http.post(f"/admin/{action}")
        assert r.status_code == 401
        assert r.json()["error"]["code"] == Code.UNAUTHORIZED
        assert (await http.post(f"/admin/{action}", headers=bearer("sk-test-wrong"))).status_code == 401
    assert not gw.runtime.orchestrator.paused
    r = await http.post("/admin/pause", headers=bearer(K1))
    assert r.status_code == 200
    assert r.json()["paused"] is True
    assert gw.runtime.orchestrator.paused
    r = await http.post("/admin/resume", headers=bearer(K2))
    assert r.status_code == 200
    assert r.json()["paused"] is False
    assert not gw.runtime.orchestrator.paused


async def test_admin_unknown_action_is_404(http: httpx.AsyncClient) -> None:
    r = await http.post("/admin/reboot", headers=bearer(K1))
    assert r.status_code == 404


async def test_admin_is_open_without_keys_on_loopback(open_gw: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=open_gw.http) as http:
        assert (await http.post("/admin/pause")).json()["paused"] is True
        assert (await http.post("/admin/resume")).json()["paused"] is False


async def test_models_lists_the_served_model_for_a_key_holder(http: httpx.AsyncClient) -> None:
    assert (await http.get("/v1/models")).status_code == 401
    r = await http.get("/v1/models", headers=bearer(K1))
    assert r.status_code == 200
    data = r.json()["data"]
    assert [m["id"] for m in data] == ["omni-cascade"]
    assert data[0]["engine"] == "passthrough"


async def test_metrics_need_an_operator_key_when_auth_is_on(gw: RunningGateway, http: httpx.AsyncClient) -> None:
    """Tenant names and counts are an operator's: a scraper sends an API key."""
    refused = await http.get("/metrics")
    assert refused.status_code == 401 and refused.json()["error"]["code"] == Code.UNAUTHORIZED
    assert (await http.get("/metrics", headers=bearer("sk-wrong"))).status_code == 401
    assert (await http.get("/metrics", headers=bearer(K2))).status_code == 200


async def test_metrics_can_be_public_or_open_on_a_loopback_gateway_without_keys(open_gw: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=open_gw.http) as http:
        assert (await http.get("/metrics")).status_code == 200  # no auth required here at all
    async with run_gateway(settings(api_keys=(K1,), metrics_public=True), engine=passthrough(), vad_factory=None) as gw:
        async with httpx.AsyncClient(base_url=gw.http) as http:
            assert (await http.get("/metrics")).status_code == 200
