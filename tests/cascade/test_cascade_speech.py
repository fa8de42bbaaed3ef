"""The eSpeak NG synthesizer and the pocketsphinx decoder pool on their own."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest
from cascade_support import speech_16k

from orchestrator.engines.cascade.stt import PocketsphinxRecognizer
from orchestrator.engines.cascade.tts import EspeakSynthesizer


def _speak(text: str, voice: str = "en-us", speed: float = 1.0) -> bytes:
    chunks: list[bytes] = []
    assert EspeakSynthesizer().synthesize(text, voice, speed, chunks.append)
    return b"".join(chunks)


def test_every_listed_voice_speaks() -> None:
    tts = EspeakSynthesizer()
    assert tts.sample_rate == 22050
    for voice in tts.voices():
        assert len(_speak("Hello.", voice)) > tts.sample_rate * 2 // 4  # > 0.25 s


def test_unknown_voice_is_refused() -> None:
    with pytest.raises(ValueError):
        _speak("Hello.", "alloy")


def test_speed_changes_duration() -> None:
    text = "This sentence is spoken at two different speeds."
    assert len(_speak(text, speed=1.5)) < 0.8 * len(_speak(text, speed=1.0))


def test_cancel_flag_stops_synthesis_at_the_next_block() -> None:
    tts = EspeakSynthesizer()
    cancel = threading.Event()
    chunks: list[bytes] = []

    def on_chunk(pcm: bytes) -> None:
        chunks.append(pcm)
        cancel.set()

    long_text = "One two three four five six seven eight nine ten. " * 5
    assert tts.synthesize(long_text, None, 1.0, on_chunk, cancel) is False
    assert len(chunks) == 1


async def test_stream_yields_blocks_and_honours_the_cancel_flag() -> None:
    tts = EspeakSynthesizer()
    blocks = [b async for b in tts.stream("Streaming works.")]
    assert len(blocks) > 3 and all(len(b) % 2 == 0 for b in blocks)
    cancel = threading.Event()
    cancel.set()
    assert [b async for b in tts.stream("Never spoken.", cancel=cancel)] == []


async def test_leaving_a_stream_early_frees_the_worker() -> None:
    tts = EspeakSynthesizer()
    cancel = threading.Event()
    async for _ in tts.stream("One two three four five six seven eight. " * 50, cancel=cancel):
        break
    assert not cancel.is_set()  # the caller's flag is the caller's
    again = await asyncio.wait_for(_collect(tts.stream("Again.")), 5)
    assert again


async def _collect(blocks: AsyncIterator[bytes]) -> list[bytes]:
    return [b async for b in blocks]


def test_pool_is_bounded_and_reuses_decoders() -> None:
    rec = PocketsphinxRecognizer(pool_size=1)
    first = rec.open()
    assert rec.in_use == 1
    with pytest.raises(TimeoutError):
        rec.open(timeout=0.05)
    pcm = speech_16k("what is your name")
    for i in range(0, len(pcm), 16000):  # 0.5 s pieces are sliced internally
        first.feed(pcm[i : i + 16000])
    assert "what" in first.finish().split()
    assert first.finish() == first.partial()  # idempotent
    assert rec.in_use == 0
    second = rec.open(timeout=1)  # the same decoder, reused
    second.close()
    second.close()
    assert rec.in_use == 0
    rec.close()
