"""The composition root: what one gateway process holds and how it is wired.

Settings, the engines (one per route) and their orchestrators, auth, metrics,
the speech detector, the store, the hosting context (the sessions served here,
their lease loop and bus listener) and the open connections. The runtime builds
and connects these parts and gives the transport what it asks for
(``RealtimeServices``, ``VideoServices``); the session logic lives in them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gateway.auth import Authenticator, SecretBox
from gateway.hosting.bus import listen_bus
from gateway.hosting.host import HostContext, SessionHost
from gateway.hosting.leases import renew_leases
from gateway.protocol.duplex_config import DuplexConfig
from gateway.protocol.errors import CloseCode, Code, ProtocolError
from gateway.protocol.session_config import SessionConfig
from gateway.protocol.video_events import decode_interaction
from gateway.routing import CATCH_ALL, Router, RouteSpec, RoutingError, parse_routes
from gateway.session.duplex import DuplexSession
from gateway.session.session import RealtimeSession, SessionLimits, VadStream
from gateway.settings import Settings
from gateway.store import create_store
from gateway.store.base import SessionStore
from gateway.transport.realtime import Connection
from gateway.transport.video import VideoConnection
from orchestrator.engine import Engine
from orchestrator.metrics import Metrics
from orchestrator.orchestrator import AdmissionLimits, Orchestrator
from orchestrator.video_engine import VideoEngine

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
        # Client secrets live in the store: minted on one replica, good (once) on any.
        self.auth = Authenticator(settings.api_keys, required=settings.requires_auth, secrets_box=SecretBox(self.store))
        self.replica_id = settings.replica_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.lease_ttl_ms = int(settings.lease_ttl_s * 1000)
        self.hosting = HostContext(
            store=self.store,
            metrics=self.metrics,
            replica_id=self.replica_id,
            lease_ttl_ms=self.lease_ttl_ms,
            detach_grace_s=settings.detach_grace_s,
        )
        self.connections: set[Connection] = set()
        self.video_sessions: dict[str, VideoConnection] = {}
        self.draining = False
        self._bus_task: asyncio.Task[None] | None = None
        self._lease_task: asyncio.Task[None] | None = None

    @property
    def hosts(self) -> dict[str, SessionHost]:
        """The realtime sessions served here, by id."""
        return self.hosting.hosts

    def session_count(self) -> int:
        return len(self.connections) + len(self.video_sessions)

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

    async def open_session(
        self, config: SessionConfig, *, principal: str, beta: bool, duplex: DuplexConfig | None = None
    ) -> SessionHost:
        """A new session hosted here: GA or beta, or, with ``duplex``, vLLM-Omni's duplex dialect."""
        found = self.route(config.model)
        if found is None:
            raise ProtocolError(Code.MODEL_NOT_FOUND, f"No model {config.model!r} here; see GET /v1/models.")
        engine, orch = found
        if "audio" not in engine.info.modalities and "audio" in config.output_modalities:
            config = replace(config, output_modalities=("text",))  # a text model answers in text
        kwargs = {"session_id": "sess_" + secrets.token_hex(10), "config": config, "engine": engine.info,
                  **self._session_kwargs(orch)}  # fmt: skip
        session = RealtimeSession(beta=beta, **kwargs) if duplex is None else DuplexSession(duplex=duplex, **kwargs)
        return await SessionHost.open(self.hosting, session, orchestrator=orch, principal=principal)

    def restore_session(self, state: dict[str, Any]) -> tuple[RealtimeSession, Orchestrator]:
        """A session taken over from the store, rebuilt on this replica's engine (in its dialect)."""
        found = self.route(state["config"]["model"])
        if found is None:
            raise ProtocolError(Code.MODEL_NOT_FOUND, "This session's model is not served here any more.")
        engine, orch = found
        cls = DuplexSession if state.get("dialect") == "duplex" else RealtimeSession
        return cls.restore(state, engine=engine.info, **self._session_kwargs(orch)), orch

    def _on_bus_message(self, body: dict[str, Any]) -> None:
        """A bus message for something other than a session host: a video interaction
        forwarded by the replica that took the HTTP request."""
        video = self.video_sessions.get(body.get("session_id", ""))
        if video is None or body.get("type") != "interaction":
            return
        try:
            default_k = video.session.info.default_transition_chunks
            event = decode_interaction(body.get("interaction"), default_k)
        except ProtocolError:
            return  # validated by the replica that accepted the HTTP request
        self.hosting.spawn(video.interact_now(event.interaction))

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
        self._bus_task = loop.create_task(listen_bus(self.hosting, self._on_bus_message), name="bus")
        self._lease_task = loop.create_task(renew_leases(self.hosting), name="leases")

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
