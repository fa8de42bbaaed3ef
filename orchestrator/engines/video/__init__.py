"""The embedded CPU video engine (and, re-exported, the video engine protocol).

The protocol and data types live in ``orchestrator/video_engine.py`` and import
nothing heavy; the engine itself (torch, PyAV) is imported on first use of
``CpuVideoEngine``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.video_engine import (
    ERROR_CODES,
    CameraMove,
    Interaction,
    VideoChunk,
    VideoEngine,
    VideoEngineInfo,
    VideoFormat,
    VideoRequest,
    default_frames_per_chunk,
    validate_interaction,
    validate_request,
)

if TYPE_CHECKING:
    from orchestrator.engines.video.engine import CpuVideoEngine

__all__ = [
    "ERROR_CODES",
    "CameraMove",
    "CpuVideoEngine",
    "Interaction",
    "VideoChunk",
    "VideoEngine",
    "VideoEngineInfo",
    "VideoFormat",
    "VideoRequest",
    "default_frames_per_chunk",
    "validate_interaction",
    "validate_request",
]


def __getattr__(name: str) -> Any:
    if name == "CpuVideoEngine":
        from orchestrator.engines.video.engine import CpuVideoEngine

        return CpuVideoEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
