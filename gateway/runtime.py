"""What one gateway process holds: settings, engine, orchestrator, auth,
metrics, the speech detector and the open connections."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson

from gateway.auth import Authenticator
from gateway.protocol import client_events as ce
from gateway.protocol.errors import CloseCode, Code, ProtocolError
from gateway.protocol.session_config import SessionConfig
from gateway.protocol.video_events import decode_interaction
from gateway.routing import CATCH_ALL, Router, RouteSpec, RoutingError, parse_routes
from gateway.session import snapshot
from gateway.session.session import RealtimeSession, SessionLimits, VadStream
from gateway.settings import Settings
from gateway.store import create_store
from gateway.store.base import JournalRead, SessionStore, StoreError, replica_channel
from gateway.transport.host import SessionHost, connection_event, error_event, new_resume_token, token_hash
from orchestrator.engine import Engine
from orchestrator.engines.video.types import VideoEngine
from orchestrator.metrics import Metrics
from orchestrator.orchestrator import AdmissionLimits, Orchestrator

if TYPE_CHECKING:
    from gateway.transport.realtime import Connection
    from gateway.transport.video import VideoConnection

log = logging.getLogger("omni.runtime")


def build_engine(spec: RouteSpec) -> Engine:
    """The engine registry: each backend is imported only when a route uses it."""
    name, options = spec.engine, dict(spec.options)
    if name == "passthrough":
        from orchestrator.engines.passthrough import PassthroughEngine

        return PassthroughEngine(**options)
    if name == "vllm":
        from orchestrator.engines.vllm_engine import VllmEngine

        return VllmEngine(**options)
    if name == "cascade":
        from orchestrator.engines.cascade import CascadeEngine

        if options.pop("thinker", "echo") == "vllm":
            from orchestrator.engines.vllm_engine import VllmEngine, VllmThinker

            llm_options = dict(options.pop("thinker_options", {}))
            llm_options.setdefault("model", options.pop("thinker_model", None) or spec.name)
            max_tokens = int(llm_options.pop("max_tokens", 256))
            options["thinker"] = VllmThinker(VllmEngine(**llm_options), max_tokens=max_tokens)
        return CascadeEngine(**options)
    if name == "remote":
        from orchestrator.engines.remote import RemoteEngine

        return RemoteEngine(**options)
    if name == "omni":
        from orchestrator.engines.omni import OmniEngine

        return OmniEngine(**options)
    known = "cascade, passthrough, vllm, remote or omni"
    raise ValueError(f"unknown engine {name!r} for model {spec.name!r}; choose {known}")


def load_video_engine(settings: Settings) -> VideoEngine | None:
    """The video engine the settings name; the CPU one needs the ``video`` extra."""
    name = settings.video_engine
    if name == "none":
        return None
    if name == "remote":
        from orchestrator.engines.remote import RemoteVideoEngine

        return RemoteVideoEngine(list(settings.upstreams), api_key=settings.upstream_api_key)
    if name == "omni":
        from orchestrator.engines.omni import OmniClient, OmniVideoEngine

        return OmniVideoEngine(OmniClient(settings.video_model))
    if name != "cpu":
        raise ValueError(f"unknown video engine {name!r}; choose cpu, remote, omni or none")
    try:
        from orchestrator.engines.video import CpuVideoEngine

        return CpuVideoEngine()
    except ImportError as exc:
        log.warning("video engine unavailable (%s); /v1/realtime/video refuses sessions", exc)
        return None


def load_vad() -> Callable[[], VadStream] | None:
    """Silero's speech detector when its model is installed (the ``cpu`` extra)."""
    try:
        from gateway.audio.vad import SileroVad

        model = SileroVad.load()
    except Exception as exc:  # missing onnxruntime or silero-vad: manual turns only
        log.warning("server VAD unavailable (%s); sessions default to manual turns", exc)
        return None
    return model.new_stream


RESUME_SEQ_SLACK = 1_000  # a client may hold this many events the journal lost in a crash


class Runtime:
    def __init__(
        self,
        settings: Settings,
        engine: Engine | None = None,
        *,
        vad_factory: Callable[[], VadStream] | bool | None = True,
        metrics: Metrics | None = None,
        store: SessionStore | None = None,
        video_engine: VideoEngine | bool | None = True,
    ) -> None:
        self.settings = settings
        self.video_engine: VideoEngine | None = (
            load_video_engine(settings) if video_engine is True else (video_engine or None)
        )
        self.metrics = metrics or Metrics()
        self.router = Router(
            parse_routes(settings.models, settings),
            (lambda spec: engine) if engine is not None else build_engine,
        )
        self._orchestrators: dict[int, Orchestrator] = {}
        default = self.router.resolve(settings.model)
        if default is None:
            raise RoutingError(f"the default model {settings.model!r} has no route")
        self.engine = default[1]
        self.orchestrator = self.orchestrator_for(self.engine)  # the default route's; also runs video
        self.auth = Authenticator(settings.api_keys, required=settings.requires_auth)
        self.session_limits = SessionLimits(
            max_append_ms=settings.max_append_ms,
            max_buffer_ms=settings.max_buffer_ms,
            max_items=settings.max_conversation_items,
            lifetime_s=settings.session_lifetime_s,
        )
        self.vad_factory: Callable[[], VadStream] | None = load_vad() if vad_factory is True else (vad_factory or None)
        self.store = store or create_store(
            settings.redis_url,
            idle_ttl_s=settings.journal_ttl_s,
            max_events=settings.journal_max_events,
            max_bytes=settings.journal_max_bytes,
            flush_interval_ms=settings.journal_flush_ms,
        )
        self.replica_id = settings.replica_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.lease_ttl_ms = int(settings.lease_ttl_s * 1000)
        self.connections: set[Connection] = set()
        self.hosts: dict[str, SessionHost] = {}
        self.video_sessions: dict[str, VideoConnection] = {}
        self.background: set[asyncio.Task[Any]] = set()
        self.draining = False
        self._bus_task: asyncio.Task[None] | None = None
        self._lease_task: asyncio.Task[None] | None = None

    # --- sessions ---------------------------------------------------------------

    def orchestrator_for(self, engine: Engine) -> Orchestrator:
        """One orchestrator per engine: its admission bounds are that engine's."""
        orch = self._orchestrators.get(id(engine))
        if orch is None:
            s = self.settings
            limits = AdmissionLimits(
                max_transcriptions=s.max_transcriptions,
                max_responses=s.max_responses,
                max_videos=s.max_videos,
                admission_timeout_s=s.admission_timeout_s,
                video_lead_chunks=s.video_lead_chunks,
            )
            video = self.video_engine if not self._orchestrators else None
            orch = self._orchestrators[id(engine)] = Orchestrator(engine, limits, self.metrics, video_engine=video)
        return orch

    @property
    def orchestrators(self) -> list[Orchestrator]:
        return list(self._orchestrators.values())

    def route(self, model: str) -> tuple[Engine, Orchestrator] | None:
        """The engine and orchestrator serving ``model``; None: no route (refuse the session)."""
        found = self.router.resolve(model)
        if found is None:
            return None
        return found[1], self.orchestrator_for(found[1])

    def _session_kwargs(self, orch: Orchestrator) -> dict[str, Any]:
        return {
            "limits": self.session_limits,
            "vad_factory": self.vad_factory,
            "rate_limits": lambda: rate_limits(orch),
        }

    async def open_session(self, config: SessionConfig, *, principal: str, beta: bool) -> SessionHost:
        found = self.route(config.model)
        if found is None:
            raise ProtocolError(Code.MODEL_NOT_FOUND, f"No model {config.model!r} here; see GET /v1/models.")
        engine, orch = found
        if "audio" not in engine.info.modalities and "audio" in config.output_modalities:
            config = replace(config, output_modalities=("text",))  # a text model answers in text
        session = RealtimeSession(
            session_id="sess_" + secrets.token_hex(10),
            config=config,
            engine=engine.info,
            beta=beta,
            **self._session_kwargs(orch),
        )
        fence = await self.store.acquire(session.id, self.replica_id, self.lease_ttl_ms)
        return SessionHost(
            self, session, orchestrator=orch, principal=principal, resume_token=new_resume_token(), fence=fence
        )

    async def resume(self, conn: Connection, event: ce.SessionResume) -> None:
        """Move ``event.session_id`` onto ``conn``: replay what the client missed, then go on live."""
        provisional = conn.host
        assert provisional is not None
        try:
            await self._resume(conn, event, provisional)
        except ProtocolError as err:
            err.event_id = event.event_id
            provisional.session.error(err)
            provisional.flush()
        except StoreError as exc:
            log.warning("resume of %s failed: %s", event.session_id, exc)
            provisional.session.error(
                ProtocolError(
                    Code.STORE_UNAVAILABLE, "Session state is unavailable; try again shortly.", event_id=event.event_id
                )
            )
            provisional.flush()

    async def _resume(self, conn: Connection, event: ce.SessionResume, provisional: SessionHost) -> None:
        sid, last = event.session_id, event.last_received_server_event_seq
        host = self.hosts.get(sid)
        read: JournalRead | None = None
        if host is not None and host is not provisional:
            # The session runs here: attach first (live events are held from now on),
            # then commit what is pending and read the journal, so nothing falls between.
            self._check_resume(event, host.token_hash, host.principal, conn.principal)
            if last > host.session.seq:
                raise _seq_error(last, host.session.seq)
            recover = False
        else:
            data = await self.store.load_snapshot(sid)
            if data is None:
                raise ProtocolError(
                    Code.SESSION_NOT_FOUND,
                    f"No session {sid!r} to resume (unknown or expired); start a new session.",
                    param="session_id",
                )
            state = snapshot.loads(data)
            self._check_resume(event, state["token_hash"], state["principal"], conn.principal)
            found = self.route(state["config"]["model"])
            if found is None:
                raise ProtocolError(Code.MODEL_NOT_FOUND, "This session's model is not served here any more.")
            previous = await self.store.owner_of(sid)
            fence = await self.store.acquire(sid, self.replica_id, self.lease_ttl_ms)
            if previous is not None and previous.owner != self.replica_id:
                # The old owner may be alive (a dropped socket): tell it to stop now, on
                # its own channel (the lease already names us). Fencing stops its writes anyway.
                stop = orjson.dumps({"type": "replaced", "session_id": sid})
                await self.store.publish(replica_channel(previous.owner), stop)
            # After acquire nobody else writes this journal: one read serves the replay.
            read = await self.store.read_events(sid, after_seq=last)
            top = max(state["seq"], read.last_seq or 0)
            if last > top + RESUME_SEQ_SLACK:
                raise _seq_error(last, top)
            engine, orch = found
            session = RealtimeSession.restore(state, engine=engine.info, **self._session_kwargs(orch))
            # Never reuse a seq the client may already hold (events sent but lost from the journal).
            session.seq = max(top, last)
            host = SessionHost(
                self, session, orchestrator=orch, principal=state["principal"], resume_token="-", fence=fence
            )
            host.token_hash = state["token_hash"]
            recover = True
        token = host.rotate_token()
        conn.hold()  # live events from here on wait until the replay is out
        host.attach(conn)
        conn.host = host
        try:
            if read is None:
                await host.writer.flush()
                read = await self.store.read_events(sid, after_seq=last)
        except StoreError:
            # Attached but cannot replay: let the client retry the resume shortly.
            conn.release(host.session.seq)
            conn.send_raw(error_event(Code.STORE_UNAVAILABLE, "Session state is unavailable; resume again shortly."))
            conn.close(CloseCode.TRY_AGAIN_LATER, Code.STORE_UNAVAILABLE)
            host.detach(conn)
            await provisional.end(reason="resume failed", delete=True)
            return
        if read.gap:
            s = host.session
            conn.send_raw(
                connection_event(
                    "session.resync_required",
                    session_id=sid,
                    resume_token=token,
                    reason="the events after your last seq are no longer kept",
                    session=s.render_config(),
                    conversation=[it.render(s.beta) for it in s.conversation],
                    last_server_event_seq=s.seq,
                )
            )
            conn.release(host.session.seq)
        else:
            replay_to = read.last_seq if read.events else last
            conn.send_raw(
                connection_event(
                    "session.resumed", session_id=sid, resume_token=token, replay_from=last + 1, replay_to=replay_to
                )
            )
            for _, data in read.events:
                conn.replay(data)
            conn.release(replay_to or 0)
        self.metrics.resumes.labels("replayed" if not read.gap else "resync").inc()
        log.info("session %s resumed (last seq %d, %d replayed, gap=%s)", sid, last, len(read.events), read.gap)
        if recover:
            host.session.recover("replica_lost")
        host.flush()  # also writes the snapshot with the rotated token
        await provisional.end(reason="replaced by a resumed session", delete=True)

    @staticmethod
    def _check_resume(event: ce.SessionResume, expected_hash: str, owner: str, principal: str) -> None:
        if not hmac.compare_digest(token_hash(event.resume_token), expected_hash):
            raise ProtocolError(
                Code.RESUME_TOKEN_INVALID,
                "The resume token is not valid for this session "
                "(each resume rotates it: use the one from the last session.resumed).",
                param="resume_token",
            )
        if owner != principal:
            raise ProtocolError(Code.RESUME_FORBIDDEN, "This session belongs to another principal.", param="session_id")

    async def trim_journal(self, session_id: str, seq: int) -> None:
        with contextlib.suppress(StoreError):
            await self.store.trim_events(session_id, seq)

    async def _listen_bus(self) -> None:
        """Messages from other replicas about sessions this one owns."""
        sub = await self.store.subscribe(replica_channel(self.replica_id))
        try:
            async for message in sub:
                try:
                    body = orjson.loads(message.data)
                except orjson.JSONDecodeError:
                    continue
                sid = body.get("session_id", "")
                host = self.hosts.get(sid)
                if host is not None and body.get("type") == "replaced":
                    host.replaced()
                video = self.video_sessions.get(sid)
                if video is not None and body.get("type") == "interaction":
                    try:
                        default_k = video.session.info.default_transition_chunks
                        event = decode_interaction(body.get("interaction"), default_k)
                    except ProtocolError:
                        continue  # validated by the replica that accepted the HTTP request
                    task = asyncio.get_running_loop().create_task(video.interact_now(event.interaction))
                    self.background.add(task)
                    task.add_done_callback(self.background.discard)
        finally:
            await sub.close()

    # --- health -------------------------------------------------------------------

    def engine_health(self) -> dict[str, str]:
        """Each engine's state by route name: ok, failed: <why>, or unhealthy."""
        health: dict[str, str] = {}
        named = {s.key for s in self.router.named()}
        for spec in self.router.specs:
            if spec.name == CATCH_ALL and spec.key in named:
                continue  # the catch-all's engine is reported under its named route
            engine = self.router.engines[spec.key]
            orch = self._orchestrators.get(id(engine))
            if orch is not None and orch.engine_failed is not None:
                health[spec.name] = f"failed: {orch.engine_failed}"
            else:
                health[spec.name] = "ok" if engine.healthy() else "unhealthy"
        if self.video_engine is not None:
            health["video"] = "ok" if self.video_engine.healthy() else "unhealthy"
        return health

    def ready(self) -> tuple[bool, str]:
        """Ready when not draining and every engine is healthy."""
        if self.draining:
            return False, "draining"
        bad = {name: state for name, state in self.engine_health().items() if state != "ok"}
        if bad:
            return False, "; ".join(f"{name}: {state}" for name, state in bad.items())
        return True, "ready"

    # --- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        for engine in self.router.engines.values():
            await engine.start()
        if self.video_engine is not None:
            await self.video_engine.start()
        loop = asyncio.get_running_loop()
        self._bus_task = loop.create_task(self._listen_bus(), name="bus")
        self._lease_task = loop.create_task(self._renew_leases(), name="leases")

    async def _renew_leases(self) -> None:
        """Every session lease of this replica, renewed together a third of the TTL
        apart: one loop (and, on Redis, one pipelined round trip) per replica, not a
        task per session. A lease the store refuses is its host's to sort out."""
        period = self.lease_ttl_ms / 3000
        while True:
            await asyncio.sleep(period)
            hosts = [h for h in self.hosts.values() if not h.ended]
            if not hosts:
                continue
            fences = [h.fence for h in hosts]
            try:
                renewed = await self.store.renew_many(
                    self.replica_id, self.lease_ttl_ms, [(h.id, f) for h, f in zip(hosts, fences, strict=True)]
                )
            except StoreError as exc:
                log.warning("lease renewal of %d sessions failed: %s", len(hosts), exc)
                continue
            except Exception:  # a bug must not stop every lease of the replica for good
                log.exception("lease renewal of %d sessions crashed", len(hosts))
                continue
            for host, fence, ok in zip(hosts, fences, renewed, strict=True):
                if not ok:
                    task = asyncio.get_running_loop().create_task(host.renewal_refused(fence))
                    self.background.add(task)
                    task.add_done_callback(self.background.discard)

    async def drain(self) -> None:
        """SIGTERM: stop taking sessions, let running answers finish (up to
        ``drain_window_s``), then close every socket with 1012 so clients resume
        on another replica. Session state stays in the store."""
        if self.draining:
            return
        self.draining = True
        log.info("draining: %d sessions, up to %.0f s", len(self.hosts), self.settings.drain_window_s)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.drain_window_s
        # Polling: many sessions, no single event to wait on.
        while loop.time() < deadline and any(h.session.active_response_id for h in self.hosts.values()):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            conn.close(CloseCode.SERVICE_RESTART, "service restart: reconnect and resume")
        hosts = list(self.hosts.values())
        await asyncio.gather(*(h.end(reason="drained") for h in hosts), return_exceptions=True)

    async def close(self) -> None:
        await self.drain()
        for task in (self._bus_task, self._lease_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        for video in list(self.video_sessions.values()):
            video.close(CloseCode.SERVICE_RESTART, "service restart")
        for orch in self.orchestrators:
            await orch.close()
        for engine in self.router.engines.values():
            await engine.close()
        if self.video_engine is not None:
            await self.video_engine.close()
        await self.store.close()


def rate_limits(orch: Orchestrator) -> list[dict[str, Any]]:
    """``rate_limits.updated``: the response slots of the session's engine."""
    stats = orch.stats()
    limit = stats["max_responses"]
    remaining = max(0, limit - stats["running_responses"])
    return [{"name": "requests", "limit": limit, "remaining": remaining, "reset_seconds": 0}]


def _seq_error(last: int, top: int) -> ProtocolError:
    return ProtocolError(
        Code.RESUME_SEQ_INVALID,
        f"last_received_server_event_seq {last} is beyond anything this session sent ({top}).",
        param="last_received_server_event_seq",
    )
