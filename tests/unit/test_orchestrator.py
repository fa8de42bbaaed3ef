"""The orchestrator: admission and its bound, pause/resume, the input pump,
cancellation and engine failures; transcriptions stepped in place and responses the
engine pushes.

The engine here is a test double written for these tests (``ScriptedEngine``):
a real ``Engine`` implementation whose behaviour each test chooses, and which
records what reached it, so each rule can be checked from the engine's side.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from gateway.runtime import Runtime
from gateway.settings import Settings
from orchestrator.engine import (
    AudioChunk,
    AudioDelta,
    Engine,
    EngineError,
    EngineInfo,
    EngineInput,
    EngineOutput,
    Finished,
    FunctionTool,
    Message,
    ResponseRequest,
    TextChunk,
    TextDelta,
    ToolChoice,
    TranscriptionRequest,
)
from orchestrator.engines.passthrough import PassthroughEngine
from orchestrator.orchestrator import AdmissionLimits, Orchestrator, RequestHandle


@dataclass
class Seen:
    """What one request looked like from inside the engine."""

    inputs: list[Any] = field(default_factory=list)
    input_ended: bool = False  # the input iterator ended normally (the final marker)
    closed: bool = False  # the output generator was finalised


class ScriptedEngine:
    """Echoes each input chunk as a TextDelta; behaviour per request id prefix:

    ``hang*``: after the input ends, wait until ``release(rid)``;
    ``boom*``: raise RuntimeError after the first input;
    ``fatal*`` / ``bad*``: raise EngineError (fatal / not fatal) after the first input.
    """

    def __init__(self) -> None:
        self.info = EngineInfo(name="scripted", description="test double")
        self.seen: dict[str, Seen] = {}
        self.started: list[str] = []
        self.aborted: list[str] = []
        self.is_healthy = True
        self._gates: dict[str, asyncio.Event] = {}

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def healthy(self) -> bool:
        return self.is_healthy

    def gate(self, rid: str) -> asyncio.Event:
        return self._gates.setdefault(rid, asyncio.Event())

    def release(self, rid: str) -> None:
        self.gate(rid).set()

    async def _run(self, rid: str, inputs: AsyncIterator[Any]) -> AsyncIterator[EngineOutput]:
        self.started.append(rid)
        seen = self.seen[rid] = Seen()
        try:
            async for chunk in inputs:
                seen.inputs.append(chunk)
                if rid.startswith("boom"):
                    raise RuntimeError("model exploded")
                if rid.startswith("fatal"):
                    raise EngineError("engine_unavailable", "GPU fell off the bus", fatal=True)
                if rid.startswith("bad"):
                    raise EngineError("engine_error", "one request failed")
                yield TextDelta(chunk.text if isinstance(chunk, TextChunk) else f"{len(chunk.pcm)}")
            seen.input_ended = True
            if rid.startswith("hang"):
                await self.gate(rid).wait()
            yield Finished(text="done")
        finally:
            seen.closed = True

    def transcribe(
        self, request: TranscriptionRequest, inputs: AsyncIterator[AudioChunk]
    ) -> AsyncIterator[EngineOutput]:
        return self._run(request.request_id, inputs)

    def respond(self, request: ResponseRequest, inputs: AsyncIterator[EngineInput]) -> AsyncIterator[EngineOutput]:
        return self._run(request.request_id, inputs)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


class Recorder:
    def __init__(self) -> None:
        self.outputs: list[EngineOutput] = []
        self.errors: list[tuple[str, str]] = []

    def submit(self, orch: Orchestrator, rid: str, kind: str = "response") -> RequestHandle:
        request: Any = ResponseRequest(rid, ()) if kind == "response" else TranscriptionRequest(rid)
        return orch.submit(
            kind,  # type: ignore[arg-type]
            request,
            on_output=self.outputs.append,
            on_error=lambda code, msg: self.errors.append((code, msg)),
        )


async def settle(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def until(predicate: Any, timeout: float = 2.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.001)


@pytest.fixture
def engine() -> ScriptedEngine:
    return ScriptedEngine()


def test_scripted_engine_is_an_engine(engine: ScriptedEngine) -> None:
    assert isinstance(engine, Engine)


# --- the input pump ---------------------------------------------------------------


async def test_fed_chunks_reach_the_engine_in_order_and_end_closes_the_input(engine: ScriptedEngine) -> None:
    orch, rec = Orchestrator(engine), Recorder()
    h = rec.submit(orch, "r1")
    chunks = [TextChunk("a"), AudioChunk(b"\x00" * 4), TextChunk("b"), TextChunk("c")]
    for c in chunks[:2]:
        h.feed(c)
    await settle()
    for c in chunks[2:]:
        h.feed(c)
    h.end()
    await asyncio.wait_for(h.task, 2)
    assert engine.seen["r1"].inputs == chunks
    assert engine.seen["r1"].input_ended
    assert rec.outputs == [TextDelta("a"), TextDelta("4"), TextDelta("b"), TextDelta("c"), Finished(text="done")]
    assert rec.errors == []
    assert orch.pending == 0
    await orch.wait_idle()
    assert engine.aborted == []  # a completed request is not aborted


async def test_feed_after_end_is_ignored(engine: ScriptedEngine) -> None:
    orch, rec = Orchestrator(engine), Recorder()
    h = rec.submit(orch, "r1")
    h.feed(TextChunk("a"))
    h.end()
    h.feed(TextChunk("late"))
    h.end()
    await asyncio.wait_for(h.task, 2)
    assert engine.seen["r1"].inputs == [TextChunk("a")]


async def test_transcriptions_and_responses_use_their_engine_call(engine: ScriptedEngine) -> None:
    orch, rec = Orchestrator(engine), Recorder()
    h = rec.submit(orch, "t1", kind="transcription")
    h.feed(AudioChunk(b"\x00\x00"))
    h.end()
    await asyncio.wait_for(h.task, 2)
    assert rec.outputs[0] == TextDelta("2")
    assert h.kind == "transcription"
    text = orch.metrics.registry.get_sample_value(
        "omni_requests_total", {"kind": "transcription", "status": "completed"}
    )
    assert text == 1.0


# --- cancel -------------------------------------------------------------------------


async def test_cancel_aborts_the_engine_request_and_leaves_no_task(engine: ScriptedEngine) -> None:
    orch, rec = Orchestrator(engine), Recorder()
    h = rec.submit(orch, "r1")
    h.feed(TextChunk("a"))
    await until(lambda: engine.seen.get("r1") and engine.seen["r1"].inputs)
    assert orch.running == 1
    h.cancel()
    await orch.wait_idle()
    assert engine.aborted == ["r1"]
    assert orch.pending == 0
    assert orch.running == 0
    assert h.task.cancelled()
    assert engine.seen["r1"].closed  # the engine's generator was finalised
    assert rec.errors == []  # a cancel is not an error
    assert orch.stats()["running_responses"] == 0
    cancelled = orch.metrics.registry.get_sample_value(
        "omni_requests_total", {"kind": "response", "status": "cancelled"}
    )
    assert cancelled == 1.0


async def test_cancel_sends_no_final_marker(engine: ScriptedEngine) -> None:
    orch, rec = Orchestrator(engine), Recorder()
    h = rec.submit(orch, "r1")
    h.feed(TextChunk("a"))
    await until(lambda: engine.seen.get("r1") and engine.seen["r1"].inputs)
    h.cancel()
    await orch.wait_idle()
    assert engine.seen["r1"].inputs == [TextChunk("a")]
    assert not engine.seen["r1"].input_ended


async def test_end_then_cancel_still_aborts_a_running_request(engine: ScriptedEngine) -> None:
    orch, rec = Orchestrator(engine), Recorder()
    h = rec.submit(orch, "hang1")
    h.end()
    await until(lambda: engine.seen.get("hang1") and engine.seen["hang1"].input_ended)
    h.cancel()
    await orch.wait_idle()
    assert engine.aborted == ["hang1"]
    assert orch.pending == 0


async def test_cancel_before_admission_never_reaches_the_engine(engine: ScriptedEngine) -> None:
    orch, rec = Orchestrator(engine), Recorder()
    await orch.pause()
    h = rec.submit(orch, "r1")
    await settle()
    h.cancel()
    await orch.wait_idle()
    assert engine.started == []
    assert orch.pending == 0
    assert rec.errors == []
    await orch.resume()
    h2 = rec.submit(orch, "r2")
    h2.end()
    await asyncio.wait_for(h2.task, 2)
    assert engine.started == ["r2"]  # the cancelled waiter left no slot or admission count behind
    assert orch.stats()["admitting"] == 0


async def test_close_cancels_every_request(engine: ScriptedEngine) -> None:
    orch, rec = Orchestrator(engine), Recorder()
    for rid in ("hang1", "hang2"):
        rec.submit(orch, rid).end()
    await until(lambda: len(engine.started) == 2)
    await orch.close()
    assert orch.pending == 0
    assert sorted(engine.aborted) == ["hang1", "hang2"]


# --- admission ------------------------------------------------------------------


async def test_admission_is_bounded_and_a_waiting_request_starts_when_a_slot_frees(engine: ScriptedEngine) -> None:
    orch, rec = Orchestrator(engine, AdmissionLimits(max_responses=1, admission_timeout_s=5)), Recorder()
    a = rec.submit(orch, "hang_a")
    a.end()
    await until(lambda: engine.started == ["hang_a"])
    b = rec.submit(orch, "b")
    b.end()
    await asyncio.sleep(0.05)
    assert engine.started == ["hang_a"]  # b waits for the slot
    assert orch.pending == 2 and orch.running == 1
    engine.release("hang_a")
    await asyncio.wait_for(b.task, 2)
    assert engine.started == ["hang_a", "b"]
    assert rec.errors == []
    await orch.wait_idle()
    assert orch.pending == 0


async def test_kinds_have_separate_slots(engine: ScriptedEngine) -> None:
    orch = Orchestrator(engine, AdmissionLimits(max_responses=1, max_transcriptions=1, admission_timeout_s=5))
    rec = Recorder()
    rec.submit(orch, "hang_r").end()
    await until(lambda: engine.started == ["hang_r"])
    t = rec.submit(orch, "t", kind="transcription")
    t.end()
    await asyncio.wait_for(t.task, 2)  # a busy response slot does not block a transcription
    assert engine.started == ["hang_r", "t"]
    engine.release("hang_r")
    await orch.wait_idle()


async def test_admission_timeout_fails_with_server_busy(engine: ScriptedEngine) -> None:
    orch, rec = Orchestrator(engine, AdmissionLimits(max_responses=1, admission_timeout_s=0.1)), Recorder()
    rec.submit(orch, "hang_a").end()
    await until(lambda: engine.started == ["hang_a"])
    b = rec.submit(orch, "b")
    await asyncio.wait_for(b.task, 2)
    assert [code for code, _ in rec.errors] == ["server_busy"]
    assert rec.errors[0][1]
    assert engine.started == ["hang_a"]
    assert "b" not in engine.aborted  # the engine never had it
    assert orch.pending == 1  # only the running one
    rejected = orch.metrics.registry.get_sample_value("omni_requests_total", {"kind": "response", "status": "rejected"})
    assert rejected == 1.0
    engine.release("hang_a")
    await orch.wait_idle()
    assert orch.pending == 0


async def test_unhealthy_engine_refuses_admission_with_engine_unavailable(engine: ScriptedEngine) -> None:
    orch, rec = Orchestrator(engine), Recorder()
    engine.is_healthy = False
    h = rec.submit(orch, "r1")
    await asyncio.wait_for(h.task, 2)
    assert [code for code, _ in rec.errors] == ["engine_unavailable"]
    assert engine.started == []


async def test_queue_wait_is_measured(engine: ScriptedEngine) -> None:
    orch, rec = Orchestrator(engine), Recorder()
    h = rec.submit(orch, "r1")
    h.feed(TextChunk("a"))
    h.end()
    await asyncio.wait_for(h.task, 2)
    get = orch.metrics.registry.get_sample_value
    assert get("omni_request_queue_wait_seconds_count", {"kind": "response"}) == 1.0
    assert get("omni_request_time_to_first_delta_seconds_count", {"kind": "response"}) == 1.0
    assert get("omni_requests_inflight", {"kind": "response"}) == 0.0


# --- pause / resume ------------------------------------------------------------------


async def test_pause_blocks_new_admissions_and_resume_releases_them(engine: ScriptedEngine) -> None:
    orch, rec = Orchestrator(engine, AdmissionLimits(admission_timeout_s=5)), Recorder()
    await orch.pause()
    assert orch.paused
    hs = [rec.submit(orch, f"r{i}") for i in range(3)]
    for h in hs:
        h.end()
    await asyncio.sleep(0.05)
    assert engine.started == []
    await orch.resume()
    assert not orch.paused
    await asyncio.wait_for(asyncio.gather(*(h.task for h in hs)), 2)
    assert sorted(engine.started) == ["r0", "r1", "r2"]
    assert rec.errors == []


async def test_pause_lets_running_requests_finish(engine: ScriptedEngine) -> None:
    orch, rec = Orchestrator(engine), Recorder()
    h = rec.submit(orch, "hang1")
    h.end()
    await until(lambda: engine.started == ["hang1"])
    await asyncio.wait_for(orch.pause(), 1)
    engine.release("hang1")
    await asyncio.wait_for(h.task, 2)
    assert rec.outputs[-1] == Finished(text="done")


async def test_pause_past_the_admission_timeout_fails_waiters_with_server_busy(engine: ScriptedEngine) -> None:
    orch, rec = Orchestrator(engine, AdmissionLimits(admission_timeout_s=0.1)), Recorder()
    await orch.pause()
    h = rec.submit(orch, "r1")
    await asyncio.wait_for(h.task, 2)
    assert [code for code, _ in rec.errors] == ["server_busy"]
    assert orch.pending == 0


async def test_pause_waits_for_an_admission_in_flight(engine: ScriptedEngine) -> None:
    orch, rec = Orchestrator(engine, AdmissionLimits(max_responses=1, admission_timeout_s=0.3)), Recorder()
    rec.submit(orch, "hang_a").end()
    await until(lambda: engine.started == ["hang_a"])
    b = rec.submit(orch, "b")  # past the pause gate, waiting for a slot
    b.end()
    await until(lambda: orch.stats()["admitting"] == 1)
    pause = asyncio.get_running_loop().create_task(orch.pause())
    await asyncio.sleep(0.1)
    assert not pause.done()  # b is half-way through admission
    engine.release("hang_a")  # a slot frees, but generation is now paused: b must not start
    await asyncio.wait_for(pause, 2)
    assert orch.stats()["admitting"] == 0
    await asyncio.wait_for(b.task, 2)
    assert engine.started == ["hang_a"]
    assert [code for code, _ in rec.errors] == ["server_busy"]
    await orch.resume()
    await orch.wait_idle()
    assert orch.pending == 0


# --- engine failures -------------------------------------------------------------


async def test_an_exception_in_the_engine_becomes_engine_error(engine: ScriptedEngine) -> None:
    orch, rec = Orchestrator(engine), Recorder()
    h = rec.submit(orch, "boom1")
    h.feed(TextChunk("a"))
    await asyncio.wait_for(h.task, 2)
    assert len(rec.errors) == 1
    code, message = rec.errors[0]
    assert code == "engine_error"
    assert "RuntimeError" in message
    await orch.wait_idle()
    assert engine.aborted == ["boom1"]  # the failed request is released in the engine
    assert orch.pending == 0 and orch.running == 0
    assert orch.engine_failed is None


async def test_engine_error_keeps_its_code_and_message(engine: ScriptedEngine) -> None:
    orch, rec = Orchestrator(engine), Recorder()
    h = rec.submit(orch, "bad1")
    h.feed(TextChunk("a"))
    await asyncio.wait_for(h.task, 2)
    assert rec.errors == [("engine_error", "one request failed")]
    assert orch.engine_failed is None


async def test_fatal_engine_error_turns_readiness_red(engine: ScriptedEngine) -> None:
    rt = Runtime(Settings(engine="passthrough", video_engine="none"), engine, vad_factory=None)
    assert rt.ready() == (True, "ready")
    rec = Recorder()
    h = rec.submit(rt.orchestrator, "fatal1")
    h.feed(TextChunk("a"))
    await asyncio.wait_for(h.task, 2)
    assert rec.errors == [("engine_unavailable", "GPU fell off the bus")]
    ok, reason = rt.ready()
    assert not ok
    assert "GPU fell off the bus" in reason
    h2 = rec.submit(rt.orchestrator, "r2")  # a dead engine admits nothing more
    await asyncio.wait_for(h2.task, 2)
    assert rec.errors[-1][0] == "engine_unavailable"
    assert "r2" not in engine.started
    await rt.orchestrator.wait_idle()


async def test_unhealthy_engine_turns_readiness_red(engine: ScriptedEngine) -> None:
    rt = Runtime(Settings(engine="passthrough", video_engine="none"), engine, vad_factory=None)
    engine.is_healthy = False
    assert rt.ready() == (False, "omni-cascade: unhealthy")


async def test_a_request_cancelled_before_it_ran_is_forgotten() -> None:
    """A request cancelled in the same loop turn it was submitted in never runs its
    coroutine: its handle must still leave the orchestrator (it held the session)."""
    orch = Orchestrator(PassthroughEngine(paced=False))
    handle = orch.submit(
        "transcription", TranscriptionRequest("req_early"), on_output=lambda o: None, on_error=lambda c, m: None
    )
    handle.cancel()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert handle.task.cancelled()
    assert "req_early" not in orch._handles


async def test_the_passthrough_answer_says_a_word_every_words_every_audio_chunks() -> None:
    engine = PassthroughEngine(audio_chunks=10, paced=False, words_every=4)

    async def no_input() -> Any:
        return
        yield

    outputs = [o async for o in engine.respond(ResponseRequest("r", ()), no_input())]
    kinds = ["w" if isinstance(o, TextDelta) else "a" if isinstance(o, AudioDelta) else "f" for o in outputs]
    assert "".join(kinds) == "wa" + "aaawa" + "aaawa" + "a" + "f"
    assert [o.text for o in outputs if isinstance(o, TextDelta)] == ["w0 ", "w4 ", "w8 "]
    with pytest.raises(ValueError, match="words_every"):
        PassthroughEngine(words_every=0)


# --- transcriptions stepped in place (engine.Transcriber) ------------------------------


class SteppedEngine(ScriptedEngine):
    """A ScriptedEngine whose transcriptions are stepped in place: each chunk is echoed by a
    plain call. ``boom*`` requests raise on their second chunk; every close is recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.closed: list[str] = []

    def transcriber(self, request: TranscriptionRequest) -> Any:
        engine, rid = self, request.request_id

        class Echo:
            def __init__(self) -> None:
                self.fed = 0

            def feed(self, chunk: AudioChunk) -> tuple[EngineOutput, ...]:
                self.fed += 1
                if rid.startswith("boom") and self.fed == 2:
                    raise EngineError("bad_audio", "the second chunk is refused")
                return (TextDelta(str(len(chunk.pcm))),)

            def finish(self) -> tuple[EngineOutput, ...]:
                return (Finished(text=f"{self.fed} chunks"),)

            def close(self) -> None:
                engine.closed.append(rid)

        return Echo()


async def test_a_stepped_transcription_answers_every_chunk_in_order_without_iterating_the_engine() -> None:
    engine = SteppedEngine()
    orch, rec = Orchestrator(engine), Recorder()
    h = rec.submit(orch, "r1", kind="transcription")
    h.feed(AudioChunk(b"\x00" * 2))  # before admission: queued, then stepped by the task
    await until(lambda: len(rec.outputs) == 1)
    for n in (4, 6, 8):  # after it: stepped in place, delivered on the next loop turn
        h.feed(AudioChunk(b"\x00" * n))
    assert len(rec.outputs) == 1  # not re-entering the caller
    h.end()
    await asyncio.wait_for(h.task, 2)
    assert rec.outputs == [TextDelta("2"), TextDelta("4"), TextDelta("6"), TextDelta("8"), Finished(text="4 chunks")]
    assert rec.errors == [] and engine.closed == ["r1"]
    assert "r1" not in engine.seen  # transcribe() was never called
    get = orch.metrics.registry.get_sample_value
    assert get("omni_request_time_to_first_delta_seconds_count", {"kind": "transcription"}) == 1.0


async def test_a_stepped_transcription_that_fails_on_a_chunk_fails_the_request() -> None:
    engine = SteppedEngine()
    orch, rec = Orchestrator(engine), Recorder()
    h = rec.submit(orch, "boom1", kind="transcription")
    h.feed(AudioChunk(b"\x00" * 2))
    await until(lambda: len(rec.outputs) == 1)
    h.feed(AudioChunk(b"\x00" * 4))  # raises in the engine
    await asyncio.wait_for(h.task, 2)
    assert rec.errors == [("bad_audio", "the second chunk is refused")]
    assert rec.outputs == [TextDelta("2")] and engine.closed == ["boom1"]
    await orch.wait_idle()
    assert engine.aborted == ["boom1"]  # a failed request is aborted, as an iterated one is


async def test_a_cancelled_stepped_transcription_delivers_nothing_more_and_closes() -> None:
    engine = SteppedEngine()
    orch, rec = Orchestrator(engine), Recorder()
    h = rec.submit(orch, "r1", kind="transcription")
    h.feed(AudioChunk(b"\x00" * 2))
    await until(lambda: len(rec.outputs) == 1)
    h.feed(AudioChunk(b"\x00" * 4))  # its delta is due on the next loop turn
    h.cancel()
    await asyncio.wait({h.task}, timeout=2)
    await settle()
    assert rec.outputs == [TextDelta("2")] and rec.errors == []
    assert engine.closed == ["r1"]


async def test_the_passthrough_transcriber_numbers_chunks_as_its_transcribe_does() -> None:
    engine = PassthroughEngine(paced=False)
    chunks = [AudioChunk(b"\x00" * 480) for _ in range(3)]

    async def inputs() -> AsyncIterator[AudioChunk]:
        for c in chunks:
            yield c

    iterated = [o async for o in engine.transcribe(TranscriptionRequest("a"), inputs())]
    stepper = engine.transcriber(TranscriptionRequest("b"))
    assert stepper is not None
    stepped = [o for c in chunks for o in stepper.feed(c)] + list(stepper.finish())
    stepper.close()
    assert stepped == iterated and engine.active == set()


# --- responses the engine pushes (engine.Responder) -------------------------------------


class CountedPassthrough(PassthroughEngine):
    """The passthrough engine, counting the answers it was asked to push (``responder``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pushed = 0

    def responder(self, request: ResponseRequest, emit: Any, fail: Any) -> Any:
        self.pushed += 1
        return super().responder(request, emit, fail)


async def iterated(engine: PassthroughEngine, request: ResponseRequest, fed: list[EngineInput]) -> list[EngineOutput]:
    async def inputs() -> AsyncIterator[EngineInput]:
        for chunk in fed:
            yield chunk

    return [o async for o in engine.respond(request, inputs())]


@pytest.mark.parametrize("paced", [False, True])
@pytest.mark.parametrize("limit", [None, 2, 10])
async def test_a_pushed_passthrough_answer_says_what_its_respond_says(paced: bool, limit: int | None) -> None:
    engine = CountedPassthrough(audio_chunks=6, chunk_ms=2, paced=paced, words_every=2)
    request = ResponseRequest("r1", (Message("user", "hello"),), max_output_tokens=limit)
    fed: list[EngineInput] = [TextChunk("there"), AudioChunk(b"\x00\x00")]
    expected = await iterated(engine, request, fed)
    orch, rec = Orchestrator(engine), Recorder()
    handle = orch.submit("response", request, on_output=rec.outputs.append,
                         on_error=lambda code, msg: rec.errors.append((code, msg)))  # fmt: skip
    for chunk in fed:  # before admission: queued, then handed to the answer
        handle.feed(chunk)
    handle.end()
    await asyncio.wait_for(handle.task, 5)
    assert rec.outputs == expected and rec.errors == []
    last = expected[-1]
    assert isinstance(last, Finished)
    assert (last.reason, last.text) == (("length", "") if limit == 2 else ("stop", "hello there")), last
    assert engine.pushed == 1 and engine.active == set()
    get = orch.metrics.registry.get_sample_value
    assert get("omni_request_time_to_first_delta_seconds_count", {"kind": "response"}) == 1.0


async def test_paced_answers_are_stepped_side_by_side_by_one_timer_and_never_ahead_of_their_pace() -> None:
    engine = PassthroughEngine(audio_chunks=5, chunk_ms=20, paced=True)
    orch = Orchestrator(engine)
    loop = asyncio.get_running_loop()
    heard: dict[str, list[tuple[float, EngineOutput]]] = {}
    handles = []
    began = loop.time()  # before any answer starts: chunk i is due i x 20 ms after its answer's start
    for n in range(20):
        rid = f"r{n}"
        got: list[tuple[float, EngineOutput]] = []
        heard[rid] = got

        def hear(output: EngineOutput, got: list[tuple[float, EngineOutput]] = got) -> None:
            got.append((loop.time(), output))

        handle = orch.submit("response", ResponseRequest(rid, ()), on_output=hear, on_error=lambda code, msg: None)
        handle.end()
        handles.append(handle)
    await asyncio.wait_for(asyncio.gather(*(h.task for h in handles)), 10)
    pacer = engine.pacer()
    assert pacer.steps == 20 * 6  # five chunks and the Finished, each answer
    assert pacer.firings <= pacer.steps // 4  # (answers started together share their timers)
    from orchestrator.engines.passthrough import PACER_GRAIN_S

    for got in heard.values():
        audio = [t for t, o in got if isinstance(o, AudioDelta)]
        assert len(audio) == 5 and isinstance(got[-1][1], Finished)
        # Chunk i no earlier than i x 20 ms after the start (less the grain). Measured from before
        # the start, not from chunk 0: on a busy machine chunk 0 may go out late, and the pace does
        # not drift (chunk 1 is then less than 20 ms behind it, and still not ahead of its pace).
        for i, t in enumerate(audio):
            assert t - began >= i * 0.020 - PACER_GRAIN_S - 0.001
    assert engine.active == set() and pacer.waiting == 0


async def test_a_cancelled_pushed_answer_says_nothing_more_and_leaves_the_pacer() -> None:
    engine = PassthroughEngine(audio_chunks=500, chunk_ms=5, paced=True)
    orch, rec = Orchestrator(engine), Recorder()
    handle = rec.submit(orch, "r1")
    handle.end()
    await until(lambda: sum(isinstance(o, AudioDelta) for o in rec.outputs) >= 2)
    handle.cancel()
    said = len(rec.outputs)
    await asyncio.wait({handle.task}, timeout=2)
    await until(lambda: engine.pacer().waiting == 0)  # dropped at its next due step
    assert len(rec.outputs) == said and rec.errors == []
    assert engine.active == set()
    await orch.wait_idle()
    assert engine.aborted == ["r1"]


async def test_a_pushed_answer_whose_delivery_fails_fails_alone() -> None:
    engine = PassthroughEngine(audio_chunks=4, chunk_ms=5, paced=True)
    orch = Orchestrator(engine)
    errors: list[tuple[str, str]] = []
    good: list[EngineOutput] = []

    def explode(output: EngineOutput) -> None:
        if isinstance(output, AudioDelta):
            raise RuntimeError("the session's handler broke")

    bad = orch.submit("response", ResponseRequest("bad", ()), on_output=explode,
                      on_error=lambda code, msg: errors.append((code, msg)))  # fmt: skip
    fine = orch.submit("response", ResponseRequest("fine", ()), on_output=good.append, on_error=lambda c, m: None)
    bad.end()
    fine.end()
    await asyncio.wait_for(asyncio.gather(bad.task, fine.task), 5)
    assert errors == [("engine_error", "The engine failed: RuntimeError.")]
    assert sum(isinstance(o, AudioDelta) for o in good) == 4 and isinstance(good[-1], Finished)
    assert engine.active == set()
    await orch.wait_idle()
    assert engine.aborted == ["bad"]


async def test_a_pushed_answer_refusing_a_required_tool_fails_with_tools_unsupported() -> None:
    engine = CountedPassthrough(paced=True)
    orch, rec = Orchestrator(engine), Recorder()
    request = ResponseRequest("r1", (), tools=(FunctionTool("f"),), tool_choice=ToolChoice("required"))
    handle = orch.submit("response", request, on_output=rec.outputs.append,
                         on_error=lambda code, msg: rec.errors.append((code, msg)))  # fmt: skip
    handle.end()
    await asyncio.wait_for(handle.task, 2)
    assert [code for code, _ in rec.errors] == ["tools_unsupported"] and rec.outputs == []
    assert engine.active == set() and engine.pushed == 1


async def test_a_passthrough_subclass_that_answers_its_own_way_is_iterated() -> None:
    class Own(PassthroughEngine):
        async def respond(self, request: ResponseRequest, inputs: Any) -> AsyncIterator[EngineOutput]:
            yield Finished(text="mine")

        async def transcribe(self, request: TranscriptionRequest, inputs: Any) -> AsyncIterator[EngineOutput]:
            yield Finished(text="mine too")

    engine = Own(paced=False)
    assert engine.responder(ResponseRequest("r", ()), print, print) is None
    assert engine.transcriber(TranscriptionRequest("t")) is None
    orch, rec = Orchestrator(engine), Recorder()
    for rid, kind in (("r1", "response"), ("t1", "transcription")):
        handle = rec.submit(orch, rid, kind)
        handle.end()
        await asyncio.wait_for(handle.task, 2)
    assert rec.outputs == [Finished(text="mine"), Finished(text="mine too")]
