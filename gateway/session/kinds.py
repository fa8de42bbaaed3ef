"""How the sessions of each dialect are built, beside the dialect (the session floor's half).

A protocol ``Dialect`` (gateway/protocol/dialects.py) is the one object the
floors consult about a connection's language; this is what the session floor
keeps beside each one: which session class speaks it and the settings a new
session starts with. The runtime opens and restores every session through
``kind_of(dialect)``, so that a new dialect is a new entry here and files of
its own, never a branch in hosting or the runtime.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.protocol import dialects
from gateway.protocol.dialects import Dialect
from gateway.protocol.duplex_config import DuplexConfig, default_session_config
from gateway.protocol.session_config import SessionConfig, TurnDetection
from gateway.session.duplex import DuplexSession
from gateway.session.live import LiveSession
from gateway.session.session import RealtimeSession
from gateway.settings import Settings


@dataclass(frozen=True, slots=True)
class SessionKind:
    """The sessions of one dialect."""

    cls: type[RealtimeSession]
    new_kwargs: Callable[[Settings], dict[str, Any]]  # what a new session of the dialect is built with, beyond
    #   the common, from the gateway's settings
    defaults: Callable[[str, bool], SessionConfig]  # (model, a speech detector runs here): a new session's settings
    id_prefix: str = "sess_"  # of the session ids it hands out

    def new(self, settings: Settings, **kwargs: Any) -> RealtimeSession:
        return self.cls(**self.new_kwargs(settings), **kwargs)

    def restore(self, state: dict[str, Any], **kwargs: Any) -> RealtimeSession:
        return self.cls.restore(state, **kwargs)


def _realtime_defaults(model: str, vad: bool) -> SessionConfig:
    """The Realtime API's: server VAD where a detector runs (else the client commits turns)."""
    return SessionConfig(model=model, turn_detection=TurnDetection() if vad else None)


def _duplex_defaults(model: str, vad: bool) -> SessionConfig:
    return default_session_config(model)  # upstream's defaults


KINDS: dict[Dialect, SessionKind] = {
    dialects.GA: SessionKind(RealtimeSession, lambda s: {}, _realtime_defaults),
    dialects.BETA: SessionKind(RealtimeSession, lambda s: {"beta": True}, _realtime_defaults),
    dialects.DUPLEX: SessionKind(DuplexSession, lambda s: {"duplex": DuplexConfig()}, _duplex_defaults),
    # A Live session with Responses delegation needs the gateway's Responses backend.
    dialects.LIVE: SessionKind(
        LiveSession,
        lambda s: {"responses_backend": bool(s.live_responses_url), "output_lead_ms": s.live_output_lead_ms},
        _realtime_defaults,
        id_prefix="live_",
    ),
}


def kind_of(dialect: Dialect) -> SessionKind:
    return KINDS[dialect]


def restore_kind(state: dict[str, Any]) -> SessionKind:
    """The kind a snapshot was written by (snapshots older than the ``dialect`` key: GA or beta)."""
    name = state.get("dialect") or ("beta" if state.get("beta") else "ga")
    return KINDS[dialects.by_name(name)]
