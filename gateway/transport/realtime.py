"""``/v1/realtime``: the WebSocket of realtime sessions, in every dialect.

Only the socket's I/O lives here: the handshake (origin, credentials,
subprotocol, the refusals of a model or a tenant limit), reading messages and
handing each to the connection's door (``gateway/hosting/door.py``), which
does the rest, and writing what the door gives it through the outbox.

Raw ASGI (no per-message framework wrapper: this is the hot path). Messages
reach the door as they are read (``omni.websocket.direct``, no task switch)
or through the read loop; a message the door must wait on (the store) holds
back every message after it, so the order holds.

A client secret opens the session it was minted for, in every dialect: its
model (a ``?model=`` naming another is refused, ``model_not_allowed``, close
4003) and its settings (the door opens every session with them); it resumes
only a session opened with a secret minted for the same, and opens no
sideband (``?call_id=``: ``client_secret_wrong_type``, close 4003).

Dialects: the OpenAI Realtime API, GA (the default) or beta (subprotocol
``openai-beta.realtime-v1`` or header ``OpenAI-Beta: realtime=v1``), and
vLLM-Omni's duplex dialect (``?duplex=1``). Subprotocols a client may offer (one
is echoed, never the key): ``omni-binary.v1`` (binary audio fast path),
``realtime``, ``openai-beta.realtime-v1``, ``openai-insecure-api-key.<key or
client secret>`` (browser auth).

A Realtime socket (GA or beta) opens its session at connect (``session.created``
first), as OpenAI's does, unless it asks for a resume-only socket (``?resume=1``
or ``?autostart=0``, a gateway extension): then nothing opens until its first
event, which must be ``session.resume`` (no throwaway session: a reconnect skips
a session's lease, commit and ``session.created``) or ``session.update`` (opens
the session with it); any other is refused (``session_not_open``).

The duplex dialect's opening (vLLM-Omni's ``realtime_duplex_api.md``,
"Endpoint and transport"): with ``?model=`` and without ``?autostart=0`` /
``?resume=1`` the session opens at connect (``session.created`` first).
Otherwise the first client event decides: ``session.update`` opens the session
with its ``session`` object (``session.created`` then ``session.updated``; a
refused update opens nothing and the client may send another),
``session.resume`` resumes with no throwaway session; any other event opens
the default session and is then handled, except on a resume-only socket
(``autostart=0``, ``resume=1``), where it is refused (``session_not_open``).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol
from urllib.parse import parse_qs

import orjson

from gateway.auth import Minted
from gateway.hosting.calls import attach_sideband, open_sideband
from gateway.hosting.door import Door, Entrance, Pending, Sessions
from gateway.protocol import client_events as ce
from gateway.protocol import duplex_events
from gateway.protocol.dialects import BETA, BETA_SUBPROTOCOL, DUPLEX, GA, Dialect
from gateway.protocol.errors import CloseCode, Code, ProtocolError
from gateway.protocol.server_events import AUDIO_DELTA, BINARY_SUBPROTOCOL, encode_audio_frame
from gateway.quotas import Seat
from gateway.transport.handshake import (
    Handshake,
    accept,
    admit_seat,
    common_refusal,
    minted_refusal,
    offered_subprotocols,
    refuse,
    request_headers,
)
from gateway.transport.lifecycle import bound_send_buffer, drop, settle
from gateway.transport.outbox import Outbox, SlowConsumer
from gateway.transport.services import Services
from gateway.transport.ws_server import ABORT_EXTENSION, DIRECT_EXTENSION, MESSAGES_PER_TURN, WRITE_EXTENSION

log = logging.getLogger("omni.realtime")

SLOW_CLOSE_GRACE_S = 5.0  # after the 4010 decision, how long the close frame may wait behind a full
#   socket before the connection is dropped without it
_AUDIO_DELTA_JSON = b'"response.output_audio.delta"'


def dialect_of(query: dict[str, list[str]], headers: dict[str, str], offered: list[str]) -> Dialect:
    """The dialect a socket to ``/v1/realtime`` speaks: vLLM-Omni's duplex (``?duplex=1``), the
    Realtime API's beta (subprotocol ``openai-beta.realtime-v1`` or header ``OpenAI-Beta:
    realtime=v1``), else GA."""
    if duplex_events.enabled(next(iter(query.get("duplex", ())), None)):
        return DUPLEX
    if "realtime=v1" in headers.get("openai-beta", "") or BETA_SUBPROTOCOL in offered:
        return BETA
    return GA


def resume_at_connect(hs: Handshake) -> ce.SessionResume | None:
    """The gateway's resume extension in the URL (``?resume_session_id=&resume_token=&
    last_received_server_event_seq=``): what ``session.resume`` as a first event does, for a
    client whose reconnect can change its URL but not send an event first (the official SDKs'
    ``on_reconnecting`` hook). None: the URL names no resume; a malformed one is not a resume
    either (the session.resume event says why, if the client sends it)."""
    session_id, token, seq = (
        hs.param("resume_session_id"),
        hs.param("resume_token"),
        hs.param("last_received_server_event_seq"),
    )
    if not (session_id and token and seq and seq.isdigit()):
        return None
    return ce.SessionResume(None, session_id, token, int(seq))


class RealtimeServices(Services, Protocol):
    """What the realtime endpoint needs of the process (the runtime provides it)."""

    @property
    def sessions(self) -> Sessions:
        """Opens and restores the sessions behind the doors."""


class RealtimeEndpoint:
    """ASGI app for the realtime WebSocket."""

    def __init__(self, runtime: RealtimeServices, *, dialect: Dialect | None = None, forks: bool = False,
                 attach: bool = False) -> None:  # fmt: skip
        self.runtime = runtime
        self.forks = forks  # every socket opens a session that carries on the stored one its path names
        self.attach = attach  # every socket is a sideband of the WebRTC session its path names (GPT-Live's /attach)
        # Every socket speaks this dialect (``/v1/duplex``: vLLM-Omni's duplex alias; ``/v1/live/sessions``:
        # GPT-Live); None: the request says (``dialect_of``).
        self.dialect = dialect

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        rt = self.runtime
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        dialect = self.dialect or dialect_of(query, request_headers(scope), offered_subprotocols(scope))

        def encode_error(code: str, message: str) -> bytes:
            return dialect.error(ProtocolError(code, message))

        hs = await accept(rt, scope, receive, send, dialect.subprotocol, encode_error)
        if hs is None:
            return
        minted = hs.grant.minted  # a client secret's: the model and settings it opens, and no others
        asked = hs.param("model")
        model = asked or (minted.model if minted is not None else rt.settings.model)
        sideband = hs.param("call_id") is not None or self.attach
        refusal = common_refusal(rt, hs) or minted_refusal(hs.grant, video=False, model=asked, sideband=sideband)
        checked = not dialect.model_at_start  # (else the door checks the model the opening event names)
        if refusal is None and checked and not rt.sessions.serves(model):
            refusal = (
                Code.MODEL_NOT_FOUND,
                f"No model {model!r} is served here; GET /v1/models lists them.",
                CloseCode.UNKNOWN_MODEL,
            )
        if refusal is None and checked and not hs.grant.tenant.allows_model(model):
            refusal = (Code.MODEL_NOT_ALLOWED, f"This credential may not use the model {model!r}.", CloseCode.FORBIDDEN)
        if refusal is not None:
            await refuse(rt, send, refusal, encode_error(refusal[0], refusal[1]))
            return
        seat = await admit_seat(rt, hs, send, encode_error)
        if seat is None:
            return
        try:
            await self._serve(scope, receive, send, hs, model, seat, dialect)
        finally:
            await seat.close()

    async def _serve(
        self, scope: dict[str, Any], receive: Any, send: Any, hs: Handshake, model: str, seat: Seat, dialect: Dialect
    ) -> None:
        rt = self.runtime
        socket = RealtimeSocket(rt, scope, receive, send, binary=dialect.binary and BINARY_SUBPROTOCOL in hs.offered)
        opening: Callable[[], Awaitable[bool]] | None
        call_id = hs.param("call_id")
        attach_id = scope.get("path_params", {}).get("session_id") if self.attach else None
        if call_id is not None or attach_id is not None:  # a sideband: it holds a WebRTC session beside its call
            if attach_id is not None:
                refused = await socket.attach_to(attach_id, dialect, principal=hs.grant.principal, model=model,
                                                 seat=seat)  # fmt: skip
            else:
                refused = await socket.join_call(str(call_id), principal=hs.grant.principal, model=model, seat=seat)
            if refused is not None:
                close = CloseCode.TRY_AGAIN_LATER if refused.code == Code.STORE_UNAVAILABLE else CloseCode.UNKNOWN_CALL
                await refuse(rt, send, (refused.code, refused.message, close),
                             (dialect if attach_id is not None else GA).error(refused))  # fmt: skip
                return
            opening = None
        else:
            autostart = (hs.param("autostart") or "").strip().lower()
            resume_only = duplex_events.enabled(hs.param("resume")) or autostart in duplex_events.FALSY
            source = scope.get("path_params", {}).get("session_id") if self.forks else None
            door = socket.door_to(dialect, principal=hs.grant.principal, model=model, seat=seat,
                                  resume_only=resume_only, minted=hs.grant.minted, source=source)  # fmt: skip
            resume = resume_at_connect(hs)
            if resume is not None:  # the resume a reconnecting client names in its URL: before anything else
                opening = functools.partial(door.resume_at_connect, resume)
            else:
                at_connect = dialect.opening.at_connect(hs.param("model") is not None, resume_only)
                opening = door.open if at_connect else None

        await socket.run(opening)


class RealtimeSocket:
    """One client WebSocket, a ``Peer`` of its door: the outbox, the read loop and the direct path."""

    def __init__(self, runtime: RealtimeServices, scope: dict[str, Any], receive: Any, send: Any, *, binary: bool):
        self.runtime = runtime
        self.binary = binary  # audio deltas go out as binary frames (omni-binary.v1)
        self._receive = receive
        self.door: Entrance | None = None
        telemetry = runtime.hosting.telemetry
        if telemetry is not None:  # traced: each turn ends when its first audio reaches the socket
            send = telemetry.socket_sends(send, lambda: self.door.trace if self.door is not None else None)
        self.outbox = Outbox(send, runtime.settings.outbound_queue_bytes, runtime.settings.outbound_stall_s)
        extensions = scope.get("extensions", {})
        if telemetry is None:  # a traced process keeps ASGI send: its traces see what reached the socket there
            self.outbox.write_now = extensions.get(WRITE_EXTENSION)
        self._direct: Callable[[Callable[[dict[str, Any]], bool]], None] | None = extensions.get(DIRECT_EXTENSION)
        self._abort: Callable[[], None] | None = extensions.get(ABORT_EXTENSION)  # drops the TCP connection
        bound_send_buffer(scope, runtime.settings.socket_send_buffer_bytes)
        self._reader_task: asyncio.Task[None] | None = None
        self._writer_task: asyncio.Task[None] | None = None
        self._busy = False  # the read loop is handling a message (the direct path must wait)
        self._waiting: asyncio.Task[None] | None = None  # a message taken directly that waits on the store

    def door_to(self, dialect: Dialect, *, principal: str, model: str, seat: Seat, resume_only: bool = False,
                minted: Minted | None = None, source: str | None = None) -> Door:  # fmt: skip
        rt = self.runtime
        door = Door(rt.hosting, rt.sessions, self, dialect=dialect, principal=principal, model=model,
                    max_message_bytes=rt.settings.max_message_bytes, seat=seat, resume_only=resume_only,
                    requested=minted.session if minted is not None else None,
                    model_bound=minted is not None, source=source,
                    minted=minted.binding() if minted is not None else None)  # fmt: skip
        self.door = door
        return door

    async def join_call(self, call_id: str, *, principal: str, model: str, seat: Seat) -> ProtocolError | None:
        """A sideband: join the session of WebRTC call ``call_id`` (on this replica, or relayed
        to the one serving it); the refusal, if any (call_id_not_found, store_unavailable)."""
        rt = self.runtime
        entrance = await open_sideband(rt.hosting, self, call_id, principal=principal, seat=seat,
                                       make_door=lambda: self.door_to(GA, principal=principal, model=model,
                                                                      seat=seat))  # fmt: skip
        if isinstance(entrance, ProtocolError):
            return entrance
        self.door = entrance
        return None

    async def attach_to(self, session_id: str, dialect: Dialect, *, principal: str, model: str,
                        seat: Seat) -> ProtocolError | None:  # fmt: skip
        """GPT-Live's sideband (``/v1/live/sessions/{id}/attach``): join WebRTC session
        ``session_id`` in ``dialect`` (here, or relayed to the replica serving it); the
        refusal, if any (session_not_found, store_unavailable)."""
        rt = self.runtime
        not_found = ProtocolError(Code.SESSION_NOT_FOUND, f"No WebRTC session {session_id!r} is in progress for "
                                  "this credential.", param="session_id")  # fmt: skip
        entrance = await attach_sideband(rt.hosting, self, session_id, principal=principal, seat=seat,
                                         dialect=dialect, not_found=not_found,
                                         make_door=lambda: self.door_to(dialect, principal=principal, model=model,
                                                                        seat=seat))  # fmt: skip
        if isinstance(entrance, ProtocolError):
            return entrance
        self.door = entrance
        return None

    # --- main loop -----------------------------------------------------------

    async def run(self, opening: Callable[[], Awaitable[bool]] | None) -> None:
        """Serve the socket; ``opening`` opens its session at connect (None: the first
        client event decides, in the duplex dialect)."""
        door = self.door
        assert door is not None
        metrics = self.runtime.hosting.metrics
        loop = asyncio.get_running_loop()
        writer = self._writer_task = loop.create_task(self.outbox.run())
        metrics.sessions.inc()
        metrics.sessions_total.inc()
        reader: asyncio.Task[None] | None = None
        try:
            if opening is not None and not await opening():
                await writer
                return
            if self._direct is not None:
                self._direct(self.on_message)  # messages now come as they are read (see on_message)
            reader = self._reader_task = loop.create_task(self._read_loop(door))
            await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
            await settle(reader, 2.0)  # we closed first: give the peer a moment to answer the close frame
        finally:
            # Whatever ended the socket (the client, a close, a slow consumer dropped, a
            # bug), the connection is released and its session detached.
            metrics.sessions.dec()
            for task in (reader, self._waiting):
                if task is not None and not task.done():
                    task.cancel()
            door.detach()
            self.outbox.close(CloseCode.NORMAL, "")
            await settle(writer, 1.0)

    async def _read_loop(self, door: Entrance) -> None:
        handled = 0
        while True:
            message = await self._receive()
            kind = message["type"]
            if kind == "websocket.disconnect":
                return
            if kind != "websocket.receive":
                continue
            self._busy = True
            try:
                waiting = self._waiting
                if waiting is not None:
                    self._waiting = None
                    await waiting  # a message taken directly still waits on the store: this one waits behind it
                pending = self._hand(door, message)
                if pending is not None:
                    await pending
            finally:
                self._busy = False
            handled += 1
            if handled % MESSAGES_PER_TURN == 0:
                await asyncio.sleep(0)  # as the server's direct path does: other sockets get their turn

    def on_message(self, message: dict[str, Any]) -> bool:
        """The direct path (``omni.websocket.direct``): the server protocol hands a
        received message here as it is read, with no task switch. False: not taken (the
        read loop is busy, a message waits on the store, or the door has no session
        yet), so the protocol queues it, and what follows, for the read loop: the order
        holds."""
        door = self.door
        waiting = self._waiting
        if self._busy or (waiting is not None and not waiting.done()) or door is None or not door.ready:
            return False
        pending = self._hand(door, message)
        if pending is not None:
            self._waiting = asyncio.get_running_loop().create_task(pending)
        return True

    @staticmethod
    def _hand(door: Entrance, message: dict[str, Any]) -> Pending:
        text = message.get("text")
        if text is not None:
            return door.receive(text)
        return door.receive_frame(message.get("bytes") or b"")

    # --- the Peer: what the door sends --------------------------------------------

    def send(self, data: bytes, event: dict[str, Any] | None = None) -> None:
        try:
            if self.binary and (event["type"] == AUDIO_DELTA if event is not None else _AUDIO_DELTA_JSON in data[:64]):
                if event is None:  # a replayed delta: the journal keeps JSON
                    event = orjson.loads(data)
                    event["delta"] = base64.b64decode(event["delta"])
                self.outbox.put_bytes(encode_audio_frame(event))
            else:
                self.outbox.put_text(data)
        except SlowConsumer as exc:
            self._slow(exc)

    def close(self, code: int, reason: str) -> None:
        self.outbox.close(code, reason)

    def _slow(self, exc: SlowConsumer) -> None:
        log.warning("slow consumer, closing: %s", exc)
        self.runtime.hosting.metrics.closes.labels(str(int(CloseCode.SLOW_CONSUMER))).inc()
        self.outbox.abort(CloseCode.SLOW_CONSUMER, Code.SLOW_CONSUMER)
        # The writer may be blocked on a socket the client never drains: give the
        # close frame a moment, then drop the connection without it.
        asyncio.get_running_loop().call_later(SLOW_CLOSE_GRACE_S, self._abandon)

    def _abandon(self) -> None:
        drop(self._abort, (self._writer_task, self._reader_task))
