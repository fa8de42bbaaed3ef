"""CascadeEngine end to end: real pocketsphinx, real eSpeak NG."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from cascade_support import EngineFactory, audio_chunks, collect, no_input, speech_16k

from orchestrator.engine import (
    AudioDelta,
    Engine,
    EngineError,
    EngineInput,
    EngineOutput,
    Finished,
    Message,
    ResponseRequest,
    TextChunk,
    TextDelta,
    TranscriptionRequest,
)
from orchestrator.engines.cascade.thinker import EchoThinker
from orchestrator.engines.cascade.tts import EspeakSynthesizer

# eSpeak NG varies its pitch slightly from call to call, so recognition is
# checked on phrases pocketsphinx got right on 12 of 12 synthesis variants.
RELIABLE = [("i want to go home", "want"), ("what is your name", "what")]


def _user(text: str) -> tuple[Message, ...]:
    return (Message(role="user", text=text),)


def _texts(outs: list[EngineOutput]) -> str:
    return "".join(o.text for o in outs if isinstance(o, TextDelta))


class GatedThinker:
    """Says one sentence, then waits for ``gate`` before saying the rest."""

    def __init__(self, first: str, rest: str) -> None:
        self.first, self.rest = first, rest
        self.gate = asyncio.Event()
        self.finished = False

    async def think(self, messages: tuple[Message, ...], instructions: str) -> AsyncIterator[str]:
        yield self.first
        await self.gate.wait()
        yield self.rest
        self.finished = True


class EndlessThinker:
    async def think(self, messages: tuple[Message, ...], instructions: str) -> AsyncIterator[str]:
        while True:
            yield "Another sentence to say. "
            await asyncio.sleep(0)


async def test_engine_satisfies_the_protocol(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    assert isinstance(engine, Engine)
    assert engine.healthy()
    assert engine.info.name == "cascade"
    assert engine.info.input_sample_rate == 16000
    assert engine.info.output_sample_rate == 22050
    assert engine.info.default_voice in engine.info.voices
    assert engine.info.transcription_models == ("pocketsphinx",)
    await engine.close()
    assert not engine.healthy()


@pytest.mark.parametrize(("phrase", "word"), RELIABLE)
async def test_transcribes_synthesized_speech(make_engine: EngineFactory, phrase: str, word: str) -> None:
    engine = await make_engine(stt_pool_size=1)
    pcm = speech_16k(phrase)
    outs = await collect(engine.transcribe(TranscriptionRequest("t1"), audio_chunks(pcm)))
    final = outs[-1]
    assert isinstance(final, Finished)
    assert word in final.text.split()
    assert sum(isinstance(o, Finished) for o in outs) == 1
    # ~0.1 s per audio token.
    assert final.usage.input_audio_tokens == round(len(pcm) / 2 / 16000 * 10)
    # Deltas are whole words, space-joined, so they concatenate to readable text.
    deltas = [o.text for o in outs if isinstance(o, TextDelta)]
    assert deltas and not deltas[0].startswith(" ")
    assert all(d.startswith(" ") for d in deltas[1:])
    assert "  " not in "".join(deltas)


async def test_respond_streams_sentence_text_then_its_audio(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    req = ResponseRequest("r1", _user("good morning. how are you"), modalities=("audio",))
    outs = await collect(engine.respond(req, no_input()))
    assert isinstance(outs[0], TextDelta)  # a sentence's text comes before its audio
    audio = [o for o in outs if isinstance(o, AudioDelta)]
    assert len(audio) > 10
    max_bytes = 22050 * 40 // 1000 * 2
    assert all(0 < len(a.pcm) <= max_bytes and len(a.pcm) % 2 == 0 for a in audio)
    # Every sentence is spoken in full (a cancel flag must not leak between them).
    direct: list[bytes] = []
    EspeakSynthesizer().synthesize("You said: good morning. how are you", None, 1.0, direct.append)
    spoken = sum(len(a.pcm) for a in audio)
    assert spoken > 0.8 * len(b"".join(direct))
    final = outs[-1]
    assert isinstance(final, Finished) and final.reason == "stop"
    assert final.text == _texts(outs) == "You said: good morning. how are you"
    assert final.usage.output_text_tokens == 7
    seconds = sum(len(a.pcm) for a in audio) / 2 / 22050
    assert final.usage.output_audio_tokens == round(seconds * 10)


async def test_first_audio_arrives_before_the_thinker_finishes(make_engine: EngineFactory) -> None:
    thinker = GatedThinker("Hello there. ", "This part comes later.")
    engine = await make_engine(thinker)
    req = ResponseRequest("r1", _user("hi"), modalities=("audio",))
    seen: list[EngineOutput] = []
    async with asyncio.timeout(20):
        async for out in engine.respond(req, no_input()):
            seen.append(out)
            if isinstance(out, AudioDelta) and not thinker.gate.is_set():
                # The thinker is still blocked: this audio was spoken early.
                assert not thinker.finished
                assert _texts(seen) == "Hello there."
                thinker.gate.set()
    assert thinker.finished
    assert isinstance(seen[-1], Finished)
    assert seen[-1].text == "Hello there. This part comes later."


async def test_text_only_modality_streams_no_audio(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    req = ResponseRequest("r1", _user("one two three"), modalities=("text",))
    outs = await collect(engine.respond(req, no_input()))
    assert not any(isinstance(o, AudioDelta) for o in outs)
    # Text-only deltas stream as the thinker makes them (word by word).
    assert [o.text for o in outs[:-1] if isinstance(o, TextDelta)] == ["You", " said:", " one", " two", " three"]
    assert all(isinstance(o, TextDelta) for o in outs[:-1])
    assert isinstance(outs[-1], Finished) and outs[-1].usage.output_audio_tokens == 0


async def test_max_output_tokens_cuts_at_a_word_and_reports_length(
    make_engine: EngineFactory,
) -> None:
    engine = await make_engine()
    req = ResponseRequest("r1", _user("alpha beta gamma delta"), max_output_tokens=3)
    outs = await collect(engine.respond(req, no_input()))
    final = outs[-1]
    assert isinstance(final, Finished)
    assert final.reason == "length"
    assert final.text == _texts(outs) == "You said: alpha"
    assert any(isinstance(o, AudioDelta) for o in outs)  # what fits is still spoken


async def test_streamed_text_extends_the_last_user_message(make_engine: EngineFactory) -> None:
    engine = await make_engine()

    async def inputs() -> AsyncIterator[EngineInput]:
        yield TextChunk(" and more")

    req = ResponseRequest("r1", _user("some"), modalities=("text",))
    outs = await collect(engine.respond(req, inputs()))
    assert isinstance(outs[-1], Finished) and outs[-1].text == "You said: some and more"


async def test_echo_without_user_text_says_so() -> None:
    words = [w async for w in EchoThinker().think((Message("system", "be nice"),), "")]
    assert "".join(words) == "I did not catch that."


async def test_unknown_voice_fails_with_a_stable_code(make_engine: EngineFactory) -> None:
    engine = await make_engine()
    req = ResponseRequest("r1", _user("hi"), voice="alloy")
    with pytest.raises(EngineError) as info:
        await collect(engine.respond(req, no_input()))
    assert info.value.code == "invalid_voice"


async def test_abort_ends_a_response_promptly(make_engine: EngineFactory) -> None:
    engine = await make_engine(EndlessThinker())
    outputs = engine.respond(ResponseRequest("r1", _user("hi")), no_input())
    got_audio = 0
    async with asyncio.timeout(10):
        async for out in outputs:
            if isinstance(out, AudioDelta):
                got_audio += 1
                if got_audio == 3:
                    await engine.abort("r1")
            if isinstance(out, Finished):
                break
    assert got_audio <= 5  # stopped within the block it was speaking
    assert isinstance(out, Finished) and out.reason == "stop"
    assert out.text.startswith("Another sentence to say.")
    assert "r1" not in engine._requests


async def test_abort_returns_the_decoder_to_the_pool(make_engine: EngineFactory) -> None:
    engine = await make_engine(stt_pool_size=1)
    never = asyncio.Event()  # the first stream never ends on its own
    first = engine.transcribe(TranscriptionRequest("a"), audio_chunks(speech_16k("yes"), then_wait=never))
    second = engine.transcribe(TranscriptionRequest("b"), audio_chunks(speech_16k("no")))
    first_task = asyncio.create_task(collect(first))
    second_task = asyncio.create_task(collect(second))
    await asyncio.sleep(0.5)
    assert not second_task.done()  # waits: the only decoder is taken
    await engine.abort("a")
    first_outs = await asyncio.wait_for(first_task, 5)
    assert isinstance(first_outs[-1], Finished)
    second_outs = await asyncio.wait_for(second_task, 20)
    assert isinstance(second_outs[-1], Finished)


async def test_cancelling_the_consumer_frees_the_decoder(make_engine: EngineFactory) -> None:
    engine = await make_engine(stt_pool_size=1)
    never = asyncio.Event()
    first = engine.transcribe(TranscriptionRequest("a"), audio_chunks(speech_16k("yes"), then_wait=never))
    first_task = asyncio.create_task(collect(first))
    await asyncio.sleep(0.5)
    first_task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first_task
    await engine.abort("a")  # what the orchestrator does next; harmless here
    pcm = speech_16k("what is your name")
    outs = await collect(engine.transcribe(TranscriptionRequest("b"), audio_chunks(pcm)), 20)
    assert isinstance(outs[-1], Finished) and "what" in outs[-1].text.split()
    assert engine._stt.in_use == 0


async def test_abort_while_waiting_for_a_decoder_gives_nothing_away(
    make_engine: EngineFactory,
) -> None:
    engine = await make_engine(stt_pool_size=1)
    hold = asyncio.Event()
    holder = asyncio.create_task(
        collect(engine.transcribe(TranscriptionRequest("a"), audio_chunks(b"", then_wait=hold)))
    )
    waiter = asyncio.create_task(collect(engine.transcribe(TranscriptionRequest("b"), audio_chunks(speech_16k("yes")))))
    await asyncio.sleep(0.3)
    await engine.abort("b")
    outs = await asyncio.wait_for(waiter, 5)
    assert outs == [Finished()]  # nothing was decoded
    hold.set()
    await asyncio.wait_for(holder, 5)
    # The pool has exactly one slot again: a third request runs.
    third = await collect(engine.transcribe(TranscriptionRequest("c"), audio_chunks(b"\0\0" * 320)))
    assert isinstance(third[-1], Finished)
