"""The ``remote`` engine against real upstream gateways over real sockets.

An upstream here is a second gateway (in this process, or a ``python -m
gateway serve`` subprocess where it must be killed for real) running the CPU
engines: it speaks the same ``/v1/realtime`` and ``/v1/realtime/video``
protocols as a vLLM-Omni server. A first gateway, the one clients talk to,
runs ``RemoteEngine`` / ``RemoteVideoEngine`` pointed at it (a gateway
advertises the duplex dialect, so ``dialect="auto"`` speaks that to it, and
``dialect="openai"`` the OpenAI one with its binary fast path; vLLM-Omni's
own protocols are tested against doubles made from its documents:
``test_remote_upstream_docs.py``). Nothing is
mocked except the one upstream that must misbehave on cue (a small
``websockets`` server that drops the socket when asked for a response).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import inspect
import io
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from http import HTTPStatus
from pathlib import Path
from typing import Any

import orjson
import pytest
import uvicorn
import websockets
from support.gateway import RunningGateway, connect, free_port, run_gateway
from support.speech import chunks, silence, speak

from gateway.app import create_app
from gateway.settings import Settings
from orchestrator.engine import (
    AudioChunk,
    AudioDelta,
    EngineError,
    Finished,
    FunctionTool,
    Message,
    ResponseRequest,
    TextDelta,
    ToolCall,
    ToolChoice,
    TranscriptionRequest,
)
from orchestrator.engines.passthrough import PassthroughEngine
from orchestrator.engines.remote import RemoteEngine
from orchestrator.engines.remote.pool import probe_ready
from orchestrator.video_engine import Interaction, VideoRequest

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[2]
SPOKEN = "what is your name"  # pocketsphinx hears "what" in every eSpeak rendering


def upstream_settings(**kwargs: Any) -> Settings:
    return Settings(engine="cascade", video_engine="none", drain_window_s=0, **kwargs)


@contextlib.asynccontextmanager
async def serve(
    settings: Settings, *, port: int | None = None, video_engine: Any = None, **kwargs: Any
) -> AsyncIterator[RunningGateway]:
    """A gateway on ``port`` (fixed, so that it can come back there), optionally
    with a given video engine (``create_app`` takes none, so it is set on the runtime)."""
    port = port or free_port()
    settings = replace(settings, host="127.0.0.1", port=port)
    takes_video = "video_engine" in inspect.signature(create_app).parameters
    if video_engine is not None and takes_video:
        kwargs["video_engine"] = video_engine
    app = create_app(settings, **kwargs)
    runtime = app.state.runtime
    if video_engine is not None and not takes_video:
        runtime.video_engine = video_engine
        runtime.orchestrator.video_engine = video_engine
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, ws="websockets-sansio", loop="none", log_level="warning", lifespan="on"
    )
    server = uvicorn.Server(config)
    task = asyncio.get_running_loop().create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    gw = RunningGateway(server, task, port, runtime)
    try:
        yield gw
    finally:
        await gw.stop()


@contextlib.asynccontextmanager
async def subprocess_gateway(engine: str = "passthrough") -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    """``python -m gateway serve`` in a process of its own, to be killed with SIGKILL."""
    port = free_port()
    env = {**os.environ, "OMNI_GATEWAY_VIDEO_ENGINE": "none", "OMNI_GATEWAY_LOG_LEVEL": "warning"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--engine",
        engine,
        "--port",
        str(port),
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if (await probe_ready(url, 1.0))[0]:
                break
            if proc.returncode is not None:
                raise RuntimeError("the upstream gateway process exited")
            await asyncio.sleep(0.05)
        yield url, proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), 10)


async def inputs_of(*items: Any) -> AsyncIterator[Any]:
    for item in items:
        yield item


async def collect(stream: AsyncIterator[Any]) -> list[Any]:
    return [out async for out in stream]


def audio_of(events: list[dict[str, Any]]) -> bytes:
    return b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")


def upstream_items(gw: RunningGateway) -> int:
    return sum(len(host.session.conversation) for host in gw.runtime.hosts.values())


async def eventually(condition: Any, within: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


# --- voice through the chain ----------------------------------------------------------


async def test_text_and_spoken_turns_through_a_remote_upstream() -> None:
    async with run_gateway(upstream_settings(), vad_factory=None) as up:
        remote = RemoteEngine([up.http])
        async with run_gateway(Settings(video_engine="none"), engine=remote) as gw, connect(gw.url) as c:
            await c.wait_for("session.created")
            # A text turn: the upstream's cascade echoes it, in speech.
            await c.send(
                {
                    "type": "conversation.item.create",
                    "item": {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "good morning"}],
                    },
                }
            )
            await c.send({"type": "response.create"})
            done = await c.wait_for("response.done", timeout=30)
            assert done["response"]["status"] == "completed"
            assert done["response"]["output"][0]["content"][0]["transcript"] == "You said: good morning"
            assert len(audio_of(c.events)) > 24000  # more than half a second of speech
            assert done["response"]["usage"]["output_tokens"] > 0
            # The upstream session was cleaned up and kept for the next request.
            await eventually(lambda: upstream_items(up) == 0 and remote.pool.stats()[0]["idle"] == 1)
            (stats,) = remote.pool.stats()
            assert stats["idle"] == 1 and stats["served"] == 1
            # A spoken turn, server VAD on the first gateway: transcribed and answered upstream.
            c.events.clear()
            await c.send(
                {
                    "type": "session.update",
                    "session": {"type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}},
                }
            )
            await c.wait_for("session.updated")
            for chunk in chunks(silence(300) + await speak(SPOKEN) + silence(1200)):
                await c.append(chunk)
            completed = await c.wait_for("conversation.item.input_audio_transcription.completed", timeout=30)
            assert "what" in completed["transcript"].lower()
            done = await c.wait_for("response.done", timeout=30)
            assert done["response"]["status"] == "completed"
            transcript = done["response"]["output"][0]["content"][0]["transcript"]
            assert transcript.lower().startswith("you said") and "what" in transcript.lower()
            assert len(audio_of(c.events)) > 24000
            assert remote.pool.stats()[0]["served"] >= 3  # the answer reused the first session


async def test_transcription_through_a_remote_upstream_binary_and_json() -> None:
    speech = await speak(SPOKEN)
    async with run_gateway(upstream_settings(), vad_factory=None) as up:
        remote = RemoteEngine([up.http])
        async with (
            run_gateway(Settings(video_engine="none"), engine=remote, vad_factory=None) as gw,
            connect(gw.url) as c,
        ):
            await c.wait_for("session.created")
            await c.send(
                {
                    "type": "session.update",
                    "session": {
                        "type": "realtime",
                        "audio": {"input": {"turn_detection": None, "transcription": {"model": "gpt-4o-transcribe"}}},
                    },
                }
            )
            await c.wait_for("session.updated")
            for chunk in chunks(speech):
                await c.append(chunk)
            await c.send({"type": "input_audio_buffer.commit"})
            completed = await c.wait_for("conversation.item.input_audio_transcription.completed", timeout=30)
            assert "what" in completed["transcript"].lower()
            deltas = [e["delta"] for e in c.events if e["type"] == "conversation.item.input_audio_transcription.delta"]
            assert deltas and "".join(deltas) == completed["transcript"]  # they add up, through both gateways
        # The engine directly: audio as binary frames (omni-binary.v1), then as base64 JSON.
        for binary in (True, False):
            await engine_transcribes_and_answers(up, speech, binary=binary)


async def engine_transcribes_and_answers(up: RunningGateway, speech: bytes, *, binary: bool) -> None:
    """The engine directly, with audio as binary frames (omni-binary.v1) or base64 JSON."""
    engine = RemoteEngine([up.http], binary=binary, dialect="openai")  # the binary fast path is OpenAI-dialect only
    await engine.start()
    try:
        outs = await collect(
            engine.transcribe(
                TranscriptionRequest(f"input_{binary}"), inputs_of(*(AudioChunk(c) for c in chunks(speech)))
            )
        )
        assert isinstance(outs[-1], Finished) and "what" in outs[-1].text
        assert outs[-1].usage.input_audio_tokens > 0
        await eventually(lambda: engine.pool.upstreams[0].idle.get("transcribe"))  # cleaned up and kept
        conn = engine.pool.upstreams[0].idle["transcribe"][0]
        assert conn.binary is binary
        # Cancelled while the audio streams: the buffer is cleared upstream and the session kept.
        live: asyncio.Queue[Any] = asyncio.Queue()

        async def live_audio() -> AsyncIterator[Any]:
            while True:
                yield await live.get()

        for piece in chunks(speech)[:20]:
            live.put_nowait(AudioChunk(piece))
        stream = engine.transcribe(TranscriptionRequest("input_cut"), live_audio())
        pending = asyncio.ensure_future(stream.__anext__())  # manual turns: deltas wait for the commit
        await eventually(lambda: upstream_items(up) == 0 and engine.pool.upstreams[0].active == 1)
        await asyncio.sleep(0.2)
        pending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pending
        # It ran on the kept session, which is kept again.
        await eventually(lambda: len(engine.pool.upstreams[0].idle.get("transcribe", [])) == 1)
        assert engine.pool.upstreams[0].open == 1 and engine.pool.upstreams[0].served == 2
        assert upstream_items(up) == 0
        # Under 100 ms: nothing to commit, an empty transcript.
        outs = await collect(engine.transcribe(TranscriptionRequest("input_short"), inputs_of(AudioChunk(silence(50)))))
        assert outs == [Finished(text="")]
        # Text out only, on the same pooled session kind.
        outs = await collect(
            engine.respond(
                ResponseRequest(f"resp_{binary}", (Message("user", "hello"),), modalities=("text",)),
                inputs_of(),
            )
        )
        assert [o.text for o in outs if isinstance(o, TextDelta)] and not any(isinstance(o, AudioDelta) for o in outs)
        assert isinstance(outs[-1], Finished) and outs[-1].text == "You said: hello"
    finally:
        await engine.close()


async def test_tools_tool_choice_and_call_items_reach_the_upstream() -> None:
    """The upstream (a gateway on the cascade, whose echo thinker cannot call tools)
    is given the tools and tool_choice: it refuses ``required`` with its own code,
    answers ``auto``, and a later request without tools clears them on the kept session."""
    async with run_gateway(upstream_settings(), vad_factory=None) as up:
        engine = RemoteEngine([up.http])
        await engine.start()
        tool = FunctionTool("get_weather", "weather", {"type": "object", "properties": {"city": {"type": "string"}}})
        history = (
            Message("user", "weather in Oslo"),
            Message("assistant", "", tool_calls=(ToolCall("call_1", "get_weather", '{"city": "Oslo"}'),)),
            Message("tool", "rain", tool_call_id="call_1"),
            Message("user", "thanks"),
        )
        try:
            required = ResponseRequest(
                "r1", history, modalities=("text",), tools=(tool,), tool_choice=ToolChoice("required")
            )
            with pytest.raises(EngineError) as info:
                await collect(engine.respond(required, inputs_of()))
            assert info.value.code == "tools_unsupported"
            outs = await collect(
                engine.respond(ResponseRequest("r2", history, modalities=("text",), tools=(tool,)), inputs_of())
            )
            assert isinstance(outs[-1], Finished) and outs[-1].text == "You said: thanks"
            conn = engine.pool.upstreams[0]
            await eventually(lambda: conn.idle.get("respond"))
            assert conn.idle["respond"][0].tools
            outs = await collect(engine.respond(ResponseRequest("r3", history, modalities=("text",)), inputs_of()))
            assert isinstance(outs[-1], Finished)
            await eventually(lambda: conn.idle.get("respond"))
            assert not conn.idle["respond"][0].tools  # cleared upstream
        finally:
            await engine.close()


# --- video through the chain ------------------------------------------------------------


async def test_video_through_a_remote_upstream_with_interactions() -> None:
    async with run_gateway(
        Settings(engine="passthrough", video_engine="cpu", drain_window_s=0),
        engine=PassthroughEngine(),
        vad_factory=None,
    ) as up:
        remote = RemoteEngine([up.http])
        video = remote.video_engine()
        async with (
            serve(Settings(video_engine="none"), engine=remote, vad_factory=None, video_engine=video) as gw,
            connect(f"ws://127.0.0.1:{gw.port}/v1/realtime/video") as c,
        ):
            await c.send(
                {
                    "type": "session.start",
                    "prompt": "a red fox",
                    "width": 64,
                    "height": 48,
                    "fps": 12,
                    "num_frames": 36,
                    "format": "jpeg",
                }
            )
            start = orjson.loads(await c.ws.recv())
            assert start["type"] == "video.start"
            metas: list[dict[str, Any]] = []
            frames: list[bytes] = []
            sent = False
            while True:
                msg = orjson.loads(await asyncio.wait_for(c.ws.recv(), 30))
                if msg["type"] == "session.done":
                    break
                if msg["type"] == "video.chunk_metadata":
                    metas.append(msg)
                    payload = await c.ws.recv()
                    assert isinstance(payload, bytes) and len(payload) == msg["byte_length"]
                    frames.append(payload)
                    if not sent:
                        await c.send(
                            {
                                "type": "session.interaction",
                                "interaction": {
                                    "event_id": "storm",
                                    "event": {"prompt": "a storm"},
                                    "transition_chunks": 1,
                                },
                            }
                        )
                        sent = True
                elif msg["type"] == "session.interaction.queued":
                    assert msg["event_id"] == "storm"
                else:
                    raise AssertionError(msg)
            assert sum(m["num_frames"] for m in metas) == 36
            assert [m["generation_chunk_index"] for m in metas] == list(range(len(metas)))
            assert all(f.startswith(b"\xff\xd8") for f in frames)
            # The upstream applied the interaction: its ids came back through the chain.
            assert any("storm" in m["started_event_ids"] for m in metas)
            assert any("storm" in m["completed_event_ids"] for m in metas)
        # fMP4 straight from the engine: the init segment is kept for every chunk.
        await video.start()
        try:
            got = [
                ch
                async for ch in video.generate_video(
                    VideoRequest("video_mp4", "a lake", width=64, height=48, num_frames=18)
                )
            ]
            assert got[0].init_segment[4:8] == b"ftyp" and got[0].data.startswith(got[0].init_segment)
            assert all(ch.init_segment == got[0].init_segment and ch.media[4:8] == b"moof" for ch in got)
            import av

            stream = b"".join(ch.data for ch in got)
            with av.open(io.BytesIO(stream), format="mp4") as container:
                assert sum(1 for _ in container.decode(video=0)) == 18
            # An endless video, aborted: the stream ends without an error and the upstream stops.
            endless = video.generate_video(VideoRequest("video_endless", "rain", width=64, height=48, format="jpeg"))
            await endless.__anext__()
            await video.submit_interaction("video_endless", Interaction("e1", prompt="snow"))
            with pytest.raises(EngineError) as err:
                await video.submit_interaction("video_endless", Interaction("e1", prompt="hail"))
            assert err.value.code == "event_id_conflict"
            await video.abort("video_endless")
            assert [ch async for ch in endless] == []
            await eventually(lambda: not up.runtime.video_sockets)
            with pytest.raises(EngineError) as err:
                await video.submit_interaction("video_endless", Interaction("e2", prompt="x"))
            assert err.value.code == "no_active_request"
        finally:
            await video.close()


# --- spreading, loss, retry, health ----------------------------------------------------------


async def test_two_upstreams_share_requests_least_loaded_first() -> None:
    settings = Settings(engine="passthrough", video_engine="none", drain_window_s=0)
    async with (
        run_gateway(settings, engine=PassthroughEngine(audio_chunks=100), vad_factory=None) as a,
        run_gateway(settings, engine=PassthroughEngine(audio_chunks=100), vad_factory=None) as b,
    ):
        engine = RemoteEngine([a.http, b.http])
        await engine.start()
        try:
            streams = []
            for i in range(4):  # each starts once the one before is running upstream
                stream = engine.respond(ResponseRequest(f"resp_{i}", (Message("user", "hi"),)), inputs_of())
                first = await stream.__anext__()
                # (the gateway is a duplex upstream: each transcript delta follows its audio delta)
                assert isinstance(first, TextDelta | AudioDelta)
                streams.append(stream)
                counts = sorted(u["active"] for u in engine.pool.stats())
                assert counts[1] - counts[0] <= 1  # never two more on one than on the other
            assert [u["active"] for u in engine.pool.stats()] == [2, 2]
            assert a.runtime.orchestrator.running == 2 and b.runtime.orchestrator.running == 2
            for stream in streams:
                await stream.aclose()  # cancelled: response.cancel upstream, items deleted, session kept
            await eventually(lambda: a.runtime.orchestrator.running == 0 and b.runtime.orchestrator.running == 0)
            await eventually(lambda: [u["idle"] for u in engine.pool.stats()] == [2, 2])
            assert upstream_items(a) == upstream_items(b) == 0
            # A finished request frees its upstream: the next goes to the less busy one.
            busy = engine.respond(ResponseRequest("resp_busy", (Message("user", "x"),)), inputs_of())
            await busy.__anext__()
            first_upstream = next(u for u in engine.pool.upstreams if u.active == 1)
            quick = await collect(
                engine.respond(ResponseRequest("resp_q", (Message("user", "x"),), max_output_tokens=2), inputs_of())
            )
            assert isinstance(quick[-1], Finished) and quick[-1].reason == "length"
            other = next(u for u in engine.pool.upstreams if u is not first_upstream)
            assert other.served == 3 and first_upstream.served == 3
            await busy.aclose()
        finally:
            await engine.close()


async def test_an_upstream_killed_mid_response_fails_it_coded_and_the_session_goes_on() -> None:
    async with (
        subprocess_gateway() as (doomed, proc),
        run_gateway(
            Settings(engine="passthrough", video_engine="none"), engine=PassthroughEngine(), vad_factory=None
        ) as spare,
    ):
        remote = RemoteEngine([doomed, spare.http], health_interval_s=0.2)
        async with (
            run_gateway(Settings(video_engine="none"), engine=remote, vad_factory=None) as gw,
            connect(gw.url) as c,
        ):
            await c.wait_for("session.created")
            await c.send(
                {
                    "type": "conversation.item.create",
                    "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]},
                }
            )
            await c.send({"type": "response.create"})
            await c.wait_for("response.output_audio.delta", timeout=20)
            assert remote.pool.upstreams[0].active == 1  # it runs on the process about to die
            proc.send_signal(signal.SIGKILL)
            done = await c.wait_for("response.done", timeout=20)
            assert done["response"]["status"] == "failed"
            assert done["response"]["status_details"]["error"]["code"] == "upstream_lost"
            error = next(e for e in c.events if e["type"] == "error")
            assert error["error"]["code"] == "upstream_lost"
            assert not remote.pool.upstreams[0].up
            # The same session answers again, on the upstream still alive.
            c.events.clear()
            await c.send({"type": "response.create"})
            done = await c.wait_for("response.done", timeout=20)
            assert done["response"]["status"] == "completed"
            assert audio_of(c.events)
            assert remote.pool.upstreams[1].served == 1


def flaky_upstream(seen: list[str]) -> Any:
    """A realtime upstream that answers /readyz, opens sessions, and drops the
    socket when asked for a response (as a server dying at that moment)."""

    async def handler(ws: Any) -> None:
        await ws.send(orjson.dumps({"type": "session.created", "session": {}}).decode())
        async for message in ws:
            event = orjson.loads(message)
            seen.append(event["type"])
            if event["type"] == "session.update":
                await ws.send(orjson.dumps({"type": "session.updated", "session": {}}).decode())
            elif event["type"] == "response.create":
                ws.transport.abort()  # no close frame: the connection is simply gone
                return

    def process_request(connection: Any, request: Any) -> Any:
        # Health as vLLM's servers have it: /health, no /readyz.
        if request.path == "/health":
            return connection.respond(HTTPStatus.OK, "ok\n")
        if request.path == "/readyz":
            return connection.respond(HTTPStatus.NOT_FOUND, "not found\n")
        return None

    return websockets.serve(handler, "127.0.0.1", 0, process_request=process_request)


async def test_a_loss_before_any_output_is_retried_once_on_another_upstream() -> None:
    seen: list[str] = []
    async with (
        flaky_upstream(seen) as flaky,
        run_gateway(
            Settings(engine="passthrough", video_engine="none"),
            engine=PassthroughEngine(audio_chunks=5, paced=False),
            vad_factory=None,
        ) as good,
    ):
        port = flaky.sockets[0].getsockname()[1]
        engine = RemoteEngine([f"http://127.0.0.1:{port}", good.http])
        await engine.start()
        try:
            assert [u.up for u in engine.pool.upstreams] == [True, True]
            outs = await collect(engine.respond(ResponseRequest("resp_1", (Message("user", "hi"),)), inputs_of()))
            assert isinstance(outs[-1], Finished) and any(isinstance(o, AudioDelta) for o in outs)
            assert "response.create" in seen  # the first try went to the flaky upstream...
            assert not engine.pool.upstreams[0].up  # ...which is now out of rotation
            assert engine.pool.upstreams[1].served == 1
            # With no other upstream left up, a loss before output is not hidden twice.
            engine.pool.upstreams[0].up = True
            engine.pool.upstreams[1].up = False
            with pytest.raises(EngineError) as err:
                await collect(engine.respond(ResponseRequest("resp_2", (Message("user", "hi"),)), inputs_of()))
            assert err.value.code in ("upstream_lost", "upstream_unavailable")
        finally:
            await engine.close()


async def test_an_api_key_reaches_upstreams_that_require_one() -> None:
    settings = Settings(engine="passthrough", video_engine="none", api_keys=("sk-upstream",))
    async with run_gateway(settings, engine=PassthroughEngine(audio_chunks=2, paced=False), vad_factory=None) as up:
        request = ResponseRequest("resp_1", (Message("user", "x"),))
        for key, ok in ((None, False), ("sk-wrong", False), ("sk-upstream", True)):
            engine = RemoteEngine(up.http, api_key=key)
            await engine.start()
            try:
                if ok:
                    assert isinstance((await collect(engine.respond(request, inputs_of())))[-1], Finished)
                else:
                    with pytest.raises(EngineError) as err:
                        await collect(engine.respond(request, inputs_of()))
                    assert err.value.code == "unauthorized"
            finally:
                await engine.close()


async def test_healthy_follows_the_upstreams_readyz() -> None:
    port = free_port()
    settings = Settings(engine="passthrough", video_engine="none", drain_window_s=0)
    engine = RemoteEngine([f"ws://127.0.0.1:{port}/v1/realtime"], health_interval_s=0.1, health_timeout_s=0.5)

    async def answers(request_id: str) -> bool:
        outs = await collect(engine.respond(ResponseRequest(request_id, (Message("user", "x"),)), inputs_of()))
        return isinstance(outs[-1], Finished)

    async with run_gateway(Settings(video_engine="none"), engine=engine, vad_factory=None) as gw:
        assert not engine.healthy()  # nothing listens there yet
        assert (await probe_ready(gw.http, 2)) == (False, "HTTP/1.1 503 Service Unavailable")
        for round_ in range(2):  # the upstream comes, goes, and comes back on the same address
            async with serve(
                settings, port=port, engine=PassthroughEngine(audio_chunks=2, paced=False), vad_factory=None
            ):
                await eventually(engine.healthy, within=3)
                assert (await probe_ready(gw.http, 2))[0]
                assert await answers(f"resp_{round_}")
            await eventually(lambda: not engine.healthy(), within=3)
            assert not (await probe_ready(gw.http, 2))[0]
            with pytest.raises(EngineError) as err:
                await answers(f"resp_down_{round_}")
            assert err.value.code == "upstream_unavailable"


def test_a_route_may_map_transcription_model_names_for_its_upstream() -> None:
    """Any name a client gives reaches the upstream's speech-to-text: mapped when the
    route says how, else as given (a mapping) or the upstream's first (a list)."""
    mapped = RemoteEngine(["http://127.0.0.1:9"], transcription_models={"gpt-4o-transcribe": "qwen3-asr", "*": "asr"})
    assert mapped.transcription_model("gpt-4o-transcribe") == "qwen3-asr"
    assert mapped.transcription_model("gpt-realtime-whisper") == "asr"
    assert mapped.transcription_model(None) == "qwen3-asr"
    listed = RemoteEngine(["http://127.0.0.1:9"], transcription_models=("whisper-1", "large-v3"))
    assert listed.transcription_model("large-v3") == "large-v3"
    assert listed.transcription_model("gpt-realtime-whisper") == "whisper-1"
