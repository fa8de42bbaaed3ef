"""VideoHost: one streaming video session on this replica, a host like every host.

The host owns the session's ownership in the store, its engine request and
its interactions; the transport (``transport/video.py``) owns only the
client's frame queue, behind a ``VideoPeer``.

- **Ownership, before anything goes out.** ``VideoHost.open`` takes the lease
  and writes the session's registration (``{"kind": "video", "principal"}``)
  before the connection reads its first message, so an interaction POSTed to
  any replica finds the session from the moment ``video.start`` can be seen.
  The lease is renewed with every other host's (``leases.py``) for as long as
  the stream runs; a renewal the store refuses is sorted out as for any host
  (taken again, or the session was taken over and stops here).
- **Interactions from anywhere**: from the socket (``receive``), from an HTTP
  request on this replica or another (``interact``; the other replica
  forwards it on the bus to ``on_bus``). The socket's client sees each outcome.
- **Ended before it is said.** When the stream is over, the registration is
  deleted from the store and only then is ``session.done`` sent: once a client
  has seen it, every replica answers an interaction for the session with 404.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from gateway.hosting.context import HostContext
from gateway.protocol import video_events as ve
from gateway.protocol.errors import Code, ProtocolError
from gateway.session.video_session import CloseVideo, Interact, StartVideo, StopVideo, VideoSession
from gateway.store.base import StoreError
from orchestrator.engine import EngineError
from orchestrator.orchestrator import Orchestrator, RequestHandle
from orchestrator.video_engine import Interaction, VideoChunk

log = logging.getLogger("omni.video")

KIND = "video"  # the registration's "kind": what tells a video session from a realtime one in the store


class VideoPeer(Protocol):
    """The video connection as the host sees it (``transport/video.py``: one ordered
    queue, chunks dropped oldest first under pressure)."""

    def send_event(self, event: dict[str, Any]) -> None:
        """A control event (never dropped). ``session.done`` gets its ``chunks`` from the
        peer: the chunks it delivered, the trailer included (upstream's count)."""

    def send_chunk(self, meta: dict[str, Any], media: bytes, init_segment: bytes) -> None:
        """A chunk: its ``video.chunk_metadata`` (the peer adds the transport's fields)
        and its bytes; the peer may drop it, or an older one, under pressure."""

    def completed(self) -> None:
        """The stream ran to its end: the stream's trailer goes out next."""

    def close(self, code: int, reason: str) -> None:
        """Close once what is queued is sent."""


@dataclass(frozen=True, slots=True)
class VideoTimeouts:
    start_s: float  # no session.start this long after the connect: session_start_timeout, close
    stall_s: float  # a stream with no chunk and no ping this long: stall_timeout, stopped, close


class VideoHost:
    def __init__(
        self,
        ctx: HostContext,
        session: VideoSession,
        *,
        orchestrator: Orchestrator,
        principal: str,
        peer: VideoPeer,
        timeouts: VideoTimeouts,
        fence: int,
    ) -> None:
        self.ctx = ctx
        self.session = session
        self.orchestrator = orchestrator
        self.principal = principal
        self.peer = peer
        self.timeouts = timeouts
        self.fence = fence  # 0: the store was down at the start (the lease loop takes it when it can)
        self.handle: RequestHandle | None = None
        self.ended = False
        self._loop = asyncio.get_running_loop()
        self._connected = self._loop.time()
        self._progress = 0.0  # loop time of the last chunk produced or ping (the stall clock)
        self._mp4 = False
        # What the session says once it is over (its events, a close), until the store forgot it.
        self._held: list[dict[str, Any] | tuple[int, str]] | None = None
        self._over = False  # the stream is over (its end is being, or was, said)
        self._watch = ctx.spawn(self._watch_timeouts())
        ctx.hosts[session.id] = self  # from now on the lease loop renews its lease

    @classmethod
    async def open(
        cls,
        ctx: HostContext,
        session: VideoSession,
        *,
        orchestrator: Orchestrator,
        principal: str,
        peer: VideoPeer,
        timeouts: VideoTimeouts,
    ) -> VideoHost:
        """Host a new video session: own it in the store first. With the store down it
        streams all the same (interactions reach it from its own socket and replica only,
        until the lease loop can take its lease)."""
        fence = 0
        try:
            fence = await cls._register(ctx, session.id, principal)
        except StoreError as exc:
            log.warning("video session %s not registered in the store (yet): %s", session.id, exc)
        return cls(ctx, session, orchestrator=orchestrator, principal=principal, peer=peer, timeouts=timeouts,
                   fence=fence)  # fmt: skip

    @staticmethod
    async def _register(ctx: HostContext, session_id: str, principal: str) -> int:
        fence = await ctx.store.acquire(session_id, ctx.replica_id, ctx.lease_ttl_ms)
        data = orjson.dumps({"kind": KIND, "principal": principal})
        await ctx.store.save_snapshot(session_id, data, fence=fence)
        return fence

    @property
    def id(self) -> str:
        return self.session.id

    @property
    def request_id(self) -> str | None:
        """The engine request of the stream (None before ``session.start``)."""
        return self.session.request_id

    # --- what comes in ------------------------------------------------------------------

    def receive(self, text: str) -> None:
        """One text message from the socket."""
        try:
            event = ve.decode(text)
            self.ctx.metrics.client_events.labels(f"video.{type(event).__name__.lower()}").inc()
            if isinstance(event, ve.Ping):
                self._progress = self._loop.time()  # a ping refreshes the stall clock
            self.session.handle(event)
        except ProtocolError as err:
            self.session.refuse(err)
        self.flush()

    def refuse(self, err: ProtocolError) -> None:
        """A message the transport could not take (a binary frame)."""
        self.session.refuse(err)
        self.flush()

    async def interact(self, spec: ve.InteractionSpec) -> tuple[str, str] | None:
        """An interaction from outside the socket (HTTP, another replica): None when
        queued, else (code, message). The socket's client sees the outcome too."""
        try:
            interaction = self.session.interact(spec)
        except ProtocolError as err:
            self.session.error(err)
            self.flush()
            return err.code, err.message
        events, effects = self.session.take()
        self._send(events)
        request_id = next(e.request_id for e in effects if isinstance(e, Interact))
        return await self._interact(request_id, interaction)

    def on_bus(self, body: dict[str, Any]) -> None:
        kind = body.get("type")
        if kind == "interaction":
            try:
                spec = ve.decode_interaction(body.get("interaction"))
            except ProtocolError:
                return  # validated by the replica that accepted the HTTP request
            self.ctx.spawn(self.interact(spec))
        elif kind == "replaced":
            self._taken_over()

    # --- what the session asks for ------------------------------------------------------

    def flush(self) -> None:
        events, effects = self.session.take()
        self._send(events)
        for effect in effects:
            match effect:
                case StartVideo():
                    self._progress = self._loop.time()
                    self._mp4 = effect.request.format == "mp4"
                    self.handle = self.orchestrator.submit(
                        "video", effect.request, on_output=self._on_chunk, on_error=self._on_error,
                        on_done=self._on_done,
                    )  # fmt: skip
                case Interact():
                    self.ctx.spawn(self._interact(effect.request_id, effect.interaction))
                case StopVideo():
                    self._cancel()
                case CloseVideo():
                    self._close(effect.code, effect.reason)

    def _send(self, events: list[dict[str, Any]]) -> None:
        if self.session.state == "done" and not self._over:
            # Over: forget the session in the store before anything more is said.
            self._over = True
            self._held = []
            self.ctx.spawn(self._finish())
        for event in events:
            if self._held is not None:
                self._held.append(event)
            else:
                self.peer.send_event(event)

    def _close(self, code: int, reason: str) -> None:
        if self._held is not None:
            self._held.append((code, reason))
        else:
            self.peer.close(code, reason)

    async def _finish(self) -> None:
        await self._forget()
        held, self._held = self._held or [], None
        for said in held:
            if isinstance(said, tuple):
                self.peer.close(*said)
            else:
                self.peer.send_event(said)
        self.peer.close(1000, "done")  # after the stream's last event (a close said before wins)

    async def _interact(self, request_id: str, interaction: Interaction) -> tuple[str, str] | None:
        try:
            await self.orchestrator.interact(request_id, interaction)
        except EngineError as exc:
            self.session.on_interaction_failed(interaction.event_id, exc.code, exc.message)
            self.flush()
            return Code.INTERACTION_FAILED, exc.message
        self.session.on_interaction_queued(interaction.event_id)
        self.flush()
        return None

    def _on_chunk(self, chunk: VideoChunk) -> None:
        self._progress = self._loop.time()
        meta = self.session.on_chunk(chunk)
        if meta is None:
            return
        if chunk.kind == "jpeg":
            meta["frame_byte_lengths"] = [len(f) for f in chunk.frames]
        self.peer.send_chunk(meta, chunk.media, chunk.init_segment)

    def _on_done(self) -> None:
        self.handle = None
        if self._mp4 and self.session.state == "streaming":
            self.peer.completed()  # the stream ran to its end: its trailer, then session.done
        self.session.on_done()
        self.flush()

    def _on_error(self, code: str, message: str) -> None:
        self.handle = None
        self.session.on_failed(code, message)
        self.flush()

    def _cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def stop(self) -> None:
        """The client cannot keep up (the transport closes it): stop generating now."""
        self._cancel()

    async def _watch_timeouts(self) -> None:
        """The start timeout and the stall report (vLLM-Omni's: 10 s to send session.start; a
        stream with no chunk and no ping for 60 s is stopped). Checked twice a second."""
        timeouts, loop = self.timeouts, self._loop
        while self.session.state != "done" and not self.ended:
            await asyncio.sleep(min(0.5, timeouts.start_s, timeouts.stall_s))
            now = loop.time()
            if self.session.state == "idle" and now - self._connected >= timeouts.start_s:
                self.session.start_timed_out(timeouts.start_s)
            elif self.session.state == "streaming" and now - self._progress >= timeouts.stall_s:
                log.warning("video session %s stalled: no progress for %.0f s", self.id, now - self._progress)
                self.session.stalled(timeouts.stall_s)
            self.flush()

    # --- ownership ----------------------------------------------------------------------

    async def renewal_refused(self, fence: int) -> None:
        """The store would not renew the lease (or there was none: the store was down at
        the start): another replica took the session over, or it is ours to take again."""
        if self.ended or fence != self.fence:
            return
        try:
            owner = await self.ctx.store.owner_of(self.id)
            if owner is not None and owner.owner != self.ctx.replica_id:
                self._taken_over()
                return
            fence = await self._register(self.ctx, self.id, self.principal)
        except StoreError as exc:
            log.warning("video session %s: lease not renewed: %s", self.id, exc)
            return  # the next round tries again
        if not self.ended:
            self.fence = fence

    def _taken_over(self) -> None:
        """Another replica owns the session now (it cannot resume a video: this is a
        mistake of the store's or an operator's): stop, without touching its lease."""
        log.warning("video session %s is owned elsewhere; stopping here", self.id)
        self.fence = 0
        self.session.stop()
        self.flush()

    async def _forget(self) -> None:
        """Release the lease and delete the registration (nobody can reach the session now)."""
        fence, self.fence = self.fence, 0
        self.ctx.hosts.pop(self.id, None)
        if fence:
            with contextlib.suppress(StoreError):
                await self.ctx.store.release(self.id, self.ctx.replica_id, fence)
                await self.ctx.store.delete_session(self.id)

    async def end(self) -> None:
        """The connection is gone: the engine request is aborted, the session forgotten."""
        if self.ended:
            return
        self.ended = True
        self._cancel()
        self._watch.cancel()
        await self._forget()


# --- interactions from HTTP -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Queued:
    forwarded: bool  # to the replica that serves the session (it reports the outcome on the socket)


@dataclass(frozen=True, slots=True)
class Refused:
    code: str
    message: str


NOT_FOUND = None  # no such session, or another principal's: answered as for one that does not exist


async def submit_interaction(
    ctx: HostContext, session_id: str, principal: str, spec: ve.InteractionSpec, payload: Any
) -> Queued | Refused | None:
    """An interaction POSTed to this replica for ``session_id``, wherever it streams.
    None: not found (never another principal's session). Raises StoreError."""
    local = ctx.hosts.get(session_id)
    if isinstance(local, VideoHost):
        if local.principal != principal or local.ended:
            return NOT_FOUND
        failure = await local.interact(spec)
        return Queued(forwarded=False) if failure is None else Refused(*failure)
    if local is not None:
        return NOT_FOUND  # a realtime session of that id
    data = await ctx.store.load_snapshot(session_id)
    try:
        state = orjson.loads(data) if data else None
    except orjson.JSONDecodeError:
        state = None
    if not isinstance(state, dict) or state.get("kind") != KIND or state.get("principal") != principal:
        return NOT_FOUND
    interaction = {**payload, "event_id": spec.event_id} if isinstance(payload, dict) else payload
    message = {"type": "interaction", "session_id": session_id, "interaction": interaction}
    delivered = await ctx.store.send_to_owner(session_id, orjson.dumps(message))
    return Queued(forwarded=True) if delivered else NOT_FOUND
