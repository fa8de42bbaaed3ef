"""``RealtimeClient``: one realtime session over a WebSocket that survives drops.

One background task owns the socket: it reads events, drops duplicates,
acknowledges what it received, and, when the connection is lost, reconnects
with backoff and resumes the session. Events reach the application through a
bounded queue read by ``async for event in client``. Sends go straight to the
socket while it is up and wait in a bounded queue while it is not.

This module is the I/O shell; the stream's bookkeeping (decoding,
de-duplication, replay window, what to ack, what a resume asks for) is the
Sans-I/O ``SessionStream`` in ``omni_gateway_client/stream.py``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Subprotocol

from omni_gateway_client.errors import (
    ConnectionLost,
    RealtimeError,
    ResumeFailed,
    SendQueueFull,
    SessionClosed,
    SessionExpired,
    Unauthorized,
)
from omni_gateway_client.frames import BINARY_SUBPROTOCOL, encode_input_frame
from omni_gateway_client.options import NO_RECONNECT, ClientStats, ReconnectPolicy
from omni_gateway_client.stream import SessionStream, parse

log = logging.getLogger("omni.client")

REALTIME_SUBPROTOCOL = "realtime"
BETA_SUBPROTOCOL = "openai-beta.realtime-v1"
KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
RESUME_REFUSALS = frozenset({"session_not_found", "resume_token_invalid", "resume_forbidden", "resume_seq_invalid"})
_PROTOCOL_FAULTS = frozenset({1002, 1003, 1007, 1008, 1009, 1010})  # a reconnect would fail the same way
SERVICE_RESTART = 1012  # a drain hands the session over: reconnect at once (elsewhere) and resume
# Refusals a reconnect would meet again (a 4029 tenant limit, by contrast, is retried with backoff).
_REFUSALS = {4003: "model_not_allowed", 4004: "model_not_found"}

State = Literal["new", "open", "resuming", "ended", "closed"]
Fallback = Literal["raise", "new_session"]
_RETRY = "retry"
_END = "end"


class RealtimeClient:
    """A realtime session that reconnects and resumes on its own.

    Parameters (every limit says what happens when it is hit):

    - ``url``: the gateway's ``ws://`` or ``wss://`` realtime URL; ``model`` is
      added as the ``?model=`` query parameter.
    - ``api_key``: sent as ``Authorization: Bearer``; used for every reconnect.
    - ``client_secret``: an ephemeral ``ek_`` secret, sent as the subprotocol
      ``openai-insecure-api-key.<secret>`` on the first connection only (it is
      single use). Reconnects then need ``api_key`` or ``client_secret_factory``
      (an async callable minting a new secret); with neither, a lost
      connection ends the session with ``ConnectionLost(code="no_credentials")``.
    - ``binary``: offer ``omni-binary.v1``; when the server accepts it, input
      audio goes as binary frames and output audio comes as binary frames.
      Either way, audio deltas reach you with ``delta`` as ``bytes``.
    - ``beta``: offer ``openai-beta.realtime-v1`` (the server then uses beta
      event names, e.g. ``response.audio.delta``).
    - ``reconnect``: a ``ReconnectPolicy``, ``True`` (the default policy) or
      ``False`` (never reconnect: a lost connection raises ``ConnectionLost``).
    - ``resume_fallback``: ``"raise"`` (default): a refused resume raises
      ``ResumeFailed`` from the iterator; a reconnect then asks for a resume-only
      socket (``?resume=1``): the gateway opens no throwaway session before the
      resume (a server that does not know it opens one, and is resumed the same).
      ``"new_session"``: carry on in the new session the server opened, after a
      synthetic ``client.session_lost`` event (``code``, ``message``,
      ``previous_session_id``, ``session_id``, ``discarded_sends``) followed by
      that session's ``session.created``.
    - ``max_pending_events`` (4096): events received but not yet iterated.
      When full, the client stops reading the socket; the server's outbound
      queue then fills and it may close with 4010 (slow consumer), after which
      the client reconnects and resumes: nothing is lost, but read promptly.
    - ``max_queued_sends`` (256): events sent while disconnected wait here and
      go out, in order, right after the session is resumed. When full, the
      send raises ``SendQueueFull`` and the event is not queued. Audio is
      never queued: ``append_audio`` during an outage is dropped and counted
      in ``stats.audio_appends_dropped`` / ``audio_bytes_dropped`` (audio that
      old is useless to a live turn). If the resume is refused and the client
      falls back to a new session, queued sends are discarded (counted in
      ``stats.sends_discarded``): they referred to the lost session.
    - ``ack_every`` (50) / ``ack_interval`` (1.0 s): the client sends
      ``session.event_ack`` after this many new events or this long after an
      unacknowledged one, and right after a replay, so the server can trim its
      journal. Only when the server gave a resume token.
    - ``open_timeout`` (10 s): to open the socket and receive ``session.created``.
    - ``resume_timeout`` (10 s): from a reconnected socket to ``session.resumed``;
      past it the attempt counts as failed and is retried.
    - ``max_message_bytes`` (32 MiB): the largest server message accepted; a
      larger one closes the connection with 1009 and ends the session (a
      ``session.resync_required`` carries the whole conversation: keep room).
    - ``headers``: extra HTTP headers; ``connect_options``: extra keyword
      arguments for ``websockets.asyncio.client.connect`` (``proxy``,
      ``ping_interval``, ``ssl``...).
    """

    def __init__(
        self,
        url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        client_secret: str | None = None,
        client_secret_factory: Callable[[], Awaitable[str]] | None = None,
        binary: bool = False,
        beta: bool = False,
        reconnect: ReconnectPolicy | bool = True,
        resume_fallback: Fallback = "raise",
        max_pending_events: int = 4096,
        max_queued_sends: int = 256,
        ack_every: int = 50,
        ack_interval: float = 1.0,
        open_timeout: float = 10.0,
        resume_timeout: float = 10.0,
        max_message_bytes: int | None = 32 << 20,
        headers: Mapping[str, str] | None = None,
        connect_options: Mapping[str, Any] | None = None,
    ) -> None:
        if resume_fallback not in ("raise", "new_session"):
            raise ValueError("resume_fallback must be 'raise' or 'new_session'")
        self.url = _with_model(url, model)
        self._api_key = api_key
        self._client_secret = client_secret
        self._secret_factory = client_secret_factory
        self._want_binary = binary
        self._beta = beta
        if reconnect is True:
            self._policy = ReconnectPolicy()
        elif reconnect is False:
            self._policy = NO_RECONNECT
        else:
            self._policy = reconnect
        self._fallback: Fallback = resume_fallback
        self._max_queued_sends = max_queued_sends
        self._ack_interval = ack_interval
        self._open_timeout = open_timeout
        self._resume_timeout = resume_timeout
        self._max_size = max_message_bytes
        self._headers = dict(headers or {})
        self._connect_options = dict(connect_options or {})
        self._rng = random.Random()

        self._state: State = "new"
        self._ws: ClientConnection | None = None
        self._binary_active = False
        self._events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(max_pending_events)
        self._pending: deque[dict[str, Any]] = deque()
        self._send_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._end_exc: RealtimeError | None = None
        self._closer: asyncio.Task[None] | None = None
        self.stats = ClientStats()
        self._stream = SessionStream(beta=beta, ack_every=ack_every, stats=self.stats)

    # --- public state ---------------------------------------------------------------------------

    @property
    def session_id(self) -> str | None:
        """The session's id (``session.created``'s ``session.id``); stable across resumes."""
        return self._stream.session_id

    @property
    def last_seq(self) -> int:
        """The highest ``server_event_seq`` received (what a resume asks to continue from)."""
        return self._stream.last_seq

    @property
    def resume_token(self) -> str | None:
        """The current resume token (rotated on every resume); None if the server gives none."""
        return self._stream.resume_token

    @property
    def connected(self) -> bool:
        """True while a socket is open and live (not during a reconnect)."""
        return self._state == "open"

    @property
    def binary(self) -> bool:
        """True when the binary fast path was negotiated on the current connection."""
        return self._binary_active

    def __repr__(self) -> str:
        return f"<RealtimeClient {self.url} state={self._state} session={self.session_id} seq={self.last_seq}>"

    # --- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> RealtimeClient:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def connect(self) -> None:
        """Open the socket and wait for ``session.created`` (delivered as the first event).

        The first connection is not retried: a refusal raises ``Unauthorized``
        (bad credentials) or ``ConnectionLost`` (with the server's error code,
        e.g. ``server_busy``); a network failure raises what ``websockets``
        raised (``OSError``, ``TimeoutError``, ``InvalidStatus``...).
        """
        if self._state != "new":
            raise RealtimeError("connect() may be called once per client", code="already_connected")
        ws = await self._open(first=True)
        try:
            created = await asyncio.wait_for(self._first_event(ws), self._open_timeout)
        except BaseException:
            await _close_quietly(ws)
            raise
        event = self._stream.ingest(created)
        assert event is not None
        self._events.put_nowait(event)
        self._ws = ws
        self._state = "open"
        log.info("realtime session %s connected (binary=%s)", self.session_id, self._binary_active)
        self._task = asyncio.get_running_loop().create_task(self._run(ws), name=f"realtime-{self.session_id}")

    async def close(self) -> None:
        """Close normally (1000) and end the event iterator. Idempotent."""
        if self._state == "closed":
            return
        self._state = "closed"
        task, self._task = self._task, None
        if task is not None and not task.done():
            await _cancel_and_wait(task)
        ws, self._ws = self._ws, None
        if ws is not None:
            await _close_quietly(ws)
        self._wake()

    # --- events ---------------------------------------------------------------------------------

    def __aiter__(self) -> RealtimeClient:
        return self

    async def __anext__(self) -> dict[str, Any]:
        """The next server event. Ends on a normal close, ``close()`` or
        ``session.replaced``; raises the ``RealtimeError`` that ended the session otherwise."""
        if self._state == "new":
            raise SessionClosed("not connected: use 'async with RealtimeClient(...)' or await connect()")
        while True:
            if self._events.empty() and self._state in ("ended", "closed"):
                if self._end_exc is not None:
                    raise self._end_exc
                raise StopAsyncIteration
            event = await self._events.get()
            if event is not None:
                return event

    async def recv(self, timeout: float | None = None) -> dict[str, Any]:  # noqa: ASYNC109
        """The next event; ``TimeoutError`` after ``timeout`` s; ``SessionClosed`` once the iterator ended."""
        try:
            return await asyncio.wait_for(self.__anext__(), timeout)
        except StopAsyncIteration:
            raise SessionClosed("the session ended") from None

    async def wait_for(
        self,
        match: str | Callable[[dict[str, Any]], bool],
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> dict[str, Any]:
        """Read events until one has type ``match`` (or satisfies it); the others are discarded."""
        test = (lambda e: e.get("type") == match) if isinstance(match, str) else match

        async def scan() -> dict[str, Any]:
            while True:
                event = await self.recv()
                if test(event):
                    return event

        return await asyncio.wait_for(scan(), timeout)

    # --- sends ----------------------------------------------------------------------------------

    async def send(self, event: dict[str, Any]) -> None:
        """Send any client event as JSON (queued while reconnecting; see ``max_queued_sends``)."""
        await self._send(event)

    async def session_update(self, session: dict[str, Any], *, event_id: str | None = None) -> None:
        await self._send(_event("session.update", event_id, session=session))

    async def append_audio(self, audio: bytes | bytearray | memoryview, *, event_id: str | None = None) -> None:
        """Append input audio: one binary frame on the fast path, else base64 JSON.
        Dropped (and counted in ``stats``) while disconnected."""
        await self._send(None, audio=bytes(audio), event_id=event_id)

    async def commit(self, *, event_id: str | None = None) -> None:
        await self._send(_event("input_audio_buffer.commit", event_id))

    async def clear(self, *, event_id: str | None = None) -> None:
        await self._send(_event("input_audio_buffer.clear", event_id))

    async def item_create(
        self, item: dict[str, Any], *, previous_item_id: str | None = None, event_id: str | None = None
    ) -> None:
        fields: dict[str, Any] = {"item": item}
        if previous_item_id is not None:
            fields["previous_item_id"] = previous_item_id
        await self._send(_event("conversation.item.create", event_id, **fields))

    async def send_text(self, text: str, *, role: str = "user", event_id: str | None = None) -> None:
        """Add a message item with one ``input_text`` part (call ``create_response`` to get an answer)."""
        item = {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}
        await self.item_create(item, event_id=event_id)

    async def item_retrieve(self, item_id: str, *, event_id: str | None = None) -> None:
        await self._send(_event("conversation.item.retrieve", event_id, item_id=item_id))

    async def item_truncate(
        self, item_id: str, content_index: int, audio_end_ms: int, *, event_id: str | None = None
    ) -> None:
        await self._send(_event("conversation.item.truncate", event_id, item_id=item_id,
                                content_index=content_index, audio_end_ms=audio_end_ms))  # fmt: skip

    async def item_delete(self, item_id: str, *, event_id: str | None = None) -> None:
        await self._send(_event("conversation.item.delete", event_id, item_id=item_id))

    async def create_response(self, *, event_id: str | None = None, **params: Any) -> None:
        """``response.create``; keyword arguments become the ``response`` object."""
        fields = {"response": params} if params else {}
        await self._send(_event("response.create", event_id, **fields))

    async def cancel_response(self, response_id: str | None = None, *, event_id: str | None = None) -> None:
        fields = {"response_id": response_id} if response_id is not None else {}
        await self._send(_event("response.cancel", event_id, **fields))

    async def _send(self, event: dict[str, Any] | None, *, audio: bytes | None = None,
                    event_id: str | None = None) -> None:  # fmt: skip
        self._check_usable()
        async with self._send_lock:
            ws = self._ws
            if self._state == "open" and ws is not None:
                try:
                    await ws.send(self._encode(event, audio, event_id))
                    return
                except ConnectionClosed:
                    pass  # not sent: the reader sees the close and reconnects; handle as an outage
            self._check_usable()
            if event is None:
                self.stats.audio_appends_dropped += 1
                self.stats.audio_bytes_dropped += len(audio or b"")
                return
            if len(self._pending) >= self._max_queued_sends:
                raise SendQueueFull(
                    f"{len(self._pending)} events already wait for the connection to come back "
                    f"(max_queued_sends={self._max_queued_sends}); {event.get('type')!r} was not queued"
                )
            self._pending.append(event)
            self.stats.sends_queued += 1

    def _encode(self, event: dict[str, Any] | None, audio: bytes | None, event_id: str | None) -> str | bytes:
        if event is not None:
            return orjson.dumps(event).decode()
        assert audio is not None
        if self._binary_active and event_id is None:
            return encode_input_frame(audio)
        append = _event("input_audio_buffer.append", event_id, audio=base64.b64encode(audio).decode("ascii"))
        return orjson.dumps(append).decode()

    def _check_usable(self) -> None:
        if self._state == "new":
            raise SessionClosed("not connected: use 'async with RealtimeClient(...)' or await connect()")
        if self._state == "closed":
            raise SessionClosed("the client was closed")
        if self._state == "ended":
            raise SessionClosed("the session ended") from self._end_exc

    # --- connecting -----------------------------------------------------------------------------

    async def _open(self, *, first: bool, resume_only: bool = False) -> ClientConnection:
        """A socket to the gateway; ``resume_only``: with ``?resume=1``, so that the gateway
        opens no throwaway session before the ``session.resume`` this client sends first."""
        protocols = [BINARY_SUBPROTOCOL] if self._want_binary else []
        protocols.append(REALTIME_SUBPROTOCOL)
        if self._beta:
            protocols.append(BETA_SUBPROTOCOL)
        headers = dict(self._headers)
        if first and self._client_secret:
            protocols.append(KEY_SUBPROTOCOL_PREFIX + self._client_secret)
        elif self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        elif self._secret_factory is not None:
            protocols.append(KEY_SUBPROTOCOL_PREFIX + await self._secret_factory())
        elif self._client_secret:
            raise ConnectionLost(
                "the connection was lost and cannot be re-established: a client secret is single use; "
                "pass api_key or client_secret_factory to reconnect",
                code="no_credentials",
            )
        options: dict[str, Any] = {"open_timeout": self._open_timeout, "max_size": self._max_size}
        options.update(self._connect_options)
        try:
            url = _with_query(self.url, "resume", "1") if resume_only else self.url
            ws = await connect(url, subprotocols=[Subprotocol(p) for p in protocols],
                               additional_headers=headers, compression=None, **options)  # fmt: skip
        except InvalidStatus as exc:
            if exc.response.status_code in (401, 403):
                raise Unauthorized(f"the server refused the credentials (HTTP {exc.response.status_code})") from exc
            raise
        self._binary_active = ws.subprotocol == BINARY_SUBPROTOCOL
        return ws

    async def _first_event(self, ws: ClientConnection) -> str | bytes:
        """Wait for ``session.created``; map a refusal (error + close) to an exception."""
        refusal: dict[str, Any] = {}
        try:
            while True:
                msg = await ws.recv()
                event = parse(msg)
                if event is None:
                    continue
                if event.get("type") == "session.created":
                    return msg
                if event.get("type") == "error":
                    refusal = event.get("error") or {}
        except ConnectionClosed:
            code, reason = _close_info(ws)
            message = refusal.get("message") or f"the server closed the connection ({code} {reason})".strip()
            if code == 4001 or refusal.get("code") == "unauthorized":
                raise Unauthorized(message, close_code=code) from None
            if code == 4008:
                raise SessionExpired(message, close_code=code) from None
            raise ConnectionLost(message, code=refusal.get("code") or "connect_failed", close_code=code) from None

    # --- the connection task --------------------------------------------------------------------

    async def _run(self, ws: ClientConnection) -> None:
        try:
            while True:
                code, reason = await self._pump(ws)
                self._ws = None
                self._state = "resuming"
                verdict = self._classify(code, reason)
                if verdict == _END:
                    log.info("realtime session %s ended (%s %s)", self.session_id, code, reason)
                    self._finish(None)
                    return
                if isinstance(verdict, RealtimeError):
                    self._finish(verdict)
                    return
                log.info("realtime session %s lost its connection (%s %s); reconnecting",
                         self.session_id, code, reason)  # fmt: skip
                ws = await self._reconnect(code, reason)
        except asyncio.CancelledError:
            raise
        except _Replaced:
            log.info("realtime session %s was taken over by another connection", self.session_id)
            self._finish(None)
        except RealtimeError as exc:
            self._finish(exc)
        except Exception as exc:  # a bug here must still end the iterator, not hang it
            log.exception("realtime session %s: connection task failed", self.session_id)
            err = ConnectionLost(f"the connection task failed: {exc!r}", code="internal_error")
            err.__cause__ = exc
            self._finish(err)

    def _classify(self, code: int, reason: str) -> str | RealtimeError:
        if self._stream.replaced or code == 4009:
            return _END
        if code == 1000:
            return _END
        if code == 4001:
            return Unauthorized(f"the server closed the session: unauthorized ({reason})", close_code=code)
        if code == 4008:
            return SessionExpired("the session reached its maximum lifetime", close_code=code)
        if code in _REFUSALS:
            return ConnectionLost(f"the server refused the session: {_REFUSALS[code]} ({reason})",
                                  code=_REFUSALS[code], close_code=code)  # fmt: skip
        if code in _PROTOCOL_FAULTS:
            return ConnectionLost(f"the server closed the connection with {code} {reason}".strip(),
                                  code="protocol_error", close_code=code)  # fmt: skip
        return _RETRY

    async def _pump(self, ws: ClientConnection) -> tuple[int, str]:
        """Read one connection until it closes; returns its close code and reason."""
        ticker = asyncio.get_running_loop().create_task(self._ack_ticker(ws))
        try:
            while True:
                try:
                    msg = await ws.recv()
                except ConnectionClosed:
                    break
                event = self._stream.ingest(msg)
                if event is not None:
                    await self._events.put(event)
                if self._stream.ack_wanted:
                    await self._ack(ws)
        finally:
            await _cancel_and_wait(ticker)
        return _close_info(ws)

    # --- acknowledgements -----------------------------------------------------------------------

    async def _ack_ticker(self, ws: ClientConnection) -> None:
        stream = self._stream
        while True:
            await asyncio.sleep(self._ack_interval)
            if stream.last_seq > stream.acked and stream.resume_token is not None:
                await self._ack(ws)

    async def _ack(self, ws: ClientConnection) -> None:
        """Send ``session.event_ack`` for everything received (only while live on ``ws``)."""
        if self._stream.resume_token is None or self._state != "open" or self._ws is not ws:
            return
        request = self._stream.ack_request()
        async with self._send_lock:
            try:
                await ws.send(orjson.dumps(request).decode())
            except ConnectionClosed:
                return
        self._stream.acked_to(request["last_received_server_event_seq"])

    # --- reconnecting and resuming --------------------------------------------------------------

    async def _reconnect(self, code: int, reason: str) -> ClientConnection:
        policy = self._policy
        loop = asyncio.get_running_loop()
        started = loop.time()
        attempt = 0
        last_error = f"closed with {code} {reason}".strip()
        while True:
            if policy.max_attempts is not None and attempt >= policy.max_attempts:
                break
            # 1012 (service restart): the server handed the session over on purpose (a drain
            # paces its handovers), so the first attempt goes at once; later ones back off.
            delay = 0.0 if attempt == 0 and code == SERVICE_RESTART else policy.delay(attempt, self._rng)
            if policy.max_elapsed is not None and loop.time() + delay - started > policy.max_elapsed:
                break
            await asyncio.sleep(delay)
            attempt += 1
            # Without a fallback to the server's new session, none is needed: the socket
            # is resume-only and the resume goes first (one round trip, no throwaway session).
            resume_only = self._fallback == "raise" and self._stream.can_resume
            try:
                ws = await self._open(first=False, resume_only=resume_only)
            except RealtimeError:
                raise
            except Exception as exc:  # refused, unreachable, timed out: retry within the budget
                last_error = repr(exc)
                self.stats.failed_attempts += 1
                log.info("realtime session %s: reconnect attempt %d failed: %s", self.session_id, attempt, exc)
                continue
            try:
                outcome = await self._handshake(ws, resume_first=resume_only)
            except BaseException:
                await _close_quietly(ws)
                raise
            if outcome == "live":
                self.stats.reconnects += 1
                return ws
            if outcome == "replaced":
                raise _Replaced
            last_error = "the new connection closed or timed out before the session was resumed"
            self.stats.failed_attempts += 1
            await _close_quietly(ws)
        if attempt == 0:
            raise ConnectionLost(f"the connection was lost ({last_error}) and reconnecting is disabled",
                                 code="reconnect_disabled", close_code=code)  # fmt: skip
        raise ConnectionLost(f"gave up reconnecting after {attempt} attempts; last: {last_error}",
                             code="reconnect_failed", close_code=code)  # fmt: skip

    async def _handshake(
        self, ws: ClientConnection, *, resume_first: bool = False
    ) -> Literal["live", "retry", "replaced"]:
        """Resume on a fresh socket: "live" when resumed (or fallen back), "retry", or
        "replaced" (another connection holds the session); raises when final.
        ``resume_first``: a resume-only socket, the ``session.resume`` goes at once;
        otherwise after the ``session.created`` of the session the server opened."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._resume_timeout
        provisional: dict[str, Any] | None = None
        highest = 0  # highest seq seen in the provisional session
        refusal: dict[str, Any] = {}
        asked = resume_first
        try:
            if resume_first:
                await ws.send(orjson.dumps(self._stream.resume_request()).decode())
            while True:
                msg = await asyncio.wait_for(ws.recv(), max(0.0, deadline - loop.time()))
                event = parse(msg)
                if event is None:
                    continue
                kind = event.get("type")
                seq = event.get("server_event_seq")
                if kind == "session.replaced":
                    self._stream.observe(event)
                    await self._events.put(event)
                    return "replaced"
                if provisional is None and kind == "session.created":
                    provisional = event  # (a server that knows no resume-only sockets opens one anyway)
                    highest = seq if isinstance(seq, int) else 0
                    if asked:
                        continue
                    if not self._stream.can_resume:
                        return await self._refused(ws, provisional, highest, "resume_unsupported",
                                                   "the server gave no resume token for this session")  # fmt: skip
                    await ws.send(orjson.dumps(self._stream.resume_request()).decode())
                    asked = True
                    continue
                if not asked:  # waiting for the session.created
                    if kind == "error":
                        refusal = event.get("error") or {}
                    continue
                if kind == "session.resumed":
                    await self._resumed(ws, event)
                    return "live"
                if kind == "session.resync_required":
                    self._stream.observe(event)
                    await self._go_live(ws)
                    await self._events.put(event)
                    await self._ack(ws)
                    return "live"
                if isinstance(seq, int):
                    highest = max(highest, seq)
                if kind == "error":
                    err = refusal = event.get("error") or {}
                    code = err.get("code")
                    if code in RESUME_REFUSALS:
                        return await self._refused(ws, provisional, highest, str(code), str(err.get("message", "")))
                    if code == "unknown_event":
                        return await self._refused(ws, provisional, highest, "resume_unsupported",
                                                   "the server does not support session.resume")  # fmt: skip
        except TimeoutError:
            log.info("realtime session %s: no session.resumed within %.1f s", self.session_id, self._resume_timeout)
            return "retry"
        except ConnectionClosed:
            code, reason = _close_info(ws)
            message = refusal.get("message") or f"closed with {code} {reason}".strip()
            if code == 4001 or refusal.get("code") == "unauthorized":
                raise Unauthorized(message, close_code=code) from None
            if code == 4009:
                return "replaced"
            verdict = self._classify(code, reason)
            if isinstance(verdict, RealtimeError):
                raise verdict from None
            return "retry"

    async def _resumed(self, ws: ClientConnection, event: dict[str, Any]) -> None:
        self._stream.resumed(event)  # the rotated token, the replay window
        log.info("realtime session %s resumed (replay %s..%s)", self.session_id,
                 event.get("replay_from"), event.get("replay_to"))  # fmt: skip
        await self._go_live(ws)
        await self._events.put(event)
        if self._stream.ack_wanted:
            await self._ack(ws)

    async def _refused(self, ws: ClientConnection, provisional: dict[str, Any] | None, highest: int,
                       code: str, message: str) -> Literal["live"]:  # fmt: skip
        log.warning("realtime session %s: resume refused (%s): %s", self.session_id, code, message)
        if self._fallback != "new_session" or provisional is None:  # (resume-only sockets: "raise" only)
            raise ResumeFailed(message or f"resume refused: {code}", code=code)
        previous = self._stream.restart(provisional, highest)
        discarded = len(self._pending)
        self._pending.clear()
        self.stats.sends_discarded += discarded
        self.stats.sessions_lost += 1
        lost = {"type": "client.session_lost", "code": code, "message": message, "previous_session_id": previous,
                "session_id": self.session_id, "discarded_sends": discarded}  # fmt: skip
        await self._go_live(ws)
        await self._events.put(lost)
        await self._events.put(provisional)
        return "live"

    async def _go_live(self, ws: ClientConnection) -> None:
        """Flush the sends queued during the outage, in order, then let new sends through."""
        async with self._send_lock:
            while self._pending:
                try:
                    await ws.send(orjson.dumps(self._pending[0]).decode())
                except ConnectionClosed:
                    break  # the reader sees the close; the rest wait for the next resume
                self._pending.popleft()
                self.stats.sends_flushed += 1
            if self._state == "resuming":
                self._ws = ws
                self._state = "open"

    # --- ending ---------------------------------------------------------------------------------

    def _finish(self, exc: RealtimeError | None) -> None:
        if self._state != "closed":
            self._state = "ended"
        self._end_exc = exc
        ws, self._ws = self._ws, None
        if ws is not None:
            self._closer = asyncio.get_running_loop().create_task(_close_quietly(ws))
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self._events.put_nowait(None)


class _Replaced(Exception):
    """Internal: the session was taken over while this client was reconnecting."""


def _event(kind: str, event_id: str | None, **fields: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"type": kind}
    if event_id is not None:
        event["event_id"] = event_id
    event.update(fields)
    return event


async def _cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it has ended. Neither its result nor its cancellation
    is raised here, but the caller's own cancellation is: ``suppress(CancelledError)``
    around ``await task`` would swallow a ``close()`` that came meanwhile, and the
    connection task would go on (and ``close()`` wait for it forever)."""
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # retrieved: no "Task exception was never retrieved" later


def _close_info(ws: ClientConnection) -> tuple[int, str]:
    code = ws.close_code
    return (1006 if code is None else int(code)), (ws.close_reason or "")


async def _close_quietly(ws: ClientConnection) -> None:
    with contextlib.suppress(Exception):
        await ws.close()


def _with_model(url: str, model: str | None) -> str:
    return url if model is None else _with_query(url, "model", model)


def _with_query(url: str, key: str, value: str) -> str:
    """``url`` with the query parameter ``key`` set to ``value`` (replacing any)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != key]
    query.append((key, value))
    return urlunsplit(parts._replace(query=urlencode(query)))
