"""Helpers for the SDK tests: a fake resume-speaking server.

The fake implements exactly the resume protocol the SDK is written against
(``session.created`` with ``resume_token``, ``session.resume``,
``session.resumed`` + replay, ``session.event_ack``,
``session.resync_required``, ``session.replaced`` + 4009, resume refusals as
``error`` events with ``server_event_seq: 0``). It is legitimate here because
it tests the *client's* reconnect, de-duplication and acknowledgement logic;
the real server's resume is tested elsewhere, against the gateway itself.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.protocol import State as WsState
from websockets.typing import Subprotocol

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent

from omni_gateway_client.frames import decode_input_frame, encode_audio_frame  # noqa: E402

SUBPROTOCOLS = [Subprotocol("omni-binary.v1"), Subprotocol("realtime"), Subprotocol("openai-beta.realtime-v1")]


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


@dataclass
class FakeSession:
    id: str
    token: str
    seq: int = 0
    journal: list[dict[str, Any]] = field(default_factory=list)
    ws: ServerConnection | None = None
    binary: bool = False
    received: list[dict[str, Any]] = field(default_factory=list)  # client events other than resume/ack
    acks: list[int] = field(default_factory=list)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass
class FakeConnection:
    authorization: str | None
    subprotocols: str  # as offered, comma separated
    path: str  # with its query: a reconnect asks for ?resume=1
    events: list[dict[str, Any]] = field(default_factory=list)  # every client event, in order


class FakeServer:
    """A minimal resume-speaking realtime server on 127.0.0.1.

    Knobs: ``down`` (new handshakes get HTTP 503), ``refuse`` (answer the next
    ``session.resume`` with this error code), ``resync_next`` (answer it with
    ``session.resync_required``), ``replay_overlap`` (also replay this many
    events the client already has, to exercise de-duplication),
    ``resume_delay`` (seconds to wait before answering the next ``session.resume``),
    ``give_tokens`` (False: ``session.created`` carries no ``resume_token``,
    like a server without resume), ``resume_only_sockets`` (False: ``?resume=1`` is
    ignored and every socket opens a session, like a server that knows no such sockets).
    """

    def __init__(self) -> None:
        self.sessions: dict[str, FakeSession] = {}
        self.connections: list[FakeConnection] = []
        self.down = False
        self.refuse: str | None = None
        self.resync_next = False
        self.replay_overlap = 0
        self.resume_delay = 0.0
        self.give_tokens = True
        self.resume_only_sockets = True
        self.url = ""

    # --- driving the fake from a test ---

    async def emit(self, target: FakeSession, type_: str, /, **fields: Any) -> dict[str, Any]:
        """Journal one event and send it if the session has a socket (else it waits for a replay)."""
        async with target.lock:
            target.seq += 1
            event = {"type": type_, "event_id": f"event_{target.seq}", **fields, "server_event_seq": target.seq}
            target.journal.append(event)
            if target.ws is not None:
                await self._send(target.ws, event, target.binary)
            return event

    async def emit_audio(self, session: FakeSession, audio: bytes, item_id: str = "item_1") -> dict[str, Any]:
        return await self.emit(session, "response.output_audio.delta", response_id="resp_1", item_id=item_id,
                               output_index=0, content_index=0, delta=audio)  # fmt: skip

    async def drop(self, session: FakeSession, code: int = 1012, reason: str = "") -> None:
        """End the session's socket: close ``code``, or 1006 (a TCP reset, no close frame)."""
        ws = session.ws
        assert ws is not None, "the session has no socket"
        session.ws = None
        if code == 1006:
            assert ws.transport is not None
            ws.transport.abort()
        else:
            await ws.close(code, reason)

    async def replace(self, session: FakeSession) -> None:
        ws = session.ws
        assert ws is not None
        session.ws = None
        await self._control(ws, {"type": "session.replaced", "session_id": session.id})
        await ws.close(4009, "session_replaced")

    def only_session(self) -> FakeSession:
        assert len(self.sessions) == 1, list(self.sessions)
        return next(iter(self.sessions.values()))

    # --- the protocol ---

    async def _send(self, ws: ServerConnection, event: dict[str, Any], binary: bool) -> None:
        delta = event.get("delta")
        try:
            if isinstance(delta, bytes):
                if binary:
                    frame = encode_audio_frame(item_id=event["item_id"], content_index=event["content_index"],
                                               server_event_seq=event["server_event_seq"], audio=delta)  # fmt: skip
                    await ws.send(frame)
                    return
                event = {**event, "delta": base64.b64encode(delta).decode()}
            await ws.send(orjson.dumps(event).decode())
        except ConnectionClosed:
            pass

    async def _control(self, ws: ServerConnection, event: dict[str, Any]) -> None:
        await self._send(ws, {**event, "event_id": "event_ctl_" + secrets.token_hex(4), "server_event_seq": 0}, False)

    async def _handler(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        headers = ws.request.headers
        conn = FakeConnection(headers.get("Authorization"), ", ".join(headers.get_all("Sec-WebSocket-Protocol")),
                              ws.request.path)  # fmt: skip
        self.connections.append(conn)
        binary = ws.subprotocol == "omni-binary.v1"
        session: FakeSession | None = None
        if not (self.resume_only_sockets and "resume=1" in ws.request.path):
            session = FakeSession("sess_" + secrets.token_hex(4), "rt_" + secrets.token_hex(8), ws=ws, binary=binary)
            self.sessions[session.id] = session
            token = {"resume_token": session.token} if self.give_tokens else {}
            await self.emit(session, "session.created", session={"id": session.id, "object": "realtime.session"},
                            **token)  # fmt: skip
        try:
            async for raw in ws:
                if isinstance(raw, bytes):
                    event = {"type": "binary.append", "audio": decode_input_frame(raw)}
                else:
                    event = orjson.loads(raw)
                conn.events.append(event)
                if event["type"] == "session.resume":
                    session = await self._resume(ws, session, event, binary)
                elif session is None:  # a resume-only socket with no session yet
                    error = {"type": "invalid_request_error", "code": "session_not_open", "message": "resume first",
                             "param": "type", "event_id": None}  # fmt: skip
                    await self._control(ws, {"type": "error", "error": error})
                elif event["type"] == "session.event_ack":
                    session.acks.append(event["last_received_server_event_seq"])
                else:
                    session.received.append(event)
        except ConnectionClosed:
            pass
        finally:
            if session is not None and session.ws is ws:
                session.ws = None

    async def _resume(self, ws: ServerConnection, provisional: FakeSession | None, req: dict[str, Any],
                      binary: bool) -> FakeSession | None:  # fmt: skip
        if self.resume_delay:
            delay, self.resume_delay = self.resume_delay, 0.0
            await asyncio.sleep(delay)
            if ws.state is not WsState.OPEN:  # the client gave up on this attempt
                return provisional
        target = self.sessions.get(req.get("session_id", ""))
        last = req.get("last_received_server_event_seq", -1)
        code = self.refuse
        self.refuse = None
        if code is None:
            if target is None or target is provisional:
                code = "session_not_found"
            elif req.get("resume_token") != target.token:
                code = "resume_token_invalid"
            elif not isinstance(last, int) or not 0 <= last <= target.seq:
                code = "resume_seq_invalid"
        if code is not None or target is None:
            error = {"type": "invalid_request_error", "code": code, "message": f"resume refused: {code}",
                     "param": None, "event_id": None}  # fmt: skip
            await self._control(ws, {"type": "error", "error": error})
            return provisional
        async with target.lock:
            old = target.ws
            if old is not None and old is not ws:
                await self._control(old, {"type": "session.replaced", "session_id": target.id})
                await old.close(4009, "session_replaced")
            if provisional is not None:
                del self.sessions[provisional.id]
            target.token = "rt_" + secrets.token_hex(8)
            target.ws, target.binary = ws, binary
            if self.resync_next:
                self.resync_next = False
                await self._control(ws, {
                    "type": "session.resync_required", "session_id": target.id, "reason": "journal_trimmed",
                    "session": {"id": target.id}, "conversation": [], "last_server_event_seq": target.seq,
                    "resume_token": target.token,
                })  # fmt: skip
                return target
            await self._control(ws, {"type": "session.resumed", "session_id": target.id, "resume_token": target.token,
                                     "replay_from": last + 1, "replay_to": target.seq})  # fmt: skip
            for event in target.journal[max(0, last - self.replay_overlap) :]:
                await self._send(ws, event, binary)
        return target

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        if self.down:
            return Response(HTTPStatus.SERVICE_UNAVAILABLE, "Service Unavailable", Headers(), b"down\n")
        return None


@contextlib.asynccontextmanager
async def fake_server() -> AsyncIterator[FakeServer]:
    fake = FakeServer()
    async with serve(fake._handler, "127.0.0.1", 0, subprotocols=SUBPROTOCOLS, compression=None,
                     process_request=fake._process_request) as server:  # fmt: skip
        port = next(iter(server.sockets)).getsockname()[1]
        fake.url = f"ws://127.0.0.1:{port}/v1/realtime"
        yield fake
