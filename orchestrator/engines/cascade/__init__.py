"""The embedded CPU voice cascade: pocketsphinx STT, a pluggable thinker, eSpeak NG TTS.

Imports are lazy so that ``thinker`` (pure Python) can be used without the
``cpu`` extras installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.engines.cascade.engine import CascadeEngine
    from orchestrator.engines.cascade.thinker import EchoThinker, Thinker

__all__ = ["CascadeEngine", "EchoThinker", "Thinker"]


def __getattr__(name: str) -> Any:
    if name == "CascadeEngine":
        from orchestrator.engines.cascade.engine import CascadeEngine

        return CascadeEngine
    if name in ("EchoThinker", "Thinker"):
        from orchestrator.engines.cascade import thinker

        return getattr(thinker, name)
    raise AttributeError(name)
