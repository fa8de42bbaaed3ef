"""SIP calls over REST: a transfer (``/refer``, OpenAI's call control) and outbound calls (ours,
and GPT-Live's).

**GPT-Live outbound** (``live_dial``: ``POST /v1/live/sessions`` with ``{"session": {...},
"transport": {"type": "sip", "destination": "+15551234567", "trunk": {"provider_url":
"sip:203.0.113.5:5060", "auth": {"type": "digest", "username", "password"}, "caller_number":
"+15550100"}}}``, the OpenAPI document 2.3.0's ``LiveSipTransport``), with an operator key:
the Live session opens with ``session`` (strict, as on ``POST /v1/live/sessions`` for WebRTC),
the call is placed, and the answer is ``201 {"session": {"id": "live_..."}, "transport":
{"type": "sip"}}`` at once, before the callee answers. A sideband attached with that id
(``/v1/live/sessions/{id}/attach``) hears ``transport.ringing``, ``transport.answered`` (the
media runs), or ``transport.failed`` (``error.code`` ``sip_call_failed``: the trunk's status,
or no answer within ``sip_ring_timeout_s``; the session then ends). The destination is an
E.164 number, as OpenAI's; unlike OpenAI's (``sips:`` only), the trunk is reached over UDP
(``sip:<IP>[:port]`` of ``sip_allowed_sources``: ``sips:`` is refused, ``unsupported``, TLS
outbound is not done yet). Refusals (before any call): 400 (``invalid_value``,
``unknown_parameter``, ``missing_required_parameter``, ``unsupported``, the session's own),
401, 403 (``forbidden``: not an operator key), 429 ``rate_limit_exceeded``, 501 ``sip_unavailable``, 503 ``server_busy``
(draining, ``max_sessions``, no RTP port) or ``store_unavailable``.

**Outbound** (the gateway's extension: OpenAI has it as GPT-Live's ``transport: {type:
"sip"}``, not built yet): ``POST /v1/realtime/sip/calls`` with an operator key and
``{"destination": "tel:+15551234567", "trunk": {"provider_url": "sip:203.0.113.5:5060",
"caller_number": "+15550100", "auth": {"type": "digest", "username": "...", "password": "..."}},
"session": {...}}`` (``auth``: answers the trunk's digest challenge, 401 or 407, once). The trunk must be an address of
``sip_allowed_sources`` (its BYE comes back from there). The request waits while the call
rings (at most ``sip_ring_timeout_s``) and answers ``200 {"call_id": "rtc_...", "status":
"answered", "codec": "PCMU"}``: the session is open, its sideband joins with that call id,
and its hangup and refer work as an inbound call's. Refusals: 400 (``invalid_value``), 401, 403
(``forbidden``: not an operator key), 429 ``rate_limit_exceeded``, 501 ``sip_unavailable``, 502 ``sip_call_failed`` (the
trunk's SIP status in the message), 504 ``sip_call_failed`` (no answer in time: the gateway
sent CANCEL).

**Transfer**: ``POST /v1/realtime/calls/{call_id}/refer`` (GPT-Live's:
``/v1/live/sessions/{session_id}/refer``, the same, its 404 ``session_not_found``).

Body: ``{"target_uri": "tel:+15551234567" | "sip:agent@pbx.example.com"}``, with the key of the
call's principal. The gateway sends the trunk a REFER in the call's dialog (RFC 3515) and
answers with what the trunk said: ``200 {}`` once it accepted the transfer (202); the call is
hung up (BYE) when the trunk's NOTIFY says the target answered. Refusals: 400
``invalid_value`` (``target_uri`` not a ``tel:``, ``sip:`` or ``sips:`` URI of at most 256
characters), 401, 404 ``call_id_not_found`` (no SIP call of that id answered on any replica, or
another principal's), 502 ``call_transfer_failed`` (the trunk refused the REFER: its status
in the message), 504 ``call_transfer_failed`` (the trunk did not answer in 8 s), 503
``store_unavailable``. A call held by another replica is asked of it over the bus
(``gateway/hosting/ask.py``, the ``sip.refer`` the SIP server answers there): this replica
answers what the trunk answered there, or 504 when no answer came within
``REFER_TIMEOUT_S + RELAY_GRACE_S``.

**Tenant limits**: every outbound call is admitted against its key's tenant's session limits
before anything is sent (as a socket, ``admit_seat``): over one, 429 ``rate_limit_exceeded``;
the seat is given back when the call ends (``SipCall.seat``).
"""

from __future__ import annotations

import re
from typing import Any, Protocol

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.auth import Authenticator, Grant
from gateway.hosting.ask import AskUnavailable, NoOwner, ask_owner
from gateway.hosting.calls import session_id_of
from gateway.hosting.context import HostContext
from gateway.hosting.door import Door, Sessions
from gateway.protocol import live_config as lc
from gateway.protocol.dialects import LIVE
from gateway.protocol.errors import Code, ProtocolError
from gateway.quotas import AdmissionUnavailable, ConnectRefusal, Quotas, Seat
from gateway.settings import Settings
from gateway.transport.http_body import BodyRefused, capped
from gateway.transport.sip.control import REFER_ASK, REFER_TIMEOUT_S

MAX_TARGET = 256
_TARGET = re.compile(r"^(tel:\+?[0-9A-Za-z*#().;=\-]+|sips?:[^\s<>\"]+)$")
MAX_BODY_BYTES = 16384
RELAY_GRACE_S = 2.0  # a refer relayed to another replica waits for its answer this long beyond the trunk's
_PROVIDER = re.compile(r"^sip:(\d{1,3}(?:\.\d{1,3}){3})(?::(\d{1,5}))?$")
_NUMBER = re.compile(r"^\+?[0-9]{1,20}$")
_E164 = re.compile(r"^\+[1-9][0-9]{1,14}$")
_LIVE_TRANSPORT_KEYS = frozenset({"type", "destination", "trunk"})
_LIVE_TRUNK_KEYS = frozenset({"provider_url", "auth", "caller_number"})


class SipRestServices(Protocol):
    @property
    def auth(self) -> Authenticator: ...

    @property
    def hosting(self) -> HostContext: ...

    @property
    def sip(self) -> Any:
        """The SIP server (``server.SipServer``), or None: SIP is off here."""

    @property
    def sessions(self) -> Sessions: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def draining(self) -> bool: ...

    def session_count(self) -> int: ...

    @property
    def quotas(self) -> Quotas: ...


def _error(status: int, code: str, message: str, param: str | None = None) -> JSONResponse:
    body = {"error": {"type": "invalid_request_error", "code": code, "message": message, "param": param}}
    return JSONResponse(body, status_code=status)


class SipCallsEndpoint:
    def __init__(self, runtime: SipRestServices) -> None:
        self.rt = runtime

    def routes(self) -> list[Route]:
        return [
            Route("/v1/realtime/calls/{call_id}/refer", self.refer, methods=["POST"]),
            Route("/v1/live/sessions/{session_id}/refer", self.refer, methods=["POST"]),  # GPT-Live's SIP call
            Route("/v1/realtime/sip/calls", self.dial, methods=["POST"]),
        ]

    async def dial(self, request: Request) -> Response:
        """An outbound call (the gateway's extension; see the module docstring)."""
        grant = await self.rt.auth.authenticate_http(request.headers)
        if grant is None:
            self.rt.hosting.metrics.auth_failures.inc()
            return _error(401, Code.UNAUTHORIZED, "Send 'Authorization: Bearer <API key>'.")
        if not grant.tenant.admin:
            return _error(403, Code.FORBIDDEN, "Only an operator key places outbound calls.")
        sip = self.rt.sip
        if sip is None:
            return _error(501, Code.SIP_UNAVAILABLE, "This gateway has no SIP (sip_port is off).")
        try:
            raw = await capped(request, MAX_BODY_BYTES).body()
        except BodyRefused as refused:
            return refused.response()
        try:
            body = orjson.loads(raw or b"{}")
        except orjson.JSONDecodeError:
            return _error(400, Code.INVALID_JSON, "The body is not valid JSON.", "body")
        if not isinstance(body, dict):
            return _error(400, Code.INVALID_TYPE, "The body must be a JSON object.", "body")
        destination = body.get("destination")
        if not isinstance(destination, str) or len(destination) > MAX_TARGET or not _TARGET.match(destination):
            return _error(400, Code.INVALID_VALUE, "'destination' must be a tel:, sip: or sips: URI of at most "
                          f"{MAX_TARGET} characters.", "destination")  # fmt: skip
        trunk = body.get("trunk")
        provider = trunk.get("provider_url") if isinstance(trunk, dict) else None
        found = _PROVIDER.match(provider) if isinstance(provider, str) else None
        if found is None or not sip.guard.allows(found.group(1)):
            return _error(400, Code.INVALID_VALUE, "'trunk.provider_url' must be sip:<IP>[:port] of a trunk in "
                          "sip_allowed_sources.", "trunk.provider_url")  # fmt: skip
        credentials: tuple[str, str] | None = None
        auth = trunk.get("auth") if isinstance(trunk, dict) else None
        if auth is not None:
            user = auth.get("username") if isinstance(auth, dict) else None
            password = auth.get("password") if isinstance(auth, dict) else None
            if not (isinstance(auth, dict) and auth.get("type") == "digest" and isinstance(user, str) and user
                    and isinstance(password, str) and len(user) <= 128 and len(password) <= 128):  # fmt: skip
                return _error(400, Code.INVALID_VALUE, "'trunk.auth' must be {\"type\": \"digest\", \"username\", "
                              "\"password\"} (at most 128 characters each).", "trunk.auth")  # fmt: skip
            credentials = (user, password)
        caller = trunk.get("caller_number") if isinstance(trunk, dict) else None
        if caller is not None and (not isinstance(caller, str) or not _NUMBER.match(caller)):
            return _error(400, Code.INVALID_VALUE, "'trunk.caller_number' must be a phone number (+ and digits).",
                          "trunk.caller_number")  # fmt: skip
        session = body.get("session")
        if session is not None and not isinstance(session, dict):
            return _error(400, Code.INVALID_TYPE, "'session' must be a JSON object of session settings.", "session")
        seat = await _admit(self.rt, grant)
        if isinstance(seat, Response):
            return seat
        result = await sip.dial(destination, (found.group(1), int(found.group(2) or 5060)), caller=caller,
                                session=session, credentials=credentials, seat=seat)  # fmt: skip
        if isinstance(result, int):
            status = 504 if result == 408 else 502
            return _error(status, Code.SIP_CALL_FAILED, f"The call was not answered: SIP {result}.")
        return JSONResponse({"call_id": result.call.call_id, "status": "answered", "codec": result.media.offer.codec})

    async def refer(self, request: Request) -> Response:
        grant = await self.rt.auth.authenticate_http(request.headers)
        if grant is None:
            self.rt.hosting.metrics.auth_failures.inc()
            return _error(401, Code.UNAUTHORIZED, "Send 'Authorization: Bearer <API key>'.")
        live = "session_id" in request.path_params  # (GPT-Live's: the call is named by its session's id)
        call_id = request.path_params["session_id" if live else "call_id"]
        try:
            raw = await capped(request, MAX_BODY_BYTES).body()
        except BodyRefused as refused:
            return refused.response()
        try:
            body = orjson.loads(raw or b"{}")
        except orjson.JSONDecodeError:
            return _error(400, Code.INVALID_JSON, "The body is not valid JSON.", "body")
        target = body.get("target_uri") if isinstance(body, dict) else None
        if not isinstance(target, str) or len(target) > MAX_TARGET or not _TARGET.match(target):
            return _error(400, Code.INVALID_VALUE, "'target_uri' must be a tel:, sip: or sips: URI of at most "
                          f"{MAX_TARGET} characters.", "target_uri")  # fmt: skip
        sip = self.rt.sip
        status = await sip.transfer(call_id, target, grant.principal) if sip is not None else None
        if status is None:  # not held here: asked of the replica that holds it (gateway/hosting/ask.py)
            try:
                status = await self._refer_elsewhere(call_id, target, grant.principal, live=live)
            except AskUnavailable:
                return _error(503, Code.STORE_UNAVAILABLE, "Session state is unavailable; try again shortly.")
        if status is None:
            if live:
                return _error(404, Code.SESSION_NOT_FOUND, f"No SIP session {call_id!r} is in progress.",
                              "session_id")  # fmt: skip
            return _error(404, Code.CALL_NOT_FOUND, f"No SIP call {call_id!r} is in progress.", "call_id")
        if 200 <= status < 300:
            return JSONResponse({})
        if status == 408:
            return _error(504, Code.CALL_TRANSFER_FAILED, "The trunk did not answer the transfer (REFER) in time.")
        return _error(502, Code.CALL_TRANSFER_FAILED, f"The trunk refused the transfer (REFER): SIP {status}.")

    async def _refer_elsewhere(self, call_id: str, target: str, principal: str, *, live: bool) -> int | None:
        """The trunk's status for a transfer of a call another replica holds (408: neither the
        trunk nor that replica answered in time), or None: no replica holds such a call of
        ``principal``'s. Raises AskUnavailable (the store)."""
        session_id = call_id if live else session_id_of(call_id)  # (a Live call's id is its session's)
        if session_id is None:
            return None
        fields = {"call_id": call_id, "target_uri": target, "principal": principal}
        try:
            answer = await ask_owner(self.rt.hosting, session_id, REFER_ASK, fields, REFER_TIMEOUT_S + RELAY_GRACE_S)
        except NoOwner:
            return None
        except TimeoutError:
            return 408
        status = answer.get("status")
        return status if answer.get("found") and isinstance(status, int) else None


async def live_dial(rt: SipRestServices, request: Request, body: Any) -> Response:
    """GPT-Live's outbound call (``POST /v1/live/sessions``, ``transport.type: "sip"``; the
    module docstring): the session opened, the call placed, 201 before it is answered."""
    grant = await rt.auth.authenticate_http(request.headers)
    if grant is None:
        rt.hosting.metrics.auth_failures.inc()
        return _error(401, Code.UNAUTHORIZED, "Send 'Authorization: Bearer <API key>'.")
    if not grant.tenant.admin or grant.minted is not None:
        return _error(403, Code.FORBIDDEN, "Only an operator key places outbound calls.")
    sip = rt.sip
    if sip is None:
        return _error(501, Code.SIP_UNAVAILABLE, "This gateway has no SIP (sip_port is off).")
    if rt.draining or rt.session_count() >= rt.settings.max_sessions:
        return _error(503, Code.SERVER_BUSY, "This replica is shutting down or at its limit of sessions; try "
                      "again later.")  # fmt: skip
    try:
        config, destination, trunk, credentials, caller = _live_sip_request(body, sip)
        settings = lc.parse_start(config, media=True)
        if settings.idle_timeout_s is not None or settings.wake_policy is not None:
            key = "idle_timeout_s" if settings.idle_timeout_s is not None else "wake_policy"
            raise ProtocolError(Code.UNSUPPORTED, f"'session.{key}': this gateway does not pause an idle SIP "
                                "session (no session.paused, no wake); leave it out.",
                                param=f"session.{key}")  # fmt: skip
    except ProtocolError as err:
        return _error(400, err.code, err.message, err.param)
    model = settings.model
    if not rt.sessions.serves(model):
        return _error(400, Code.MODEL_NOT_FOUND, f"No model {model!r} is served here; GET /v1/models lists them.",
                      "session.model")  # fmt: skip
    if not grant.tenant.allows_model(model):
        return _error(403, Code.MODEL_NOT_ALLOWED, f"This credential may not use the model {model!r}.",
                      "session.model")  # fmt: skip
    seat = await _admit(rt, grant)
    if isinstance(seat, Response):
        return seat
    call = sip.outbound_call()
    if call is None:
        await seat.close()
        return _error(503, Code.SERVER_BUSY, "No free RTP port for the call (sip_rtp_ports); try again later.")
    call.seat = seat  # (given back when the call ends, answered or not)
    door = Door(rt.hosting, rt.sessions, call, dialect=LIVE, principal=grant.principal, model=model,
                max_message_bytes=rt.settings.max_message_bytes, seat=seat, media=call)  # fmt: skip
    refused = await door.open_media(config)
    if refused is not None or door.host is None:
        await call.end("its session was refused")
        why = refused or ProtocolError(Code.STORE_UNAVAILABLE, "Session state is unavailable; try again shortly.")
        status = {Code.STORE_UNAVAILABLE: 503, Code.RATE_LIMIT_EXCEEDED: 429}.get(why.code, 400)
        return _error(status, why.code, why.message, why.param)
    rt.hosting.metrics.sessions.inc()
    rt.hosting.metrics.sessions_total.inc()
    session_id = door.host.id
    call.call_id = session_id  # (its refer and hangup name it so)
    rt.hosting.spawn(sip.dial_live(destination, trunk, door, call, caller=caller, credentials=credentials))
    return JSONResponse({"session": {"id": session_id}, "transport": {"type": "sip"}}, status_code=201,
                        headers={"Location": f"/v1/live/sessions/{session_id}"})  # fmt: skip


async def _admit(rt: SipRestServices, grant: Grant) -> Seat | Response:
    """An outbound call's seat under its tenant's limits (as a socket's, ``admit_seat``), or the
    refusal: 429 ``rate_limit_exceeded`` (``max_sessions``, ``session_starts_per_min``), 503
    ``store_unavailable``."""
    try:
        admitted = await rt.quotas.admit(grant)
    except AdmissionUnavailable:
        return _error(503, Code.STORE_UNAVAILABLE, "Session state is unavailable; try again shortly.")
    if isinstance(admitted, ConnectRefusal):
        return _error(429, admitted.code, admitted.message)
    return admitted


def _live_sip_request(body: Any, sip: Any) -> tuple[dict[str, Any], str, tuple[str, int], tuple[str, str], str]:
    """(session, destination, trunk address, digest credentials, caller number) of a Live SIP
    create's body; raises ProtocolError naming the field."""
    if not isinstance(body, dict):
        raise ProtocolError(Code.INVALID_TYPE, "The body must be a JSON object with 'session' and 'transport'.")
    for key in body:
        if key not in ("session", "transport"):
            raise ProtocolError(Code.UNKNOWN_PARAMETER, f"Unknown parameter: '{key}'.", param=key)
    session = body.get("session")
    if session is None:
        raise ProtocolError(Code.MISSING_FIELD, "Missing required parameter: 'session'.", param="session")
    if not isinstance(session, dict):
        raise ProtocolError(Code.INVALID_TYPE, "'session' must be an object.", param="session")
    transport = body["transport"]
    _known(transport, _LIVE_TRANSPORT_KEYS, "transport")
    destination = _required(transport, "destination", "transport")
    if not isinstance(destination, str) or not _E164.match(destination):
        raise ProtocolError(Code.INVALID_VALUE, "'transport.destination' must be a phone number in E.164 format "
                            "(+ and up to 15 digits).", param="transport.destination")  # fmt: skip
    trunk = _required(transport, "trunk", "transport")
    _known(trunk, _LIVE_TRUNK_KEYS, "transport.trunk")
    provider = _required(trunk, "provider_url", "transport.trunk")
    if isinstance(provider, str) and provider.startswith("sips:"):
        raise ProtocolError(Code.UNSUPPORTED, "'transport.trunk.provider_url': this gateway reaches trunks over "
                            "UDP (sip:<IP>[:port]); TLS (sips:) outbound is not done yet.",
                            param="transport.trunk.provider_url")  # fmt: skip
    found = _PROVIDER.match(provider) if isinstance(provider, str) else None
    if found is None or not sip.guard.allows(found.group(1)):
        raise ProtocolError(Code.INVALID_VALUE, "'transport.trunk.provider_url' must be sip:<IP>[:port] of a trunk "
                            "in sip_allowed_sources.", param="transport.trunk.provider_url")  # fmt: skip
    auth = _required(trunk, "auth", "transport.trunk")
    _known(auth, frozenset({"type", "username", "password"}), "transport.trunk.auth")
    user, password = auth.get("username"), auth.get("password")
    if not (auth.get("type") == "digest" and isinstance(user, str) and user.strip() and isinstance(password, str)
            and len(user.encode()) <= 256 and len(password.encode()) <= 4096
            and not any(c in user + password for c in "\r\n\0")):  # fmt: skip
        raise ProtocolError(Code.INVALID_VALUE, "'transport.trunk.auth' must be {\"type\": \"digest\", \"username\" "
                            "(at most 256 bytes), \"password\" (at most 4096 bytes)}, without CR, LF or NUL.",
                            param="transport.trunk.auth")  # fmt: skip
    caller = _required(trunk, "caller_number", "transport.trunk")
    if not isinstance(caller, str) or not _E164.match(caller):
        raise ProtocolError(Code.INVALID_VALUE, "'transport.trunk.caller_number' must be a phone number in E.164 "
                            "format.", param="transport.trunk.caller_number")  # fmt: skip
    return session, "tel:" + destination, (found.group(1), int(found.group(2) or 5060)), (user, password), caller


def _known(value: Any, keys: frozenset[str], param: str) -> None:
    if not isinstance(value, dict):
        raise ProtocolError(Code.INVALID_TYPE, f"'{param}' must be an object.", param=param)
    for key in value:
        if key not in keys:
            raise ProtocolError(Code.UNKNOWN_PARAMETER, f"Unknown parameter: '{param}.{key}'.", param=f"{param}.{key}")


def _required(value: dict[str, Any], key: str, param: str) -> Any:
    if key not in value:
        raise ProtocolError(Code.MISSING_FIELD, f"Missing required parameter: '{param}.{key}'.",
                            param=f"{param}.{key}")  # fmt: skip
    return value[key]
