"""What one gateway process holds: settings, engine, orchestrator, auth,
metrics, the speech detector and the open connections."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.auth import Authenticator
from gateway.session.session import SessionLimits, VadStream
from gateway.settings import Settings
from orchestrator.engine import Engine
from orchestrator.metrics import Metrics
from orchestrator.orchestrator import AdmissionLimits, Orchestrator

if TYPE_CHECKING:
    from gateway.transport.realtime import Connection

log = logging.getLogger("omni.runtime")


def build_engine(name: str) -> Engine:
    """The engine registry: each backend is imported only when chosen."""
    if name == "passthrough":
        from orchestrator.engines.passthrough import PassthroughEngine

        return PassthroughEngine()
    if name == "cascade":
        from orchestrator.engines.cascade import CascadeEngine

        return CascadeEngine()
    raise ValueError(f"unknown engine {name!r}; choose cascade or passthrough")


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
    ) -> None:
        self.settings = settings
        self.engine = engine if engine is not None else build_engine(settings.engine)
        self.metrics = metrics or Metrics()
        self.orchestrator = Orchestrator(
            self.engine,
            AdmissionLimits(
                max_transcriptions=settings.max_transcriptions,
                max_responses=settings.max_responses,
                admission_timeout_s=settings.admission_timeout_s,
            ),
            self.metrics,
        )
        self.auth = Authenticator(settings.api_keys, required=settings.requires_auth)
        self.session_limits = SessionLimits(
            max_append_ms=settings.max_append_ms,
            max_buffer_ms=settings.max_buffer_ms,
            max_items=settings.max_conversation_items,
            lifetime_s=settings.session_lifetime_s,
        )
        self.vad_factory: Callable[[], VadStream] | None = load_vad() if vad_factory is True else (vad_factory or None)
        self.connections: set[Connection] = set()
        self.draining = False

    def rate_limits(self) -> list[dict[str, Any]]:
        stats = self.orchestrator.stats()
        limit = stats["max_responses"]
        return [
            {
                "name": "requests",
                "limit": limit,
                "remaining": max(0, limit - stats["running_responses"]),
                "reset_seconds": 0,
            }
        ]

    def ready(self) -> tuple[bool, str]:
        if self.draining:
            return False, "draining"
        if self.orchestrator.engine_failed is not None:
            return False, f"engine failed: {self.orchestrator.engine_failed}"
        if not self.engine.healthy():
            return False, "engine unhealthy"
        return True, "ready"

    async def start(self) -> None:
        await self.engine.start()

    async def close(self) -> None:
        from gateway.protocol.errors import CloseCode

        for conn in list(self.connections):
            conn.close(CloseCode.GOING_AWAY, "server shutting down")
        await self.orchestrator.close()
        await self.engine.close()
