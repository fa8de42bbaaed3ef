"""The ASGI application: ``create_app(settings)``."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from gateway import logs
from gateway.auth import DEFAULT_SECRET_TTL_S, MAX_SECRET_TTL_S, Grant
from gateway.protocol.errors import Code, ProtocolError
from gateway.protocol.session_config import ConfigLimits, SessionConfig, apply_update, render
from gateway.protocol.video_events import decode_interaction
from gateway.runtime import Runtime
from gateway.session.session import VadStream
from gateway.settings import Settings
from gateway.store.base import StoreError
from gateway.transport.realtime import RealtimeEndpoint
from gateway.transport.video import VideoEndpoint
from orchestrator.engine import Engine

WEB_DEMO = Path(__file__).resolve().parent.parent / "web_demo"
GC_THRESHOLDS = (700, 10, 100)  # the collector's generation thresholds once started (see lifespan)


def _error(status: int, code: str, message: str, param: str | None = None) -> JSONResponse:
    body = {"error": {"type": "invalid_request_error", "code": code, "message": message, "param": param}}
    return JSONResponse(body, status_code=status)


def create_app(
    settings: Settings | None = None,
    *,
    engine: Engine | None = None,
    vad_factory: Callable[[], VadStream] | bool | None = True,
) -> Starlette:
    settings = settings or Settings()
    logs.install()
    rt = Runtime(settings, engine, vad_factory=vad_factory)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        ok, reason = rt.ready()
        return JSONResponse({"status": reason, "engines": rt.engine_health()}, status_code=200 if ok else 503)

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(rt.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def models(request: Request) -> Response:
        if rt.auth.authenticate_http(request.headers) is None:
            return _error(401, Code.UNAUTHORIZED, "Send 'Authorization: Bearer <API key>'.")
        health = rt.engine_health()
        data = []
        for spec in rt.router.named():
            engine = rt.router.engines[spec.key]
            data.append(
                {
                    "id": spec.name,
                    "object": "model",
                    "owned_by": "omni-gateway",
                    "engine": engine.info.name,
                    "description": engine.info.description,
                    "health": health.get(spec.name, "ok"),
                }
            )
        return JSONResponse({"object": "list", "data": data})

    async def client_secrets(request: Request) -> Response:
        grant = rt.auth.authenticate_http(request.headers)
        if grant is None:
            rt.metrics.auth_failures.inc()
            return _error(401, Code.UNAUTHORIZED, "Minting a client secret needs 'Authorization: Bearer <API key>'.")
        raw = await request.body()
        try:
            body: Any = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            return _error(400, Code.INVALID_JSON, "The body is not valid JSON.")
        if not isinstance(body, dict):
            return _error(400, Code.INVALID_JSON, "The body must be a JSON object.")
        ttl = settings.client_secret_ttl_s or DEFAULT_SECRET_TTL_S
        expires = body.get("expires_after")
        if expires is not None:
            seconds = expires.get("seconds") if isinstance(expires, dict) else None
            if isinstance(seconds, bool) or not isinstance(seconds, int) or not 10 <= seconds <= MAX_SECRET_TTL_S:
                return _error(
                    400,
                    Code.INVALID_VALUE,
                    f"'expires_after.seconds' must be an integer from 10 to {MAX_SECRET_TTL_S}.",
                    "expires_after.seconds",
                )
            ttl = seconds
        session = body.get("session") or {}
        config = SessionConfig(
            model=str(session.get("model", settings.model)) if isinstance(session, dict) else settings.model
        )
        try:
            config, _ = apply_update(config, session, beta=False, limits=ConfigLimits(voices=rt.engine.info.voices))
        except ProtocolError as err:
            return _error(400, err.code, err.message, err.param)
        if rt.vad_factory is None:
            config = replace(config, turn_detection=None)  # what the session will really get here
        token, expires_at = rt.auth.secrets.mint(Grant(grant.principal, session or None), ttl)
        rendered = render(config, session_id="sess_pending", expires_at=expires_at, beta=False)
        return JSONResponse({"value": token, "expires_at": expires_at, "session": rendered})

    async def admin(request: Request) -> Response:
        if rt.auth.authenticate_http(request.headers) is None:
            return _error(401, Code.UNAUTHORIZED, "Admin endpoints need 'Authorization: Bearer <API key>'.")
        action = request.path_params["action"]
        if action in ("pause", "resume"):
            # Admission: new requests wait while paused (those being admitted finish first).
            for orch in rt.orchestrators:
                await (orch.pause() if action == "pause" else orch.resume())
            return JSONResponse({"paused": rt.orchestrator.paused, **rt.orchestrator.stats()})
        if action not in ("sleep", "wake_up", "engine_pause", "engine_resume"):
            return _error(
                404,
                Code.INVALID_VALUE,
                f"Unknown admin action {action!r}; use pause, resume, sleep, wake_up, engine_pause or engine_resume.",
            )
        # Engine-level controls (vLLM-Omni's sleep/wake_up, pause/resume_generation): only
        # engines that have them act; ``level`` is sleep's (1 or 2).
        method = {"engine_pause": "pause", "engine_resume": "resume"}.get(action, action)
        acted = []
        for spec in rt.router.named():
            engine = rt.router.engines[spec.key]
            fn = getattr(engine, method, None)
            if fn is None:
                continue
            if action == "sleep":
                await fn(int(request.query_params.get("level", "1")))
            else:
                await fn()
            acted.append(spec.name)
        if not acted:
            return _error(409, Code.INVALID_VALUE, f"No engine here supports {action}.")
        return JSONResponse({"action": action, "models": acted})

    async def video_interaction(request: Request) -> Response:
        """POST an interaction to a streaming video session, from any replica."""
        grant = rt.auth.authenticate_http(request.headers)
        if grant is None:
            rt.metrics.auth_failures.inc()
            return _error(401, Code.UNAUTHORIZED, "Send 'Authorization: Bearer <API key>'.")
        sid = request.path_params["session_id"]
        try:
            body = orjson.loads(await request.body() or b"{}")
            payload = body.get("interaction", body) if isinstance(body, dict) else None
            default_k = rt.video_engine.info.default_transition_chunks if rt.video_engine else 3
            event = decode_interaction(payload, default_k)
        except orjson.JSONDecodeError:
            return _error(400, Code.INVALID_JSON, "The body is not valid JSON.")
        except ProtocolError as err:
            return _error(400, err.code, err.message, err.param)
        interaction = event.interaction
        local = rt.video_sessions.get(sid)
        if local is not None:
            if local.principal != grant.principal:
                return _error(403, Code.RESUME_FORBIDDEN, "This session belongs to another principal.")
            failure = await local.interact_now(interaction)
            if failure is not None:
                return _error(409, failure[0], failure[1], "interaction")
            return JSONResponse({"queued": True, "session_id": sid, "event_id": interaction.event_id}, status_code=202)
        try:
            data = await rt.store.load_snapshot(sid)
            state = orjson.loads(data) if data else None
            if not isinstance(state, dict) or state.get("kind") != "video":
                return _error(404, Code.SESSION_NOT_FOUND, f"No streaming video session {sid!r}.")
            if state.get("principal") != grant.principal:
                return _error(403, Code.RESUME_FORBIDDEN, "This session belongs to another principal.")
            message = {"type": "interaction", "session_id": sid, "interaction": payload}
            if not isinstance(payload, dict) or "event_id" not in payload:
                message["interaction"] = {**(payload or {}), "event_id": interaction.event_id}
            delivered = await rt.store.send_to_owner(sid, orjson.dumps(message))
        except StoreError:
            return _error(503, Code.STORE_UNAVAILABLE, "Session state is unavailable; try again shortly.")
        if not delivered:
            return _error(404, Code.SESSION_NOT_FOUND, f"Session {sid!r} has no live owner.")
        # Forwarded: the owning replica reports the outcome on the session's socket.
        return JSONResponse(
            {"queued": True, "forwarded": True, "session_id": sid, "event_id": interaction.event_id}, status_code=202
        )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await rt.start()
        # Everything loaded so far (engines, torch, models) lives as long as the
        # process: move it out of the collector's sight, so a full collection
        # walks only per-session objects (measured: 110-170 ms pauses -> 7 ms).
        gc.collect()
        gc.freeze()
        # Sessions keep growing the heap (conversation items, journal entries), and with
        # the default thresholds each 25 % of growth costs a full collection, a pause
        # that stops every session (400 streaming sessions: up to 82 ms, several in 5 s;
        # see bench/README.md). Young collections stay as they are (a larger gen-0 threshold only
        # made each pause longer: 7-22 ms at 50 000); full ones wait for 100 gen-1
        # collections, so cycles that reached the oldest generation live longer.
        gc.set_threshold(*GC_THRESHOLDS)
        try:
            yield
        finally:
            await rt.close()

    app = Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
            Route("/v1/models", models),
            Route("/v1/realtime/client_secrets", client_secrets, methods=["POST"]),
            Route("/admin/{action}", admin, methods=["POST"]),
            Route("/v1/realtime/video/{session_id}/interactions", video_interaction, methods=["POST"]),
            WebSocketRoute("/v1/realtime", RealtimeEndpoint(rt)),
            WebSocketRoute("/v1/realtime/video", VideoEndpoint(rt)),
            # The browser demo and SDK, last so that it never shadows the API.
            Mount("/", StaticFiles(directory=WEB_DEMO, html=True, check_dir=False), name="web_demo"),
        ],
        lifespan=lifespan,
    )
    app.state.runtime = rt
    return app
