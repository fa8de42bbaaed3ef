"""The gateway as a user agent client: an outbound call's INVITE transaction (RFC 3261 17.1.1).

``invite`` sends the INVITE (again at T1, 3 T1, 7 T1 and 15 T1 until any answer comes),
reports a 180 or 183, answers one digest challenge (401 or 407) with the credentials it was
given, sends CANCEL when nobody answers by the ring deadline or the call is abandoned while it
rings (its session ended), ACKs a failure (hop by hop: the INVITE's branch; the 487 that ends a
cancelled INVITE too) and builds the ACK of a 2xx (end to end: a branch of its own, to the
answer's Contact). It touches no socket: ``send`` writes to the trunk, and ``answers`` brings the
responses the listener routes here by Call-ID (``server.SipServer``).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from gateway.transport.sip import digest
from gateway.transport.sip import message as sipmsg
from gateway.transport.sip.message import SipMessage

ALLOW = "INVITE, ACK, BYE, CANCEL, OPTIONS, NOTIFY"  # the methods the gateway takes in a dialog
T1 = 0.5  # RFC 3261's round-trip estimate: the first retransmission interval
_RESENDS = (T1, 3 * T1, 7 * T1, 15 * T1)  # an INVITE sent again at these (timer A, doubling) until any answer
# After a CANCEL, the longest wait for the INVITE's final answer (the 487 to ACK, or a 2xx that
# crossed the CANCEL); past it the transaction is left to the trunk's own timers.
CANCELLED_FINAL_WAIT_S = 4 * T1
REQUEST_TERMINATED = 487  # what a cancelled INVITE ends with

Send = Callable[[bytes], None]


def host_part(host: str) -> str:
    """``host`` as a SIP URI's host (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host


@dataclass(frozen=True, slots=True)
class Outgoing:
    """An outbound call's INVITE, before it is sent."""

    target: str  # the Request-URI (and To)
    call_id: str
    local_party: str  # From, with the gateway's tag
    contact: str  # host:port of the gateway's Via and Contact
    sdp: bytes  # the offer


@dataclass(frozen=True, slots=True)
class Answered:
    """A 2xx to the INVITE: what the dialog is built from."""

    invite: SipMessage  # the INVITE that was answered (its last CSeq)
    final: SipMessage  # the 2xx
    cseq: int
    remote_uri: str  # the answer's Contact: where in-dialog requests go
    ack: SipMessage  # the 2xx's ACK, to send once the answer is taken


async def invite(out: Outgoing, send: Send, answers: asyncio.Queue[SipMessage], *, ring_timeout_s: float,
                 credentials: tuple[str, str] | None = None, on_ringing: Callable[[], None] | None = None,
                 abandoned: asyncio.Event | None = None) -> Answered | int:  # fmt: skip
    """Place the call: the 2xx (``Answered``), or the SIP status it failed with (408: nobody
    answered within ``ring_timeout_s``; 487: ``abandoned`` was set while it rang; else the
    trunk's final status, its ACK sent). A cancelled call that the trunk answered as the CANCEL
    crossed it is ``Answered`` too: the caller hangs it up."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ring_timeout_s
    cseq, auth = 1, None
    while True:
        request = _invite(out, cseq, auth)
        final = await _ring(request, send, answers, deadline, on_ringing, abandoned)
        if final is None:  # nobody answered in time, or nobody wants the call now: CANCEL
            final = await _cancel(out, request, cseq, send, answers)
            if final is None or (final.status or 500) >= 300:
                return REQUEST_TERMINATED if abandoned is not None and abandoned.is_set() else 408
        status = final.status or 500
        if status in (401, 407) and credentials is not None and auth is None:
            send(_ack_failure(out, request, final, cseq))
            proxy = status == 407
            challenge = final.get("Proxy-Authenticate" if proxy else "WWW-Authenticate") or ""
            value = digest.answer(challenge, username=credentials[0], password=credentials[1], method="INVITE",
                                  uri=out.target)  # fmt: skip
            if value is None:
                return status
            auth = ("Proxy-Authorization" if proxy else "Authorization", value)
            cseq += 1
            continue
        if status >= 300:
            send(_ack_failure(out, request, final, cseq))
            return status
        contact = final.get("Contact")
        remote_uri = sipmsg.uri_of(contact) if contact else out.target
        ack = SipMessage(method="ACK", uri=remote_uri)
        ack.add("Via", f"SIP/2.0/UDP {out.contact};branch=z9hG4bK{secrets.token_hex(8)}")
        ack.add("Max-Forwards", "70")
        ack.add("From", out.local_party)
        ack.add("To", final.get("To") or "")
        ack.add("Call-ID", out.call_id)
        ack.add("CSeq", f"{cseq} ACK")
        return Answered(request, final, cseq, remote_uri, ack)


def _invite(out: Outgoing, cseq: int, auth: tuple[str, str] | None) -> SipMessage:
    request = SipMessage(method="INVITE", uri=out.target)
    request.add("Via", f"SIP/2.0/UDP {out.contact};branch=z9hG4bK{secrets.token_hex(8)}")
    request.add("Max-Forwards", "70")
    request.add("From", out.local_party)
    request.add("To", f"<{out.target}>")
    request.add("Call-ID", out.call_id)
    request.add("CSeq", f"{cseq} INVITE")
    request.add("Contact", f"<sip:omni-gateway@{out.contact}>")
    request.add("Allow", ALLOW)
    if auth is not None:
        request.add(*auth)
    request.add("Content-Type", "application/sdp")
    request.body = out.sdp
    return request


def _ack_failure(out: Outgoing, request: SipMessage, final: SipMessage, cseq: int) -> bytes:
    """The ACK of a non-2xx final answer: hop by hop, in the INVITE's transaction (its branch)."""
    ack = SipMessage(method="ACK", uri=out.target)
    for name in ("Via", "Max-Forwards", "From", "Call-ID"):
        ack.add(name, request.get(name) or "")
    ack.add("To", final.get("To") or "")
    ack.add("CSeq", f"{cseq} ACK")
    return ack.encode()


async def _cancel(out: Outgoing, request: SipMessage, cseq: int, send: Send,
                  answers: asyncio.Queue[SipMessage]) -> SipMessage | None:  # fmt: skip
    """CANCEL the ringing ``request`` (in its transaction: its branch), then wait (at most
    ``CANCELLED_FINAL_WAIT_S``) for the INVITE's final answer: a failure (the 487) is ACKed
    and returned; a 2xx (answered as the CANCEL crossed it) is returned for the caller to take
    and hang up; None: none came."""
    cancel = SipMessage(method="CANCEL", uri=out.target)
    for name in ("Via", "Max-Forwards", "From", "To", "Call-ID"):
        cancel.add(name, request.get(name) or "")
    cancel.add("CSeq", f"{cseq} CANCEL")
    send(cancel.encode())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CANCELLED_FINAL_WAIT_S
    while (left := deadline - loop.time()) > 0:
        try:
            msg = await asyncio.wait_for(answers.get(), left)
        except TimeoutError:
            return None
        if msg.cseq == (cseq, "INVITE") and msg.status is not None and msg.status >= 200:
            if msg.status >= 300:
                send(_ack_failure(out, request, msg, cseq))
            return msg
    return None


async def _next_answer(answers: asyncio.Queue[SipMessage], within_s: float,
                       abandoned: asyncio.Event | None) -> SipMessage | None:  # fmt: skip
    """The trunk's next answer within ``within_s`` (TimeoutError past it), or None once
    ``abandoned`` is set (an answer already queued is taken first)."""
    if abandoned is None or not answers.empty():
        return await asyncio.wait_for(answers.get(), within_s)
    if abandoned.is_set():
        return None
    got, gone = asyncio.ensure_future(answers.get()), asyncio.ensure_future(abandoned.wait())
    try:
        await asyncio.wait((got, gone), timeout=within_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (got, gone):
            if not task.done():
                task.cancel()
    if got.done() and not got.cancelled():
        return got.result()
    if gone.done():
        return None
    raise TimeoutError


async def _ring(request: SipMessage, send: Send, answers: asyncio.Queue[SipMessage], deadline: float,
                on_ringing: Callable[[], None] | None,
                abandoned: asyncio.Event | None) -> SipMessage | None:  # fmt: skip
    """Send ``request`` (again until any answer) and wait for its final response until
    ``deadline`` or ``abandoned`` (None: none came); ``on_ringing``: called on a 180 or 183."""
    loop = asyncio.get_running_loop()
    data = request.encode()
    send(data)
    resend = [loop.call_later(d, send, data) for d in _RESENDS]
    cseq = request.cseq[0]
    try:
        while True:
            left = deadline - loop.time()
            if left <= 0:
                return None
            try:
                msg = await _next_answer(answers, left, abandoned)
            except TimeoutError:
                return None
            if msg is None:
                return None
            for handle in resend:
                handle.cancel()  # any answer: the INVITE arrived
            if msg.cseq[0] == cseq and msg.status is not None and msg.status >= 200:
                return msg
            if msg.status in (180, 183) and on_ringing is not None:
                on_ringing()
    finally:
        for handle in resend:
            handle.cancel()
