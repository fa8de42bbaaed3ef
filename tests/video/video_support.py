"""Helpers for the CPU video engine tests: decoding, pure renderings, pixel blends."""

from __future__ import annotations

import io
from collections.abc import Awaitable, Callable

import av
import numpy as np

from orchestrator.engines.video.engine import CpuVideoEngine
from orchestrator.engines.video.render import RenderState, render_chunk
from orchestrator.video_engine import VideoChunk, VideoRequest


def decode_mp4(data: bytes) -> list[av.VideoFrame]:
    """Every frame of an fMP4 byte stream (init segment + fragments), via FFmpeg."""
    with av.open(io.BytesIO(data), mode="r", format="mp4") as container:
        return list(container.decode(video=0))


def rgb(frames: list[av.VideoFrame]) -> np.ndarray:
    return np.stack([f.to_ndarray(format="rgb24") for f in frames]).astype(np.float32)


def pure_frames(prompt: str, request: VideoRequest, n_frames: int) -> np.ndarray:
    """Frames 0..n-1 of ``prompt`` alone, with no interaction (float RGB)."""
    state = RenderState(prompt, request.width, request.height, request.fps, request.chunk_frames, request.seed or 0)
    return render_chunk(state, n_frames).numpy().astype(np.float32)


def blend_alpha(frame: np.ndarray, old: np.ndarray, new: np.ndarray) -> float:
    """Least-squares weight a of ``frame`` ≈ (1-a)·old + a·new."""
    d = (new - old).ravel()
    return float(np.dot((frame - old).ravel(), d) / np.dot(d, d))


async def run(
    engine: CpuVideoEngine,
    request: VideoRequest,
    on_chunk: Callable[[VideoChunk], Awaitable[None]] | None = None,
) -> list[VideoChunk]:
    """All chunks of ``request``; ``on_chunk`` runs after each one arrives,
    before the next is asked for (so its interactions land on the next chunk)."""
    chunks: list[VideoChunk] = []
    async for chunk in engine.generate_video(request):
        chunks.append(chunk)
        if on_chunk is not None:
            await on_chunk(chunk)
    return chunks
