"""``POST /v1/realtime/calls/{call_id}/refer``: transfer a SIP call (OpenAI's call control).

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
MAX_BODY_BYTES = 4096


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
        return [Route("/v1/realtime/calls/{call_id}/refer", self.refer, methods=["POST"])]

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
