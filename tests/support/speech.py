"""Speech audio synthesized at test time (eSpeak NG from the espeakng-loader wheel)."""

from __future__ import annotations

from gateway.audio.resample import resample_once
from orchestrator.engines.cascade.tts import EspeakSynthesizer


async def speak(text: str, rate: int = 24000, voice: str | None = None) -> bytes:
    """PCM16 mono at ``rate`` of ``text`` spoken by eSpeak NG."""
    synth = EspeakSynthesizer()
    chunks = [chunk async for chunk in synth.stream(text, voice=voice)]
    return resample_once(b"".join(chunks), synth.sample_rate, rate)


def silence(ms: int, rate: int = 24000) -> bytes:
    return bytes(2 * rate * ms // 1000)


def chunks(pcm: bytes, ms: int = 20, rate: int = 24000) -> list[bytes]:
    step = 2 * rate * ms // 1000
    return [pcm[i : i + step] for i in range(0, len(pcm), step)]
