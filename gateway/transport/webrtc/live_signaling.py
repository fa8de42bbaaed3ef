"""``POST /v1/live/sessions``: a GPT-Live session over WebRTC (openai-python 3.63.0's
``client.live.create``: ``LiveCreateParams`` in, ``LiveCreateResponse`` out).

The request is JSON, ``{"session": <MediaSessionConfigParam>, "transport": {"type":
"webrtc", "sdp": <the browser's offer>}}``, sent by a backend with its key (or JWT),
or by a page with a client secret minted for the model it names. The session is
strict, as on the WebSocket (an unknown field anywhere: ``unknown_parameter``), and
has no ``audio.format``: WebRTC negotiates its audio (Opus on the track, PCM16 at
24 kHz to the model). Answer: ``201`` with ``{"session": {"id": "live_..."},
"transport": {"type": "webrtc", "sdp": <answer>}}``; the page applies the answer and
waits for ``session.started`` on its ``oai-events`` data channel.

The call is the one ``POST /v1/realtime/calls`` answers (``signaling.py``: the same
refusals, before any media, in OpenAI's error shape, the same CORS for pages on an
allowed origin, the same limits), speaking the Live dialect on its channel, with the
session's ``client.data_channel`` allow-lists applied there (``protocol/live_channel.py``).
Its server is attached through ``/v1/live/sessions/{id}/attach`` (``realtime.py``).
A body whose ``transport.type`` is ``"sip"`` is an outbound phone call instead
(``transport/sip/rest.py``'s ``live_dial``).

A **re-offer** (the page's, after its call's replica went away: the gateway's resume
extension, as on ``/v1/realtime/calls``) carries the header ``X-Omni-Resume``
(``{"session_id", "resume_token", "last_received_server_event_seq"}``, the token from
``session.started``): the new call resumes that session on whichever replica takes the
POST (the body's ``session`` is checked, then the resumed session's own settings hold),
its channel says ``session.resumed`` and carries on from the journal.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.hosting.door import Door
from gateway.hosting.stored import stored_model
from gateway.protocol import live_config as lc
from gateway.protocol.dialects import LIVE
from gateway.protocol.errors import Code, ProtocolError
from gateway.transport.handshake import minted_refusal
from gateway.transport.http_body import BodyRefused, capped, json_body
from gateway.transport.sip.rest import live_dial
from gateway.transport.webrtc.signaling import _RESUME_STATUS, RESUME_HEADER, CallsEndpoint, _error, _resume

_KEYS = ("session", "transport")


class LiveSessionsEndpoint(CallsEndpoint):
    """See the module docstring (the calls endpoint's checks, the Live request and answer)."""

    def routes(self) -> list[Route]:
        return [
            Route("/v1/live/sessions", self.create, methods=["POST", "OPTIONS"]),
            Route("/v1/live/sessions/{session_id}/fork", self.fork, methods=["POST", "OPTIONS"]),
        ]

    async def fork(self, request: Request) -> Response:
        """``POST /v1/live/sessions/{id}/fork`` (``client.live.sessions.fork``): the stored
        session carried on by a new WebRTC call (module docstring)."""
        return await self._with_cors(request, self._fork(request, request.path_params["session_id"]))

    async def _create(self, request: Request) -> Response:
        try:
            body = json_body(await capped(request, self.rt.settings.max_http_body_bytes).body())
        except BodyRefused as refused:
            return refused.response()
        transport = body.get("transport") if isinstance(body, dict) else None
        if isinstance(transport, dict) and transport.get("type") == "sip":
            return await live_dial(self.rt, request, body)  # an outbound SIP call (transport/sip/rest.py)
        checked = await self._caller(request)
        if isinstance(checked, Response):
            return checked
        book, grant = checked
        try:
            config, offer = _read(body)
            settings = lc.parse_start(config, media=True)
        except ProtocolError as err:
            return _error(400, err.code, err.message, err.param)
        resume = None
        if request.headers.get(RESUME_HEADER) is not None:  # a re-offer: the gateway's resume extension
            try:
                resume = _resume(request.headers[RESUME_HEADER])
            except ProtocolError as err:
                return _error(400, err.code, err.message, f"resume.{err.param}" if err.param else "resume")
        model = settings.model
        refusal = minted_refusal(grant, video=False, model=model)
        if refusal is not None:
            return _error(403, refusal[0], refusal[1], "session.model")
        screened = self._screen(book, offer)
        if isinstance(screened, Response):
            return screened
        offer, max_message_size = screened
        seat = await self._seat(grant, model)
        if isinstance(seat, Response):
            return seat

        async def opening(door: Door) -> Response | None:
            if resume is not None:
                refused = await door.resume(resume)
                if refused is not None:
                    return _error(_RESUME_STATUS.get(refused.code, 400), refused.code, refused.message, "resume")
                return None
            refused = await door.open_media(config)
            if refused is None:
                return None
            return _refused(refused)

        minted = grant.minted
        return await self._answer(book, offer, max_message_size, grant, seat, model, LIVE, opening, _answered,
                                  requested=minted.session if minted is not None else None, frontend=True,
                                  resumed=resume is not None)  # fmt: skip

    async def _fork(self, request: Request, source: str) -> Response:
        checked = await self._caller(request)
        if isinstance(checked, Response):
            return checked
        book, grant = checked
        try:
            body = json_body(await capped(request, self.rt.settings.max_http_body_bytes).body())
            config, offer = _read(body, session_required=False)
        except BodyRefused as refused:
            return refused.response()
        except ProtocolError as err:
            return _error(400, err.code, err.message, err.param)
        minted = grant.minted.binding() if grant.minted is not None else None
        try:  # its model, for the tenant's admission (the fork itself loads it again, on the door)
            model = await stored_model(self.rt.hosting, source, grant.principal, minted)
        except ProtocolError as err:
            return _error(503 if err.code == Code.STORE_UNAVAILABLE else 404, err.code, err.message, "session_id")
        refusal = minted_refusal(grant, video=False, model=model)
        if refusal is not None:
            return _error(403, refusal[0], refusal[1], "session_id")
        screened = self._screen(book, offer)
        if isinstance(screened, Response):
            return screened
        offer, max_message_size = screened
        seat = await self._seat(grant, model, "session_id")
        if isinstance(seat, Response):
            return seat

        async def opening(door: Door) -> Response | None:
            refused = await door.open_media_fork(source, config)
            if refused is None:
                return None
            return _refused(refused)

        return await self._answer(book, offer, max_message_size, grant, seat, model, LIVE, opening, _answered,
                                  frontend=True)  # fmt: skip


# A session refused before the call is answered: its HTTP status (else 400).
_REFUSAL_STATUS = {Code.STORE_UNAVAILABLE: 503, Code.RATE_LIMIT_EXCEEDED: 429, Code.SESSION_NOT_FOUND: 404,
                   Code.MODEL_NOT_FOUND: 404}  # fmt: skip


def _refused(err: ProtocolError) -> Response:
    return _error(_REFUSAL_STATUS.get(err.code, 400), err.code, err.message, err.param)


def _answered(answer: str, call_id: str, session_id: str) -> Response:
    """201 ``LiveCreateResponse`` / ``SessionForkResponse``: the session's id and the SDP answer."""
    body = {"session": {"id": session_id}, "transport": {"type": "webrtc", "sdp": answer}}
    return JSONResponse(body, status_code=201, headers={"Location": f"/v1/live/sessions/{session_id}"})


def _read(body: Any, *, session_required: bool = True) -> tuple[dict[str, Any], str]:
    """(the session, the offer) of a ``LiveCreateParams`` body (a fork's ``SessionForkParams``:
    its ``session`` may be left out, ``{}``); raises ProtocolError."""
    if not isinstance(body, dict):
        raise ProtocolError(Code.INVALID_TYPE, "The body must be a JSON object with 'session' and 'transport'.")
    for key in body:
        if key not in _KEYS:
            raise ProtocolError(Code.UNKNOWN_PARAMETER, f"Unknown parameter: '{key}'.", param=key)
    for key in _KEYS if session_required else ("transport",):
        if key not in body:
            raise ProtocolError(Code.MISSING_FIELD, f"Missing required parameter: '{key}'.", param=key)
    transport = body["transport"]
    if not isinstance(transport, dict):
        raise ProtocolError(Code.INVALID_TYPE, "'transport' must be an object.", param="transport")
    for key in transport:
        if key not in ("type", "sdp"):
            raise ProtocolError(Code.UNKNOWN_PARAMETER, f"Unknown parameter: 'transport.{key}'.",
                                param=f"transport.{key}")  # fmt: skip
    if transport.get("type") != "webrtc":
        raise ProtocolError(Code.INVALID_VALUE, "'transport.type' must be 'webrtc' (a WebSocket session opens "
                            "with session.start on wss /v1/live/sessions).", param="transport.type")  # fmt: skip
    sdp = transport.get("sdp")
    if not isinstance(sdp, str) or not sdp.strip():
        raise ProtocolError(Code.MISSING_FIELD if sdp is None else Code.INVALID_VALUE,
                            "'transport.sdp' must be the browser's SDP offer.", param="transport.sdp")  # fmt: skip
    session = body.get("session", {})
    if not isinstance(session, dict):
        raise ProtocolError(Code.INVALID_TYPE, "'session' must be an object.", param="session")
    return session, sdp
