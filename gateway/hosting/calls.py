"""WebRTC calls as hosting sees them: their ids, their hangup, and their sideband sockets.

A call's id is its session's (``rtc_<x>`` for ``sess_<x>``): a call re-offered after its
replica went away keeps its id, and any replica finds the call's session, and so its
owner, through the store.

**Sideband** (``/v1/realtime?call_id=``): a backend's socket that holds the call's
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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable
from typing import Any

import orjson

from gateway.hosting.claim import realtime_head
from gateway.hosting.context import HostContext
from gateway.hosting.delivery import Delivery
from gateway.hosting.door import Door, Pending
from gateway.hosting.host import SessionHost
from gateway.hosting.peer import Peer
from gateway.protocol.dialects import GA
from gateway.protocol.errors import CloseCode, Code, ProtocolError
from gateway.store.base import StoreError, replica_channel

log = logging.getLogger("omni.calls")

CALL_PREFIX = "rtc_"
SESSION_PREFIX = "sess_"
RELAY_CHECK_S = 5.0  # a relayed sideband checks this often that its session's owner is still the same


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
    carry concurrent publishes on different connections, so order is kept here."""

    def __init__(self, ctx: HostContext, replica: str) -> None:
        self.ctx, self.channel = ctx, replica_channel(replica)
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._task = ctx.spawn(self._run())

    def put(self, body: dict[str, Any], *, last: bool = False) -> None:
        self._queue.put_nowait(orjson.dumps(body))
        if last:
            self.stop()

    def stop(self) -> None:
        """No more messages: the sender stops once the queued ones are out."""
        self._queue.put_nowait(None)

    async def _run(self) -> None:
        while (message := await self._queue.get()) is not None:
            with contextlib.suppress(StoreError):  # a lost message: the other side's watch closes the sideband
                await self.ctx.store.publish(self.channel, message)


# --- the sideband, on the replica that owns the session ------------------------------


class BusPeer:
    """A sideband's socket on another replica, as the owner's door sees it (``Peer``).
    ``on_closed``: the door closed it (the session ended here, or moved)."""

    def __init__(self, ctx: HostContext, replica: str, link: str, on_closed: Callable[[], None]) -> None:
        self.link = link
        self.outbound = Outbound(ctx, replica)
        self.closed = False
        self._on_closed = on_closed

    def send(self, data: bytes, event: dict[str, Any] | None = None) -> None:
        if not self.closed:
            self.outbound.put({"type": "sideband.out", "link": self.link, "data": data.decode()})

    def close(self, code: int, reason: str) -> None:
        if not self.closed:
            self.closed = True
            self.outbound.put({"type": "sideband.close", "link": self.link, "code": code, "reason": reason}, last=True)
            self._on_closed()

    def joined(self) -> None:
        """The sideband joined the session: its socket may go on."""
        self.outbound.put({"type": "sideband.joined", "link": self.link})


class Links:
    """The relayed sidebands of one session host: a door each, joined to it, fed in order."""

    def __init__(self, ctx: HostContext, host: SessionHost) -> None:
        self.ctx, self.host = ctx, host
        self.doors: dict[str, tuple[Door, asyncio.Queue[str | None], BusPeer]] = {}

    def on_bus(self, body: dict[str, Any]) -> None:
        kind, link = body.get("type"), str(body.get("link", ""))
        if kind == "sideband.open":
            self._open(link, str(body.get("replica", "")), str(body.get("principal", "")))
        elif kind == "sideband.in" and link in self.doors:
            self.doors[link][1].put_nowait(str(body.get("text", "")))
        elif kind == "sideband.close" and link in self.doors:  # the socket on the other replica went
            door, _, peer = self.doors[link]
            door.detach()
            peer.outbound.stop()
            self._forget(link)

    def _forget(self, link: str) -> None:
        entry = self.doors.pop(link, None)
        if entry is not None:
            entry[1].put_nowait(None)  # its feed ends

    def _open(self, link: str, replica: str, principal: str) -> None:
        peer = BusPeer(self.ctx, replica, link, on_closed=lambda: self._forget(link))
        if principal != self.host.principal or self.host.ended or not self.host.call or not replica:
            peer.close(CloseCode.UNKNOWN_MODEL, Code.CALL_NOT_FOUND)  # another's call: as one that does not exist
            return
        door = Door(self.ctx, None, peer, dialect=GA, principal=principal, model=self.host.session.config.model,
                    max_message_bytes=self.ctx.max_message_bytes)  # fmt: skip
        door.join(self.host)
        inbox: asyncio.Queue[str | None] = asyncio.Queue()
        self.doors[link] = (door, inbox, peer)
        peer.joined()
        self.ctx.spawn(self._feed(door, inbox))

    async def _feed(self, door: Door, inbox: asyncio.Queue[str | None]) -> None:
        """The backend's messages, handed to its door one after another (a message that waits
        on the store holds the ones after it, as on a socket)."""
        while (text := await inbox.get()) is not None:
            pending = door.receive(text)
            if pending is not None:
                await pending


# --- the sideband, on the replica that holds the socket -------------------------------


class Relay:
    """A sideband socket's way to a session served on another replica (what the socket's
    transport sees in place of a ``Door``): what the backend sends is forwarded to the
    owner in order; what the owner sends back is written to the socket."""

    def __init__(self, ctx: HostContext, peer: Peer, *, session_id: str, owner: str, principal: str) -> None:
        self.ctx, self.peer, self.session_id, self.owner, self.principal = ctx, peer, session_id, owner, principal
        self.link = "lnk_" + secrets.token_hex(8)
        self.outbound = Outbound(ctx, owner)
        self.delivery = Delivery(peer, gated=False)
        self.host = None
        self.ready = True  # every message goes to the owner: none waits here
        self.trace = None
        self._closed = False
        self._joined = asyncio.Event()
        ctx.links[self.link] = self
        ctx.doors.add(self)
        self._watch = ctx.spawn(self._watch_owner())

    async def open(self) -> bool:
        """Ask the owner to join the session; False: it refused (or did not answer in time)."""
        self.outbound.put({"type": "sideband.open", "session_id": self.session_id, "link": self.link,
                           "replica": self.ctx.replica_id, "principal": self.principal})  # fmt: skip
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.ctx.lease_ttl_ms / 1000):
                await self._joined.wait()
        return self._joined.is_set() and not self._closed

    def receive(self, text: str) -> Pending:
        self.outbound.put({"type": "sideband.in", "session_id": self.session_id, "link": self.link, "text": text})
        return None

    def receive_frame(self, data: bytes) -> Pending:
        err = ProtocolError(Code.UNSUPPORTED, "A sideband socket carries JSON events only.", param="binary")
        self.delivery.send_now(GA.error(err))
        return None

    def on_bus(self, body: dict[str, Any]) -> None:
        kind = body.get("type")
        if kind == "sideband.out":
            self.peer.send(str(body.get("data", "")).encode())
        elif kind == "sideband.joined":
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
    ctx: HostContext, peer: Peer, call_id: str, *, principal: str, make_door: Callable[[], Door]
) -> Door | Relay | ProtocolError:
    """The sideband socket's way to the call's session, on this replica or relayed to its
    owner; or why not: ``call_id_not_found`` (no such call in progress, or another
    principal's: answered the same), ``store_unavailable``."""
    not_found = ProtocolError(Code.CALL_NOT_FOUND, f"No call {call_id!r} is in progress.", param="call_id")
    session_id = session_id_of(call_id)
    if session_id is None:
        return not_found
    host = ctx.hosts.get(session_id)
    if isinstance(host, SessionHost) and not host.ended:
        if host.principal != principal or not host.call:  # (a plain socket's session: as no call)
            return not_found
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
    relay = Relay(ctx, peer, session_id=session_id, owner=owner.owner, principal=principal)
    if not await relay.open():
        relay.detach()
        return not_found
    return relay
