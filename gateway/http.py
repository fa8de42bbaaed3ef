"""The HTTP endpoints: health, metrics, models, client secrets, admin, video interactions.

Each handler is a method of ``HttpApi``, which holds the runtime; ``routes``
lists them for the app (``create_app`` adds the WebSocket endpoints and the
static demo).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.auth import DEFAULT_SECRET_TTL_S, MAX_SECRET_TTL_S, Grant, Minted, MintRefused
from gateway.hosting.calls import hang_up
from gateway.hosting.incoming import Accepted, Rejected, answer_call, call_of_live
from gateway.hosting.stored import recording
from gateway.hosting.video import Refused, submit_interaction
from gateway.jwt_auth import TokenRefused
from gateway.protocol import live_config as lc
from gateway.protocol.dialects import LIVE
from gateway.protocol.errors import Code, ProtocolError
from gateway.protocol.live_events import LIVE_PREFIX
from gateway.protocol.session_config import ConfigLimits, SessionConfig, apply_update, render
from gateway.protocol.video_events import decode_interaction
from gateway.runtime import Runtime
from gateway.store.base import StoreError
from gateway.transport.http_body import BodyRefused, capped, json_body


def _error(status: int, code: str, message: str, param: str | None = None) -> JSONResponse:
    body = {"error": {"type": "invalid_request_error", "code": code, "message": message, "param": param}}
    return JSONResponse(body, status_code=status)


async def token_refused(request: Request, exc: Exception) -> Response:
    """Any HTTP endpoint given a token the gateway refuses for a stated reason (its lifetime): 401 saying it."""
    return _error(401, Code.UNAUTHORIZED, exc.message if isinstance(exc, TokenRefused) else str(exc))


class HttpApi:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    def routes(self) -> list[Route]:
        return [
            Route("/healthz", self.healthz),
            Route("/readyz", self.readyz),
            Route("/metrics", self.metrics),
            Route("/v1/models", self.models),
            Route("/v1/realtime/client_secrets", self.client_secrets, methods=["POST"]),
            Route("/admin/{action}", self.admin, methods=["POST"]),
            Route("/v1/realtime/video/{session_id}/interactions", self.video_interaction, methods=["POST"]),
            Route("/v1/live/sessions/{session_id}/content", self.live_content, methods=["GET"]),
            # An announced phone call's answer (gateway/hosting/incoming.py); /hangup is the calls endpoint's.
            Route("/v1/realtime/calls/{call_id}/accept", self.call_accept, methods=["POST"]),
            Route("/v1/realtime/calls/{call_id}/reject", self.call_reject, methods=["POST"]),
            # GPT-Live's: a SIP call announced as live.transport.incoming, and its hangup (/refer: rest.py).
            Route("/v1/live/sessions/{session_id}/accept", self.live_accept, methods=["POST"]),
            Route("/v1/live/sessions/{session_id}/reject", self.live_reject, methods=["POST"]),
            Route("/v1/live/sessions/{session_id}/hangup", self.live_hangup, methods=["POST"]),
        ]

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        ok, reason = self.rt.ready()
        health = self.rt.engine_health()
        status = "ready" if ok else "draining" if self.rt.draining else "not_ready"
        body: dict[str, Any] = {"status": status, "engines_ok": sum(1 for state in health.values() if state == "ok"),
                                "engines_total": len(health)}  # fmt: skip
        if not ok:  # why, in one word: draining, store_unavailable (sessions can neither open nor resume
            body["reason"] = self.rt.not_ready_reason()  # here) or engine_unhealthy
        grant = await self.rt.auth.authenticate_http(request.headers)
        if grant is not None and grant.tenant.admin:  # the routes' names are a model list: an operator's
            body.update(status=reason, engines=health)
        return JSONResponse(body, status_code=200 if ok else 503)

    async def metrics(self, request: Request) -> Response:
        settings = self.rt.settings
        if settings.requires_auth and not settings.metrics_public:
            # Tenant names and counts are nobody else's business: an operator credential reads them.
            refused = await self._refused_unless_operator(request, "Metrics")
            if refused is not None:
                return refused
        exposition = self.rt.metrics_exposition
        body = await exposition() if exposition is not None else generate_latest(self.rt.metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    async def _refused_unless_operator(self, request: Request, what: str) -> Response | None:
        """401 without a valid credential, 403 for one that is not an operator's; None: go on."""
        grant = await self.rt.auth.authenticate_http(request.headers)
        if grant is None:
            self.rt.metrics.auth_failures.inc()
            return _error(401, Code.UNAUTHORIZED, f"{what} need 'Authorization: Bearer <operator key>'.")
        if not grant.tenant.admin:
            return _error(403, Code.FORBIDDEN, f"{what}: this credential is not an operator's (an operator key is).")
        return None

    async def _grant(self, request: Request, doing: str) -> Grant | Response:
        """The request's credential, or the 401 that says what ``doing`` needs."""
        grant = await self.rt.auth.authenticate_http(request.headers)
        if grant is None:
            self.rt.metrics.auth_failures.inc()
            return _error(401, Code.UNAUTHORIZED, f"{doing} needs 'Authorization: Bearer <API key>'.")
        return grant

    async def _body(self, request: Request) -> Any:
        """The request's JSON body (empty: ``{}``), read within ``max_http_body_bytes``; raises
        BodyRefused (413 past the cap, 400 not JSON: ``BodyRefused.response``)."""
        return json_body(await capped(request, self.rt.settings.max_http_body_bytes).body(), empty={})

    async def models(self, request: Request) -> Response:
        grant = await self._grant(request, "Listing the models")
        if isinstance(grant, Response):
            return grant
        health = self.rt.engine_health()
        data = []
        for spec in self.rt.router.named():
            if not grant.tenant.allows_model(spec.name):
                continue  # only the models this credential may use
            engine = self.rt.router.engines[spec.key]
            data.append(
                {
                    "id": spec.name,
                    "object": "model",
                    "owned_by": "omni-gateway",
                    "engine": engine.info.name,
                    "description": engine.info.description,
                    # session fields this model accepts but does not act on (session.warning names them too)
                    "ignored_fields": list(engine.info.ignored_fields),
                    "accepts_images": engine.info.accepts_images,  # input_image parts (PNG, JPEG)
                    "takes_turns": engine.info.takes_turns,  # its model takes its own turns (docs/live.md)
                    "health": health.get(spec.name, "ok"),
                }
            )
        return JSONResponse({"object": "list", "data": data})

    async def live_content(self, request: Request) -> Response:
        """GPT-Live's ``GET /v1/live/sessions/{id}/content``: a stored session's recording
        (``gateway/session/live_recording.py``), for the credential that created it."""
        grant = await self._grant(request, "Downloading a recording")
        if isinstance(grant, Response):
            return grant
        try:
            content, media_type = await recording(self.rt.hosting, request.path_params["session_id"], grant.principal)
        except ProtocolError as err:
            return _error(404 if err.code == Code.SESSION_NOT_FOUND else 400, err.code, err.message, err.param)
        except StoreError:
            return _error(503, Code.STORE_UNAVAILABLE, "Session state is unavailable; try again shortly.")
        return Response(content, media_type=media_type)

    async def client_secrets(self, request: Request) -> Response:
        grant = await self._grant(request, "Minting a client secret")
        if isinstance(grant, Response):
            return grant
        try:
            body: Any = await self._body(request)
        except BodyRefused as refused:
            return refused.response()
        if not isinstance(body, dict):
            return _error(400, Code.INVALID_JSON, "The body must be a JSON object.")
        ttl = self.rt.settings.client_secret_ttl_s or DEFAULT_SECRET_TTL_S
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
        session = body.get("session")
        if session is not None and not isinstance(session, dict):
            return _error(400, Code.INVALID_TYPE, "'session' must be an object.", "session")
        if session is not None and session.get("type") == "video":
            bound = self._video_secret(grant, session)
        else:
            bound = self._realtime_secret(grant, session)
        if isinstance(bound, Response):
            return bound
        minted, rendered = bound
        try:
            token, expires_at = await self.rt.auth.secrets.mint(replace(grant, minted=minted), ttl)
        except MintRefused as refused:
            if refused.limit == "max_secret_bytes":
                return _error(400, Code.CLIENT_SECRET_TOO_LARGE, refused.message, "session")
            response = _error(429, Code.RATE_LIMIT_EXCEEDED, refused.message)
            if refused.retry_after_s is not None:
                response.headers["Retry-After"] = str(refused.retry_after_s)
            return response
        except StoreError:
            return _error(503, Code.STORE_UNAVAILABLE, "Session state is unavailable; try again shortly.")
        if minted.type != "video":
            rendered = render(rendered, session_id="sess_pending", expires_at=expires_at, beta=False, rest=True)
        result: dict[str, Any] = {"value": token, "expires_at": expires_at, "session": rendered}
        if self.rt.calls is not None and minted.type != "video":  # (an extension: a page needs them for
            result["ice_servers"] = self.rt.calls.config.client_ice_servers()  # its RTCPeerConnection)
        return JSONResponse(result)

    def _realtime_secret(self, grant: Grant, session: dict[str, Any] | None) -> tuple[Minted, Any] | Response:
        """What a realtime (or transcription) secret opens: its model and settings, checked now."""
        default_model = self.rt.settings.model
        config = SessionConfig(model=str(session.get("model", default_model)) if session else default_model)
        try:
            limits = ConfigLimits(voices=self.rt.engine.info.voices)
            if session is not None:  # (given, it needs its type, as the API's does)
                config, _ = apply_update(config, session, beta=False, limits=limits)
        except ProtocolError as err:
            return _error(400, err.code, err.message, err.param)
        if self.rt.vad_factory is None:
            config = replace(config, turn_detection=None)  # what the session will really get here
        if not grant.tenant.allows_model(config.model):
            return _error(403, Code.MODEL_NOT_ALLOWED, f"This credential may not use the model {config.model!r}.",
                          "session.model")  # fmt: skip
        return Minted(config.type, config.model, session or None), config

    def _video_secret(self, grant: Grant, session: dict[str, Any]) -> tuple[Minted, Any] | Response:
        """A secret for /v1/realtime/video (the gateway's extension: ``session.type`` ``video``)."""
        unknown = sorted(set(session) - {"type", "model"})
        if unknown:
            message = (f"A video secret's session takes only 'type' and 'model', not {unknown[0]!r} "
                       "(session.start sets the rest).")  # fmt: skip
            return _error(400, Code.UNKNOWN_PARAMETER, message, f"session.{unknown[0]}")
        if not self.rt.serves_video:
            return _error(400, Code.NO_VIDEO_ENGINE, "This gateway runs no video engine.", "session.type")
        model = self.rt.video_model
        asked = session.get("model")
        if asked is not None and asked != model:
            return _error(400, Code.MODEL_NOT_FOUND, f"The video route serves {model!r}, not {asked!r}; leave "
                          "'model' out or send that.", "session.model")  # fmt: skip
        if not self.rt.video_allowed(grant):
            return _error(403, Code.MODEL_NOT_ALLOWED, f"This credential may not use the video model {model!r}.",
                          "session.model")  # fmt: skip
        return Minted("video", model or ""), {"type": "video", "model": model}

    async def call_accept(self, request: Request) -> Response:
        """An announced call (``realtime.call.incoming``) is accepted with a session configuration:
        its session opens with it, for this credential, on the replica that holds the call."""
        grant = await self._grant(request, "Accepting a call")
        if isinstance(grant, Response):
            return grant
        try:
            body: Any = await self._body(request)
        except BodyRefused as refused:
            return refused.response()
        if not isinstance(body, dict):
            return _error(400, Code.INVALID_JSON, "The body must be a session configuration (a JSON object).")
        if "type" not in body:
            body = {"type": "realtime", **body}
        try:
            model, _ = self.rt.session_defaults(replace(grant, minted=None), body)
        except ProtocolError as err:
            return _error(400, err.code, err.message, err.param)
        if not self.rt.sessions.serves(model):
            return _error(400, Code.MODEL_NOT_FOUND, f"No model {model!r} is served here; GET /v1/models lists them.",
                          "model")  # fmt: skip
        if not grant.tenant.allows_model(model):
            return _error(403, Code.MODEL_NOT_ALLOWED, f"This credential may not use the model {model!r}.", "model")
        return await self._answer_call(request, Accepted(replace(grant, minted=None), body))

    async def live_accept(self, request: Request) -> Response:
        """GPT-Live's accept of a call announced as ``live.transport.incoming``
        (``SessionAcceptParams``: ``{"session": {"type": "live", "model", ...}}``, strict): the
        call's session opens in the Live dialect, with ``session`` as its start settings."""
        grant = await self._grant(request, "Accepting a call")
        if isinstance(grant, Response):
            return grant
        try:
            body: Any = await self._body(request)
            config = _live_accept(body)
        except BodyRefused as refused:
            return refused.response()
        except ProtocolError as err:
            return _error(400, err.code, err.message, err.param)
        model = config["model"]
        if not self.rt.sessions.serves(model):
            return _error(400, Code.MODEL_NOT_FOUND, f"No model {model!r} is served here; GET /v1/models lists them.",
                          "session.model")  # fmt: skip
        if not grant.tenant.allows_model(model):
            return _error(403, Code.MODEL_NOT_ALLOWED, f"This credential may not use the model {model!r}.",
                          "session.model")  # fmt: skip
        session_id = request.path_params["session_id"]
        accepted = Accepted(replace(grant, minted=None), config, LIVE, session_id)
        return await self._answer_live(session_id, accepted)

    async def live_reject(self, request: Request) -> Response:
        """GPT-Live's reject (``SessionRejectParams``: ``status_code`` required, the SIP final response)."""
        grant = await self._grant(request, "Rejecting a call")
        if isinstance(grant, Response):
            return grant
        try:
            body: Any = await self._body(request)
        except BodyRefused as refused:
            return refused.response()
        if not isinstance(body, dict):
            return _error(400, Code.INVALID_TYPE, 'The body must be {"status_code": 400-699}.')
        for key in body:
            if key != "status_code":
                return _error(400, Code.UNKNOWN_PARAMETER, f"Unknown parameter: '{key}'.", key)
        status = body.get("status_code")
        if status is None:
            return _error(400, Code.MISSING_FIELD, "Missing required parameter: 'status_code'.", "status_code")
        if not _sip_final_status(status):
            return _error(400, Code.INVALID_VALUE, SIP_STATUS_MESSAGE, "status_code")
        return await self._answer_live(request.path_params["session_id"], Rejected("rejected", status))

    async def _answer_live(self, session_id: str, answer: Accepted | Rejected) -> Response:
        call_id = call_of_live(session_id)
        try:
            delivered = call_id is not None and await answer_call(self.rt.hosting, call_id, answer)
        except StoreError:
            return _error(503, Code.STORE_UNAVAILABLE, "Session state is unavailable; try again shortly.")
        if not delivered:
            return _error(404, Code.SESSION_NOT_FOUND, f"No incoming call {session_id!r} is waiting for an answer.",
                          "session_id")  # fmt: skip
        return JSONResponse({})

    async def live_hangup(self, request: Request) -> Response:
        """GPT-Live's hangup: the Live session's call ends (SIP: BYE), and its session for good."""
        grant = await self._grant(request, "Ending a call")
        if isinstance(grant, Response):
            return grant
        session_id = request.path_params["session_id"]
        if not session_id.startswith(LIVE_PREFIX) or len(session_id) > 133:
            ended = False
        else:
            try:
                ended = await hang_up(self.rt.hosting, session_id, grant.principal)
            except ProtocolError as err:  # store_unavailable
                return _error(503, err.code, err.message)
        if not ended:
            return _error(404, Code.SESSION_NOT_FOUND, f"No Live session {session_id!r} is in progress.", "session_id")
        return JSONResponse({})

    async def call_reject(self, request: Request) -> Response:
        grant = await self._grant(request, "Rejecting a call")
        if isinstance(grant, Response):
            return grant
        try:
            body: Any = await self._body(request)
        except BodyRefused as refused:
            return refused.response()
        status = body.get("status_code") if isinstance(body, dict) else None
        if not isinstance(body, dict) or set(body) - {"status_code"}:
            return _error(400, Code.INVALID_VALUE, 'The body is empty or {"status_code": 400-699}.')
        if status is not None and not _sip_final_status(status):
            return _error(400, Code.INVALID_VALUE, SIP_STATUS_MESSAGE, "status_code")
        return await self._answer_call(request, Rejected("rejected", status))

    async def _answer_call(self, request: Request, answer: Accepted | Rejected) -> Response:
        call_id = request.path_params["call_id"]
        try:
            delivered = await answer_call(self.rt.hosting, call_id, answer)
        except StoreError:
            return _error(503, Code.STORE_UNAVAILABLE, "Session state is unavailable; try again shortly.")
        if not delivered:
            return _error(404, Code.CALL_NOT_FOUND, f"No call {call_id!r} is waiting for an answer.", "call_id")
        return JSONResponse({})

    async def admin(self, request: Request) -> Response:
        refused = await self._refused_unless_operator(request, "Admin endpoints")
        if refused is not None:
            return refused
        action = request.path_params["action"]
        if action in ("pause", "resume"):
            # Admission: new requests wait while paused (those being admitted finish first).
            for orch in self.rt.orchestrators:
                await (orch.pause() if action == "pause" else orch.resume())
            return JSONResponse({"paused": self.rt.orchestrator.paused, **self.rt.orchestrator.stats()})
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
        for spec in self.rt.router.named():
            engine = self.rt.router.engines[spec.key]
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

    async def video_interaction(self, request: Request) -> Response:
        """POST an interaction to a streaming video session, from any replica."""
        grant = await self._grant(request, "Posting an interaction")
        if isinstance(grant, Response):
            return grant
        sid = request.path_params["session_id"]
        try:
            body = await self._body(request)
            payload = body.get("interaction", body) if isinstance(body, dict) else None
            spec = decode_interaction(payload)
        except BodyRefused as refused:
            return refused.response()
        except ProtocolError as err:
            return _error(400, err.code, err.message, err.param)
        try:
            outcome = await submit_interaction(self.rt.hosting, sid, grant.principal, spec, payload)
        except StoreError:
            return _error(503, Code.STORE_UNAVAILABLE, "Session state is unavailable; try again shortly.")
        if outcome is None:  # another's session answers exactly as one that does not exist
            return _error(404, Code.SESSION_NOT_FOUND, f"No streaming video session {sid!r}.")
        if isinstance(outcome, Refused):
            status = 429 if outcome.code == Code.RATE_LIMIT_EXCEEDED else 409
            return _error(status, outcome.code, outcome.message, "interaction")
        body = {"queued": True, "session_id": sid, "event_id": spec.event_id}
        if outcome.forwarded:  # the owning replica reports the outcome on the session's socket
            body = {"queued": True, "forwarded": True, "session_id": sid, "event_id": spec.event_id}
        return JSONResponse(body, status_code=202)


SIP_STATUS_MESSAGE = "'status_code' must be a SIP final status from 400 to 699 (486 Busy Here, 603 Decline...)."


def _sip_final_status(value: Any) -> bool:
    """A reject's ``status_code``: the SIP final response the caller gets."""
    return isinstance(value, int) and not isinstance(value, bool) and 400 <= value <= 699


_ACCEPT_KEYS = frozenset({"type", "model", "audio", "delegation", "input", "instructions", "safety_identifier",
                          "store", "triggers"})  # fmt: skip


def _live_accept(body: Any) -> dict[str, Any]:
    """The Live start settings of an accept's body (``SessionAcceptParams``); raises ProtocolError."""
    if not isinstance(body, dict):
        raise ProtocolError(Code.INVALID_TYPE, "The body must be a JSON object with 'session'.")
    for key in body:
        if key != "session":
            raise ProtocolError(Code.UNKNOWN_PARAMETER, f"Unknown parameter: '{key}'.", param=key)
    session = body.get("session")
    if session is None:
        raise ProtocolError(Code.MISSING_FIELD, "Missing required parameter: 'session'.", param="session")
    if not isinstance(session, dict):
        raise ProtocolError(Code.INVALID_TYPE, "'session' must be an object.", param="session")
    for key in session:
        if key not in _ACCEPT_KEYS:
            raise ProtocolError(Code.UNKNOWN_PARAMETER, f"Unknown parameter: 'session.{key}'.", param=f"session.{key}")
    if session.get("type") != "live":
        raise ProtocolError(Code.MISSING_FIELD if "type" not in session else Code.INVALID_VALUE,
                            "'session.type' must be 'live' (a Realtime session accepts the call at "
                            "/v1/realtime/calls/{call_id}/accept).", param="session.type")  # fmt: skip
    config = {key: value for key, value in session.items() if key != "type"}
    lc.parse_start(config, media=True)  # (checked here: the call is answered only with settings that open)
    return config
