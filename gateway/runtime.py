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
import functools
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from gateway.allocator import ALLOCATOR
from gateway.auth import Authenticator, Grant
from gateway.hosting.bus import listen_bus
from gateway.hosting.claim import FLUSH_ASK, flush_asked
from gateway.hosting.context import Closable, HostContext
from gateway.hosting.host import SessionHost
from gateway.hosting.leases import renew_leases
from gateway.hosting.mcp import McpConnector, McpPolicy
from gateway.hosting.responses_backend import BackendPolicy, ResponsesBackend
from gateway.hosting.store_watch import StoreWatch
from gateway.hosting.stored import load_stored
from gateway.hosting.video import VideoHost, VideoPeer, VideoTimeouts
from gateway.jwt_auth import JwtVerifier
from gateway.origins import OriginPolicy
from gateway.protocol.dialects import Dialect
from gateway.protocol.errors import CloseCode, Code, ProtocolError
from gateway.protocol.session_config import ConfigLimits, SessionConfig, apply_update
from gateway.quotas import Quotas, Seat
from gateway.routing import Router, RouteSpec, RoutingError, is_pattern, parse_routes
from gateway.session.kinds import kind_of, restore_kind
from gateway.session.session import RealtimeSession, SessionLimits, VadStream
from gateway.session.video_session import InteractionLimits, VideoSession
from gateway.settings import Settings
from gateway.store import create_store
from gateway.store.base import SessionStore, StateQuota
from gateway.telemetry import Telemetry
from gateway.tenants import KeysFile, TenantLimits
from gateway.transport.handshake import VIDEO_SECRET_ON_REALTIME, bound_model_message
from gateway.transport.video import VideoSocket
from gateway.transport.webrtc.config import WebRTCConfig
from gateway.transport.webrtc.signaling import CallBook
from orchestrator.engine import Engine
from orchestrator.metrics import Metrics
from orchestrator.orchestrator import AdmissionLimits, Orchestrator
from orchestrator.video_engine import VideoEngine

# A drain hands sessions over at most this far apart (less with many sessions: a quarter of the
# window spread over them), so a replica's sessions reach the others as a stream, not a herd.
DRAIN_GAP_S = 0.05

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
        log.warning(
            "video engine unavailable (%s): /v1/realtime/video refuses sessions. The CPU video engine needs the "
            "video extra (torch, PyAV): pip install torch --index-url https://download.pytorch.org/whl/cpu, then "
            "pip install 'omni-realtime-gateway[video]'; or serve with --video-engine none",
            exc,
        )
        return None


def load_calls(settings: Settings) -> CallBook | None:
    """WebRTC calls, where the settings want them and aiortc is installed (the webrtc extra)."""
    if not settings.webrtc:
        return None
    config = WebRTCConfig.from_strings(
        ice_servers=settings.webrtc_ice_servers,
        udp_ports=settings.webrtc_udp_ports,
        advertised_addresses=settings.webrtc_advertised_addresses,
        advertise_mode="replace" if settings.webrtc_advertise_mode == "replace" else "add",
        ice_connect_timeout_s=settings.webrtc_ice_timeout_s,
        peer_timeout_s=settings.webrtc_peer_timeout_s,
        peer_networks=settings.webrtc_peer_networks,
        max_offer_sections=settings.webrtc_max_offer_sections,
        max_offer_candidates=settings.webrtc_max_offer_candidates,
    )
    try:
        return CallBook.build(config)
    except ImportError as exc:
        log.warning("WebRTC calls unavailable (%s); POST /v1/realtime/calls answers 501", exc)
        return None


def load_sip(runtime: Any) -> Any:
    """The SIP listener (``sip_port``; it plays RTP through the webrtc extra's av); None: off."""
    if not runtime.settings.sip_port:
        return None
    try:
        from gateway.transport.sip.server import build_sip_server
    except ImportError as exc:
        log.warning("SIP unavailable (%s): install the webrtc extra; nothing listens on sip_port", exc)
        return None
    return build_sip_server(runtime)


def responses_backend(settings: Settings) -> ResponsesBackend | None:
    """GPT-Live's Responses backend, where ``live_responses_url`` names one (a URL that is not
    http(s) stops the start: ValueError)."""
    if not settings.live_responses_url:
        return None
    return ResponsesBackend(
        BackendPolicy(settings.live_responses_url, settings.live_responses_api_key, settings.live_responses_timeout_s,
                      settings.live_responses_max_event_bytes)
    )  # fmt: skip


def load_vad() -> Callable[[], VadStream] | None:
    """Silero's speech detector when its model is installed (the ``cpu`` extra)."""
    try:
        from gateway.audio.vad import SileroVad

        model = SileroVad.load()
    except Exception as exc:  # no onnxruntime or Silero model (the cpu extra): manual turns only
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
        telemetry: Telemetry | None = None,
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
            max_conversation_bytes=settings.max_conversation_bytes,
            max_images=settings.max_conversation_images,
            max_image_pixels=settings.max_conversation_image_pixels,
            lifetime_s=settings.session_lifetime_s,
        )
        self.vad_factory: Callable[[], VadStream] | None = load_vad() if vad_factory is True else (vad_factory or None)
        self.store = store or create_store(
            settings.redis_url,
            idle_ttl_s=settings.journal_ttl_s,
            max_events=settings.journal_max_events,
            max_bytes=settings.journal_max_bytes,
            flush_interval_ms=settings.journal_flush_ms,
            max_pending_bytes=settings.journal_pending_max_bytes,
            socket_timeout_s=settings.redis_timeout_s,
        )
        self.tenant_defaults = tenant_defaults(settings)
        self.auth = Authenticator(
            settings.api_keys,
            required=settings.requires_auth,
            store=self.store,
            keys_file=KeysFile.parse(settings.keys_file, self.tenant_defaults),
            jwt=jwt_verifier(settings, self.tenant_defaults),
            defaults=self.tenant_defaults,
        )
        self.origins = OriginPolicy(settings.allowed_origins, auth_required=settings.requires_auth)
        self.quotas = Quotas(self.store, self.metrics.registry, ttl_ms=int(settings.lease_ttl_s * 1000))
        self.replica_id = settings.replica_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.lease_ttl_ms = int(settings.lease_ttl_s * 1000)
        # Traces: None (off) unless otel_traces_endpoint is set, or a test gives its own.
        self.telemetry = telemetry or Telemetry.from_settings(settings, self.replica_id)
        self.hosting = HostContext(
            store=self.store,
            metrics=self.metrics,
            replica_id=self.replica_id,
            lease_ttl_ms=self.lease_ttl_ms,
            detach_grace_s=settings.detach_grace_s,
            telemetry=self.telemetry,
            max_message_bytes=settings.max_message_bytes,
            relay_max_bytes=settings.sideband_relay_max_bytes,
            relay_queue_bytes=settings.outbound_queue_bytes,
            mcp=McpConnector(
                McpPolicy(
                    settings.mcp_allowed_urls,
                    settings.mcp_timeout_s,
                    settings.mcp_max_result_bytes,
                    settings.mcp_max_listings,
                    settings.mcp_max_listings_per_session,
                )
            ),
            responses=responses_backend(settings),
        )
        # Whether the store answers and still holds its data (readiness; writing back what
        # this replica serves when Redis comes back empty); a resume asks it (claim.py).
        self.store_watch = StoreWatch(self.hosting, interval_s=settings.redis_probe_interval_s,
                                      restore_window_s=settings.lease_ttl_s)  # fmt: skip
        self.hosting.watch = self.store_watch
        # A resume on another replica asks this one to commit a session's journal first (claim.py).
        self.hosting.answerers[FLUSH_ASK] = functools.partial(flush_asked, self.hosting)
        health = self.store.health
        health.listeners.append(lambda h: self.metrics.store_up.set(1 if h.up else 0))
        health.on_refused = self.metrics.store_calls_refused.inc
        self.metrics.store_up.set(1 if health.up else 0)
        # What GET /metrics answers; None: this process's registry. A worker of several sets
        # it to every worker's metrics (gateway/workers.py).
        self.metrics_exposition: Callable[[], Awaitable[bytes]] | None = None
        self.video_sockets: dict[str, VideoSocket] = {}  # the video transport's open sockets
        self.calls: CallBook | None = load_calls(settings)  # WebRTC; None: off, or no aiortc here
        self.sip: Any = load_sip(self)  # SIP trunks (gateway/transport/sip); None: off
        self.draining = False
        self._bus_task: asyncio.Task[None] | None = None
        self._lease_task: asyncio.Task[None] | None = None
        self._quota_task: asyncio.Task[None] | None = None
        self._trim_task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None

    @property
    def hosts(self) -> dict[str, SessionHost]:
        """The realtime sessions served here, by id."""
        return {sid: h for sid, h in self.hosting.hosts.items() if isinstance(h, SessionHost)}

    @property
    def connections(self) -> set[Closable]:
        """The realtime connections open here, of every transport."""
        return self.hosting.doors

    @property
    def sessions(self) -> Runtime:
        """What a connection's door opens and restores sessions through (this runtime)."""
        return self

    def session_count(self) -> int:
        return len(self.hosting.doors) + len(self.video_sockets)

    def session_defaults(self, grant: Grant, requested: dict[str, Any] | None) -> tuple[str, dict[str, Any] | None]:
        """A WebRTC call's model and session settings: those its client secret was minted
        with (the form's ``session`` may not name another model: ProtocolError
        ``model_not_allowed``, then applies over them), else the unified form's ``session``
        (checked here: raises ProtocolError)."""
        minted = grant.minted
        if minted is not None:
            if minted.type == "video":
                raise ProtocolError(Code.CLIENT_SECRET_WRONG_TYPE, VIDEO_SECRET_ON_REALTIME)
            asked = requested.get("model") if requested else None
            if asked is not None and asked != minted.model:
                raise ProtocolError(Code.MODEL_NOT_ALLOWED, bound_model_message(minted.model), param="session.model")
            if not requested:
                return minted.model, minted.session
            requested = {**(minted.session or {}), **requested}
        if requested is not None:
            config = SessionConfig(model=str(requested.get("model") or self.settings.model))
            apply_update(config, requested, beta=False, limits=ConfigLimits(voices=self.engine.info.voices))
            return config.model, requested
        return self.settings.model, None

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

    def _session_kwargs(self, session_id: str) -> dict[str, Any]:
        return {
            "limits": self.session_limits,
            "vad_factory": self.vad_factory,
            "rate_limits": lambda: self._rate_limits(session_id),
        }

    def _rate_limits(self, session_id: str) -> dict[str, Any]:
        """``rate_limits.updated``: the limits of the principal the session belongs to."""
        host = self.hosts.get(session_id)
        meter = host.meter if host is not None else None
        if isinstance(meter, Seat):
            return meter.rate_limits()
        return {"rate_limits": [], "tenant_limits": []}

    def serves(self, model: str) -> bool:
        return self.router.resolve(model) is not None

    def session_config(self, model: str, requested: dict[str, Any] | None, *, dialect: Dialect,
                       takes_turns: bool = False) -> SessionConfig:  # fmt: skip
        """What a new session starts with: the dialect's defaults for ``model`` (server turn
        detection where a detector runs, or where the engine takes its own turns: ``takes_turns``),
        then what a client secret was minted with (``requested``, validated when minted: a shape
        that no longer applies falls back to the defaults)."""
        kind = kind_of(dialect)
        detects = self.vad_factory is not None or (takes_turns and kind.cls.passes_engine_turns)
        config = kind.defaults(model, detects)
        if requested:
            try:
                config, _ = apply_update(
                    config, requested, beta=False, limits=ConfigLimits(voices=self.engine.info.voices)
                )
            except ProtocolError as err:  # (validated when minted: a route or voice list changed since)
                log.warning("a client secret's session settings no longer apply (%s): the defaults", err.message)
            if not detects:
                config = replace(config, turn_detection=None)  # no detector here: manual turns
        return config

    async def open_session(
        self,
        model: str,
        *,
        principal: str,
        dialect: Dialect,
        requested: dict[str, Any] | None = None,
        quota: StateQuota | None = None,
        session_id: str | None = None,
    ) -> SessionHost:
        """A new session hosted here, in ``dialect`` (built as ``session/kinds.py`` says), with
        ``session_id`` where one was given out before (an announced phone call's)."""
        found = self.route(model)
        if found is None:
            raise ProtocolError(Code.MODEL_NOT_FOUND, f"No model {model!r} here; see GET /v1/models.")
        engine, orch = found
        config = self.session_config(model, requested, dialect=dialect, takes_turns=engine.info.takes_turns)
        if "audio" not in engine.info.modalities and "audio" in config.output_modalities:
            config = replace(config, output_modalities=("text",))  # a text model answers in text
        kind = kind_of(dialect)
        sid = session_id or kind.id_prefix + secrets.token_hex(10)
        session = kind.new(self.settings, session_id=sid, config=config, engine=engine.info,
                           **self._session_kwargs(sid))  # fmt: skip
        return await SessionHost.open(self.hosting, session, orchestrator=orch, principal=principal, quota=quota)

    async def fork_session(
        self, source: str, *, principal: str, quota: StateQuota | None = None, minted: str | None = None
    ) -> SessionHost:
        """A new session hosted here that carries on the stored session ``source`` (its
        conversation and settings: ``RealtimeSession.fork``); raises ProtocolError
        (``session_not_found``: none stored for ``principal``, or for the client secret of
        binding ``minted``; its model not served here) or StoreError."""
        state = await load_stored(self.hosting, source, principal, minted)
        found = self.route(state["config"]["model"])
        if found is None:
            raise ProtocolError(Code.MODEL_NOT_FOUND, "The stored session's model is not served here.")
        engine, orch = found
        kind = restore_kind(state)
        sid = kind.id_prefix + secrets.token_hex(10)
        session = kind.cls.fork(state, session_id=sid, engine=engine.info, **kind.new_kwargs(self.settings),
                                **self._session_kwargs(sid))  # fmt: skip
        return await SessionHost.open(self.hosting, session, orchestrator=orch, principal=principal, quota=quota)

    def restore_session(self, state: dict[str, Any]) -> tuple[RealtimeSession, Orchestrator]:
        """A session taken over from the store, rebuilt on this replica's engine (in its dialect)
        from its snapshot's head: its conversation is loaded once the resume is answered
        (``SessionHost.load_conversation``)."""
        found = self.route(state["config"]["model"])
        if found is None:
            raise ProtocolError(Code.MODEL_NOT_FOUND, "This session's model is not served here any more.")
        engine, orch = found
        session = restore_kind(state).restore(
            state, engine=engine.info, conversation=False, **self._session_kwargs(state["id"])
        )
        return session, orch

    @property
    def serves_video(self) -> bool:
        return self.video_engine is not None

    @property
    def video_model(self) -> str | None:
        """The model ``/v1/realtime/video`` serves, by name (None: no video engine, or one
        that names none): a ``session.start`` may name no other."""
        if self.video_engine is None:
            return None
        return self.settings.video_model or self.video_engine.info.model

    def video_allowed(self, grant: Grant) -> bool:
        """Whether ``grant`` may use the video model (its tenant's allow-list must name it: a
        video engine that names no model is open only to principals without one)."""
        model, tenant = self.video_model, grant.tenant
        return tenant.models is None or (model is not None and tenant.allows_model(model))

    async def open_video(self, principal: str, peer: VideoPeer) -> VideoHost:
        """A new streaming video session, owned in the store before it returns."""
        assert self.video_engine is not None
        info = replace(self.video_engine.info, model=self.video_model)
        limits = InteractionLimits(self.settings.video_interactions_per_s, self.settings.video_max_interaction_ids)
        session = VideoSession(session_id="vsess_" + secrets.token_hex(10), info=info, limits=limits)
        timeouts = VideoTimeouts(
            start_s=self.settings.video_start_timeout_s, stall_s=self.settings.video_stall_timeout_s
        )
        return await VideoHost.open(self.hosting, session, orchestrator=self.orchestrator, principal=principal,
                                    peer=peer, timeouts=timeouts)  # fmt: skip

    # --- health -------------------------------------------------------------------

    def engine_health(self) -> dict[str, str]:
        """Each engine's state by route name: ok, failed: <why>, or unhealthy."""
        health: dict[str, str] = {}
        named = {s.key for s in self.router.named()}
        for spec in self.router.specs:
            if is_pattern(spec.name) and spec.key in named:
                continue  # a pattern's engine is reported under its named route
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
        """Ready when not draining, the store answers (so sessions can open and resume here)
        and every engine is healthy."""
        if self.draining:
            return False, "draining"
        health = self.store.health
        if not health.up:
            return False, f"store_unavailable: {health.reason}"
        bad = {name: state for name, state in self.engine_health().items() if state != "ok"}
        if bad:
            return False, "; ".join(f"{name}: {state}" for name, state in bad.items())
        return True, "ready"

    def not_ready_reason(self) -> str | None:
        """Why ``ready`` says no, in one word anyone may read (``/readyz``'s ``reason``):
        draining, store_unavailable or engine_unhealthy; None: ready."""
        ok, reason = self.ready()
        if ok:
            return None
        return reason.split(":", 1)[0] if reason.startswith(("draining", "store_unavailable")) else "engine_unhealthy"

    # --- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        if self.auth.jwt is not None:
            await self.auth.jwt.start()
        for engine in self.router.engines.values():
            await engine.start()
        if self.video_engine is not None:
            await self.video_engine.start()
        loop = asyncio.get_running_loop()
        self._watch_task = loop.create_task(self.store_watch.run(), name="store-watch")
        self._bus_task = loop.create_task(listen_bus(self.hosting), name="bus")
        self._lease_task = loop.create_task(renew_leases(self.hosting), name="leases")
        self._quota_task = loop.create_task(self.quotas.run(), name="tenant-entries")
        if self.settings.malloc_trim_s > 0:  # give memory back (allocator.py; the trims with glibc only)
            ALLOCATOR.tune()
            trimming = ALLOCATOR.trim_loop(self.settings.malloc_trim_s, self.metrics.gc_pauses.observe)
            self._trim_task = loop.create_task(trimming, name="malloc-trim")
        if self.calls is not None:
            await self.calls.start()  # checks the UDP port range and aiortc's receive buffer (warnings)
        if self.sip is not None:
            await self.sip.start()

    async def drain(self) -> None:
        """SIGTERM: stop taking sessions, and hand each session over at its own first idle
        moment (between answers and turns: ``SessionHost.idle``), closing its sockets with
        1012 so the client resumes on another replica, with nothing cut. Handovers are paced
        (``DRAIN_GAP_S`` apart at most), so sessions idle at once do not land on the other
        replicas in one instant. At ``drain_window_s`` every session left is handed over as
        it is (a running answer is ended and re-issued by the replica that resumes it, with
        ``gateway_reason`` ``drained``). A carrier's phone call cannot reconnect: its session
        is left alone until the call ends, then handed over as the others; a call still on at
        the end of the window is ended then (close 1012). Session state stays in the store."""
        if self.draining:
            return
        self.draining = True
        hosts = list(self.hosts.values())
        window = self.settings.drain_window_s
        log.info("draining: %d sessions, up to %.0f s", len(hosts), window)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + window
        idle: asyncio.Queue[SessionHost] = asyncio.Queue()
        for host in hosts:
            host.when_idle(idle.put_nowait)
        gap = min(DRAIN_GAP_S, window / (4 * max(1, len(hosts))))
        left = set(hosts)
        # A phone call cannot reconnect: its session is handed over once the call has ended
        # (at its next idle moment), or at the end of the window, which ends the call.
        calls = {h for h in hosts if h.holds_call}
        for host in calls:
            host.when_idle(None)
        ends: list[asyncio.Task[Any]] = []
        while left and loop.time() < deadline:
            try:
                host = await asyncio.wait_for(idle.get(), min(0.2, max(0.0, deadline - loop.time())))
            except TimeoutError:
                left = {h for h in left if not h.ended}  # (ended on their own: client gone)
                for done in [h for h in calls if not h.holds_call]:  # the call ended: hand over when idle
                    calls.discard(done)
                    done.when_idle(idle.put_nowait)
                continue
            if host in calls:
                continue  # (queued before the drain knew it holds a call: it waits for the call's end)
            if host.ended or host not in left:
                left.discard(host)
                continue
            if not host.idle():  # busy again since it was queued: at its next idle moment
                host.when_idle(idle.put_nowait)
                continue
            left.discard(host)
            ends.append(host.hand_over(CloseCode.SERVICE_RESTART, "service restart: reconnect and resume"))
            await asyncio.sleep(gap)
        for host in left:  # the window ran out: as they are
            if not host.ended:
                ends.append(host.hand_over(CloseCode.SERVICE_RESTART, "service restart: reconnect and resume"))
        for door in list(self.hosting.doors):  # (video sockets, and any not yet hosting a session)
            door.close(CloseCode.SERVICE_RESTART, "service restart: reconnect and resume")
        ends += [self.hosting.spawn(h.end(reason="drained")) for h in self.hosts.values()]  # (resumed here since)
        await asyncio.gather(*ends, return_exceptions=True)  # their last snapshots are in the store

    async def close(self) -> None:
        await self.drain()
        for task in (self._bus_task, self._lease_task, self._quota_task, self._trim_task, self._watch_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        for video in list(self.video_sockets.values()):
            video.close(CloseCode.SERVICE_RESTART, "service restart")
        if self.calls is not None:
            await self.calls.close()
        if self.sip is not None:
            await self.sip.close()
        for orch in self.orchestrators:
            await orch.close()
        for engine in self.router.engines.values():
            await engine.close()
        if self.video_engine is not None:
            await self.video_engine.close()
        if self.auth.jwt is not None:
            await self.auth.jwt.close()
        await self.store.close()
        if self.telemetry is not None:
            self.telemetry.shutdown()  # exports what is pending


def tenant_defaults(settings: Settings) -> TenantLimits:
    """Every principal's limits unless its keys-file entry or token says otherwise."""
    return TenantLimits(
        max_sessions=settings.tenant_max_sessions,
        session_starts_per_min=settings.tenant_session_starts_per_min,
        audio_in_s_per_min=settings.tenant_audio_in_s_per_min,
        audio_out_s_per_min=settings.tenant_audio_out_s_per_min,
        events_per_s=settings.tenant_events_per_s,
        max_secret_bytes=settings.tenant_max_secret_bytes,
        max_secrets=settings.tenant_max_secrets,
        secret_mints_per_min=settings.tenant_secret_mints_per_min,
        max_state_mib=settings.tenant_max_state_mib,
        max_kept_sessions=settings.tenant_max_kept_sessions,
        kept_session_ttl_s=settings.tenant_kept_session_ttl_s,
    )


def jwt_verifier(settings: Settings, defaults: TenantLimits) -> JwtVerifier | None:
    if not (settings.jwt_secret or settings.jwt_jwks):
        return None
    return JwtVerifier(
        secret=settings.jwt_secret,
        jwks=settings.jwt_jwks,
        issuer=settings.jwt_issuer,
        audience=settings.jwt_audience,
        leeway_s=settings.jwt_leeway_s,
        refresh_s=settings.jwks_refresh_s,
        defaults=defaults,
        max_lifetime_s=settings.jwt_max_lifetime_s,
        allow_http=settings.jwt_jwks_allow_http,
    )
