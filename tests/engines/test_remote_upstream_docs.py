"""The ``remote`` engine against doubles of vLLM-Omni made from its documents
(``support.vllm_omni_double``; the sequences it sends cite their sections in
``support.upstream_docs``), not against our own server: if our reading of
vLLM-Omni's protocols were wrong, these tests would say so.

- The duplex dialect (``/v1/realtime?duplex=1``): the engine finds it
  advertised and speaks it (its session object, ``response.create`` with
  ``modalities``, acks of the upstream's seqs); streaming input reaches the
  upstream as it comes; a cancel aborts the upstream answer; an upstream that
  dies mid-answer fails it coded and the session goes on; a slow upstream
  still streams, and one slower than ``event_timeout_s`` is ``upstream_timeout``.
- The gateway in front of it: a duplex session on the gateway (its own
  ``?duplex=1``) is forwarded to the duplex upstream; its resume is ours.
- Turns the upstream takes (``turns: "upstream"``): the session object asks for its
  server VAD, barge-in on speech and answers of its own; its speech start, commit,
  transcript and answer come through as ``converse``'s outputs, and its barge-in of a
  running answer ends it; through the gateway, a GPT-Live and a Realtime client see
  the upstream's turns with no detector on the gateway, and its barge-in cuts the answer.
- The turn-based ``/v1/realtime``: refused with a clear code.
- ``/v1/realtime/video``: ``size``/``seconds`` reach the upstream resolved,
  chunks and interactions go through, an interaction the upstream refuses is
  ``interaction_failed``, the upstream's trailer is replaced by ours, a stalled
  upstream is reported, one that dies mid-stream is ``upstream_lost``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import orjson
import pytest
from support import upstream_docs as doc
from support.gateway import connect, run_gateway
from support.vllm_omni_double import Behaviour, OmniDouble, omni_double

from gateway.settings import Settings
from orchestrator.engine import (
    AnswerStarted,
    AudioChunk,
    AudioDelta,
    ConversationRequest,
    EngineError,
    Finished,
    Heard,
    Message,
    ResponseRequest,
    SpeechStarted,
    SpeechStopped,
    TextDelta,
    TranscriptionRequest,
)
from orchestrator.engines.remote import RemoteEngine, RemoteVideoEngine

pytestmark = pytest.mark.timeout(60)

FAST_POOL = {"health_interval_s": 0.1, "cleanup_timeout_s": 2.0}


@contextlib.asynccontextmanager
async def engine_for(double: OmniDouble, **options: Any) -> AsyncIterator[RemoteEngine]:
    engine = RemoteEngine([double.http], **{**FAST_POOL, **options})
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()


async def inputs(*items: Any, delay_s: float = 0.0) -> AsyncIterator[Any]:
    for item in items:
        if delay_s:
            await asyncio.sleep(delay_s)
        yield item


def answer_request(rid: str, text: str = "good morning", **kwargs: Any) -> ResponseRequest:
    return ResponseRequest(rid, (Message("user", text),), **kwargs)


async def test_the_engine_speaks_the_duplex_dialect_an_upstream_advertises() -> None:
    async with omni_double() as up, engine_for(up) as engine:
        outs = [o async for o in engine.respond(answer_request("r1"), inputs())]
        assert isinstance(outs[-1], Finished)
        text = "".join(o.text for o in outs if isinstance(o, TextDelta))
        assert text.split() == ["You", "said:", "good", "You", "said:", "good", "You", "said:"]
        assert sum(len(o.pcm) for o in outs if isinstance(o, AudioDelta)) == 8 * 960  # 20 ms each, 24 kHz
        assert engine.pool.upstreams[0].duplex
        (session,) = up.seen.duplex_sessions  # the duplex session object, as the document has it
        assert session["extra_body"] == {"auto_response": False} and session["turn_detection"] is None
        assert session["input_audio_format"] == "pcm16" and session["sample_rate_hz"] == 24000
        assert "type" not in session and session["modalities"] == ["audio", "text"]
        for _ in range(500):  # the acks are sent; the upstream reads them in a task of its own
            if up.seen.acks:
                break
            await asyncio.sleep(0.02)
        assert up.seen.acks and up.seen.acks == sorted(up.seen.acks)  # the upstream's seqs, acknowledged
        # The session was cleaned (items deleted) and is lent to the next request.
        for _ in range(100):
            if engine.pool.stats()[0]["idle"] == 1:
                break
            await asyncio.sleep(0.02)
        second = [o async for o in engine.respond(answer_request("r2", "hello"), inputs())]
        assert isinstance(second[-1], Finished) and up.seen.connections == 1


async def test_streaming_input_reaches_the_upstream_as_it_comes() -> None:
    async with omni_double() as up, engine_for(up) as engine:
        chunk = bytes(4800)  # 100 ms of 24 kHz PCM16
        loop = asyncio.get_running_loop()
        yielded: list[float] = []

        async def microphone() -> AsyncIterator[AudioChunk]:
            for _ in range(5):
                await asyncio.sleep(0.15)
                yielded.append(loop.time())
                yield AudioChunk(chunk)

        outs = [o async for o in engine.transcribe(TranscriptionRequest("input_1"), microphone())]
        final = outs[-1]
        assert isinstance(final, Finished) and final.text == f"heard {5 * 4800 // 32} ms"
        assert len(up.seen.appends) == 5
        assert up.seen.appends[0][0] < yielded[-1]  # the first chunk was upstream before the last was spoken


async def test_a_cancelled_answer_is_aborted_upstream() -> None:
    async with omni_double(Behaviour(delay_s=0.2, words=20)) as up, engine_for(up) as engine:
        stream = engine.respond(answer_request("r1"), inputs())
        assert isinstance(await stream.__anext__(), AudioDelta | TextDelta)
        await engine.abort("r1")
        for _ in range(100):
            if up.seen.cancels:
                break
            await asyncio.sleep(0.02)
        assert up.seen.cancels == 1  # the farewell: response.cancel reached the upstream
        with contextlib.suppress(Exception):
            await stream.aclose()


async def test_an_upstream_that_dies_mid_answer_fails_it_coded_and_the_session_goes_on() -> None:
    behaviour = Behaviour(die_after=3)
    async with omni_double(behaviour) as up:
        engine = RemoteEngine([up.http], **FAST_POOL)
        async with run_gateway(Settings(video_engine="none"), engine=engine, vad_factory=None) as gw:
            async with connect(gw.url) as c:
                await c.wait_for("session.created")
                await c.send(doc.ITEM_CREATE)
                await c.send({"type": "response.create"})
                done = await c.wait_for("response.done", timeout=20)
                assert done["response"]["status"] == "failed"
                assert done["response"]["status_details"]["error"]["code"] == "upstream_lost"
                behaviour.die_after = None  # the upstream is back
                for _ in range(100):
                    if engine.pool.upstreams[0].up:
                        break
                    await asyncio.sleep(0.05)
                await c.send({"type": "response.create"})
                again = await c.wait_for("response.done", timeout=20)
                assert again["response"]["status"] == "completed"


async def test_a_slow_upstream_streams_and_one_too_slow_times_out() -> None:
    async with omni_double(Behaviour(delay_s=0.1, words=6)) as up, engine_for(up) as engine:
        loop = asyncio.get_running_loop()
        arrivals = [
            loop.time() async for o in engine.respond(answer_request("slow"), inputs()) if isinstance(o, AudioDelta)
        ]
        assert len(arrivals) == 6 and arrivals[-1] - arrivals[0] >= 0.4  # streamed as made, not at the end
    async with omni_double(Behaviour(delay_s=2.0)) as up, engine_for(up, event_timeout_s=0.5) as engine:
        with pytest.raises(EngineError) as slow:
            _ = [o async for o in engine.respond(answer_request("stuck"), inputs())]
        assert slow.value.code == "upstream_timeout"


async def test_a_duplex_session_on_the_gateway_is_forwarded_to_a_duplex_upstream() -> None:
    async with omni_double() as up:
        engine = RemoteEngine([up.http], **FAST_POOL)
        async with run_gateway(Settings(video_engine="none"), engine=engine, vad_factory=None) as gw:
            url = gw.url + "?duplex=1&autostart=0"
            async with connect(url) as c:
                await c.send({"type": "session.update", "session": {"turn_detection": None}})
                created = await c.wait_for("session.created")
                await c.send(doc.fill(doc.APPEND, audio=doc.pcm16(300)))
                await c.send(doc.COMMIT)
                done = await c.wait_for("response.done", timeout=20)
                assert done["response"]["status"] == "completed"
                speak = [e for e in c.events if e["type"] == "response.speak"]
                assert len(speak) == 1
                last = max(e["server_event_seq"] for e in c.events if "server_event_seq" in e)
            # The resume is ours: the upstream never sees a session.resume.
            async with connect(url) as r:
                await r.send(
                    {
                        **doc.RESUME,
                        "session_id": created["session"]["id"],
                        "resume_token": created["resume_token"],
                        "last_received_server_event_seq": last,
                    }
                )
                assert (await r.recv())["type"] == "session.resumed"
        assert engine.pool.upstreams[0].duplex and up.seen.duplex_sessions


async def test_the_turn_based_realtime_api_is_refused_with_a_clear_code() -> None:
    # A turn-mode deployment: its /v1/realtime is the turn-based API (?duplex=1 is not mounted).
    async with omni_double(Behaviour(duplex_route=False)) as up, engine_for(up, retries=0) as engine:
        with pytest.raises(EngineError) as refused:
            _ = [o async for o in engine.respond(answer_request("t1"), inputs())]
        assert refused.value.code == "upstream_unsupported" and "turn-based" in refused.value.message
        assert not engine.pool.upstreams[0].duplex


# --- video --------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def video_gateway(up: OmniDouble, **settings: Any) -> AsyncIterator[Any]:
    video = RemoteVideoEngine([up.http], formats=("mp4",), **FAST_POOL)
    s = Settings(video_engine="none", engine="passthrough", **settings)
    async with run_gateway(s, vad_factory=None, video_engine=video) as gw:
        yield gw


async def read_video(
    c: Any, *, until: str = "session.done", interact: dict[str, Any] | None = None, timeout: float = 20.0
) -> list[tuple[dict[str, Any], bytes | None]]:
    got: list[tuple[dict[str, Any], bytes | None]] = []
    while True:
        event = orjson.loads(await asyncio.wait_for(c.ws.recv(), timeout))
        payload = await c.ws.recv() if event["type"] == "video.chunk_metadata" else None
        got.append((event, payload))
        if interact is not None and event["type"] == "video.chunk_metadata":
            await c.send(interact)
            interact = None
        if event["type"] == until:
            return got


# --- turns the upstream takes (route option turns: "upstream") ------------------------------------

LOUD = (0.05 * np.sin(2 * np.pi * 220 * np.arange(480) / 24000) * 32767).astype("<i2").tobytes()  # 20 ms, 24 kHz
QUIET = bytes(len(LOUD))


async def fed(queue: asyncio.Queue[Any]) -> AsyncIterator[Any]:
    """Inputs as the test puts them (None: their end)."""
    while (item := await queue.get()) is not None:
        yield item


async def test_the_upstream_takes_the_turns_and_its_barge_in_ends_the_answer() -> None:
    async with omni_double(Behaviour(words=40, delay_s=0.02)) as up, engine_for(up, turns="upstream") as engine:
        assert engine.info.takes_turns
        queue: asyncio.Queue[Any] = asyncio.Queue()
        outputs = engine.converse(ConversationRequest("conv_1", (Message("system", "Be brief."),), "Be kind."),
                                  fed(queue))  # fmt: skip
        for chunk in [LOUD] * 15 + [QUIET] * 30:  # 300 ms of sound, 600 ms of quiet
            queue.put_nowait(AudioChunk(chunk))
        got: list[Any] = []
        async for out in outputs:
            got.append(out)
            if isinstance(out, AudioDelta) and sum(isinstance(o, AudioDelta) for o in got) == 3:
                for chunk in [LOUD] * 5:  # the caller over the answer
                    queue.put_nowait(AudioChunk(chunk))
            if isinstance(out, Finished):
                break
        (session,) = up.seen.duplex_sessions  # one upstream session, its own turns asked for
        assert session["turn_detection"] == {"type": "server_vad"} and session["instructions"] == "Be kind."
        assert session["extra_body"] == {"auto_response": True} and session["overlap_policy"] == "barge_in_on_speech"
        kinds = [type(o) for o in got]
        assert kinds[:4] == [SpeechStarted, SpeechStopped, Heard, AnswerStarted]
        assert got[0].audio_ms == 0 and got[1].audio_ms == 300
        assert got[2] == Heard("heard 1200 ms", final=True)  # the double's transcript (800 ms, counted at 16 kHz)
        # The upstream heard the caller over its answer and stopped it (its barge-in, not a cancel of ours).
        assert SpeechStarted in kinds[4:] and kinds[-1] is Finished
        assert up.seen.barge_ins == 1 and up.seen.cancels == 0
        assert sum(isinstance(o, AudioDelta) for o in got) < 40
        queue.put_nowait(None)  # the session is over: the upstream's is closed for good
        assert [o async for o in outputs] == []
        for _ in range(200):
            if up.seen.closes:
                break
            await asyncio.sleep(0.01)
        assert up.seen.closes == 1


async def test_a_realtime_and_a_live_client_see_the_upstreams_turns_and_barge_in() -> None:
    async with (
        omni_double(Behaviour(words=50, delay_s=0.04)) as up,
        run_gateway(
            Settings(video_engine="none"),
            engine=RemoteEngine([up.http], turns="upstream", **FAST_POOL),
            vad_factory=None,
        ) as gw,  # fmt: skip
    ):
        async with connect(gw.url) as c:  # server turn detection by default: the engine's
            created = await c.wait_for("session.created")
            assert created["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
            for chunk in [LOUD] * 15 + [QUIET] * 30:
                await c.append(chunk)
            first = await c.wait_for("response.created")
            await c.wait_for("response.output_audio.delta")
            for chunk in [LOUD] * 5 + [QUIET] * 30:
                await c.append(chunk)
            done = await c.wait_for("response.done")
            assert done["response"]["id"] == first["response"]["id"]
            assert done["response"]["status"] == "cancelled"
            assert done["response"]["status_details"]["reason"] == "turn_detected"
            second = await c.wait_for("response.done")  # the upstream answers the interruption
            assert second["response"]["status"] == "completed"
        async with connect(f"ws://127.0.0.1:{gw.port}/v1/live/sessions") as c:
            await c.send({"type": "session.start", "session": {"model": "gpt-live-1"}})
            await c.wait_for("session.started")
            for chunk in [LOUD] * 15 + [QUIET] * 30:
                await c.send({"type": "session.input_audio.append", "audio": base64.b64encode(chunk).decode()})
            await c.wait_for("session.output_audio.delta")
            for chunk in [LOUD] * 5:
                await c.send({"type": "session.input_audio.append", "audio": base64.b64encode(chunk).decode()})
            barged = up.seen.barge_ins + 1
            for _ in range(500):
                if up.seen.barge_ins >= barged:
                    break
                await asyncio.sleep(0.01)
            # Nothing more of the answer after the upstream's barge-in, beyond what was on its way.
            mark = len(c.events)
            await c.send({"type": "session.close"})
            await c.wait_for("session.closed")
            late = [e for e in c.events[mark:] if e["type"] == "session.output_audio.delta"]
            assert sum(len(base64.b64decode(e["delta"])) for e in late) <= 300 * 48  # the lead, at most
            sent = [e for e in c.events if e["type"] == "session.output_audio.delta"]
            assert sum(len(base64.b64decode(e["delta"])) for e in sent) < 50 * 20 * 48  # not the whole answer


async def test_video_through_a_vllm_omni_upstream_with_size_seconds_and_interactions() -> None:
    async with (
        omni_double(Behaviour(delay_s=0.05)) as up,
        video_gateway(up) as gw,
        connect(gw.http.replace("http", "ws") + "/v1/realtime/video") as c,
    ):
        await c.send(
            {**doc.VIDEO_START, "width": None, "height": None, "num_frames": None, "size": "96x64", "seconds": "3"}
        )
        got = await read_video(c, interact=doc.VIDEO_INTERACTION)
        start = got[0][0]
        assert start["type"] == "video.start" and (start["config"]["width"], start["config"]["height"]) == (96, 64)
        assert start["config"]["num_frames"] == 48  # "3" seconds x 16 fps
        (sent,) = up.seen.video_starts
        assert (sent["width"], sent["height"], sent["num_frames"], sent["fps"]) == (96, 64, 48, 16)
        metas = [e for e, _ in got if e["type"] == "video.chunk_metadata"]
        media = [m for m in metas if m["kind"] == "media"]
        assert sum(m["num_frames"] for m in media) == 48
        assert any("sunlight-update" in m["started_event_ids"] for m in media)
        assert any(e["type"] == "session.interaction.queued" for e, _ in got)
        trailer = metas[-1]  # ours (the fragments delivered), not the upstream's: both end the stream
        assert trailer["kind"] == "trailer" and trailer["generation_chunk_index"] is None
        assert got[-1][0]["stopped"] is False


async def test_an_interaction_the_upstream_refuses_is_interaction_failed() -> None:
    async with omni_double(Behaviour(refuse_interactions=True, delay_s=0.1)) as up, video_gateway(up) as gw:
        async with connect(gw.http.replace("http", "ws") + "/v1/realtime/video") as c:
            await c.send(doc.VIDEO_START)
            got = await read_video(c, until="error", interact=doc.VIDEO_CAMERA)
            error = got[-1][0]
            assert error["code"] == "interaction_failed" and error["event_id"] == "forward-1"
            assert error["request_id"] == got[0][0]["request_id"]
            await c.send(doc.VIDEO_STOP)
            done = await read_video(c)
            assert done[-1][0]["stopped"] is True


async def test_a_stalled_upstream_is_reported_and_one_that_dies_is_upstream_lost() -> None:
    async with omni_double(Behaviour(stall_after=1)) as up, video_gateway(up, video_stall_timeout_s=0.5) as gw:
        async with connect(gw.http.replace("http", "ws") + "/v1/realtime/video") as c:
            await c.send(doc.VIDEO_START)
            got = await read_video(c)
            errors = [e for e, _ in got if e["type"] == "error"]
            assert [e["code"] for e in errors] == ["stall_timeout"]
            assert got[-1][0] == {
                "type": "session.done",
                "request_id": errors[0]["request_id"],
                "chunks": 1,
                "stopped": True,
            }
        assert up.seen.stops == 1  # the upstream was told to stop
    async with omni_double(Behaviour(die_after=2)) as up, video_gateway(up) as gw:
        async with connect(gw.http.replace("http", "ws") + "/v1/realtime/video") as c:
            await c.send(doc.VIDEO_START)
            got = await read_video(c)
            assert [e["code"] for e, _ in got if e["type"] == "error"] == ["upstream_lost"]
            assert got[-1][0]["stopped"] is True
