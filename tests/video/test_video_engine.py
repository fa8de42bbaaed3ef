"""CpuVideoEngine end to end: interactions measured in decoded pixels, chunk
metadata, refusals, abort and cancellation."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from dataclasses import replace

import numpy as np
import pytest
from video_support import blend_alpha, decode_mp4, pure_frames, rgb, run

from orchestrator.engine import EngineError
from orchestrator.engines.video import VideoEngine
from orchestrator.engines.video.engine import CpuVideoEngine
from orchestrator.video_engine import CameraMove, Interaction, VideoChunk, VideoRequest

OLD, NEW = "A red fox in snow", "A blue whale at night"
F = 4  # frames per chunk


def request(num_frames: int | None = 8 * F, **fields: object) -> VideoRequest:
    base = VideoRequest("req", OLD, width=128, height=96, fps=12, num_frames=num_frames, frames_per_chunk=F)
    return replace(base, **fields)  # type: ignore[arg-type]


def test_a_gateway_with_the_cpu_video_engine_starts_without_torch_which_the_first_chunk_imports() -> None:
    # (~1.8 s of CPU, which a replica that serves no video never spends, nor one that is starting)
    code = (
        "import sys, asyncio; from gateway.app import create_app; from gateway.settings import Settings; "
        "from orchestrator.engines.video.engine import CpuVideoEngine; from orchestrator.video_engine import "
        "VideoRequest; app = create_app(Settings(engine='passthrough'), vad_factory=None); "
        "assert isinstance(app.state.runtime.video_engine, CpuVideoEngine); print('torch' in sys.modules); "
        "engine = CpuVideoEngine()\n"
        "async def first():\n"
        "    await engine.start()\n"
        "    stream = engine.generate_video(VideoRequest('r', 'a fox', width=64, height=48, fps=12, num_frames=4, "
        "frames_per_chunk=4))\n"
        "    chunk = await anext(stream)\n"
        "    await stream.aclose(); await engine.close()\n"
        "    return chunk\n"
        "chunk = asyncio.run(first()); assert chunk.data; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]


def test_cpu_engine_implements_the_video_engine_protocol() -> None:
    engine = CpuVideoEngine()
    assert isinstance(engine, VideoEngine)
    assert "not a generative model" in engine.info.description


@pytest.mark.parametrize("k", [0, 1, 3])
async def test_prompt_interaction_blends_over_exactly_k_chunks(engine: CpuVideoEngine, k: int) -> None:
    req = request()
    at = 2  # submitted after chunk 1 arrives: it starts with chunk 2

    async def on_chunk(chunk: VideoChunk) -> None:
        if chunk.generation_chunk_index == at - 1:
            await engine.submit_interaction("req", Interaction("swap", prompt=NEW, transition_chunks=k))

    chunks = await run(engine, req, on_chunk)
    frames = rgb(decode_mp4(b"".join(c.data for c in chunks)))
    old, new = pure_frames(OLD, req, 8 * F), pure_frames(NEW, req, 8 * F)
    alphas = np.array([blend_alpha(frames[i], old[i], new[i]) for i in range(8 * F)]).reshape(8, F)

    done = at + max(k, 1) - 1  # the chunk whose last frame reaches the new prompt
    assert np.all(np.abs(alphas[:at]) < 0.05)  # untouched before the boundary
    for c in range(at, done + 1):
        frame_in_fade = (c - at) * F + np.arange(1, F + 1)
        expected = np.minimum(1.0, frame_in_fade / (k * F)) if k else np.ones(F)
        assert alphas[c] == pytest.approx(expected, abs=0.06)
    assert np.all(np.abs(alphas[done + 1 :] - 1.0) < 0.05)
    if k > 0:
        assert alphas[done, 0] < 0.95  # still fading in the last chunk of the k

    started = [c.generation_chunk_index for c in chunks if "swap" in c.started_event_ids]
    active = [c.generation_chunk_index for c in chunks if "swap" in c.active_event_ids]
    completed = [c.generation_chunk_index for c in chunks if "swap" in c.completed_event_ids]
    assert started == [at]
    assert active == list(range(at, done + 1))
    assert completed == [done]
    assert not any(c.superseded_event_ids for c in chunks)


async def test_newer_prompt_during_a_fade_supersedes_it(engine: CpuVideoEngine) -> None:
    async def on_chunk(chunk: VideoChunk) -> None:
        if chunk.generation_chunk_index == 0:
            await engine.submit_interaction("req", Interaction("a", prompt=NEW, transition_chunks=4))
        if chunk.generation_chunk_index == 2:
            await engine.submit_interaction("req", Interaction("b", prompt="A green forest", transition_chunks=2))

    chunks = await run(engine, request(), on_chunk)
    table = [(c.started_event_ids, c.active_event_ids, c.completed_event_ids) for c in chunks]

    assert table[1] == (("a",), ("a",), ())
    assert table[2] == ((), ("a",), ())
    assert table[3] == (("b",), ("b",), ("a",))  # "a" is over where "b" starts
    assert chunks[3].superseded_event_ids == ("a",)
    assert table[4] == ((), ("b",), ("b",))
    assert table[5:] == [((), (), ())] * 3


async def test_camera_interaction_changes_the_view(engine: CpuVideoEngine) -> None:
    req = request(num_frames=4 * F)

    async def on_chunk(chunk: VideoChunk) -> None:
        if chunk.generation_chunk_index == 0:
            move = CameraMove("velocity", translation=(0.02, 0.0, 0.0), rotation=(0.0, 0.0, 2.0))
            await engine.submit_interaction("req", Interaction("cam", camera=move, transition_chunks=1))

    chunks = await run(engine, req, on_chunk)
    frames = rgb(decode_mp4(b"".join(c.data for c in chunks)))
    still = pure_frames(OLD, req, 4 * F)
    distance = np.abs(frames - still).mean(axis=(1, 2, 3))

    assert np.all(distance[:F] < 4)  # same picture before the move
    assert np.all(distance[2 * F :] > 8)  # then the view drifts away, and keeps going
    assert distance[-1] > distance[2 * F]
    assert [c.completed_event_ids for c in chunks] == [(), ("cam",), (), ()]


async def test_interaction_refusals_carry_stable_codes(engine: CpuVideoEngine) -> None:
    async def expect(code: str, request_id: str, interaction: Interaction) -> None:
        with pytest.raises(EngineError) as raised:
            await engine.submit_interaction(request_id, interaction)
        assert raised.value.code == code

    await expect("no_active_request", "nobody", Interaction("e0", prompt=NEW))
    stream = engine.generate_video(request(num_frames=2 * F))
    await stream.__anext__()
    await expect("invalid_interaction", "req", Interaction("e1", prompt=""))
    await expect("invalid_interaction", "req", Interaction("e2", prompt="   "))
    await expect("invalid_interaction", "req", Interaction("e3", prompt=NEW, transition_chunks=-1))
    await expect("invalid_interaction", "req", Interaction("e4"))  # changes nothing
    await expect("invalid_interaction", "req", Interaction("", prompt=NEW))
    await engine.submit_interaction("req", Interaction("e5", prompt=NEW))
    await expect("event_id_conflict", "req", Interaction("e5", prompt="A green forest"))
    async for _ in stream:
        pass
    await expect("no_active_request", "req", Interaction("e6", prompt=NEW))  # finished


async def test_pending_interactions_are_bounded_per_request() -> None:
    engine = CpuVideoEngine(workers=1, max_pending_interactions=2)
    await engine.start()
    stream = engine.generate_video(request(num_frames=None))
    await anext(stream)
    await engine.submit_interaction("req", Interaction("a", prompt=NEW))
    await engine.submit_interaction("req", Interaction("b", prompt=OLD))
    with pytest.raises(EngineError) as raised:
        await engine.submit_interaction("req", Interaction("c", prompt=NEW))
    assert raised.value.code == "too_many_pending_interactions"
    chunk = await anext(stream)  # the queue drains at the boundary: last write wins
    assert chunk.started_event_ids == ("a", "b")
    assert chunk.completed_event_ids == ("a",) and chunk.superseded_event_ids == ("a",)
    await engine.submit_interaction("req", Interaction("c", prompt=NEW))
    await stream.aclose()
    await engine.close()


async def test_request_refusals_carry_stable_codes(engine: CpuVideoEngine) -> None:
    async def expect(code: str, req: VideoRequest, eng: CpuVideoEngine = engine) -> None:
        with pytest.raises(EngineError) as raised:
            await eng.generate_video(req).__anext__()
        assert raised.value.code == code

    await expect("invalid_request", request(width=127))
    await expect("invalid_request", request(fps=0))
    await expect("invalid_request", request(frames_per_chunk=0))
    await expect("invalid_request", request(format="webm"))
    await expect("engine_not_started", request(), CpuVideoEngine())
    running = engine.generate_video(request(num_frames=None))
    await running.__anext__()
    await expect("request_id_conflict", request())
    small = CpuVideoEngine(max_active_requests=1)
    await small.start()
    first = small.generate_video(request(num_frames=None))
    await first.__anext__()
    await expect("capacity_exceeded", VideoRequest("other", OLD, width=64, height=64), small)
    await first.aclose()
    await small.close()
    await running.aclose()


async def test_abort_mid_stream_ends_the_stream_and_leaves_nothing_running(engine: CpuVideoEngine) -> None:
    tasks_before = asyncio.all_tasks()
    chunks = []
    async for chunk in engine.generate_video(request(num_frames=None)):
        chunks.append(chunk)
        if len(chunks) == 3:
            await engine.abort("req")
            await engine.abort("req")  # idempotent
    assert len(chunks) == 3
    assert engine.active_request_ids == ()
    assert asyncio.all_tasks() == tasks_before
    with pytest.raises(EngineError) as raised:
        await engine.submit_interaction("req", Interaction("late", prompt=NEW))
    assert raised.value.code == "no_active_request"
    await engine.abort("never-existed")  # a no-op


async def test_abort_while_a_chunk_renders_returns_promptly(engine: CpuVideoEngine) -> None:
    big = VideoRequest("big", OLD, width=640, height=480, num_frames=None, frames_per_chunk=60)
    stream = engine.generate_video(big)
    consumer: asyncio.Task[VideoChunk] = asyncio.create_task(anext(stream))
    await asyncio.sleep(0.05)  # the first chunk is rendering in a worker
    loop = asyncio.get_running_loop()
    started = loop.time()
    await engine.abort("big")
    with pytest.raises(StopAsyncIteration):
        await consumer
    assert loop.time() - started < 0.5
    assert engine.active_request_ids == ()


async def test_cancelling_the_consumer_frees_the_request_and_close_joins_workers() -> None:
    engine = CpuVideoEngine(workers=2)
    await engine.start()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.002)

    async def consume() -> None:
        async for _ in engine.generate_video(request(num_frames=None, frames_per_chunk=24)):
            pass

    tick_task = asyncio.create_task(ticker())
    consumer = asyncio.create_task(consume())
    await asyncio.sleep(0.3)
    assert ticks > 20  # the event loop kept running while chunks rendered
    consumer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await consumer
    tick_task.cancel()
    assert engine.active_request_ids == ()
    await engine.close()
    assert not engine.healthy()
    assert not [t for t in threading.enumerate() if t.name.startswith("cpu-video")]
