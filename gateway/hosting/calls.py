"""WebRTC calls as hosting sees them: their ids, their hangup, and their sideband sockets.

A call's id is its session's (``rtc_<x>`` for ``sess_<x>``): a call re-offered after its
replica went away keeps its id, and any replica finds the call's session, and so its
owner, through the store.

**Sideband** (``/v1/realtime?call_id=``; GPT-Live's ``/v1/live/sessions/{id}/attach``,
``attach_sideband``, in the session's own dialect): a backend's socket that holds the call's
session beside the browser (it updates it, answers function calls, watches its events).
Only a session a WebRTC call carried has one (``SessionHost.call``): the id of any other
session, spelled as a call's, is answered as a call that does not exist.
On the replica that serves the session it joins the session's host (``Door.join``). On
any other replica it is relayed over the bus: the socket's ``Relay`` forwards what the
backend sends to the owner, whose ``Link`` (a door joined to the host, writing to the
bus) carries the session's events back. A sideband is never ahead of the call: it sees
the session's events from when it joined, in order; it is closed (1012, reconnect with
the same ``call_id``) when the session moves to another replica or its owner stops
answering, and when the call's session ends.

A relayed sideband is held to what one on the owner would be, and cannot flood the bus:

- its messages are metered where its socket is held (the ``Relay``, with the socket's
  seat): the tenant's ``events_per_s``, and its input audio limit for each
  ``input_audio_buffer.append`` (timed in the session's input format, which the owner
  sends along with ``session.created``/``session.updated``). A refused message gets its
  ``error`` on the sideband and never reaches the bus;
- a message larger than ``relay_max_bytes`` (``sideband_relay_max_bytes``) is refused
  there (``message_too_large``); an event larger than that goes to the sideband in
  pieces of at most that size;
- each direction has at most ``relay_max_bytes`` in flight on the bus (``Window``: the
  receiver acknowledges what it handled, ``sideband.ack``). The relay waits for room
  before it reads the socket's next message (so a flooding backend is slowed by TCP),
  and the owner acknowledges a message only once what it made the session say to the
  sideband fits in a window (so an echo larger than the message cannot outrun the
  bus); what waits for room beyond that (the call's own traffic, to a sideband that
  lags) is kept up to ``relay_queue_bytes`` (the ``outbound_queue_bytes`` of a
  socket), then the sideband is closed as a slow consumer (4010). So one sideband
  never holds more than a window in a replica's pub/sub output buffer, and never makes
  Redis drop the replica's bus subscription (its ``client-output-buffer-limit pubsub``,
  32 MB / 8 MB for 60 s by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
from collections import deque
from collections.abc import Callable
from typing import Any

import orjson

from gateway.audio.codecs import AudioFormat
from gateway.hosting.claim import realtime_head
from gateway.hosting.context import HostContext
from gateway.hosting.delivery import Delivery
from gateway.hosting.door import Door, Pending
from gateway.hosting.host import SessionHost
from gateway.hosting.peer import Peer
from gateway.protocol.dialects import DIALECTS, GA, Dialect
from gateway.protocol.errors import CloseCode, Code, ProtocolError
from gateway.quotas import NeedBudget, Seat
from gateway.store.base import StoreError, replica_channel

log = logging.getLogger("omni.calls")

CALL_PREFIX = "rtc_"
SESSION_PREFIX = "sess_"
RELAY_CHECK_S = 5.0  # a relayed sideband checks this often that its session's owner is still the same
_FORMAT_EVENTS = ("session.created", "session.updated")  # they carry the input format a relay meters with


def call_id_of(session_id: str) -> str:
    return CALL_PREFIX + session_id.removeprefix(SESSION_PREFIX)


def session_id_of(call_id: str) -> str | None:
    """The session of ``call_id``; None: not a call id."""
    if not call_id.startswith(CALL_PREFIX) or len(call_id) <= len(CALL_PREFIX) or len(call_id) > 64:
        return None
    rest = call_id[len(CALL_PREFIX) :]
    return SESSION_PREFIX + rest if rest.isalnum() else None


async def principal_of(ctx: HostContext, session_id: str, *, call: bool = False) -> str | None:
    """Who the session belongs to, from this replica or the store (None: no such session;
    with ``call``, none that a WebRTC call carried either)."""
    host = ctx.hosts.get(session_id)
    if isinstance(host, SessionHost):
        return None if host.ended or (call and not host.call) else host.principal
    head = realtime_head(await ctx.store.load_snapshot(session_id))  # (not a video's registration)
    principal = head.get("principal") if head is not None and (head.get("call") or not call) else None
    return principal if isinstance(principal, str) else None


async def hang_up(ctx: HostContext, session_id: str, principal: str) -> bool:
    """End the call's session for good, wherever it runs; False: no such call (or another
    principal's: answered the same). Raises ProtocolError (store_unavailable)."""
    host = ctx.hosts.get(session_id)
    if isinstance(host, SessionHost) and not host.ended:
        if host.principal != principal:
            return False
        await host.hang_up()
        return True
    try:
        if await principal_of(ctx, session_id) != principal:
            return False
        message = {"type": "hangup", "session_id": session_id}
        if not await ctx.store.send_to_owner(session_id, orjson.dumps(message)):
            await ctx.store.delete_session(session_id)  # nobody serves it: nothing left to resume either
    except StoreError:
        raise ProtocolError(Code.STORE_UNAVAILABLE, "Session state is unavailable; try again shortly.") from None
    return True


class Outbound:
    """Bus messages to one replica, published one after another: the store's client may
    carry concurrent publishes on different connections, so order is kept here. (What it
    holds is bounded by its callers: a ``Window`` each.)"""

    def __init__(self, ctx: HostContext, replica: str) -> None:
        self.ctx, self.channel = ctx, replica_channel(replica)
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._task = ctx.spawn(self._run())

    def put(self, body: dict[str, Any], *, last: bool = False) -> None:
        self.put_bytes(orjson.dumps(body))
        if last:
            self.stop()

    def put_bytes(self, message: bytes) -> None:
        self._queue.put_nowait(message)

    def stop(self) -> None:
        """No more messages: the sender stops once the queued ones are out."""
        self._queue.put_nowait(None)

    async def _run(self) -> None:
        while (message := await self._queue.get()) is not None:
            with contextlib.suppress(StoreError):  # a lost message: the other side's watch closes the sideband
                await self.ctx.store.publish(self.channel, message)


class Window:
    """What one direction of a relayed sideband has in flight on the bus: at most ``limit``
    bytes (or one message, however large, when nothing else is), until the other side
    acknowledges the messages it handled (``sideband.ack``, by count, in order)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bytes = 0
        self._sizes: deque[int] = deque()
        self._room = asyncio.Event()

    def fits(self, size: int) -> bool:
        return not self._sizes or self.bytes + size <= self.limit

    def sent(self, size: int) -> None:
        self._sizes.append(size)
        self.bytes += size

    def acked(self, count: int) -> None:
        for _ in range(min(max(0, count), len(self._sizes))):
            self.bytes -= self._sizes.popleft()
        self._room.set()

    async def room(self, size: int) -> None:
        while not self.fits(size):
            self._room.clear()
            await self._room.wait()

    def clear(self) -> None:
        """The link is gone: nothing is in flight any more (a sender waiting for room goes on)."""
        self.acked(len(self._sizes))


class Acks:
    """The receiving side's acknowledgements: one ``sideband.ack`` per loop turn, for every
    message handled in it (so a sender's window opens again)."""

    def __init__(self, outbound: Outbound, head: dict[str, Any]) -> None:
        self.outbound, self.head = outbound, head
        self._count = 0

    def handled(self) -> None:
        self._count += 1
        if self._count == 1:
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        count, self._count = self._count, 0
        if count:
            self.outbound.put({**self.head, "type": "sideband.ack", "count": count})


def pieces(text: str, max_bytes: int) -> list[str]:
    """``text`` in pieces of at most ``max_bytes`` as UTF-8 (by characters: 4 bytes each at most)."""
    if len(text) * 4 <= max_bytes or len(text.encode()) <= max_bytes:
        return [text]
    step = max(1, max_bytes // 4)
    return [text[i : i + step] for i in range(0, len(text), step)]


def _format(fmt: AudioFormat) -> dict[str, Any]:
    return dataclasses.asdict(fmt)


# --- the sideband, on the replica that owns the session ------------------------------


class BusPeer:
    """A sideband's socket on another replica, as the owner's door sees it (``Peer``).
    ``on_closed``: the door closed it (the session ended here, or moved). What the session
    says goes out within the link's ``Window``; what waits for room is kept up to
    ``relay_queue_bytes``, past which the sideband is closed as a slow consumer."""

    def __init__(self, ctx: HostContext, replica: str, link: str, on_closed: Callable[[], None],
                 input_format: Callable[[], AudioFormat] | None = None) -> None:  # fmt: skip
        self.ctx = ctx
        self.link = link
        self.outbound = Outbound(ctx, replica)
        self.window = Window(ctx.relay_max_bytes)
        self.closed = False
        self._on_closed = on_closed
        self._input_format = input_format
        self._waiting: deque[bytes] = deque()  # messages waiting for room in the window
        self._waiting_bytes = 0
        self._drained = asyncio.Event()  # what waits is within one window (set), or more (clear)
        self._drained.set()

    def send(self, data: bytes, event: dict[str, Any] | None = None) -> None:
        if self.closed:
            return
        parts = pieces(data.decode(), self.ctx.relay_max_bytes)
        for i, part in enumerate(parts):
            body: dict[str, Any] = {"type": "sideband.out", "link": self.link, "data": part}
            if i < len(parts) - 1:
                body["more"] = True
            elif event is not None and event.get("type") in _FORMAT_EVENTS and self._input_format is not None:
                body["input_format"] = _format(self._input_format())
            message = orjson.dumps(body)
            self._waiting.append(message)
            self._waiting_bytes += len(message)
        if self._waiting_bytes > self.ctx.relay_queue_bytes:  # (the call's own traffic, to a sideband that lags)
            log.warning("relayed sideband %s: %d bytes wait for the bus; closing (slow consumer)", self.link,
                        self._waiting_bytes)  # fmt: skip
            self._waiting.clear()
            self._waiting_bytes = 0
            self.close(CloseCode.SLOW_CONSUMER, Code.SLOW_CONSUMER)
            return
        self._pump()

    def acked(self, count: int) -> None:
        """The other replica wrote ``count`` more of what was sent to its socket."""
        self.window.acked(count)
        self._pump()

    def _pump(self) -> None:
        waiting = self._waiting
        while waiting and self.window.fits(len(waiting[0])):
            message = waiting.popleft()
            self._waiting_bytes -= len(message)
            self.window.sent(len(message))
            self.outbound.put_bytes(message)
        if self._waiting_bytes <= self.ctx.relay_max_bytes or self.closed:
            self._drained.set()
        else:
            self._drained.clear()

    async def drained(self) -> None:
        """Until what waits for the bus is within one window: the link's feed waits for it
        before it acknowledges the sideband's next message, so a sideband whose messages
        make more to say than the bus carries is slowed down (its relay, then TCP)."""
        await self._drained.wait()

    def close(self, code: int, reason: str) -> None:
        if not self.closed:
            self.closed = True
            self._pump()  # (what fits goes first; the close follows it, in order)
            self._drained.set()
            self.outbound.put({"type": "sideband.close", "link": self.link, "code": code, "reason": reason}, last=True)
            self._on_closed()

    def joined(self) -> None:
        """The sideband joined the session: its socket may go on."""
        body: dict[str, Any] = {"type": "sideband.joined", "link": self.link}
        if self._input_format is not None:
            body["input_format"] = _format(self._input_format())
        self.outbound.put(body)


class Links:
    """The relayed sidebands of one session host: a door each, joined to it, fed in order."""

    def __init__(self, ctx: HostContext, host: SessionHost) -> None:
        self.ctx, self.host = ctx, host
        self.doors: dict[str, tuple[Door, asyncio.Queue[str | None], BusPeer]] = {}

    def on_bus(self, body: dict[str, Any]) -> None:
        kind, link = body.get("type"), str(body.get("link", ""))
        if kind == "sideband.open":
            self._open(link, str(body.get("replica", "")), str(body.get("principal", "")),
                       str(body.get("dialect", GA.name)))  # fmt: skip
        elif kind == "sideband.in" and link in self.doors:
            self.doors[link][1].put_nowait(str(body.get("text", "")))
        elif kind == "sideband.ack" and link in self.doors:
            count = body.get("count")
            self.doors[link][2].acked(count if isinstance(count, int) else 0)
        elif kind == "sideband.close" and link in self.doors:  # the socket on the other replica went
            door, _, peer = self.doors[link]
            door.detach()
            peer.outbound.stop()
            self._forget(link)

    def _forget(self, link: str) -> None:
        entry = self.doors.pop(link, None)
        if entry is not None:
            entry[1].put_nowait(None)  # its feed ends

    def _open(self, link: str, replica: str, principal: str, dialect_name: str) -> None:
        peer = BusPeer(self.ctx, replica, link, on_closed=lambda: self._forget(link),
                       input_format=lambda: self.host.input_format)  # fmt: skip
        dialect = self.host.session.dialect
        spoken = DIALECTS.get(dialect_name)
        if (
            principal != self.host.principal
            or self.host.ended
            or not self.host.call
            or not replica
            or (spoken is not dialect)
        ):
            peer.close(CloseCode.UNKNOWN_MODEL, Code.CALL_NOT_FOUND)  # another's call: as one that does not exist
            return
        door = Door(self.ctx, None, peer, dialect=dialect, principal=principal, model=self.host.session.config.model,
                    max_message_bytes=self.ctx.max_message_bytes)  # fmt: skip
        door.join(self.host)
        inbox: asyncio.Queue[str | None] = asyncio.Queue()  # (bounded by the relay's window)
        self.doors[link] = (door, inbox, peer)
        peer.joined()
        self.ctx.spawn(self._feed(door, inbox, peer, Acks(peer.outbound, {"link": link})))

    async def _feed(self, door: Door, inbox: asyncio.Queue[str | None], peer: BusPeer, acks: Acks) -> None:
        """The backend's messages, handed to its door one after another (a message that waits
        on the store holds the ones after it, as on a socket); each acknowledged once handled
        and what it made the session say is on its way (``BusPeer.drained``)."""
        while (text := await inbox.get()) is not None:
            pending = door.receive(text)
            if pending is not None:
                await pending
            await peer.drained()
            acks.handled()


# --- the sideband, on the replica that holds the socket -------------------------------


class Relay:
    """A sideband socket's way to a session served on another replica (what the socket's
    transport sees in place of a ``Door``): what the backend sends is metered with the
    socket's ``seat``, then forwarded to the owner in order, within the link's ``Window``;
    what the owner sends back is written to the socket (and acknowledged)."""

    def __init__(
        self, ctx: HostContext, peer: Peer, *, session_id: str, owner: str, principal: str, seat: Seat | None = None,
        dialect: Dialect = GA,
    ) -> None:  # fmt: skip
        self.ctx, self.peer, self.session_id, self.owner, self.principal = ctx, peer, session_id, owner, principal
        self.seat = seat
        self.dialect = dialect  # the sideband's: its refusals here (the owner checks it is the session's)
        self.link = "lnk_" + secrets.token_hex(8)
        self.outbound = Outbound(ctx, owner)
        self.window = Window(ctx.relay_max_bytes)
        self.acks = Acks(self.outbound, {"session_id": session_id, "link": self.link})
        self.delivery = Delivery(peer, gated=False)
        self.host = None
        self.ready = True  # every message goes to the owner: none waits here (but for room in the window)
        self.trace = None
        self.input_format = AudioFormat("pcm16", 24_000)  # the session's, as the owner last said
        self._paid = False  # the message being handled was counted against the events limit
        self._pieces: list[str] = []  # an event coming in pieces
        self._closed = False
        self._joined = asyncio.Event()
        ctx.links[self.link] = self
        ctx.doors.add(self)
        self._watch = ctx.spawn(self._watch_owner())

    async def open(self) -> bool:
        """Ask the owner to join the session; False: it refused (or did not answer in time)."""
        self.outbound.put({"type": "sideband.open", "session_id": self.session_id, "link": self.link,
                           "replica": self.ctx.replica_id, "principal": self.principal,
                           "dialect": self.dialect.name})  # fmt: skip
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.ctx.lease_ttl_ms / 1000):
                await self._joined.wait()
        return self._joined.is_set() and not self._closed

    def receive(self, text: str) -> Pending:
        limit = self.ctx.relay_max_bytes
        size = len(text) if text.isascii() else len(text.encode())
        if size > limit:  # (unread: never on the bus)
            self._refuse(ProtocolError(
                Code.MESSAGE_TOO_LARGE, f"A sideband on a replica that does not serve its call relays messages of at "
                f"most {limit} bytes (sideband_relay_max_bytes); this one has {size}. Send less at once, or connect "
                "the sideband to the replica that serves the call.",
            ))  # fmt: skip
            return None
        seat = self.seat
        try:
            if seat is not None and not self._paid:
                seat.message()  # the events limit, where the socket is held
                self._paid = True
            if seat is not None and seat.audio_in_budget is not None:
                audio = self._audio_ms(text)
                if audio is not None:
                    seat.audio_in(*audio)
        except NeedBudget as need:
            return self._after_budget(need, text)
        except ProtocolError as err:
            self._paid = False
            self._refuse(err)
            return None
        self._paid = False
        message = orjson.dumps({"type": "sideband.in", "session_id": self.session_id, "link": self.link, "text": text})
        if self.window.fits(len(message)):
            self._send(message)
            return None
        return self._when_room(message)  # the transport reads nothing more until it is out

    def _send(self, message: bytes) -> None:
        self.window.sent(len(message))
        self.outbound.put_bytes(message)

    async def _when_room(self, message: bytes) -> None:
        await self.window.room(len(message))
        if not self._closed:
            self._send(message)

    async def _after_budget(self, need: NeedBudget, text: str) -> None:
        await need.wait()
        pending = self.receive(text)
        if pending is not None:
            await pending

    def _audio_ms(self, text: str) -> tuple[float, str | None] | None:
        """(ms, event id) of an ``input_audio_buffer.append``'s audio, in the session's input
        format; None for any other message (the owner answers a malformed one)."""
        try:
            event = orjson.loads(text)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(event, dict) or event.get("type") != "input_audio_buffer.append":
            return None
        audio = event.get("audio")
        if not isinstance(audio, str):
            return None
        nbytes = max(0, len(audio) * 3 // 4 - audio[-2:].count("="))
        event_id = event.get("event_id")
        return self.input_format.duration_ms(nbytes), event_id if isinstance(event_id, str) else None

    def _refuse(self, err: ProtocolError) -> None:
        self.delivery.send_now(self.dialect.error(err))

    def _note_format(self, body: dict[str, Any]) -> None:
        raw = body.get("input_format")
        if isinstance(raw, dict):
            with contextlib.suppress(TypeError, ValueError):
                self.input_format = AudioFormat(**raw)

    def receive_frame(self, data: bytes) -> Pending:
        err = ProtocolError(Code.UNSUPPORTED, "A sideband socket carries JSON events only.", param="binary")
        self.delivery.send_now(self.dialect.error(err))
        return None

    def on_bus(self, body: dict[str, Any]) -> None:
        kind = body.get("type")
        if kind == "sideband.out":
            self.acks.handled()
            self._pieces.append(str(body.get("data", "")))
            if body.get("more"):
                return  # (the owner sends an event's pieces one after another)
            data, self._pieces = "".join(self._pieces), []
            self._note_format(body)
            self.peer.send(data.encode())
        elif kind == "sideband.ack":
            count = body.get("count")
            self.window.acked(count if isinstance(count, int) else 0)
        elif kind == "sideband.joined":
            self._note_format(body)
            self._joined.set()
        elif kind == "sideband.close":
            self._end()
            self.peer.close(int(body.get("code", CloseCode.NORMAL)), str(body.get("reason", "")))

    def close(self, code: int, reason: str) -> None:
        self.peer.close(code, reason)

    def detach(self) -> None:
        if not self._closed:
            self.outbound.put({"type": "sideband.close", "session_id": self.session_id, "link": self.link}, last=True)
        self._end()

    def _end(self) -> None:
        self._closed = True
        self.outbound.stop()
        self._joined.set()
        self.window.clear()  # (a message waiting for room gives up)
        self._watch.cancel()
        self.ctx.links.pop(self.link, None)
        self.ctx.doors.discard(self)

    async def _watch_owner(self) -> None:
        """The owner died or the session moved (a call re-offered elsewhere): close, so the
        backend reconnects with the same ``call_id`` to wherever the session is now."""
        while not self._closed:
            await asyncio.sleep(RELAY_CHECK_S)
            try:
                owner = await self.ctx.store.owner_of(self.session_id)
            except StoreError:
                continue
            if owner is None or owner.owner != self.owner:
                log.info("sideband of %s: the session left %s; closing", self.session_id, self.owner)
                self._end()
                self.peer.close(CloseCode.SERVICE_RESTART, "the call's session moved: reconnect with its call_id")
                return


async def open_sideband(
    ctx: HostContext, peer: Peer, call_id: str, *, principal: str, make_door: Callable[[], Door],
    seat: Seat | None = None,
) -> Door | Relay | ProtocolError:  # fmt: skip
    """The sideband socket's way to the call's session, on this replica or relayed to its
    owner; or why not: ``call_id_not_found`` (no such call in progress, or another
    principal's: answered the same), ``store_unavailable``."""
    not_found = ProtocolError(Code.CALL_NOT_FOUND, f"No call {call_id!r} is in progress.", param="call_id")
    session_id = session_id_of(call_id)
    if session_id is None:
        return not_found
    return await attach_sideband(ctx, peer, session_id, principal=principal, make_door=make_door, seat=seat,
                                 dialect=GA, not_found=not_found)  # fmt: skip


async def attach_sideband(
    ctx: HostContext, peer: Peer, session_id: str, *, principal: str, make_door: Callable[[], Door],
    dialect: Dialect, not_found: ProtocolError, seat: Seat | None = None,
) -> Door | Relay | ProtocolError:  # fmt: skip
    """A sideband in ``dialect`` beside the WebRTC session ``session_id`` (GPT-Live's
    ``/v1/live/sessions/{id}/attach``; a Realtime call's ``?call_id=``), on this replica or
    relayed to its owner; or why not: ``not_found`` (no such WebRTC session in progress, one
    in another dialect, or another principal's: answered the same), ``store_unavailable``."""
    host = ctx.hosts.get(session_id)
    if isinstance(host, SessionHost) and not host.ended:
        if host.principal != principal or not host.call or host.session.dialect is not dialect:
            return not_found  # (a plain socket's session: as no call)
        door = make_door()
        door.join(host)
        return door
    try:
        if await principal_of(ctx, session_id, call=True) != principal:
            return not_found
        owner = await ctx.store.owner_of(session_id)
    except StoreError:
        return ProtocolError(Code.STORE_UNAVAILABLE, "Session state is unavailable; try again shortly.")
    if owner is None or owner.owner == ctx.replica_id:
        return not_found  # nobody serves it now (its call is gone): nothing to hold
    relay = Relay(ctx, peer, session_id=session_id, owner=owner.owner, principal=principal, seat=seat,
                  dialect=dialect)  # fmt: skip
    if not await relay.open():
        relay.detach()
        return not_found
    return relay
