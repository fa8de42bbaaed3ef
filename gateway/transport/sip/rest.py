"""SIP calls over REST: a transfer (``/refer``, OpenAI's call control) and outbound calls (ours).

**Outbound** (the gateway's extension: OpenAI has it as GPT-Live's ``transport: {type:
"sip"}``, not built yet): ``POST /v1/realtime/sip/calls`` with an operator key and
``{"destination": "tel:+15551234567", "trunk": {"provider_url": "sip:203.0.113.5:5060",
"caller_number": "+15550100", "auth": {"type": "digest", "username": "...", "password": "..."}},
"session": {...}}`` (``auth``: answers the trunk's digest challenge, 401 or 407, once). The trunk must be an address of
``sip_allowed_sources`` (its BYE comes back from there). The request waits while the call
rings (at most ``sip_ring_timeout_s``) and answers ``200 {"call_id": "rtc_...", "status":
"answered", "codec": "PCMU"}``: the session is open, its sideband joins with that call id,
and its hangup and refer work as an inbound call's. Refusals: 400 (``invalid_value``), 401, 403
(``forbidden``: not an operator key), 501 ``sip_unavailable``, 502 ``sip_call_failed`` (the
trunk's SIP status in the message), 504 ``sip_call_failed`` (no answer in time: the gateway
sent CANCEL).

**Transfer**: ``POST /v1/realtime/calls/{call_id}/refer``.

Body: ``{"target_uri": "tel:+15551234567" | "sip:agent@pbx.example.com"}``, with the key of the
call's principal. The gateway sends the trunk a REFER in the call's dialog (RFC 3515) and
answers with what the trunk said: ``200 {}`` once it accepted the transfer (202); the call is
hung up (BYE) when the trunk's NOTIFY says the target answered. Refusals: 400
``invalid_value`` (``target_uri`` not a ``tel:``, ``sip:`` or ``sips:`` URI of at most 256
characters), 401, 404 ``call_id_not_found`` (no SIP call of that id answered on this replica,
or another principal's), 502 ``call_transfer_failed`` (the trunk refused the REFER: its status
in the message), 504 ``call_transfer_failed`` (the trunk did not answer in 8 s). A call held
by another replica is not reached from here yet (404).
"""

from __future__ import annotations

import re
from typing import Any, Protocol

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.auth import Authenticator
from gateway.hosting.context import HostContext
from gateway.protocol.errors import Code
from gateway.transport.http_body import BodyRefused, capped

MAX_TARGET = 256
_TARGET = re.compile(r"^(tel:\+?[0-9A-Za-z*#().;=\-]+|sips?:[^\s<>\"]+)$")
MAX_BODY_BYTES = 16384
_PROVIDER = re.compile(r"^sip:(\d{1,3}(?:\.\d{1,3}){3})(?::(\d{1,5}))?$")
_NUMBER = re.compile(r"^\+?[0-9]{1,20}$")


class SipRestServices(Protocol):
    @property
    def auth(self) -> Authenticator: ...

    @property
    def hosting(self) -> HostContext: ...

    @property
    def sip(self) -> Any:
        """The SIP server (``server.SipServer``), or None: SIP is off here."""


def _error(status: int, code: str, message: str, param: str | None = None) -> JSONResponse:
    body = {"error": {"type": "invalid_request_error", "code": code, "message": message, "param": param}}
    return JSONResponse(body, status_code=status)


class SipCallsEndpoint:
    def __init__(self, runtime: SipRestServices) -> None:
        self.rt = runtime

    def routes(self) -> list[Route]:
        return [
            Route("/v1/realtime/calls/{call_id}/refer", self.refer, methods=["POST"]),
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
        result = await sip.dial(destination, (found.group(1), int(found.group(2) or 5060)), caller=caller,
                                session=session, credentials=credentials)  # fmt: skip
        if isinstance(result, int):
            status = 504 if result == 408 else 502
            return _error(status, Code.SIP_CALL_FAILED, f"The call was not answered: SIP {result}.")
        return JSONResponse({"call_id": result.call.call_id, "status": "answered", "codec": result.media.offer.codec})

    async def refer(self, request: Request) -> Response:
        grant = await self.rt.auth.authenticate_http(request.headers)
        if grant is None:
            self.rt.hosting.metrics.auth_failures.inc()
            return _error(401, Code.UNAUTHORIZED, "Send 'Authorization: Bearer <API key>'.")
        call_id = request.path_params["call_id"]
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
        dialog = sip.find(call_id) if sip is not None else None
        host = dialog.call.door.host if dialog is not None and dialog.call.door is not None else None
        if dialog is None or host is None or host.principal != grant.principal:
            return _error(404, Code.CALL_NOT_FOUND, f"No SIP call {call_id!r} is in progress here.", "call_id")
        status = await sip.refer(dialog, target)
        if 200 <= status < 300:
            return JSONResponse({})
        if status == 408:
            return _error(504, Code.CALL_TRANSFER_FAILED, "The trunk did not answer the transfer (REFER) in time.")
        return _error(502, Code.CALL_TRANSFER_FAILED, f"The trunk refused the transfer (REFER): SIP {status}.")
