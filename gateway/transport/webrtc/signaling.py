"""``POST /v1/realtime/calls``: WebRTC calls on OpenAI's GA surface.

Both ways OpenAI accepts a call:

- the browser's SDP offer as ``application/sdp``, with ``Authorization: Bearer <client
  secret or key>`` (the session is the one the client secret was minted with);
- the unified form, ``multipart/form-data`` with ``sdp`` and ``session`` (a session
  object, as for ``POST /v1/realtime/client_secrets``), sent by a backend with its key.

Answer: ``201`` with the SDP answer (``application/sdp``) and ``Location:
/v1/realtime/calls/{call_id}``. Every refusal comes before any media is set up, in
OpenAI's error shape: 400 (a bad offer or session, a model not served), 401
(credentials), 403 (the page's origin, a model the credential may not use), 404 (a
re-offer's session that does not exist), 429 (a tenant limit), 501 (no WebRTC here), 503
(draining, full, the store unavailable).

A **re-offer** (the browser SDK's, after its call's replica went away) carries the
session's resume token, in the header ``X-Omni-Resume`` or the multipart field
``resume`` (``{"session_id", "resume_token", "last_received_server_event_seq"}``): the
new call resumes the session, on whichever replica takes the POST, and its data channel
carries on from the journal, with no event lost or repeated (the listener hears the gap
while the browser re-offers, then the answer from where the journal had it).

``POST /v1/realtime/calls/{call_id}/hangup`` ends a call (its session ends for good) on
any replica. ``GET /v1/realtime/calls/ice_servers`` (a key) tells a backend the STUN/TURN
servers a page should give its ``RTCPeerConnection`` (OpenAI has no such field: they come
with every client secret too, as ``ice_servers``, which is how a page gets them).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.auth import CredentialsUnavailable, Grant
from gateway.hosting.calls import call_id_of, hang_up, session_id_of
from gateway.hosting.door import Door, Sessions
from gateway.protocol import client_events as ce
from gateway.protocol.dialects import GA, Dialect
from gateway.protocol.errors import Code, ProtocolError
from gateway.quotas import AdmissionUnavailable, ConnectRefusal, Seat
from gateway.transport.http_body import BodyRefused, capped, checked_shape
from gateway.transport.services import Services
from gateway.transport.webrtc.config import WebRTCConfig
from gateway.transport.webrtc.sdp import OfferError, PeerNetworks, check_offer, screen_candidates

log = logging.getLogger("omni.webrtc")

RESUME_HEADER = "x-omni-resume"
MAX_BODY_BYTES = 1 << 20  # an offer (64 KiB at most, sdp.py) or a form part; larger: 400 (the whole
#   body is read with the cap max_http_body_bytes: larger, 413 request_body_too_large)
# A form part is read up to MAX_BODY_BYTES: Starlette's max_part_size where it takes one (not
# 0.40, the lowest we declare, whose fixed limit is the same 1 MiB).
_PART_SIZE: dict[str, int] = (
    {"max_part_size": MAX_BODY_BYTES} if "max_part_size" in inspect.signature(Request.form).parameters else {}
)
_RESUME_STATUS = {  # a refused re-offer, by its code
    Code.SESSION_NOT_FOUND: 404,
    Code.RESUME_TOKEN_INVALID: 401,
    Code.STORE_UNAVAILABLE: 503,
}
CORS_HEADERS = "authorization, content-type, x-openai-agents-sdk, x-omni-resume"


class CallServices(Services, Protocol):
    """What the calls endpoint needs of the process (the runtime provides it)."""

    @property
    def sessions(self) -> Sessions: ...

    @property
    def calls(self) -> CallBook | None:
        """The WebRTC calls of this replica; None: WebRTC is off here (setting, or no aiortc)."""

    @property
    def sip(self) -> Any:
        """The SIP server, or None (GPT-Live's ``POST /v1/live/sessions`` places SIP calls too)."""

    def session_defaults(self, grant: Grant, requested: dict[str, Any] | None) -> tuple[str, dict[str, Any] | None]:
        """The model and session settings a call opens with: the client secret's, with the
        unified form's ``session`` over them (it may not name another model), else that
        ``session`` validated (raises ProtocolError)."""


@dataclass
class CallBook:
    """The calls in progress here, and what makes them (built only where aiortc imports)."""

    config: WebRTCConfig
    factory: Any  # peer.PeerFactory
    calls: dict[str, Any] = field(default_factory=dict)  # call id -> call.Call
    peers: PeerNetworks = field(default_factory=PeerNetworks)  # where ICE checks may go (config.peer_networks)

    def __post_init__(self) -> None:
        self.peers = self.config.peers

    @classmethod
    def build(cls, config: WebRTCConfig) -> CallBook:
        from gateway.transport.webrtc.peer import PeerFactory  # aiortc: the webrtc extra

        return cls(config, PeerFactory(config))

    async def start(self) -> list[str]:
        return list(await self.factory.start())

    async def close(self) -> None:
        for call in list(self.calls.values()):
            await call.end("shutdown")


def _error(status: int, code: str, message: str, param: str | None = None, **headers: str) -> JSONResponse:
    body = {"error": {"type": "invalid_request_error", "code": code, "message": message, "param": param}}
    return JSONResponse(body, status_code=status, headers=headers or None)


class CallsEndpoint:
    def __init__(self, runtime: CallServices) -> None:
        self.rt = runtime

    def routes(self) -> list[Route]:
        return [
            Route("/v1/realtime/calls", self.create, methods=["POST", "OPTIONS"]),
            Route("/v1/realtime/calls/ice_servers", self.ice_servers, methods=["GET", "OPTIONS"]),
            Route("/v1/realtime/calls/{call_id}/hangup", self.hangup, methods=["POST", "OPTIONS"]),
        ]

    # --- CORS: a page on another allowed origin may call ---------------------------------

    def _cors(self, request: Request) -> dict[str, str] | None:
        """The CORS headers for the request's page; None: an Origin that may not call here."""
        origin = request.headers.get("origin")
        if origin is None:
            return {}
        if not self.rt.origins.allows(origin, request.headers.get("host")):
            return None
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin", "Access-Control-Expose-Headers": "Location"}

    def _preflight(self, request: Request, cors: dict[str, str]) -> Response:
        return Response(status_code=204, headers={
            **cors, "Access-Control-Allow-Methods": "POST, GET, OPTIONS", "Access-Control-Allow-Headers": CORS_HEADERS,
            "Access-Control-Max-Age": "600",
        })  # fmt: skip

    # --- POST /v1/realtime/calls ----------------------------------------------------------

    async def create(self, request: Request) -> Response:
        return await self._with_cors(request, self._create(request))

    async def _with_cors(self, request: Request, handled: Coroutine[Any, Any, Response]) -> Response:
        """``handled``'s response with the page's CORS headers; a preflight answered; a page
        from an origin not allowed refused (``handled`` is then never run)."""
        cors = self._cors(request)
        if cors is None or request.method == "OPTIONS":
            handled.close()
        if cors is None:
            origin = request.headers.get("origin")
            return _error(403, Code.ORIGIN_NOT_ALLOWED, f"Pages from {origin!r} may not start calls here "
                          "(see the allowed_origins setting).")  # fmt: skip
        if request.method == "OPTIONS":
            return self._preflight(request, cors)
        response = await handled
        response.headers.update(cors)
        return response

    async def _create(self, request: Request) -> Response:
        checked = await self._caller(request)
        if isinstance(checked, Response):
            return checked
        book, grant = checked
        parsed = await self._read_offer(request)
        if isinstance(parsed, Response):
            return parsed
        offer, requested, resume = parsed
        screened = self._screen(book, offer)
        if isinstance(screened, Response):
            return screened
        offer, max_message_size = screened
        try:
            model, settings = self.rt.session_defaults(grant, requested)
        except ProtocolError as err:  # (a client secret's other model or endpoint: 403)
            status = 403 if err.code in (Code.MODEL_NOT_ALLOWED, Code.CLIENT_SECRET_WRONG_TYPE) else 400
            return _error(status, err.code, err.message, err.param)
        seat = await self._seat(grant, model)
        if isinstance(seat, Response):
            return seat

        async def opening(door: Door) -> Response | None:
            if resume is not None:
                refused = await door.resume(resume)
                if refused is not None:
                    return _error(_RESUME_STATUS.get(refused.code, 400), refused.code, refused.message, "resume")
            elif not await door.open(settings):
                return _error(503, Code.STORE_UNAVAILABLE, "Session state is unavailable; try again shortly.")
            return None

        def answered(answer: str, call_id: str, session_id: str) -> Response:
            return Response(answer, status_code=201, media_type="application/sdp",
                            headers={"Location": f"/v1/realtime/calls/{call_id}"})  # fmt: skip

        return await self._answer(book, offer, max_message_size, grant, seat, model, GA, opening, answered,
                                  resumed=resume is not None)  # fmt: skip

    async def _caller(self, request: Request) -> tuple[CallBook, Grant] | Response:
        """What refuses any call here, before a byte of the body: WebRTC off, draining, full, no
        credential (a client secret is not spent on a replica that cannot take the call: a
        retry elsewhere can still use it; a caller without one holds nothing here)."""
        rt = self.rt
        book = rt.calls
        if book is None:
            return _error(501, Code.WEBRTC_UNAVAILABLE, "This gateway answers no WebRTC calls (the webrtc extra is "
                          "not installed, or the webrtc setting is off); use a WebSocket instead.")  # fmt: skip
        if rt.draining:
            return _error(503, Code.SERVER_BUSY, "This replica is shutting down; offer the call again.")
        if rt.session_count() >= rt.settings.max_sessions:
            return _error(503, Code.SERVER_BUSY, f"This replica is at its limit of {rt.settings.max_sessions} "
                          "sessions; try again later.")  # fmt: skip
        try:
            grant = await rt.auth.authenticate(request.headers, [])
        except CredentialsUnavailable:
            return _error(503, Code.STORE_UNAVAILABLE, "Client secrets cannot be checked now; try again shortly.")
        if grant is None:
            rt.hosting.metrics.auth_failures.inc()
            return _error(401, Code.UNAUTHORIZED, "Send 'Authorization: Bearer <API key or client secret>'.",
                          **{"WWW-Authenticate": 'Bearer realm="omni-gateway"'})  # fmt: skip
        return book, grant

    @staticmethod
    def _screen(book: CallBook, offer: str) -> tuple[str, int] | Response:
        """The offer checked (400 past its bounds) and its candidates screened: (offer, the
        peer's max message size)."""
        config = book.config
        try:
            summary = check_offer(offer, max_sections=config.max_offer_sections,
                                  max_candidates=config.max_offer_candidates)  # fmt: skip
        except OfferError as err:
            return JSONResponse(err.body(), status_code=err.status)
        offer, dropped = screen_candidates(offer, book.peers)
        if dropped:
            log.info("webrtc: %d of the offer's ICE candidates left out (webrtc_peer_networks)", dropped)
        return offer, summary.max_message_size

    async def _seat(self, grant: Grant, model: str, param: str = "session.model") -> Seat | Response:
        """The model served and allowed, and the caller's seat among its tenant's sessions."""
        rt = self.rt
        if not rt.sessions.serves(model):
            return _error(400, Code.MODEL_NOT_FOUND, f"No model {model!r} is served here; GET /v1/models lists "
                          "them.", param)  # fmt: skip
        if not grant.tenant.allows_model(model):
            return _error(403, Code.MODEL_NOT_ALLOWED, f"This credential may not use the model {model!r}.", param)
        try:
            admitted = await rt.quotas.admit(grant)
        except AdmissionUnavailable:
            return _error(503, Code.STORE_UNAVAILABLE, "Session state is unavailable; try again shortly.")
        if isinstance(admitted, ConnectRefusal):
            return _error(429, admitted.code, admitted.message)
        return admitted

    async def _answer(
        self, book: CallBook, offer: str, max_message_size: int, grant: Grant, seat: Seat, model: str,
        dialect: Dialect, opening: Callable[[Door], Awaitable[Response | None]],
        answered: Callable[[str, str, str], Response], *, resumed: bool = False,
        requested: dict[str, Any] | None = None, frontend: bool = False,
    ) -> Response:  # fmt: skip
        """Answer the offer, open (or resume) the call's session through its door (``opening``:
        a refusal's response, or None), and say so (``answered(sdp, call id, session id)``)."""
        from gateway.transport.webrtc.call import Call  # aiortc: the webrtc extra

        rt = self.rt

        def on_ended(call: Call) -> None:
            if book.calls.get(call.call_id) is call:  # (a re-offer's new call may hold the id already)
                del book.calls[call.call_id]
            rt.hosting.metrics.sessions.dec()
            rt.hosting.spawn(seat.close())

        call = Call("", book.factory, on_ended=on_ended, max_message_size=max_message_size, dialect=dialect)
        rt.hosting.metrics.sessions.inc()  # (on_ended takes it off, however the call ends)
        rt.hosting.metrics.sessions_total.inc()
        try:
            answer = await call.answer(offer)
        except OfferError as err:
            await call.end("offer refused")
            return JSONResponse(err.body(), status_code=err.status)
        except Exception as exc:  # aiortc failing on what the offer check let through
            log.warning("webrtc: answering an offer failed: %s", exc)
            await call.end("answer failed")
            return _error(400, "invalid_offer", f"Invalid SDP offer: it could not be answered ({type(exc).__name__}).",
                          "sdp")  # fmt: skip
        minted = grant.minted.binding() if grant.minted is not None else None  # (a re-offer's resume checks it)
        door = Door(rt.hosting, rt.sessions, call, dialect=dialect, principal=grant.principal, model=model,
                    max_message_bytes=rt.settings.max_message_bytes, seat=seat, media=call, minted=minted,
                    requested=requested, frontend=frontend)  # fmt: skip
        refused = await opening(door)
        if refused is not None:
            await call.end("no session")
            return refused
        assert door.host is not None
        call.call_id = call_id_of(door.host.id)
        old = book.calls.get(call.call_id)
        if old is not None and old is not call:
            await old.end("re-offered")  # (its door was replaced already; its media goes now)
        book.calls[call.call_id] = call
        call.start(door)
        log.info("call %s answered principal=%s model=%s dialect=%s resumed=%s", call.call_id, grant.principal,
                 model, dialect.name, resumed)  # fmt: skip
        return answered(answer, call.call_id, door.host.id)

    async def _read_offer(
        self, request: Request
    ) -> tuple[str, dict[str, Any] | None, ce.SessionResume | None] | Response:
        """(offer, the unified form's session, the re-offer's resume), or a 400 (413 past the body cap)."""
        try:
            return await self._read_capped_offer(capped(request, self.rt.settings.max_http_body_bytes))
        except BodyRefused as refused:
            return refused.response()

    async def _read_capped_offer(
        self, request: Request
    ) -> tuple[str, dict[str, Any] | None, ce.SessionResume | None] | Response:
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        resume_raw: Any = request.headers.get(RESUME_HEADER)
        if kind == "multipart/form-data":
            try:
                form = await request.form(max_files=4, max_fields=8, **_PART_SIZE)
            except BodyRefused:
                raise
            except Exception:
                return _error(400, Code.INVALID_VALUE, "The multipart body could not be read.", "body")
            offer_field = form.get("sdp")
            if offer_field is None:
                return _error(400, Code.MISSING_FIELD, "The form needs an 'sdp' field (the SDP offer).", "sdp")
            offer = await _text(offer_field)
            session_field = form.get("session")
            requested = None
            if session_field is not None:
                try:
                    requested = orjson.loads(await _text(session_field))
                except orjson.JSONDecodeError:
                    return _error(400, Code.INVALID_JSON, "'session' is not valid JSON.", "session")
                if not isinstance(requested, dict):
                    return _error(400, Code.INVALID_TYPE, "'session' must be a JSON object.", "session")
                checked_shape(requested, "session")
            if form.get("resume") is not None:
                resume_raw = await _text(form["resume"])
        elif kind in ("application/sdp", "text/plain", ""):
            body = await request.body()
            if len(body) > MAX_BODY_BYTES:
                return _error(400, "offer_too_large", "The offer is too large.", "sdp")
            offer, requested = body.decode("utf-8", "replace"), None
        else:
            return _error(400, Code.INVALID_VALUE, f"Content-Type {kind!r}: send the offer as application/sdp, or "
                          "multipart/form-data with 'sdp' and 'session'.", "Content-Type")  # fmt: skip
        resume = None
        if resume_raw is not None:
            try:
                resume = _resume(resume_raw)
            except ProtocolError as err:
                return _error(400, err.code, err.message, f"resume.{err.param}" if err.param else "resume")
        return offer, requested, resume

    # --- hangup and ICE servers ----------------------------------------------------------

    async def hangup(self, request: Request) -> Response:
        cors = self._cors(request)
        if cors is None:
            return _error(403, Code.ORIGIN_NOT_ALLOWED, "This page may not end calls here.")
        if request.method == "OPTIONS":
            return self._preflight(request, cors)
        grant = await self.rt.auth.authenticate_http(request.headers)
        call_id = request.path_params["call_id"]
        if grant is None:
            self.rt.hosting.metrics.auth_failures.inc()
            return _error(401, Code.UNAUTHORIZED, "Send 'Authorization: Bearer <API key>'.", **cors)
        session_id = session_id_of(call_id)
        not_found = _error(404, Code.CALL_NOT_FOUND, f"No call {call_id!r} is in progress.", "call_id", **cors)
        if session_id is None:
            return not_found
        try:
            ended = await hang_up(self.rt.hosting, session_id, grant.principal)
        except ProtocolError as err:  # store_unavailable
            return _error(503, err.code, err.message, **cors)
        return JSONResponse({}, headers=cors) if ended else not_found

    async def ice_servers(self, request: Request) -> Response:
        cors = self._cors(request)
        if cors is None:
            return _error(403, Code.ORIGIN_NOT_ALLOWED, "This page may not ask here.")
        if request.method == "OPTIONS":
            return self._preflight(request, cors)
        # TURN credentials are nobody else's: a key or token (a page gets them with the client
        # secret its backend minted, which a single-use secret cannot be spent on here).
        if await self.rt.auth.authenticate_http(request.headers) is None:
            self.rt.hosting.metrics.auth_failures.inc()
            return _error(401, Code.UNAUTHORIZED, "Send 'Authorization: Bearer <API key>'.", **cors)
        book = self.rt.calls
        servers = book.config.client_ice_servers() if book is not None else []
        return JSONResponse({"ice_servers": servers}, headers=cors)


async def _text(value: str | UploadFile) -> str:
    if isinstance(value, str):
        return value
    data = await value.read()
    return data.decode("utf-8", "replace")


def _resume(raw: str) -> ce.SessionResume:
    """A re-offer's resume, as ``session.resume`` carries it."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ProtocolError(Code.INVALID_JSON, "The resume is not valid JSON.") from None
    if not isinstance(data, dict):
        raise ProtocolError(Code.INVALID_TYPE, "The resume must be a JSON object.")
    event = ce.decode_object({"type": "session.resume", "last_received_server_event_seq": 0, **data})
    assert isinstance(event, ce.SessionResume)
    return event
