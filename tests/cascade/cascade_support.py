"""Helpers shared by the cascade tests (a plain module: ``conftest`` is not
importable reliably when several test folders have one)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from gateway.audio.resample import resample_once
from orchestrator.engine import AudioChunk, EngineOutput
from orchestrator.engines.cascade.engine import CascadeEngine
from orchestrator.engines.cascade.tts import EspeakSynthesizer

CHUNK_BYTES = 16000 * 2 * 20 // 1000  # 20 ms of 16 kHz PCM16


def speech_16k(text: str, voice: str = "en-us", pad_s: float = 0.3) -> bytes:
    """eSpeak NG speech resampled to 16 kHz, with silence around it (as a mic would)."""
    tts = EspeakSynthesizer()
    chunks: list[bytes] = []
    tts.synthesize(text, voice, 1.0, chunks.append)
    pad = bytes(int(16000 * pad_s) * 2)
    return pad + resample_once(b"".join(chunks), tts.sample_rate, 16000) + pad


async def audio_chunks(pcm: bytes, *, then_wait: asyncio.Event | None = None) -> AsyncIterator[AudioChunk]:
    """``pcm`` in 20 ms chunks; with ``then_wait``, the stream stays open until it is set."""
    for i in range(0, len(pcm), CHUNK_BYTES):
        yield AudioChunk(pcm[i : i + CHUNK_BYTES])
    if then_wait is not None:
        await then_wait.wait()


async def no_input() -> AsyncIterator[AudioChunk]:
    return
    yield  # makes this an async generator


async def collect(outputs: AsyncIterator[EngineOutput], timeout: float = 20.0) -> list[EngineOutput]:
    async def run() -> list[EngineOutput]:
        return [o async for o in outputs]

    return await asyncio.wait_for(run(), timeout)


EngineFactory = Callable[..., Awaitable[CascadeEngine]]
