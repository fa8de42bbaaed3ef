"""``/v1/telephony/{carrier}``: a carrier's media stream, the socket's I/O (Twilio's here; the
other carriers' differ only as their codec object says: ``gateway/protocol/telephony.py``).

The carrier dials it from its call instructions (Twilio's TwiML
``<Connect><Stream url="wss://HOST/v1/telephony/twilio"><Parameter name="client_secret"
value="ek_..."/></Stream></Connect>``). In order, before any audio:

1. The upgrade: refused with 503 while the replica drains; with the carrier's signing
   key set (``twilio_auth_token``), refused with 403 ``signature_invalid`` unless
   ``X-Twilio-Signature`` signs the URL the carrier requested (``wss://`` + ``Host`` +
   path and query; the URL as the gateway sees it is accepted too).
2. ``connected`` then ``start`` (within ``START_TIMEOUT_S``, at most
   ``MAX_EARLY_MESSAGES`` messages): its ``customParameters.client_secret`` must be a
   client secret (``POST /v1/realtime/client_secrets``), which it spends: else close 4001
   ``unauthorized``. Its ``mediaFormat`` must be μ-law 8000 Hz mono (else 4003). The
   secret opens the session it was minted for (model, instructions, voice, turn
   detection), with the carrier's format as its input and output audio format, so that
   the session converts the caller's audio once to what the engine takes, and the
   engine's once to the carrier's (a carrier's linear PCM at 8 or 16 kHz: the session's
   ``audio/pcm`` at 24 kHz, to and from which the call converts in one step). Then the
   replica's and the tenant's limits, as on every socket (1013, 4029).
   A stream without a client secret, with ``call_webhook_url`` set, is announced instead
   (``realtime.call.incoming``; with ``call_webhook_live`` also GPT-Live's
   ``live.transport.incoming``, ``type`` the carrier's name) and opens the session the
   first accept names (``gateway/hosting/incoming.py``): a Realtime one, with the carrier's
   format, or a GPT-Live one (``/v1/live/sessions/{id}/accept``: its ``session`` is the
   start settings; its format PCM16 at 24 kHz, a media session's), in the
   accept's dialect (``Door.open_call``, as a SIP call's).
3. The call (``call.py``) until the carrier's ``stop``, a hangup, or the socket's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import parse_qs

from gateway.audio.codecs import AudioFormat
from gateway.auth import CredentialsUnavailable, Grant
from gateway.hosting.calls import call_id_of
from gateway.hosting.door import Door, Sessions
from gateway.hosting.incoming import (
    IncomingCall,
    Rejected,
    Webhook,
    announce,
    call_of_live,
    forget,
    new_call_id,
    session_of,
)
from gateway.protocol.dialects import GA, Dialect
from gateway.protocol.errors import CloseCode, Code, ProtocolError
from gateway.protocol.telephony import Carrier, CarrierMessageError, StreamStart, StreamStop
from gateway.quotas import AdmissionUnavailable, ConnectRefusal
from gateway.transport.handshake import (
    DRAINING_MESSAGE,
    Handshake,
    UpgradeRefusal,
    common_refusal,
    refuse_upgrade,
    request_headers,
)
from gateway.transport.lifecycle import settle
from gateway.transport.outbox import Outbox
from gateway.transport.services import Services
from gateway.transport.telephony.call import PhoneCall

log = logging.getLogger("omni.telephony")

START_TIMEOUT_S = 10.0  # from the upgrade to the carrier's start message; later: close 4001
MAX_EARLY_MESSAGES = 4  # messages before start (connected, ...); more: close 4001
# The carrier's audio as a session format, what its clients are shown: G.711 as it is; linear PCM at 8
# or 16 kHz as the session's linear PCM, which is 24 kHz (the Realtime API's schema has audio/pcm at no
# other rate, and a sideband is sent the session's format). Either way the call hands the door the
# carrier's own audio (``door.receive_audio``: converted once to the engine's rate) and converts the
# engine's own audio once to the carrier's (``audio.convert.OutputConverters``).
_SESSION_FORMATS = {"pcmu": "audio/pcmu", "pcma": "audio/pcma", "pcm16": "audio/pcm"}
_PRIVATE_HEADERS = frozenset({"authorization", "cookie", "sec-websocket-key"})  # never sent to the webhook


@dataclass(frozen=True, slots=True)
class _Accepted:
    call_id: str
    grant: Grant
    session: dict[str, Any]
    dialect: Dialect  # the accept endpoint's: Realtime, or GPT-Live's (``/v1/live/sessions/{id}/accept``)
    session_id: str  # the session's id: ``sess_`` (Realtime) or ``live_`` (Live) + the call id's suffix
    incoming: IncomingCall  # settled once the session opened (or will not): the accept waits for it


class TelephonyServices(Services, Protocol):
    """What a carrier's endpoint needs of the process (the runtime provides it)."""

    @property
    def sessions(self) -> Sessions: ...

    def session_defaults(self, grant: Any, requested: dict[str, Any] | None) -> tuple[str, dict[str, Any] | None]:
        """The model and session settings a client secret opens, ``requested`` over them."""


def _error(code: str, message: str) -> bytes:
    return GA.error(ProtocolError(code, message))


def signed_urls(scope: dict[str, Any], headers: dict[str, str]) -> list[str]:
    """The URLs a carrier may have signed for this upgrade: ``wss://`` as it dialed, and the
    scheme the gateway sees (behind a TLS proxy: ``ws``)."""
    raw = scope.get("raw_path") or scope.get("path", "").encode()
    path = raw.decode("latin-1") if isinstance(raw, bytes) else str(raw)
    query = scope.get("query_string", b"").decode("latin-1")
    tail = headers.get("host", "") + path + ("?" + query if query else "")
    seen = scope.get("scheme", "ws")
    return ["wss://" + tail] + ([f"{seen}://{tail}"] if seen != "wss" else [])


def phone_session(minted_session: dict[str, Any] | None, fmt: AudioFormat) -> dict[str, Any]:
    """A client secret's (or an accept's) session settings with the carrier's audio format in and out."""
    session = dict(minted_session or {"type": "realtime"})
    audio = dict(session.get("audio") or {})
    for side in ("input", "output"):
        settings = dict(audio.get(side) or {})
        settings["format"] = {"type": _SESSION_FORMATS[fmt.codec]}
        audio[side] = settings
    session["audio"] = audio
    session.setdefault("type", "realtime")
    return session


class TelephonyEndpoint:
    """ASGI app for one carrier's media streams."""

    def __init__(self, runtime: TelephonyServices, codec: Carrier, *, signing_key: str | None = None) -> None:
        self.runtime = runtime
        self.codec = codec
        self.signing_key = signing_key  # the carrier's key its upgrades are signed with (None: not checked)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        rt = self.runtime
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        headers = request_headers(scope)
        refusal: UpgradeRefusal | None = None
        key, header = self.signing_key, self.codec.signature_header
        if rt.draining:
            refusal = UpgradeRefusal(503, Code.SERVER_BUSY, DRAINING_MESSAGE, CloseCode.SERVICE_RESTART)
        elif key and header and not self.codec.signed(key, signed_urls(scope, headers), headers.get(header)):
            rt.hosting.metrics.auth_failures.inc()
            refusal = UpgradeRefusal(
                403, Code.SIGNATURE_INVALID,
                f"The {header} header does not sign this request with the carrier's key "
                f"({self.codec.signing_key_setting}).",
                CloseCode.FORBIDDEN,
            )  # fmt: skip
        if refusal is not None:
            log.info("%s stream refused at the upgrade: %s", self.codec.name, refusal.code)
            await refuse_upgrade(rt, scope, send, refusal, _error)
            return
        await send({"type": "websocket.accept", "subprotocol": None})
        await self._serve(scope, receive, send)

    async def _close(self, send: Any, code: int, reason: str) -> None:
        await send({"type": "websocket.close", "code": int(code), "reason": reason})
        self.runtime.hosting.metrics.closes.labels(str(int(code))).inc()

    async def _start(self, receive: Any) -> StreamStart | str:
        """The carrier's start message; or why none came (a log line)."""
        for _ in range(MAX_EARLY_MESSAGES):
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return "the carrier left before start"
            text = message.get("text") if message.get("text") is not None else message.get("bytes")
            try:
                event = self.codec.decode(text or b"")
            except CarrierMessageError as exc:
                return f"a message before start does not decode: {exc}"
            if isinstance(event, StreamStart):
                return event
        return f"no start within {MAX_EARLY_MESSAGES} messages"

    async def _serve(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        rt = self.runtime
        try:
            start = await asyncio.wait_for(self._start(receive), START_TIMEOUT_S)
        except TimeoutError:
            start = f"no start within {START_TIMEOUT_S:g} s"
        except CarrierMessageError as exc:
            start = str(exc)
        if isinstance(start, str):
            log.info("%s stream refused: %s", self.codec.name, start)
            await self._close(send, CloseCode.UNAUTHORIZED, Code.UNAUTHORIZED)
            return
        # The stream's parameters carry it; a carrier whose parameters cannot (Plivo's are letters
        # and digits only) puts it in the stream URL's query.
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        secret = start.parameters.get(self.codec.secret_parameter) or next(
            iter(query.get(self.codec.secret_parameter, ())), ""
        )
        webhook = self._webhook()
        if not secret and webhook is not None:  # announced to the operator's backend, which accepts it
            accepted = await self._announce(scope, receive, start, webhook)
            if isinstance(accepted, tuple):
                await self._close(send, *accepted)
                return
            try:
                await self._admit(receive, send, scope, start, accepted.grant, accepted.session, accepted)
            finally:
                await accepted.incoming.settle(False)  # (a session that opened settled it already)
            return
        try:
            found = await rt.auth.client_secret(secret)
        except CredentialsUnavailable:
            await self._close(send, CloseCode.TRY_AGAIN_LATER, Code.STORE_UNAVAILABLE)
            return
        if found is None or found.minted is None or found.minted.type == "video":
            rt.hosting.metrics.auth_failures.inc()
            log.info("%s stream %s refused: no valid client secret in customParameters.%s", self.codec.name,
                     start.stream_id, self.codec.secret_parameter)  # fmt: skip
            await self._close(send, CloseCode.UNAUTHORIZED, Code.UNAUTHORIZED)
            return
        await self._admit(receive, send, scope, start, found, found.minted.session, None)

    async def _admit(self, receive: Any, send: Any, scope: dict[str, Any], start: StreamStart, grant: Grant,
                     requested: dict[str, Any] | None, accepted: _Accepted | None) -> None:  # fmt: skip
        """The call's session, for ``grant`` with ``requested`` (a client secret's, or the
        backend's ``accepted`` one), if its model and its tenant's limits admit it; then the call."""
        rt = self.runtime
        session_id, dialect = (accepted.session_id, accepted.dialect) if accepted is not None else (None, GA)
        hs = Handshake(request_headers(scope), [], {}, grant)
        refusal = common_refusal(rt, hs)
        if refusal is not None:
            await self._close(send, refusal[2], refusal[0])
            return
        try:
            if dialect.media_start:  # GPT-Live's accept: its ``session`` (checked there) is the start settings
                model, settings = str((requested or {}).get("model", "")), requested
            else:
                model, settings = rt.session_defaults(grant, phone_session(requested, start.audio))
        except ProtocolError as err:
            await self._close(send, CloseCode.FORBIDDEN, err.code)
            return
        if not rt.sessions.serves(model) or not grant.tenant.allows_model(model):
            await self._close(send, CloseCode.FORBIDDEN, Code.MODEL_NOT_ALLOWED)
            return
        try:
            seat = await rt.quotas.admit(grant)
        except AdmissionUnavailable:
            await self._close(send, CloseCode.TRY_AGAIN_LATER, Code.STORE_UNAVAILABLE)
            return
        if isinstance(seat, ConnectRefusal):
            await self._close(send, CloseCode.RATE_LIMITED, seat.code)
            return
        try:
            await self._run(receive, send, start, grant, model, settings, seat, session_id, dialect,
                            accepted.incoming if accepted is not None else None)  # fmt: skip
        finally:
            await seat.close()

    def _webhook(self) -> Webhook | None:
        s = self.runtime.settings
        if not s.call_webhook_url:
            return None
        return Webhook(s.call_webhook_url, s.call_webhook_secret, s.call_webhook_timeout_s, s.call_accept_timeout_s,
                       live=s.call_webhook_live)  # fmt: skip

    async def _announce(
        self, scope: dict[str, Any], receive: Any, start: StreamStart, webhook: Webhook
    ) -> _Accepted | tuple[int, str]:
        """``realtime.call.incoming``, then the wait for the backend's accept (or why the call
        ends: a close code and reason). The caller's audio meanwhile is read and dropped."""
        rt = self.runtime
        call_id = new_call_id()
        headers = [{"name": k, "value": v} for k, v in request_headers(scope).items() if k not in _PRIVATE_HEADERS]
        data = {"carrier": self.codec.name, "carrier_call_id": start.call_id, "stream_id": start.stream_id,
                "account_id": start.account_id, "parameters": start.parameters, "headers": headers}  # fmt: skip
        # With call_webhook_live, also GPT-Live's live.transport.incoming (the SIP call's announcement,
        # written once: incoming.py), its ``type`` the carrier's name (the gateway's: OpenAI's is "sip" only)
        # and no SIP headers (a stream has no INVITE: the upgrade's headers are in ``headers``).
        live = {"type": self.codec.name, "sip_headers": [], **data}
        incoming = await announce(rt.hosting, webhook, call_id, data, live=live)
        if isinstance(incoming, str):
            log.warning("%s call %s refused: %s", self.codec.name, start.call_id, incoming)
            return CloseCode.UNAUTHORIZED, Code.UNAUTHORIZED
        log.info("%s call %s announced as %s", self.codec.name, start.call_id, call_id)
        loop = asyncio.get_running_loop()
        waiting = loop.create_task(incoming.wait(webhook.accept_timeout_s))
        draining = loop.create_task(self._until_stop(receive))
        try:
            await asyncio.wait({waiting, draining}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            draining.cancel()
            forget(rt.hosting, call_id)
        if not waiting.done():
            waiting.cancel()
            return CloseCode.NORMAL, "the carrier stopped the stream"
        answer = waiting.result()
        if isinstance(answer, Rejected):
            log.info("call %s refused: %s", call_id, answer.reason)
            timed_out = answer.reason != "rejected"
            return (CloseCode.UNAUTHORIZED, Code.UNAUTHORIZED) if timed_out else (CloseCode.NORMAL, "rejected")
        return _Accepted(call_id, answer.grant, answer.session, answer.dialect,
                         answer.session_id or session_of(call_id), incoming)  # fmt: skip

    async def _until_stop(self, receive: Any) -> None:
        """Read and drop the carrier's messages until its stop or the socket's end."""
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text") if message.get("text") is not None else message.get("bytes")
            with contextlib.suppress(CarrierMessageError):
                if isinstance(self.codec.decode(text or b""), StreamStop):
                    return

    async def _run(self, receive: Any, send: Any, start: StreamStart, grant: Any, model: str,
                   settings: dict[str, Any] | None, seat: Any, session_id: str | None,
                   dialect: Dialect, incoming: IncomingCall | None) -> None:  # fmt: skip
        rt = self.runtime
        outbox = Outbox(send, rt.settings.outbound_queue_bytes, rt.settings.outbound_stall_s)
        writer = asyncio.get_running_loop().create_task(outbox.run())
        call = PhoneCall(self.codec, start.stream_id, start.call_id, outbox, start.audio)
        door = Door(rt.hosting, rt.sessions, call, dialect=dialect, principal=grant.principal, model=model,
                    max_message_bytes=rt.settings.max_message_bytes, seat=seat, media=call,
                    minted=grant.minted.binding() if grant.minted is not None else None,
                    session_id=session_id)  # fmt: skip
        metrics = rt.hosting.metrics
        metrics.sessions.inc()
        metrics.sessions_total.inc()
        try:
            if not await door.open_call(settings):
                # (a refused Realtime session closed the stream already; a Live one's refusal says nothing)
                call.end("no session", code=CloseCode.TRY_AGAIN_LATER)
                await settle(writer, 1.0)
                return
            assert door.host is not None
            # (the call id in the log is how a backend without the webhook finds the call's sideband)
            log.info("%s call %s (stream %s) is call %s, session %s", self.codec.name, start.call_id, start.stream_id,
                     call_of_live(door.host.id) or call_id_of(door.host.id), door.host.id)  # fmt: skip
            call.start(door)
            if incoming is not None:
                await incoming.settle(True)  # (the accept answers now: its sideband finds the session)
            await self._read(receive, call)
        finally:
            metrics.sessions.dec()
            call.end("the socket closed")
            await settle(writer, 1.0)

    async def _read(self, receive: Any, call: PhoneCall) -> None:
        bad = 0
        while not call.ended:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text") if message.get("text") is not None else message.get("bytes")
            try:
                event = self.codec.decode(text or b"")
            except CarrierMessageError as exc:
                bad += 1
                if bad == 1 or bad % 100 == 0:  # (one line, then one per hundred)
                    log.warning("call %s: %d carrier message(s) did not decode: %s", call.call_sid, bad, exc)
                continue
            if event is None:
                continue
            pending = call.handle(event)
            if pending is not None:
                await pending
