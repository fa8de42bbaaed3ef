"""The realtime protocol over real sockets: a real uvicorn on 127.0.0.1, a real
WebSocket client, the model-free passthrough engine and manual turns."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support.gateway import Client, RunningGateway, connect, run_gateway

from gateway.protocol.server_events import BINARY_SUBPROTOCOL
from gateway.settings import Settings
from omni_gateway_client.frames import encode_input_frame
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(60)

CHUNKS = 5  # audio chunks per passthrough answer
CHUNK_BYTES = 24000 * 2 * 20 // 1000  # 20 ms of 24 kHz PCM16
MS = 48  # bytes of 24 kHz PCM16 per millisecond

GA_RESPONSE_ORDER = [
    "response.created",
    "response.output_item.added",
    "conversation.item.added",
    "response.content_part.added",
    "response.output_audio_transcript.delta",
    "response.output_audio.delta",
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
]


def settings(**kwargs: Any) -> Settings:
    """Passthrough settings for these tests. A session whose socket drops stays
    resumable for ``detach_grace_s`` before its requests are cancelled (the
    resume tests cover that window); here it is short so that leaks show at once.
    ``drain_window_s`` bounds the shutdown of a gateway with answers still running."""
    kwargs.setdefault("detach_grace_s", 0.2)
    kwargs.setdefault("drain_window_s", 0.5)
    kwargs.setdefault("video_engine", "none")
    return Settings(engine="passthrough", **kwargs)


def passthrough(**kwargs: Any) -> PassthroughEngine:
    kwargs.setdefault("audio_chunks", CHUNKS)
    kwargs.setdefault("paced", False)
    return PassthroughEngine(**kwargs)


@pytest.fixture
async def gw() -> AsyncIterator[RunningGateway]:
    async with run_gateway(settings(), engine=passthrough(), vad_factory=None) as gw:
        yield gw


@pytest.fixture
async def paced_gw() -> AsyncIterator[RunningGateway]:
    """Answers that last 4 s (200 paced chunks of 20 ms): time to act mid-response."""
    engine = passthrough(audio_chunks=200, paced=True)
    async with run_gateway(settings(), engine=engine, vad_factory=None) as gw:
        yield gw


def dedupe(types: list[str]) -> list[str]:
    """Collapse runs and repeats of delta events so the order of phases shows."""
    out: list[str] = []
    for t in types:
        if t not in out:
            out.append(t)
    return out


def response_events(c: Client, response_id: str) -> list[dict[str, Any]]:
    """The events of one response, from response.created to response.done."""
    start = next(
        i for i, e in enumerate(c.events) if e["type"] == "response.created" and e["response"]["id"] == response_id
    )
    end = next(i for i, e in enumerate(c.events) if e["type"] == "response.done" and e["response"]["id"] == response_id)
    return c.events[start : end + 1]


def assert_seq_ordered(events: list[dict[str, Any]]) -> None:
    seqs = [e["server_event_seq"] for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), seqs
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "a gap in server_event_seq"


async def text_item(c: Client, text: str, item_id: str | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    if item_id is not None:
        item["id"] = item_id
    await c.send({"type": "conversation.item.create", "item": item})
    return await c.wait_for("conversation.item.added")


async def full_response(c: Client, **response: Any) -> dict[str, Any]:
    await c.send({"type": "response.create", "response": response} if response else {"type": "response.create"})
    return await c.wait_for("response.done")


# --- turns ------------------------------------------------------------------------


async def test_manual_audio_turn_runs_the_whole_ga_event_sequence(gw: RunningGateway) -> None:
    async with connect(gw.url) as c:
        created = await c.wait_for("session.created")
        assert created["session"]["type"] == "realtime"
        assert created["session"]["audio"]["input"]["turn_detection"] is None  # no VAD here: manual turns
        for _ in range(4):
            await c.append(bytes(50 * MS))
        await c.send({"type": "input_audio_buffer.commit", "event_id": "commit_1"})
        committed = await c.wait_for("input_audio_buffer.committed")
        user_item = await c.wait_for("conversation.item.added")
        assert user_item["item"]["id"] == committed["item_id"]
        assert user_item["item"]["role"] == "user"
        done = await full_response(c)
        resp = done["response"]
        assert resp["status"] == "completed"
        assert resp["status_details"] is None
        usage = resp["usage"]
        assert usage is not None
        assert usage["output_tokens"] > 0
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
        assert usage["output_token_details"]["audio_tokens"] == CHUNKS
        events = response_events(c, resp["id"])
        assert dedupe([e["type"] for e in events]) == GA_RESPONSE_ORDER
        deltas = [e for e in events if e["type"] == "response.output_audio.delta"]
        assert len(deltas) == CHUNKS
        audio = b"".join(base64.b64decode(e["delta"]) for e in deltas)
        assert len(audio) == CHUNKS * CHUNK_BYTES
        transcript = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
        assert transcript == "w0 w1 w2 w3 w4 "
        item = resp["output"][0]
        assert item["role"] == "assistant" and item["status"] == "completed"
        assert item["content"] == [{"type": "output_audio", "transcript": transcript}]
        assert all(isinstance(e["event_id"], str) and e["event_id"] for e in c.events)
        assert_seq_ordered(c.events)


async def test_text_turn_is_answered(gw: RunningGateway) -> None:
    async with connect(gw.url) as c:
        await c.wait_for("session.created")
        added = await text_item(c, "hello there", item_id="msg_1")
        assert added["item"]["id"] == "msg_1"
        assert added["item"]["content"] == [{"type": "input_text", "text": "hello there"}]
        await c.wait_for("conversation.item.done")
        done = await full_response(c)
        assert done["response"]["status"] == "completed"
        assert done["response"]["usage"]["input_token_details"]["text_tokens"] == 2  # "hello there"
        final = next(e for e in c.events if e["type"] == "response.output_audio_transcript.done")
        assert final["transcript"] == "w0 w1 w2 w3 w4 "


async def test_text_only_response_sends_text_deltas_and_no_audio(gw: RunningGateway) -> None:
    async with connect(gw.url) as c:
        await c.wait_for("session.created")
        await text_item(c, "hi")
        done = await full_response(c, output_modalities=["text"])
        events = response_events(c, done["response"]["id"])
        types = [e["type"] for e in events]
        assert "response.output_audio.delta" not in types
        assert "response.output_audio_transcript.delta" not in types
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        assert text == "w0 w1 w2 w3 w4 "
        assert next(e for e in events if e["type"] == "response.output_text.done")["text"] == text
        assert done["response"]["output_modalities"] == ["text"]
        assert done["response"]["output"][0]["content"] == [{"type": "output_text", "text": text}]


async def test_session_text_modality_applies_to_later_responses(gw: RunningGateway) -> None:
    async with connect(gw.url) as c:
        await c.wait_for("session.created")
        await c.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
        updated = await c.wait_for("session.updated")
        assert updated["session"]["output_modalities"] == ["text"]
        await full_response(c)
        assert "response.output_audio.delta" not in c.types()
        assert "response.output_text.delta" in c.types()


async def test_transcription_of_a_committed_turn_is_reported(gw: RunningGateway) -> None:
    async with connect(gw.url) as c:
        await c.wait_for("session.created")
        await c.send(
            {
                "type": "session.update",
                "session": {
                    "type": "realtime",
                    "audio": {"input": {"transcription": {"model": "gpt-4o-mini-transcribe"}}},
                },
            }
        )
        await c.wait_for("session.updated")
        await c.append(bytes(60 * MS))
        await c.append(bytes(60 * MS))
        await c.send({"type": "input_audio_buffer.commit"})
        done = await c.wait_for("conversation.item.input_audio_transcription.completed")
        assert done["transcript"] == "1 2"  # the passthrough numbers the chunks it was fed
        deltas = [e["delta"] for e in c.events if e["type"] == "conversation.item.input_audio_transcription.delta"]
        assert "".join(deltas) == "1 2"  # the deltas add up to the transcript
        await c.send({"type": "conversation.item.retrieve", "item_id": done["item_id"]})
        got = await c.wait_for("conversation.item.retrieved")
        assert got["item"]["content"][0]["transcript"] == "1 2"


# --- cancel, truncate, items --------------------------------------------------------


async def wait_until(predicate: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def test_cancel_mid_response_ends_it_and_aborts_the_engine_request(paced_gw: RunningGateway) -> None:
    engine = paced_gw.runtime.engine
    assert isinstance(engine, PassthroughEngine)
    async with connect(paced_gw.url) as c:
        await c.wait_for("session.created")
        await c.send({"type": "response.create"})
        created = await c.wait_for("response.created")
        resp_id = created["response"]["id"]
        await c.wait_for("response.output_audio.delta")
        await c.send({"type": "response.cancel", "event_id": "cancel_1"})
        done = await c.wait_for("response.done")
        assert done["response"]["id"] == resp_id
        assert done["response"]["status"] == "cancelled"
        assert done["response"]["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
        await wait_until(lambda: resp_id in engine.aborted)
        await wait_until(lambda: paced_gw.runtime.orchestrator.pending == 0)
        assert engine.active == set()
        # Nothing of the cancelled response arrives after its response.done.
        await asyncio.sleep(0.2)
        await c.send({"type": "input_audio_buffer.clear"})
        await c.wait_for("input_audio_buffer.cleared")
        after = c.events[c.events.index(done) + 1 :]
        assert [e["type"] for e in after] == ["rate_limits.updated", "input_audio_buffer.cleared"]
        deltas = sum(1 for e in c.events if e["type"] == "response.output_audio.delta")
        assert deltas < 200


async def test_client_that_disconnects_mid_response_leaks_nothing_after_the_resume_window(
    paced_gw: RunningGateway,
) -> None:
    rt = paced_gw.runtime
    engine = rt.engine
    assert isinstance(engine, PassthroughEngine)
    async with connect(paced_gw.url) as c:
        await c.wait_for("session.created")
        await c.send({"type": "response.create"})
        resp_id = (await c.wait_for("response.created"))["response"]["id"]
        await c.wait_for("response.output_audio.delta")
        assert engine.active == {resp_id}
    await wait_until(lambda: resp_id in engine.aborted)
    await wait_until(lambda: rt.orchestrator.pending == 0 and not rt.connections)
    assert engine.active == set()
    assert rt.orchestrator.running == 0
    assert rt.metrics.registry.get_sample_value("omni_sessions_active") == 0.0


async def test_disconnect_with_an_open_input_buffer_cancels_its_transcription(gw: RunningGateway) -> None:
    rt = gw.runtime
    engine = rt.engine
    assert isinstance(engine, PassthroughEngine)
    async with connect(gw.url) as c:
        await c.wait_for("session.created")
        await c.append(bytes(50 * MS))
        await wait_until(lambda: len(engine.active) == 1)
        (rid,) = engine.active
    await wait_until(lambda: rt.orchestrator.pending == 0 and not engine.active)
    assert rid in engine.aborted


async def test_truncate_after_a_response_shortens_its_transcript(gw: RunningGateway) -> None:
    async with connect(gw.url) as c:
        await c.wait_for("session.created")
        done = await full_response(c)  # 5 chunks: w0 at 0 ms, w1 at 20 ms, ... 100 ms of audio
        item_id = done["response"]["output"][0]["id"]
        await c.send(
            {
                "type": "conversation.item.truncate",
                "item_id": item_id,
                "content_index": 0,
                "audio_end_ms": 30,
                "event_id": "trunc",
            }
        )
        truncated = await c.wait_for("conversation.item.truncated")
        assert (truncated["item_id"], truncated["content_index"], truncated["audio_end_ms"]) == (item_id, 0, 30)
        await c.send({"type": "conversation.item.retrieve", "item_id": item_id})
        got = await c.wait_for("conversation.item.retrieved")
        assert got["item"]["content"][0]["transcript"] == "w0 w1 "


async def test_items_can_be_retrieved_and_deleted(gw: RunningGateway) -> None:
    async with connect(gw.url) as c:
        await c.wait_for("session.created")
        await text_item(c, "keep me", item_id="item_a")
        await c.send({"type": "conversation.item.retrieve", "item_id": "item_a", "event_id": "r1"})
        got = await c.wait_for("conversation.item.retrieved")
        assert got["item"]["id"] == "item_a"
        assert got["item"]["content"] == [{"type": "input_text", "text": "keep me"}]
        await c.send({"type": "conversation.item.delete", "item_id": "item_a"})
        deleted = await c.wait_for("conversation.item.deleted")
        assert deleted["item_id"] == "item_a"
        await c.send({"type": "conversation.item.retrieve", "item_id": "item_a", "event_id": "r2"})
        err = await c.wait_for("error")
        assert (err["error"]["code"], err["error"]["event_id"]) == ("item_not_found", "r2")


async def test_conversation_over_its_item_limit_drops_the_oldest() -> None:
    async with (
        run_gateway(settings(max_conversation_items=2), engine=passthrough(), vad_factory=None) as gw,
        connect(gw.url) as c,
    ):
        await c.wait_for("session.created")
        for name in ("a", "b", "c"):
            await text_item(c, name, item_id=name)
        assert [e["item_id"] for e in c.events if e["type"] == "conversation.item.deleted"] == ["a"]
        await c.send({"type": "conversation.item.retrieve", "item_id": "a", "event_id": "gone"})
        assert (await c.wait_for("error"))["error"]["code"] == "item_not_found"


async def test_responses_follow_one_another_in_one_session(gw: RunningGateway) -> None:
    async with connect(gw.url) as c:
        await c.wait_for("session.created")
        first = await full_response(c)
        second = await full_response(c)
        assert first["response"]["id"] != second["response"]["id"]
        assert second["response"]["status"] == "completed"
        assert_seq_ordered(c.events)


# --- beta clients --------------------------------------------------------------------

BETA_NAMES_SEEN = {
    "response.audio.delta",
    "response.audio_transcript.delta",
    "response.audio.done",
    "response.audio_transcript.done",
    "conversation.item.created",
}
GA_ONLY_NAMES = {
    "response.output_audio.delta",
    "response.output_audio_transcript.delta",
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "conversation.item.added",
}


async def beta_turn(c: Client) -> dict[str, Any]:
    created = await c.wait_for("session.created")
    await c.send(
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        }
    )
    await c.wait_for("conversation.item.created")
    await c.send({"type": "response.create"})
    await c.wait_for("response.done")
    return created


async def test_beta_header_client_gets_beta_names_and_flat_session(gw: RunningGateway) -> None:
    async with connect(gw.url, headers={"OpenAI-Beta": "realtime=v1"}) as c:
        created = await beta_turn(c)
        session = created["session"]
        assert session["input_audio_format"] == "pcm16"
        assert session["output_audio_format"] == "pcm16"
        assert session["modalities"] == ["audio", "text"]
        assert "audio" not in session and "type" not in session
        types = set(c.types())
        assert types >= BETA_NAMES_SEEN
        assert not types & GA_ONLY_NAMES
        done = c.events[-1]
        assert done["response"]["modalities"] == ["audio", "text"]
        assert done["response"]["output"][0]["content"][0]["type"] == "audio"
        audio = b"".join(base64.b64decode(e["delta"]) for e in c.events if e["type"] == "response.audio.delta")
        assert len(audio) == CHUNKS * CHUNK_BYTES


async def test_beta_subprotocol_client_gets_beta_names_and_flat_session(gw: RunningGateway) -> None:
    async with connect(gw.url, subprotocols=["openai-beta.realtime-v1"]) as c:
        assert c.ws.subprotocol == "openai-beta.realtime-v1"
        created = await beta_turn(c)
        assert created["session"]["input_audio_format"] == "pcm16"
        types = set(c.types())
        assert types >= BETA_NAMES_SEEN
        assert not types & GA_ONLY_NAMES


async def test_beta_session_update_uses_flat_fields(gw: RunningGateway) -> None:
    async with connect(gw.url, headers={"OpenAI-Beta": "realtime=v1"}) as c:
        await c.wait_for("session.created")
        await c.send(
            {
                "type": "session.update",
                "session": {
                    "voice": "ash",
                    "input_audio_format": "g711_ulaw",
                    "turn_detection": None,
                    "modalities": ["text"],
                },
            }
        )
        updated = await c.wait_for("session.updated")
        s = updated["session"]
        assert (s["voice"], s["input_audio_format"], s["modalities"]) == ("ash", "g711_ulaw", ["text"])
        await c.send({"type": "response.create"})
        await c.wait_for("response.done")
        assert "response.text.delta" in c.types()
        assert "response.output_text.delta" not in c.types()


async def test_beta_clients_never_see_ga_only_events(gw: RunningGateway) -> None:
    async with connect(gw.url, headers={"OpenAI-Beta": "realtime=v1"}) as c:
        await beta_turn(c)
        assert "conversation.item.done" not in c.types()


async def test_ga_client_gets_no_beta_names(gw: RunningGateway) -> None:
    async with connect(gw.url) as c:
        await c.wait_for("session.created")
        await full_response(c)
        assert not set(c.types()) & BETA_NAMES_SEEN


# --- binary fast path and subprotocols ---------------------------------------------------


async def test_binary_subprotocol_is_echoed_and_audio_deltas_arrive_as_binary_frames(gw: RunningGateway) -> None:
    async with connect(gw.url, subprotocols=[BINARY_SUBPROTOCOL]) as c:
        assert c.ws.subprotocol == BINARY_SUBPROTOCOL
        await c.wait_for("session.created")
        await c.ws.send(encode_input_frame(bytes(120 * MS)))
        await c.send({"type": "input_audio_buffer.commit"})
        committed = await c.wait_for("input_audio_buffer.committed")
        assert committed["item_id"]
        done = await full_response(c)
        assert len(c.binary) == CHUNKS
        deltas = [e for e in c.events if e["type"] == "response.output_audio.delta"]
        assert len(deltas) == CHUNKS
        item_id = done["response"]["output"][0]["id"]
        for e in deltas:
            assert isinstance(e["delta"], bytes)  # decoded from a binary frame, not base64 JSON
            assert len(e["delta"]) == CHUNK_BYTES
            assert (e["item_id"], e["content_index"]) == (item_id, 0)
        # The binary frames' header seq slots into the JSON events' seq order, without a gap.
        assert_seq_ordered(c.events)


async def test_binary_input_frames_feed_the_input_buffer(gw: RunningGateway) -> None:
    engine = gw.runtime.engine
    assert isinstance(engine, PassthroughEngine)
    async with connect(gw.url, subprotocols=[BINARY_SUBPROTOCOL]) as c:
        await c.wait_for("session.created")
        await c.send(
            {
                "type": "session.update",
                "session": {"type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}},
            }
        )
        await c.wait_for("session.updated")
        for _ in range(3):
            await c.ws.send(encode_input_frame(bytes(40 * MS)))
        await c.send({"type": "input_audio_buffer.commit"})
        done = await c.wait_for("conversation.item.input_audio_transcription.completed")
        assert done["transcript"] == "1 2 3"  # three frames, three chunks to the engine


async def test_binary_preferred_when_offered_with_others(gw: RunningGateway) -> None:
    async with connect(gw.url, subprotocols=["realtime", BINARY_SUBPROTOCOL]) as c:
        assert c.ws.subprotocol == BINARY_SUBPROTOCOL


async def test_without_the_binary_subprotocol_audio_stays_json(gw: RunningGateway) -> None:
    async with connect(gw.url, subprotocols=["realtime"]) as c:
        assert c.ws.subprotocol == "realtime"
        await c.wait_for("session.created")
        await full_response(c)
        assert c.binary == []
        deltas = [e for e in c.events if e["type"] == "response.output_audio.delta"]
        assert len(deltas) == CHUNKS
        assert all(isinstance(e["delta"], str) for e in deltas)


async def test_no_subprotocol_offered_none_echoed(gw: RunningGateway) -> None:
    async with connect(gw.url) as c:
        assert c.ws.subprotocol is None
        await c.wait_for("session.created")


async def test_key_subprotocol_is_never_echoed(gw: RunningGateway) -> None:
    async with connect(gw.url, subprotocols=["openai-insecure-api-key.anything"]) as c:
        assert c.ws.subprotocol is None
        await c.wait_for("session.created")
    async with connect(gw.url, subprotocols=["openai-insecure-api-key.anything", "realtime"]) as c:
        assert c.ws.subprotocol == "realtime"
        await c.wait_for("session.created")


async def test_model_query_parameter_names_the_session_model(gw: RunningGateway) -> None:
    async with connect(gw.url + "?model=gpt-realtime") as c:
        created = await c.wait_for("session.created")
        assert created["session"]["model"] == "gpt-realtime"


async def test_two_sessions_are_independent(gw: RunningGateway) -> None:
    async with connect(gw.url) as a, connect(gw.url) as b:
        ca = await a.wait_for("session.created")
        cb = await b.wait_for("session.created")
        assert ca["session"]["id"] != cb["session"]["id"]
        await text_item(a, "only in a", item_id="shared_id")
        await text_item(b, "only in b", item_id="shared_id")  # no item_already_exists across sessions
        await a.send({"type": "conversation.item.retrieve", "item_id": "shared_id"})
        assert (await a.wait_for("conversation.item.retrieved"))["item"]["content"][0]["text"] == "only in a"


async def test_an_engine_that_calls_no_function_fails_required_and_answers_auto(gw: RunningGateway) -> None:
    tool = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
    async with connect(gw.url) as c:
        await c.wait_for("session.created")
        await c.send({"type": "session.update", "session": {"type": "realtime", "tools": [tool]}})
        await c.wait_for("session.updated")
        await c.send({"type": "response.create"})
        done = await c.wait_for("response.done")
        assert done["response"]["status"] == "completed"  # auto: the passthrough answers as always
        await c.send({"type": "response.create", "event_id": "req", "response": {"tool_choice": "required"}})
        error = await c.wait_for("error")
        assert (error["error"]["code"], error["error"]["event_id"]) == ("tools_unsupported", "req")
        done = await c.wait_for("response.done")
        assert done["response"]["status"] == "failed"
        assert done["response"]["status_details"]["error"]["code"] == "tools_unsupported"


async def test_an_out_of_band_response_streams_while_the_default_one_runs(paced_gw: RunningGateway) -> None:
    async with connect(paced_gw.url) as c:
        await c.wait_for("session.created")
        await c.send({"type": "response.create"})
        main = (await c.wait_for("response.created"))["response"]["id"]
        await c.wait_for("response.output_audio.delta")
        await c.send({"type": "response.create", "response": {"conversation": "none", "output_modalities": ["text"]}})
        oob = (await c.wait_for("response.created"))["response"]["id"]
        first = await c.wait_for(lambda e: e["type"] == "response.done")
        second = await c.wait_for(lambda e: e["type"] == "response.done")
        assert {first["response"]["id"], second["response"]["id"]} == {main, oob}
        assert all(d["response"]["status"] == "completed" for d in (first, second))
        types_by_response = [e.get("response_id") for e in c.events if e["type"].endswith(".delta")]
        last_main = len(types_by_response) - 1 - types_by_response[::-1].index(main)
        assert types_by_response.index(oob) < last_main  # their deltas interleaved: they ran together
        assert "error" not in c.types()
        out = next(d for d in (first, second) if d["response"]["id"] == oob)["response"]
        assert out["conversation_id"] is None
