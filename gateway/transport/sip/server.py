"""The SIP listener (``sip_port``, UDP and TCP): a user agent server for trunks.

What it does with each request (RFC 3261, the parts a UAS answering calls needs):

- ``INVITE`` (a new dialog): the guard first (``guard.py``: 403 outside the allow-list, 503
  over the INVITE rates, 486 at ``sip_max_calls``), the trunk's digest credentials where
  ``sip_trunk_credentials`` are set (401 with a challenge, ``digest.py``), then the SDP (488 when it cannot be
  answered), 100 Trying, an RTP port, 180 Ringing while the ``CallControl`` decides
  (``control.py``; 480 after ``sip_ring_timeout_s``), then 200 OK with the SDP answer and a
  session opened through a hosting door (``call.py``), or the control's rejection. A 200 OK
  over UDP is sent again (500 ms, doubling up to 4 s) until its ACK; none in 32 s: BYE.
  A retransmitted INVITE gets the last response again. A re-INVITE in the dialog is answered
  200 OK with the same answer (hold and codec changes are not taken).
- ``ACK``: the call is confirmed. ``CANCEL`` of a ringing INVITE: 200, then 487.
- ``BYE``: 200 OK, and the call's session ends for good. Unknown dialog: 481.
- ``OPTIONS``: 200 OK with ``Allow`` (trunks ping with it). ``NOTIFY`` in a dialog: 200, and
  a transfer's progress (``refer``: the REFER the gateway sent; its 2xx hangs up). Anything
  else: 405.

The call is bounded by ``sip_max_call_s`` (then BYE). When the session lets the call go (a REST
hangup, the session closed) the gateway sends BYE. An outbound call's INVITE transaction is
``uac.py``'s; once answered, its dialog is held here as an inbound call's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.auth import Authenticator, Grant
from gateway.hosting.calls import call_id_of
from gateway.hosting.context import HostContext
from gateway.hosting.door import Door, Sessions
from gateway.protocol.errors import Code
from gateway.quotas import AdmissionUnavailable, ConnectRefusal, Quotas, Seat
from gateway.settings import Settings
from gateway.transport.sip import digest, uac
from gateway.transport.sip import message as sipmsg
from gateway.transport.sip.call import SipCall
from gateway.transport.sip.control import (
    REFER_ASK,
    REFER_TIMEOUT_S,
    Accept,
    CallControl,
    IncomingCall,
    Reject,
    ringing_id,
)
from gateway.transport.sip.guard import Guard
from gateway.transport.sip.media import PortsExhausted, RtpMedia, bind_rtp, parse_port_range
from gateway.transport.sip.message import SipMessage, SipParseError, response_to
from gateway.transport.sip.sdp import Offer, SdpError, build_answer, build_offer, parse_answer, parse_offer
from gateway.transport.sip.srtp import offer_key
from gateway.transport.sip.uac import ALLOW, T1, host_part

log = logging.getLogger("omni.sip")

T2 = 4.0
TIMER_H = 64 * T1  # no ACK for a 200 OK this long: the call is hung up
CALL_ID_HEADER = "X-Omni-Call-Id"  # the 200 OK names the session's call id (rtc_...): sideband and hangup use it
MAX_TCP_CONNECTIONS = 256  # more at once: a new connection is closed at once
TCP_IDLE_S = 300.0  # a TCP connection with no message this long is closed
_REASONS = {
    100: "Trying", 180: "Ringing", 200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
    405: "Method Not Allowed",
    480: "Temporarily Unavailable", 481: "Call/Transaction Does Not Exist", 486: "Busy Here",
    487: "Request Terminated", 488: "Not Acceptable Here", 500: "Server Internal Error",
    503: "Service Unavailable", 603: "Decline", 202: "Accepted",
}  # fmt: skip


class SipServices(Protocol):
    """What the SIP server needs of the process (the runtime provides it)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def hosting(self) -> HostContext: ...

    @property
    def sessions(self) -> Sessions: ...

    @property
    def draining(self) -> bool: ...

    def session_count(self) -> int: ...

    @property
    def quotas(self) -> Quotas: ...

    @property
    def auth(self) -> Authenticator: ...


Send = Callable[[bytes], None]


@dataclass(frozen=True, slots=True)
class SipConfig:
    host: str
    port: int
    rtp_host: str
    advertised_address: str | None
    rtp_ports: tuple[int, int] | None
    ring_timeout_s: float
    max_call_s: float
    grant: Grant  # whose a call the default session answers is (the operator's, api_keys' first)
    model: str
    session: dict[str, Any] | None
    tls_port: int = 0  # 0: no TLS listener
    tls: ssl.SSLContext | None = None
    outbound_srtp: bool = False  # outbound calls offer SDES-SRTP, and take only an SRTP answer


@dataclass
class Dialog:
    sip_call_id: str
    invite: SipMessage
    source: tuple[str, int]
    send: Send
    transport: str  # "UDP" or "TCP"
    local_tag: str
    remote_uri: str  # where in-dialog requests go (the INVITE's Contact)
    media: RtpMedia
    call: SipCall
    last_response: bytes = b""
    state: str = "ringing"  # ringing -> answered -> confirmed -> ended
    cseq: int = 0
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    decide: asyncio.Task[Any] | None = None
    ended_by: str | None = None
    local_party: str = ""  # an outbound call's From (ours, tagged); inbound: the INVITE's To with our tag
    remote_party: str = ""  # an outbound call's To as the 200 OK tagged it; inbound: the INVITE's From
    ack: bytes = b""  # an outbound call's ACK (sent again for a retransmitted 200 OK)


def _reason(status: int) -> str:
    return _REASONS.get(status, "Unknown")


class SipServer:
    def __init__(self, services: SipServices, config: SipConfig, guard: Guard, control: CallControl,
                 challenger: digest.Challenger | None = None) -> None:  # fmt: skip
        self.rt = services
        self.challenger = challenger  # trunk credentials: an INVITE must answer its digest challenge
        self.config = config
        self.guard = guard
        self.control = control
        self.dialogs: dict[str, Dialog] = {}  # the INVITE's Call-ID -> its dialog
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None
        self._tls: asyncio.Server | None = None
        self.tls_bound: tuple[str, int] | None = None
        self._tcp_count = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self.bound: tuple[str, int] | None = None
        self._byes: dict[str, list[asyncio.TimerHandle]] = {}  # Call-ID -> our BYE's retransmissions
        self._refers: dict[str, asyncio.Future[int]] = {}  # Call-ID -> our REFER's final status
        self._dialing: dict[str, asyncio.Queue[SipMessage]] = {}  # an outbound INVITE's Call-ID -> its responses
        # counters
        self.malformed = 0
        self.dropped = 0  # requests other than INVITE from outside the allow-list

    # --- listening ------------------------------------------------------------------------

    async def start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        cfg = self.config
        server = self
        self.rt.hosting.answerers[REFER_ASK] = self._refer_asked  # a /refer taken on another replica

        class Udp(asyncio.DatagramProtocol):
            def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
                transport = server._udp
                if transport is None:
                    return
                server.received(data, (addr[0], addr[1]), lambda out: server._sendto(out, addr), "UDP")

        udp, _ = await loop.create_datagram_endpoint(Udp, local_addr=(cfg.host, cfg.port))
        self._udp = udp
        sockname = udp.get_extra_info("sockname")
        self.bound = (sockname[0], int(sockname[1]))
        self._tcp = await asyncio.start_server(self._tcp_client, cfg.host, self.bound[1])
        log.info("SIP listening on %s:%d (UDP and TCP)", *self.bound)
        if cfg.tls is not None and cfg.tls_port:
            self._tls = await asyncio.start_server(self._tls_client, cfg.host, cfg.tls_port, ssl=cfg.tls,
                                                   ssl_handshake_timeout=10.0)  # fmt: skip
            tls_name = self._tls.sockets[0].getsockname()
            self.tls_bound = (tls_name[0], int(tls_name[1]))
            log.info("SIP over TLS listening on %s:%d", *self.tls_bound)

    def _sendto(self, out: bytes, addr: tuple[str, int]) -> None:
        if self._udp is not None and not self._udp.is_closing():
            self._udp.sendto(out, addr)

    async def _tls_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._tcp_client(reader, writer, "TLS")

    async def _tcp_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                          transport: str = "TCP") -> None:  # fmt: skip
        if self._tcp_count >= MAX_TCP_CONNECTIONS:
            writer.close()
            return
        self._tcp_count += 1
        peer = writer.get_extra_info("peername")
        source = (peer[0], int(peer[1]))
        framer = sipmsg.StreamFramer()

        def send(out: bytes) -> None:
            if not writer.is_closing():
                writer.write(out)

        try:
            while True:
                data = await asyncio.wait_for(reader.read(65536), TCP_IDLE_S)
                if not data:
                    break
                try:
                    messages = framer.feed(data)
                except SipParseError:
                    self.malformed += 1
                    break
                for raw in messages:
                    self.received(raw, source, send, transport)
        except (TimeoutError, ConnectionError, ssl.SSLError):
            pass
        finally:
            self._tcp_count -= 1
            writer.close()

    async def close(self) -> None:
        if self.rt.hosting.answerers.get(REFER_ASK) == self._refer_asked:
            del self.rt.hosting.answerers[REFER_ASK]
        for dialog in list(self.dialogs.values()):
            await self._hang_up(dialog, "shutdown")
        for handles in self._byes.values():
            for handle in handles:
                handle.cancel()
        if self._udp is not None:
            self._udp.close()
        for server in (self._tcp, self._tls):
            if server is not None:
                server.close()
                with contextlib.suppress(Exception):
                    await server.wait_closed()

    # --- requests ----------------------------------------------------------------------------

    def received(self, data: bytes, source: tuple[str, int], send: Send, transport: str) -> None:
        try:
            msg = sipmsg.parse(data)
        except SipParseError as err:
            self.malformed += 1
            log.debug("sip: malformed message from %s: %s", source[0], err)
            return
        if not msg.is_request:
            method = msg.cseq[1]
            if method == "BYE":  # the answer to our BYE: it is not sent again
                for handle in self._byes.pop(msg.call_id, []):
                    handle.cancel()
            elif method == "INVITE":
                queue = self._dialing.get(msg.call_id)
                if queue is not None:
                    queue.put_nowait(msg)
                else:
                    dialog = self.dialogs.get(msg.call_id)
                    if dialog is not None and dialog.ack and msg.status == 200:
                        dialog.send(dialog.ack)  # the 200 OK again: our ACK was lost
            elif method == "REFER" and msg.status is not None and msg.status >= 200:
                future = self._refers.get(msg.call_id)
                if future is not None and not future.done():
                    future.set_result(msg.status)
            return
        if msg.method != "INVITE" and not self.guard.allows(source[0]):
            self.dropped += 1
            return  # never answer a scanner: only an INVITE is told it is forbidden
        handler = {
            "INVITE": self._invite, "ACK": self._ack, "BYE": self._bye, "CANCEL": self._cancel,
            "OPTIONS": self._options, "NOTIFY": self._notify,
        }.get(msg.method or "")  # fmt: skip
        if handler is None:
            resp = response_to(msg, 405, _reason(405))
            resp.add("Allow", ALLOW)
            send(resp.encode())
            return
        handler(msg, source, send, transport)

    def _reply(self, request: SipMessage, status: int, send: Send, *, tag: str | None = None,
               extra: tuple[tuple[str, str], ...] = ()) -> bytes:  # fmt: skip
        resp = response_to(request, status, _reason(status), to_tag=tag)
        for name, value in extra:
            resp.add(name, value)
        out = resp.encode()
        send(out)
        if status >= 300 and request.method == "INVITE":
            self.rt.hosting.metrics.sip_refusals.labels(str(status)).inc()
        return out

    def _options(self, msg: SipMessage, source: tuple[str, int], send: Send, transport: str) -> None:
        self._reply(msg, 200, send, tag=secrets.token_hex(6), extra=(("Allow", ALLOW), ("Accept", "application/sdp")))

    def _invite(self, msg: SipMessage, source: tuple[str, int], send: Send, transport: str) -> None:
        existing = self.dialogs.get(msg.call_id)
        if existing is not None:
            if sipmsg.tag_of(msg.get("To")) is None:
                if existing.last_response:
                    send(existing.last_response)  # a retransmission: the last answer again
                return
            # a re-INVITE in the dialog: the same answer again (hold and codec changes are not taken)
            self._reply(msg, 200, send, tag=existing.local_tag, extra=self._answer_headers(existing))
            return
        if sipmsg.tag_of(msg.get("To")) is not None:
            self._reply(msg, 481, send)
            return
        assert self._loop is not None
        verdict = self.guard.invite(source[0], self._loop.time(), len(self.dialogs))
        if verdict == "forbidden":
            log.info("sip: INVITE from %s refused: not in sip_allowed_sources", source[0])
            self._reply(msg, 403, send)
            return
        if verdict == "rate_limited":
            self._reply(msg, 503, send, extra=(("Retry-After", "10"),))
            return
        if verdict == "busy" or self.rt.draining or self.rt.session_count() >= self.rt.settings.max_sessions:
            self._reply(msg, 486 if verdict == "busy" else 503, send)
            return
        challenger = self.challenger
        if challenger is not None and not challenger.check(msg.get("Authorization"), "INVITE"):
            self.guard.unauthenticated += 1
            self._reply(msg, 401, send, tag=secrets.token_hex(6), extra=(("WWW-Authenticate", challenger.challenge()),))
            return
        try:
            offer = parse_offer(msg.body)
        except SdpError as err:
            self._reply(msg, 488, send, extra=(("Warning", f'304 omni-gateway "{err}"'),))
            return
        self._reply(msg, 100, send)
        try:
            sock = bind_rtp(self.config.rtp_host, self.config.rtp_ports)
        except (PortsExhausted, OSError) as exc:
            log.warning("sip: %s", exc)
            self._reply(msg, 503, send)
            return
        media = RtpMedia(sock, offer, on_audio=lambda pcm: None, on_dtmf=lambda key: None)
        rid = ringing_id()
        tag = secrets.token_hex(8)
        contact = msg.get("Contact")
        remote_uri = sipmsg.uri_of(contact) if contact else sipmsg.uri_of(msg.get("From") or "")
        dialog = Dialog(msg.call_id, msg, source, send, transport, tag, remote_uri, media,
                        SipCall(rid, media, on_close=self._session_let_go))  # fmt: skip
        self.dialogs[msg.call_id] = dialog
        dialog.last_response = self._reply(msg, 180, send, tag=tag)
        incoming = IncomingCall(rid, msg.call_id, source[0], sipmsg.uri_of(msg.get("From") or ""),
                                sipmsg.uri_of(msg.get("To") or ""), tuple(msg.headers),
                                srtp=offer.crypto is not None)  # fmt: skip
        dialog.decide = self._loop.create_task(self._decide(dialog, incoming), name=f"sip ring {rid}")

    def _answer_headers(self, dialog: Dialog) -> tuple[tuple[str, str], ...]:
        host, port = self._advertised(dialog), self._port(dialog)
        transport = {"TCP": ";transport=tcp", "TLS": ";transport=tls"}.get(dialog.transport, "")
        return (
            ("Contact", f"<sip:omni-gateway@{host_part(host)}:{port}{transport}>"),
            ("Allow", ALLOW),
            (CALL_ID_HEADER, dialog.call.call_id),
            ("Content-Type", "application/sdp"),
        )

    def _port(self, dialog: Dialog) -> int:
        if dialog.transport == "TLS" and self.tls_bound is not None:
            return self.tls_bound[1]
        return self.bound[1] if self.bound else self.config.port

    def _advertised(self, dialog: Dialog) -> str:
        cfg = self.config
        if cfg.advertised_address:
            return cfg.advertised_address
        if cfg.rtp_host not in ("0.0.0.0", "::", ""):
            return cfg.rtp_host
        return self.bound[0] if self.bound else "127.0.0.1"

    async def _decide(self, dialog: Dialog, incoming: IncomingCall) -> None:
        try:
            decision = await asyncio.wait_for(self.control.incoming(incoming), self.config.ring_timeout_s)
        except TimeoutError:
            decision = Reject(480, _reason(480))
        except asyncio.CancelledError:
            return  # the caller gave up (CANCEL) or shutdown: what to answer is said there
        except Exception:
            log.exception("sip: call control failed on %s", incoming.call_id)
            decision = Reject(500, _reason(500))
        if isinstance(decision, Reject):
            if dialog.state == "ringing":
                status = decision.status_code if 400 <= decision.status_code <= 699 else 603
                await self._final(dialog, status)
            return
        try:
            if dialog.state == "ringing":
                await self._accept(dialog, decision)
        finally:
            if decision.settle is not None:
                await decision.settle(False)  # (a session that opened settled it already)

    async def _final(self, dialog: Dialog, status: int) -> None:
        dialog.state = "ended"
        dialog.last_response = self._reply(dialog.invite, status, dialog.send, tag=dialog.local_tag)
        await dialog.call.end(f"refused {status}")
        # Kept a little for the ACK of this final response (and retransmitted INVITEs).
        assert self._loop is not None
        self._loop.call_later(TIMER_H, self._forget, dialog)

    def _forget(self, dialog: Dialog) -> None:
        if self.dialogs.get(dialog.sip_call_id) is dialog:
            del self.dialogs[dialog.sip_call_id]

    async def _open(self, dialog: Dialog, requested: dict[str, Any] | None,
                    accepted: Accept | None = None) -> int | None:  # fmt: skip
        """The call's session, opened through a door (``accepted``: for whom, on which model and
        with which id, where the control said), admitted against its tenant's limits; its media
        started. None: opened; else the SIP status it was refused with (486: its tenant is at
        its limit of sessions; 503: otherwise)."""
        cfg = self.config
        rt = self.rt
        call = dialog.call
        accepted = accepted or Accept()
        grant = accepted.grant or cfg.grant
        if call.seat is None:  # (an outbound call's was taken by its request)
            admitted = await admit(rt.quotas, grant, call.ringing_id)
            if isinstance(admitted, int):
                return admitted
            call.seat = admitted
        try:
            return await self._open_admitted(dialog, requested, accepted, grant)
        finally:
            if call.ended and call.seat is not None:
                await call.seat.close()  # (it ended while its session opened: SipCall.end ran before its seat came)

    async def _open_admitted(self, dialog: Dialog, requested: dict[str, Any] | None, accepted: Accept,
                             grant: Grant) -> int | None:  # fmt: skip
        cfg = self.config
        rt = self.rt
        call = dialog.call
        door = Door(rt.hosting, rt.sessions, call, dialect=accepted.dialect,
                    principal=accepted.principal or grant.principal, model=accepted.model or cfg.model,
                    max_message_bytes=rt.settings.max_message_bytes,
                    seat=call.seat, media=call, session_id=accepted.session_id)  # fmt: skip
        rt.hosting.metrics.sessions.inc()
        rt.hosting.metrics.sessions_total.inc()
        try:
            opened = await door.open_call(requested)
        except Exception:
            log.exception("sip: opening the session of %s failed", call.ringing_id)
            opened = False
        if not opened or door.host is None:
            rt.hosting.metrics.sessions.dec()
            return 503
        if dialog.state == "ended":  # cancelled while the session opened
            rt.hosting.metrics.sessions.dec()
            door.detach()
            return 503
        call.call_id = accepted.call_id or call_id_of(door.host.id)
        await dialog.media.start()
        call.start(door)
        return None

    async def _accept(self, dialog: Dialog, decision: Accept) -> None:
        cfg = self.config
        call = dialog.call
        dialog.tasks.append(asyncio.current_task())  # type: ignore[arg-type]
        # (sip_session is the Realtime dialect's defaults; a Live accept's session is the whole start)
        defaults = cfg.session if not decision.dialect.media_start else None
        refused = await self._open(dialog, {**(defaults or {}), **(decision.session or {})} or None, decision)
        if refused is not None:
            if dialog.state == "ringing":
                await self._final(dialog, refused)
            return
        if dialog.state != "ringing":
            return
        answer = build_answer(dialog.media.offer, address=self._advertised(dialog), port=dialog.media.port,
                              session_id=int(time.time()), crypto=dialog.media.local_crypto)  # fmt: skip
        resp = response_to(dialog.invite, 200, "OK", to_tag=dialog.local_tag)
        for name, value in self._answer_headers(dialog):
            resp.add(name, value)
        resp.body = answer
        dialog.last_response = resp.encode()
        dialog.state = "answered"
        dialog.send(dialog.last_response)
        log.info("sip call %s answered (from %s, %s)", call.call_id, dialog.source[0], dialog.media.offer.codec)
        if decision.settle is not None:
            await decision.settle(True)  # (the accept answers now: its sideband finds the session)
        self.rt.hosting.metrics.sip_calls.labels("inbound").inc()
        assert self._loop is not None
        if dialog.transport == "UDP":
            dialog.tasks.append(self._loop.create_task(self._retransmit_ok(dialog)))
        if cfg.max_call_s > 0:
            dialog.tasks.append(self._loop.create_task(self._cap_length(dialog)))

    async def _retransmit_ok(self, dialog: Dialog) -> None:
        interval, waited = T1, 0.0
        while dialog.state == "answered" and waited < TIMER_H:
            await asyncio.sleep(interval)
            waited += interval
            if dialog.state == "answered":
                dialog.send(dialog.last_response)
            interval = min(interval * 2, T2)
        if dialog.state == "answered":
            log.info("sip call %s: no ACK for the 200 OK: hanging up", dialog.call.call_id)
            await self._hang_up(dialog, "no ACK")

    async def _cap_length(self, dialog: Dialog) -> None:
        await asyncio.sleep(self.config.max_call_s)
        if dialog.state in ("answered", "confirmed"):
            log.info("sip call %s: sip_max_call_s reached: hanging up", dialog.call.call_id)
            await self._hang_up(dialog, "call length cap")

    def _ack(self, msg: SipMessage, source: tuple[str, int], send: Send, transport: str) -> None:
        dialog = self.dialogs.get(msg.call_id)
        if dialog is not None and dialog.state == "answered":
            dialog.state = "confirmed"

    def _cancel(self, msg: SipMessage, source: tuple[str, int], send: Send, transport: str) -> None:
        dialog = self.dialogs.get(msg.call_id)
        if dialog is None or dialog.invite.branch != msg.branch:
            self._reply(msg, 481, send)
            return
        self._reply(msg, 200, send, tag=dialog.local_tag)
        if dialog.state == "ringing":
            if dialog.decide is not None:
                dialog.decide.cancel()
            assert self._loop is not None
            self._loop.create_task(self._final(dialog, 487))

    def _bye(self, msg: SipMessage, source: tuple[str, int], send: Send, transport: str) -> None:
        dialog = self.dialogs.get(msg.call_id)
        if dialog is None or dialog.state in ("ringing", "ended") or sipmsg.tag_of(msg.get("To")) != dialog.local_tag:
            self._reply(msg, 481, send)
            return
        self._reply(msg, 200, send)
        log.info("sip call %s: the caller hung up", dialog.call.call_id)
        assert self._loop is not None
        self._loop.create_task(self._end(dialog, "the caller hung up", bye=False))

    # --- the end ------------------------------------------------------------------------------

    def _session_let_go(self, call: SipCall, reason: str) -> None:
        dialog = next((d for d in self.dialogs.values() if d.call is call), None)
        if dialog is not None and dialog.state in ("answered", "confirmed"):
            assert self._loop is not None
            self._loop.create_task(self._end(dialog, reason, bye=True, end_session=False))

    async def _hang_up(self, dialog: Dialog, reason: str) -> None:
        if dialog.state == "ringing":
            if dialog.decide is not None:
                dialog.decide.cancel()
            await self._final(dialog, 503 if reason == "shutdown" else 480)
            return
        await self._end(dialog, reason, bye=True)

    async def _end(self, dialog: Dialog, reason: str, *, bye: bool, end_session: bool = True) -> None:
        if dialog.state == "ended":
            return
        dialog.state = "ended"
        dialog.ended_by = reason
        current = asyncio.current_task()
        for task in dialog.tasks:
            if task is not current and not task.done():
                task.cancel()
        if bye:
            self._send_bye(dialog, reason)
        door = dialog.call.door
        host = door.host if door is not None else None
        await dialog.call.end(reason)
        self.rt.hosting.metrics.sessions.dec()
        if end_session and host is not None and not host.ended:
            await host.hang_up()  # the call is over: its session ends for good
        self._forget(dialog)

    def _in_dialog(self, dialog: Dialog, method: str, *extra: tuple[str, str]) -> bytes:
        """A request of ours in ``dialog`` (RFC 3261 12.2.1.1), sent; its bytes (to send again)."""
        invite = dialog.invite
        dialog.cseq += 1
        host = self._advertised(dialog)
        port = self._port(dialog)
        req = SipMessage(method=method, uri=dialog.remote_uri)
        req.add("Via", f"SIP/2.0/{dialog.transport} {host_part(host)}:{port};branch=z9hG4bK{secrets.token_hex(8)}")
        req.add("Max-Forwards", "70")
        req.add("From", dialog.local_party or f"{invite.get('To')};tag={dialog.local_tag}")
        req.add("To", dialog.remote_party or invite.get("From") or "")
        req.add("Call-ID", dialog.sip_call_id)
        req.add("CSeq", f"{dialog.cseq} {method}")
        for name, value in extra:
            req.add(name, value)
        out = req.encode()
        dialog.send(out)
        return out

    def _send_bye(self, dialog: Dialog, reason: str) -> None:
        out = self._in_dialog(dialog, "BYE", ("Reason", f'SIP;cause=200;text="{reason}"'))
        if dialog.transport == "UDP":  # sent again a few times, until its answer comes
            assert self._loop is not None
            self._byes[dialog.sip_call_id] = [self._loop.call_later(d, dialog.send, out) for d in (T1, 3 * T1, 7 * T1)]
            self._loop.call_later(8 * T1, self._byes.pop, dialog.sip_call_id, None)

    # --- outbound calls (the gateway as a UAC) ------------------------------------------------

    async def dial(self, destination: str, trunk: tuple[str, int], *, caller: str | None = None,
                   session: dict[str, Any] | None = None,
                   credentials: tuple[str, str] | None = None, seat: Seat | None = None) -> Dialog | int:  # fmt: skip
        """Call ``destination`` (a ``sip:``/``tel:`` URI) through the trunk at ``trunk`` (UDP):
        INVITE with the gateway's offer (answering one digest challenge, 401 or 407, with
        ``credentials``: (user, password)), rings at most ``sip_ring_timeout_s`` (then CANCEL),
        and on 200 OK: ACK, and the call's session opens as an answered inbound call's does.
        The answered call's dialog, or the SIP status it failed with (408: no answer in time;
        488: an answer the gateway cannot take; 503: no session, no RTP port). ``seat``: the
        call's admission under its tenant's limits, released when it ends (or fails)."""
        cfg = self.config
        call = self.outbound_call()
        if call is None:
            if seat is not None:
                await seat.close()
            return 503
        call.seat = seat
        dialog = await self._place(destination, trunk, call, caller=caller, credentials=credentials)
        if isinstance(dialog, int):
            await call.end(f"not answered ({dialog})")  # (its seat given back)
            return dialog
        if await self._open(dialog, {**(cfg.session or {}), **(session or {})} or None) is not None:
            await self._end(dialog, "no session", bye=True, end_session=False)
            return 503
        self._answered_outbound(dialog, destination)
        return dialog

    def outbound_call(self) -> SipCall | None:
        """A call to place: its RTP bound on ``sip_rtp_ports`` (its media is made once the answer
        names the far end and the codec: ``_place``); None: no free port."""
        cfg = self.config
        try:
            sock = bind_rtp(cfg.rtp_host, cfg.rtp_ports)
        except (PortsExhausted, OSError) as exc:
            log.warning("sip: %s", exc)
            return None
        unanswered = RtpMedia(sock, _NO_MEDIA, on_audio=_ignore, on_dtmf=_ignore)  # (never started)
        return SipCall(ringing_id(), unanswered, on_close=self._session_let_go)

    async def dial_live(self, destination: str, trunk: tuple[str, int], door: Door, call: SipCall, *,
                        caller: str | None = None, credentials: tuple[str, str] | None = None) -> None:  # fmt: skip
        """GPT-Live's outbound call (``POST /v1/live/sessions`` with ``transport.type: "sip"``):
        ``door``'s session is open already (its id is the call's), and hears of the call as
        it goes, on its sidebands: ``transport.ringing`` (the trunk's 180 or 183),
        ``transport.answered`` (200 OK: the media runs), or ``transport.failed`` (the SIP
        status, or no answer in time; the session then ends). A session that ends while the
        call rings cancels it (CANCEL); one the trunk answered as the CANCEL crossed it is hung
        up (BYE)."""
        host = door.host
        assert host is not None and self._loop is not None
        rang = False

        def ringing() -> None:
            nonlocal rang
            if not rang and not host.ended:
                rang = True
                host.transport_progress("ringing", {})

        try:
            dialog = await self._place(destination, trunk, call, caller=caller, credentials=credentials,
                                       on_ringing=ringing)  # fmt: skip
        except Exception:
            log.exception("sip: placing the Live call %s failed", host.id)
            dialog = 500
        if isinstance(dialog, int):
            self.rt.hosting.metrics.sessions.dec()
            if not host.ended:
                why = "no answer in time" if dialog == 408 else f"SIP {dialog}"
                message = f"The call was not answered: {why}."
                error = {"type": "call_error", "code": Code.SIP_CALL_FAILED, "message": message}
                host.transport_progress("failed", {"error": error})
                await host.hang_up()
            await call.end(f"not answered ({dialog})")
            return
        if host.ended or call.ended:
            await self._end(dialog, "its session ended while it rang", bye=True, end_session=False)
            return
        await dialog.media.start()
        call.start(door)
        self._answered_outbound(dialog, destination)
        host.transport_progress("answered", {})

    def _answered_outbound(self, dialog: Dialog, destination: str) -> None:
        assert self._loop is not None
        dialog.state = "confirmed"
        codec = dialog.media.offer.codec
        log.info("sip call %s: outbound to %s answered (%s)", dialog.call.call_id, destination, codec)
        self.rt.hosting.metrics.sip_calls.labels("outbound").inc()
        if self.config.max_call_s > 0:
            dialog.tasks.append(self._loop.create_task(self._cap_length(dialog)))

    async def _place(self, destination: str, trunk: tuple[str, int], call: SipCall, *, caller: str | None,
                     credentials: tuple[str, str] | None,
                     on_ringing: Callable[[], None] | None = None) -> Dialog | int:  # fmt: skip
        """The INVITE of an outbound call (``call``: its RTP bound, not started; the transaction:
        ``uac.invite``), rung until its final answer (``on_ringing``: a 180 or 183 came): the
        answered call's dialog (ACK sent, the call given its media for the answer's SDP), or the
        SIP status it failed with (408: no answer in time; 487: cancelled as it rang, its session
        having let it go; 488: an answer the gateway cannot take). The RTP socket is closed on
        failure."""
        cfg = self.config
        sock = call.media.sock
        host = cfg.advertised_address or (cfg.rtp_host if cfg.rtp_host not in ("0.0.0.0", "::", "") else "127.0.0.1")
        port = self.bound[1] if self.bound else cfg.port
        target = destination if destination.startswith("sip") else f"sip:{destination.removeprefix('tel:')}@{trunk[0]}"
        user = (caller or "omni-gateway").removeprefix("tel:")
        local_tag = secrets.token_hex(8)
        key = offer_key() if cfg.outbound_srtp else None
        out = uac.Outgoing(
            target=target, call_id=f"{secrets.token_hex(12)}@omni-gateway",
            local_party=f"<sip:{user}@{uac.host_part(host)}>;tag={local_tag}", contact=f"{uac.host_part(host)}:{port}",
            sdp=build_offer(address=host, port=call.media.port, session_id=int(time.time()), crypto=key),
        )  # fmt: skip

        def send(data: bytes) -> None:
            self._sendto(data, trunk)

        answers: asyncio.Queue[SipMessage] = asyncio.Queue()  # the listener routes the trunk's answers here
        self._dialing[out.call_id] = answers
        try:
            placed = await uac.invite(out, send, answers, ring_timeout_s=cfg.ring_timeout_s, credentials=credentials,
                                      on_ringing=on_ringing, abandoned=call.let_go)  # fmt: skip
        finally:
            self._dialing.pop(out.call_id, None)
        if isinstance(placed, int):
            sock.close()
            return placed
        remote_party = placed.final.get("To") or ""
        try:
            answer = parse_answer(placed.final.body, key)
        except SdpError as err:
            log.info("sip: the answer to an outbound call cannot be taken: %s", err)
            send(placed.ack.encode())
            bye = Dialog(out.call_id, placed.invite, trunk, send, "UDP", local_tag, placed.remote_uri, call.media, call,
                         cseq=placed.cseq, local_party=out.local_party, remote_party=remote_party)  # fmt: skip
            self._send_bye(bye, "no acceptable media")
            sock.close()
            return 488
        media = RtpMedia(sock, answer, on_audio=_ignore, on_dtmf=_ignore, local_crypto=key)
        call.take_media(media)
        dialog = Dialog(out.call_id, placed.invite, trunk, send, "UDP", local_tag, placed.remote_uri, media, call,
                        state="answered", cseq=placed.cseq, local_party=out.local_party, remote_party=remote_party,
                        ack=placed.ack.encode())  # fmt: skip
        self.dialogs[out.call_id] = dialog
        send(dialog.ack)
        return dialog

    # --- transfer (REFER, RFC 3515) -------------------------------------------------------------

    async def transfer(self, call_id: str, target_uri: str, principal: str) -> int | None:
        """``/refer`` of the call ``call_id`` held here, for ``principal``: the trunk's status
        (``refer``), or None: no such call answered here (or another principal's)."""
        dialog = self.find(call_id)
        host = dialog.call.door.host if dialog is not None and dialog.call.door is not None else None
        if dialog is None or host is None or host.principal != principal:
            return None
        return await self.refer(dialog, target_uri)

    async def _refer_asked(self, body: dict[str, Any]) -> dict[str, Any]:
        """Another replica's ``/refer`` of a call held here (``gateway/hosting/ask.py``): the
        trunk's status, or ``found: false``."""
        call_id, target, principal = body.get("call_id"), body.get("target_uri"), body.get("principal")
        if not (isinstance(call_id, str) and isinstance(target, str) and isinstance(principal, str)):
            return {"found": False}
        status = await self.transfer(call_id, target, principal)
        return {"found": False} if status is None else {"found": True, "status": status}

    def find(self, call_id: str) -> Dialog | None:
        """The answered call whose session's call id is ``call_id`` (rtc_...), on this replica."""
        return next((d for d in self.dialogs.values() if d.call.call_id == call_id and d.state in
                     ("answered", "confirmed")), None)  # fmt: skip

    async def refer(self, dialog: Dialog, target_uri: str) -> int:
        """Ask the trunk to transfer ``dialog`` to ``target_uri`` (REFER); the trunk's status
        (202 Accepted: it is trying; the call is hung up once its NOTIFY says the transfer
        was answered), or 408 when none came within ``REFER_TIMEOUT_S``."""
        assert self._loop is not None
        future: asyncio.Future[int] = self._loop.create_future()
        self._refers[dialog.sip_call_id] = future
        host = self._advertised(dialog)
        contact = f"<sip:omni-gateway@{host_part(host)}:{self._port(dialog)}>"
        out = self._in_dialog(dialog, "REFER", ("Contact", contact), ("Refer-To", f"<{target_uri}>"),
                              ("Referred-By", contact))  # fmt: skip
        handles = []
        if dialog.transport == "UDP":
            handles = [self._loop.call_later(d, dialog.send, out) for d in (T1, 3 * T1, 7 * T1)]
        try:
            return await asyncio.wait_for(future, REFER_TIMEOUT_S)
        except TimeoutError:
            return 408
        finally:
            for handle in handles:
                handle.cancel()
            if self._refers.get(dialog.sip_call_id) is future:
                del self._refers[dialog.sip_call_id]

    def _notify(self, msg: SipMessage, source: tuple[str, int], send: Send, transport: str) -> None:
        """The trunk's progress on a transfer (a ``message/sipfrag`` status): once the target
        answered (2xx), the gateway's part of the call is over (BYE)."""
        dialog = self.dialogs.get(msg.call_id)
        if dialog is None or dialog.state not in ("answered", "confirmed"):
            self._reply(msg, 481, send)
            return
        self._reply(msg, 200, send)
        match = re.match(rb"\s*SIP/2\.0 (\d{3})", msg.body)
        if match is not None and (msg.get("Event") or "").lower().startswith("refer"):
            status = int(match.group(1))
            log.info("sip call %s: transfer progress %d", dialog.call.call_id, status)
            if 200 <= status < 300:
                assert self._loop is not None
                self._loop.create_task(self._end(dialog, "transferred", bye=True))


_NO_MEDIA = Offer("127.0.0.1", 9, 0, None, 20)


async def admit(quotas: Quotas, grant: Grant, call: str) -> Seat | int:
    """A call's seat under its tenant's limits (as a socket's, ``admit_seat``), or the SIP status
    it is refused with: 486 Busy Here (the tenant is at ``max_sessions`` or
    ``session_starts_per_min``: RFC 3261 21.4.24, the callee cannot take another call), 503
    Service Unavailable (the store cannot say)."""
    try:
        admitted = await quotas.admit(grant)
    except AdmissionUnavailable as exc:
        log.warning("sip: call %s refused: the store cannot admit it (%s)", call, exc)
        return 503
    if isinstance(admitted, ConnectRefusal):
        log.info("sip: call %s refused (486): %s", call, admitted.message)
        return 486
    return admitted


def _ignore(_: Any) -> None:
    pass


def build_sip_server(services: SipServices, control: CallControl | None = None) -> SipServer:
    """The SIP server the settings describe (``control``: who answers calls; None: the default
    session answers every admitted call). Raises ValueError on a setting it cannot take."""
    import orjson

    from gateway.auth import principal_of_key
    from gateway.hosting.incoming import Webhook
    from gateway.transport.sip.control import DefaultAnswer, WebhookControl

    s = services.settings
    session: dict[str, Any] | None = None
    if s.sip_session:
        try:
            session = orjson.loads(s.sip_session)
        except orjson.JSONDecodeError:
            raise ValueError("sip_session is not valid JSON") from None
        if not isinstance(session, dict):
            raise ValueError("sip_session must be a JSON object of session settings")
    tls: ssl.SSLContext | None = None
    if s.sip_tls_port:
        if not (s.sip_tls_cert and s.sip_tls_key):
            raise ValueError("sip_tls_port needs sip_tls_cert and sip_tls_key (PEM files)")
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.minimum_version = ssl.TLSVersion.TLSv1_2
        tls.load_cert_chain(s.sip_tls_cert, s.sip_tls_key)
    config = SipConfig(
        host=s.host, port=s.sip_port, rtp_host=s.host, advertised_address=s.sip_advertised_address,
        rtp_ports=parse_port_range(s.sip_rtp_ports), ring_timeout_s=s.sip_ring_timeout_s,
        max_call_s=s.sip_max_call_s,
        grant=services.auth.operator(principal_of_key(s.api_keys[0]) if s.api_keys else "anonymous"),
        model=s.sip_model or s.model, session=session, tls_port=s.sip_tls_port, tls=tls,
        outbound_srtp=s.sip_outbound_srtp,
    )  # fmt: skip
    guard = Guard(s.sip_allowed_sources, per_source_per_min=s.sip_invites_per_source_per_min,
                  per_min=s.sip_invites_per_min, max_calls=s.sip_max_calls)  # fmt: skip
    challenger = None
    if s.sip_trunk_credentials:
        pairs = [entry.partition(":") for entry in s.sip_trunk_credentials]
        if any(not user or not sep or not password for user, sep, password in pairs):
            raise ValueError("sip_trunk_credentials: give user:password entries, comma separated")
        challenger = digest.Challenger({user: password for user, _, password in pairs})
    if control is None and s.call_webhook_url:
        webhook = Webhook(s.call_webhook_url, s.call_webhook_secret, s.call_webhook_timeout_s, s.call_accept_timeout_s,
                          live=s.call_webhook_live)  # fmt: skip
        control = WebhookControl(services.hosting, webhook)
    return SipServer(services, config, guard, control or DefaultAnswer(), challenger)
