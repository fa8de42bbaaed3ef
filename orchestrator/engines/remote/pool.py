"""Upstreams: where they are, whether they answer, and their WebSocket connections.

An ``UpstreamPool`` holds a list of upstream servers (vLLM-Omni, or another
gateway: the same protocols) and, per upstream, the WebSocket connections
open to it. Every limit says what happens when it is hit:

- ``max_connections_per_upstream`` (64): connections open to one upstream,
  idle ones included. A request that finds every up upstream at the bound
  waits up to ``acquire_timeout_s`` for a connection to free, then fails
  with ``upstream_busy``.
- ``max_idle_per_upstream`` (8): idle connections kept per upstream and
  kind of request, for reuse; a connection released beyond it is closed.
- ``idle_ttl_s`` (60): an idle connection unused this long is closed.
- ``connect_timeout_s`` (5): the WebSocket handshake; a slower upstream
  counts as refusing (marked down; the next one is tried).
- ``health_interval_s`` (2) / ``health_timeout_s`` (2): every upstream's
  ``/readyz`` is polled this often (``/health`` where ``/readyz`` is a 404,
  as on vLLM's servers: ``health_paths``); 200 marks it up, anything else
  (or no answer in time) marks it down. An upstream that refuses a connection, or
  whose socket drops mid-request, is marked down at once, until a poll
  finds it ready again. Only up upstreams get new requests.
- ``max_message_bytes`` (32 MiB): the largest upstream message accepted (a
  video chunk); a larger one closes that connection (``upstream_lost``).

- ``dialect`` ("auto"): how ``/v1/realtime`` is spoken. "openai": the OpenAI
  Realtime API (another gateway, an OpenAI-compatible server). "duplex":
  vLLM-Omni's ``?duplex=1`` dialect (a ``session_mode: duplex`` deployment,
  which serves no other realtime route). "auto": the first connection to an
  upstream asks for the duplex dialect; an upstream that advertises it (its
  ``session.created`` carries ``capabilities``) is spoken to in it from then
  on, any other in OpenAI's (it opened a session at connect: ``probe_s``).

Selection is least-loaded: the up upstream with the fewest requests in
flight (ties go round-robin), with a free connection or room for one.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import ssl
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlencode, urlsplit

import orjson
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.protocol import State
from websockets.typing import Subprotocol

from orchestrator.engine import EngineError

log = logging.getLogger("omni.engines.remote")

BINARY_SUBPROTOCOL = "omni-binary.v1"
DUPLEX_ACK_EVERY = 16  # a duplex upstream's events are acknowledged every this many (its journal trims)
REALTIME_PATH = "/v1/realtime"
VIDEO_PATH = "/v1/realtime/video"
_KIND_INPUT_AUDIO = 1
_KIND_OUTPUT_AUDIO = 2


class UpstreamLost(EngineError):
    """The upstream's socket closed (or it stopped answering) mid-request."""

    def __init__(self, message: str, code: str = "upstream_lost") -> None:
        super().__init__(code, message)


class UpstreamUnavailable(EngineError):
    def __init__(self, message: str, code: str = "upstream_unavailable") -> None:
        super().__init__(code, message)


def split_url(url: str) -> tuple[str, str]:
    """``http(s)://`` or ``ws(s)://host:port[/prefix][/v1/realtime[/video]]`` ->
    (WebSocket base, HTTP base), both without a trailing slash."""
    parts = urlsplit(url.strip())
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None or not parts.netloc:
        raise ValueError(f"upstream URL {url!r} must be http(s):// or ws(s)://host:port")
    path = parts.path.rstrip("/")
    for suffix in (VIDEO_PATH, REALTIME_PATH):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    http = "https" if scheme == "wss" else "http"
    return f"{scheme}://{parts.netloc}{path}", f"{http}://{parts.netloc}{path}"


async def probe_ready(
    http_base: str, limit_s: float, headers: Mapping[str, str] | None = None, paths: Sequence[str] = ("/readyz",)
) -> tuple[bool, str]:
    """GET each of ``paths`` until one is not a 404: (True, "ready") on 200, else (False, why)."""
    why = "no answer"
    for path in paths:
        ok, why, status = await _get(http_base + path, limit_s, headers)
        if status != 404:
            return ok, why
    return False, why


async def _get(url: str, limit_s: float, headers: Mapping[str, str] | None) -> tuple[bool, str, int]:
    parts = urlsplit(url)
    secure = parts.scheme == "https"
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if secure else 80)
    lines = [f"GET {parts.path} HTTP/1.1", f"Host: {parts.netloc}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    try:
        async with asyncio.timeout(limit_s):
            context = ssl.create_default_context() if secure else None
            reader, writer = await asyncio.open_connection(host, port, ssl=context)
            try:
                writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
                await writer.drain()
                status = await reader.readline()
            finally:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
    except (OSError, TimeoutError) as exc:
        return False, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, 0
    fields = status.split()
    code = int(fields[1]) if len(fields) >= 2 and fields[1].isdigit() else 0
    if code == 200:
        return True, "ready", code
    return False, status.decode("latin-1", "replace").strip() or "no answer", code


def output_audio_frame(frame: bytes) -> bytes | None:
    """The audio of a binary ``response.output_audio.delta`` frame (omni-binary.v1), or None."""
    if len(frame) < 2 or frame[0] != _KIND_OUTPUT_AUDIO:
        return None
    header = frame[1]
    return frame[header:] if header <= len(frame) else None


@dataclass(eq=False)
class Upstream:
    """One upstream server, as the pool sees it."""

    ws: str  # WebSocket base
    http: str  # HTTP base (``/readyz``)
    up: bool = False
    reason: str = "not probed yet"
    active: int = 0  # requests in flight
    open: int = 0  # connections open, idle included
    served: int = 0  # requests given to it, ever
    idle: dict[str, list[Connection]] = field(default_factory=dict)
    duplex: bool | None = None  # /v1/realtime speaks vLLM-Omni's duplex dialect (else OpenAI's); None: not probed yet

    @property
    def name(self) -> str:
        return self.http


class Connection:
    """One WebSocket to an upstream; JSON events in and out, audio on the
    binary fast path when the upstream chose ``omni-binary.v1``."""

    def __init__(self, ws: ClientConnection, upstream: Upstream, kind: str, duplex: bool | None = None) -> None:
        self.ws = ws
        self.upstream = upstream
        self.kind = kind
        self.binary = ws.subprotocol == BINARY_SUBPROTOCOL
        self.idle_since = time.monotonic()
        self.epoch = 0  # one per request; our events are tagged with it
        self.tools = False  # this upstream session was given tools (a later request must clear them)
        # On /v1/realtime: False (OpenAI's dialect), or True (vLLM-Omni's ?duplex=1 dialect: every event
        # has a server_event_seq, acknowledged every DUPLEX_ACK_EVERY events); None until the handshake.
        self.duplex = duplex
        self.pushback: list[dict[str, Any]] = []  # events read by the handshake, not yet consumed
        self._sent = 0
        self._seq = 0  # the last server_event_seq received (duplex)
        self._acked = 0

    @property
    def closed(self) -> bool:
        return self.ws.state is not State.OPEN

    def begin(self) -> None:
        """A new request on this connection: errors about earlier requests' events become stale."""
        self.epoch += 1

    def stale(self, event: dict[str, Any]) -> bool:
        """Whether an ``error`` event is about an event of an earlier request on this connection."""
        err = event.get("error")
        cause = err.get("event_id") if isinstance(err, dict) else None
        return isinstance(cause, str) and cause.startswith("rmt") and not cause.startswith(f"rmt{self.epoch}.")

    async def send(self, event: dict[str, Any]) -> None:
        if self.kind != "video":
            self._sent += 1
            event = {**event, "event_id": f"rmt{self.epoch}.{self._sent}"}
        try:
            await self.ws.send(orjson.dumps(event).decode())
        except websockets.ConnectionClosed as exc:
            raise UpstreamLost(f"upstream {self.upstream.name} closed the connection ({exc})") from exc

    async def send_audio(self, pcm: bytes) -> None:
        if self.binary:
            try:
                await self.ws.send(bytes((_KIND_INPUT_AUDIO, 0, 0, 0)) + pcm)
            except websockets.ConnectionClosed as exc:
                raise UpstreamLost(f"upstream {self.upstream.name} closed the connection ({exc})") from exc
        else:
            await self.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode("ascii")})

    async def recv(self, limit_s: float | None = None) -> dict[str, Any] | bytes:
        """The next message (an event dict, or the bytes of a binary frame),
        waiting at most ``limit_s`` (then ``upstream_timeout``)."""
        if self.pushback:
            return self.pushback.pop(0)
        event = await self._recv(limit_s)
        if self.duplex and isinstance(event, dict):
            seq = event.get("server_event_seq")
            if isinstance(seq, int) and seq > self._seq:
                self._seq = seq
                if seq - self._acked >= DUPLEX_ACK_EVERY:
                    await self.ack()
        return event

    async def ack(self) -> None:
        """``session.event_ack`` up to the last seq received (duplex: trims the upstream's journal)."""
        if self._seq > self._acked:
            self._acked = self._seq
            await self.send({"type": "session.event_ack", "server_event_seq": self._seq})

    async def _recv(self, limit_s: float | None) -> dict[str, Any] | bytes:
        try:
            async with asyncio.timeout(limit_s):
                message = await self.ws.recv()
        except websockets.ConnectionClosed as exc:
            raise UpstreamLost(f"upstream {self.upstream.name} closed the connection ({exc})") from exc
        except TimeoutError:
            raise UpstreamLost(
                f"upstream {self.upstream.name} sent nothing for {limit_s:.0f} s", code="upstream_timeout"
            ) from None
        if isinstance(message, bytes):
            return message
        try:
            event = orjson.loads(message)
        except orjson.JSONDecodeError:
            return {"type": "invalid"}
        return event if isinstance(event, dict) else {"type": "invalid"}

    async def close(self, farewell: Iterable[dict[str, Any]] = ()) -> None:
        """Send ``farewell`` events (best effort), then close."""
        with contextlib.suppress(Exception):
            for event in farewell:
                await self.ws.send(orjson.dumps(event).decode())
        with contextlib.suppress(Exception):
            await self.ws.close()


@dataclass(eq=False)
class Lease:
    """A connection lent to one request; ``release`` gives it back.

    The request keeps what it takes to make the upstream session clean again:
    ``items`` it created there, ``farewell`` events that stop what it left
    running (``response.cancel``...) and the ``barrier`` event types that
    confirm it stopped. On release the pool recycles the connection in the
    background (farewell, wait for the barrier, delete the items, each
    acknowledged, within ``cleanup_timeout_s``) and parks it idle for the next
    request of its kind; a ``broken`` connection, or one whose cleanup fails,
    is closed (after the farewell).
    """

    pool: UpstreamPool
    upstream: Upstream
    conn: Connection
    reused: bool
    items: list[str] = field(default_factory=list)
    farewell: list[dict[str, Any]] = field(default_factory=list)
    barrier: frozenset[str] = frozenset()
    broken: bool = False
    released: bool = False

    def expect(self, farewell: list[dict[str, Any]], *barrier: str) -> None:
        self.farewell, self.barrier = farewell, frozenset(barrier)

    def add_item(self, item_id: Any) -> None:
        if isinstance(item_id, str) and item_id and item_id not in self.items:
            self.items.append(item_id)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.pool._release(self)


class UpstreamPool:
    """Upstreams with health polling and pooled connections (see the module docstring)."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        api_key: str | None = None,
        model: str | None = None,
        binary: bool = True,
        dialect: str = "auto",
        max_connections_per_upstream: int = 64,
        max_idle_per_upstream: int = 8,
        idle_ttl_s: float = 60.0,
        connect_timeout_s: float = 5.0,
        acquire_timeout_s: float = 10.0,
        cleanup_timeout_s: float = 2.0,
        health_interval_s: float = 2.0,
        health_timeout_s: float = 2.0,
        health_paths: Sequence[str] = ("/readyz", "/health"),
        max_message_bytes: int = 32 * 1024 * 1024,
    ) -> None:
        if not urls:
            raise ValueError("at least one upstream URL is needed")
        self.upstreams = [Upstream(*split_url(u)) for u in urls]
        self.api_key = api_key
        self.model = model
        self.binary = binary
        modes = {"auto": None, "openai": False, "duplex": True}
        if dialect not in modes:
            raise ValueError(f"upstream dialect {dialect!r}: use auto, openai or duplex")
        self.duplex = modes[dialect]  # the dialect every upstream is spoken in; None: each one's is probed
        self.max_connections = max_connections_per_upstream
        self.max_idle = max_idle_per_upstream
        self.idle_ttl_s = idle_ttl_s
        self.connect_timeout_s = connect_timeout_s
        self.acquire_timeout_s = acquire_timeout_s
        self.cleanup_timeout_s = cleanup_timeout_s
        self.health_interval_s = health_interval_s
        self.health_timeout_s = health_timeout_s
        self.health_paths = tuple(health_paths)
        self.max_message_bytes = max_message_bytes
        self._users = 0
        self._closed = False
        self._rr = 0
        self._changed = asyncio.Event()
        self._poller: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    # --- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        """Probe every upstream once, then keep polling (shared: counted per user)."""
        self._users += 1
        if self._poller is not None:
            return
        self._closed = False
        await self.poll()
        self._poller = asyncio.get_running_loop().create_task(self._poll_loop(), name="upstream health")

    async def close(self) -> None:
        self._users = max(0, self._users - 1)
        if self._users:
            return
        self._closed = True
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(BaseException):
                await self._poller
            self._poller = None
        for upstream in self.upstreams:
            self._drop_idle(upstream)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)

    def healthy(self) -> bool:
        """True while at least one upstream answers its ``/readyz``."""
        return not self._closed and any(u.up for u in self.upstreams)

    def stats(self) -> list[dict[str, Any]]:
        return [
            {"upstream": u.name, "up": u.up, "reason": u.reason, "active": u.active, "open": u.open,
             "idle": sum(len(v) for v in u.idle.values()), "served": u.served}
            for u in self.upstreams
        ]  # fmt: skip

    # --- health -------------------------------------------------------------------

    async def poll(self) -> None:
        results = await asyncio.gather(
            *(probe_ready(u.http, self.health_timeout_s, self.headers, self.health_paths) for u in self.upstreams)
        )
        now = time.monotonic()
        for upstream, (ok, reason) in zip(self.upstreams, results, strict=True):
            if ok and not upstream.up:
                log.info("upstream %s is up", upstream.name)
                self._changed.set()
            elif not ok and upstream.up:
                log.warning("upstream %s is down: %s", upstream.name, reason)
            upstream.up, upstream.reason = ok, reason
            if not ok:
                self._drop_idle(upstream)
            for kind, conns in upstream.idle.items():
                keep = [c for c in conns if not c.closed and now - c.idle_since < self.idle_ttl_s]
                for conn in conns:
                    if conn not in keep:
                        self._discard(upstream, conn)
                upstream.idle[kind] = keep

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            try:
                await self.poll()
            except Exception:
                log.exception("upstream health poll failed")

    def mark_down(self, upstream: Upstream, reason: str) -> None:
        if upstream.up:
            log.warning("upstream %s marked down: %s", upstream.name, reason)
        upstream.up, upstream.reason = False, reason
        self._drop_idle(upstream)

    # --- connections ------------------------------------------------------------------

    def _pick(self, kind: str, exclude: set[Upstream]) -> Upstream | None:
        up = [u for u in self.upstreams if u.up]
        preferred = [u for u in up if u not in exclude] or up
        free = [u for u in preferred if u.open < self.max_connections or u.idle.get(kind)]
        if not free:
            return None
        n = len(self.upstreams)
        order = {u: (i - self._rr) % n for i, u in enumerate(self.upstreams)}
        self._rr += 1
        return min(free, key=lambda u: (u.active, order[u]))

    async def lease(self, kind: str, path: str, exclude: set[Upstream] | None = None) -> Lease:
        """A connection for one request of ``kind`` (``path`` on the upstream):
        an idle one of that kind on the chosen upstream, or a new one."""
        if self._closed:
            raise UpstreamUnavailable("the remote engine is closed")
        tried = set(exclude or ())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.acquire_timeout_s
        while True:
            if not any(u.up for u in self.upstreams):
                reasons = "; ".join(f"{u.name}: {u.reason}" for u in self.upstreams)
                raise UpstreamUnavailable(f"no upstream is ready ({reasons})")
            upstream = self._pick(kind, tried)
            if upstream is None:
                self._changed.clear()
                left = deadline - loop.time()
                if left <= 0:
                    raise UpstreamUnavailable(
                        f"every upstream has {self.max_connections} connections open", code="upstream_busy"
                    )
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await self._changed.wait()
                continue
            upstream.active += 1
            idle = upstream.idle.get(kind, [])
            while idle:
                conn = idle.pop()
                if conn.closed:
                    self._discard(upstream, conn)
                    continue
                upstream.served += 1
                conn.begin()
                return Lease(self, upstream, conn, reused=True)
            upstream.open += 1
            try:
                conn = await self._connect(upstream, kind, path)
            except websockets.InvalidStatus as exc:
                upstream.open -= 1
                upstream.active -= 1
                status = exc.response.status_code
                if status in (401, 403):  # refused at the upgrade: our key, not the upstream, is wrong
                    raise UpstreamUnavailable(f"upstream {upstream.name} refused our credentials (HTTP {status})",
                                              code="unauthorized") from exc  # fmt: skip
                self.mark_down(upstream, f"connect failed: HTTP {status}")
                tried.add(upstream)
                self._changed.set()
                continue
            except Exception as exc:
                upstream.open -= 1
                upstream.active -= 1
                self.mark_down(upstream, f"connect failed: {type(exc).__name__}: {exc}")
                tried.add(upstream)
                self._changed.set()
                continue
            upstream.served += 1
            conn.begin()
            return Lease(self, upstream, conn, reused=False)

    async def _connect(self, upstream: Upstream, kind: str, path: str) -> Connection:
        url = upstream.ws + path
        query: dict[str, str] = {}
        duplex: bool | None = False if path == REALTIME_PATH else None
        if path == REALTIME_PATH and self.duplex is not False and upstream.duplex is not False:
            # vLLM-Omni's duplex route; autostart=0: no session until our session.update (a server
            # that does not speak it opens one at connect: that is how the probe tells them apart).
            query.update(duplex="1", autostart="0")
            duplex = True if self.duplex or upstream.duplex else None
        if self.model and path == REALTIME_PATH:
            query["model"] = self.model
        if query:
            url += "?" + urlencode(query)
        subprotocols = None
        if path == REALTIME_PATH:
            offered = [BINARY_SUBPROTOCOL, "realtime"] if self.binary and not duplex else ["realtime"]
            subprotocols = [cast(Subprotocol, p) for p in offered]
        ws = await websockets.connect(
            url,
            additional_headers=self.headers or None,
            subprotocols=subprotocols,
            open_timeout=self.connect_timeout_s,
            close_timeout=2,
            max_size=self.max_message_bytes,
            compression=None,
            ping_interval=20,
            ping_timeout=20,
        )
        return Connection(ws, upstream, kind, duplex)

    def _release(self, lease: Lease) -> None:
        upstream, conn = lease.upstream, lease.conn
        upstream.active -= 1
        self._changed.set()
        if lease.broken or conn.closed or self._closed or not upstream.up or conn.kind == "video":
            self._discard(upstream, conn, lease.farewell)
        elif not lease.items and not lease.farewell and not lease.barrier:
            self._park(upstream, conn)
        else:
            self.spawn(self._recycle(lease))

    def _park(self, upstream: Upstream, conn: Connection) -> None:
        idle = upstream.idle.setdefault(conn.kind, [])
        if self._closed or not upstream.up or conn.closed or len(idle) >= self.max_idle:
            self._discard(upstream, conn)
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)
        self._changed.set()

    async def _recycle(self, lease: Lease) -> None:
        """Make a released session clean again (see ``Lease``), then park it."""
        conn, items = lease.conn, list(lease.items)
        try:
            async with asyncio.timeout(self.cleanup_timeout_s):
                for farewell in lease.farewell:
                    await conn.send(farewell)
                while lease.barrier:
                    message = await conn.recv()
                    if isinstance(message, bytes):
                        continue
                    event = message
                    kind = event.get("type")
                    item_id = event.get("item_id") if kind == "input_audio_buffer.committed" else None
                    if kind in ("conversation.item.added", "conversation.item.created"):
                        item_id = (event.get("item") or {}).get("id")
                    if isinstance(item_id, str) and item_id and item_id not in items:
                        items.append(item_id)
                    if kind == "error" and conn.stale(event):
                        continue
                    if kind in lease.barrier:
                        break
                for item_id in items:
                    await conn.send({"type": "conversation.item.delete", "item_id": item_id})
                pending = set(items)
                while pending:
                    message = await conn.recv()
                    if isinstance(message, bytes):
                        continue
                    event = message
                    if event.get("type") == "conversation.item.deleted":
                        pending.discard(str(event.get("item_id")))
                    elif event.get("type") == "error" and not conn.stale(event):
                        if (event.get("error") or {}).get("code") == "response_cancel_not_active":
                            continue  # the response had ended before the cancel reached it
                        raise UpstreamLost(f"cleanup refused: {event.get('error')}")
        except Exception as exc:
            log.debug("upstream session not reusable (%s); closing it", exc)
            self._discard(lease.upstream, conn)
            return
        self._park(lease.upstream, conn)

    def _discard(self, upstream: Upstream, conn: Connection, farewell: Iterable[dict[str, Any]] = ()) -> None:
        upstream.open -= 1
        self.spawn(conn.close(list(farewell)))

    def _drop_idle(self, upstream: Upstream) -> None:
        for conns in upstream.idle.values():
            for conn in conns:
                self._discard(upstream, conn)
            conns.clear()

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class PooledEngine:
    """The lifecycle the remote voice and video engines share: the pool is
    started with the engine (counted per user), every running request is aborted
    on close, and the engine is healthy while it runs and an upstream is up."""

    pool: UpstreamPool
    _started: bool = False

    def _running(self) -> list[str]:
        """Request ids to abort on close."""
        raise NotImplementedError

    async def abort(self, request_id: str) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        if not self._started:
            self._started = True
            await self.pool.start()

    async def close(self) -> None:
        for request_id in self._running():
            await self.abort(request_id)
        if self._started:
            self._started = False
            await self.pool.close()

    def healthy(self) -> bool:
        return self._started and self.pool.healthy()
