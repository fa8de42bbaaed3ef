"""Realtime text sessions through the gateway, answered by vLLM's AsyncLLM."""

from __future__ import annotations

from typing import Any

import pytest
from support.gateway import Client, RunningGateway, connect, run_gateway

from gateway.settings import Settings
from orchestrator.engines.vllm_engine import VllmEngine

# The default 300 s timeout: the first test of the session also starts vLLM.
pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]


async def text_session(c: Client) -> None:
    await c.wait_for("session.created")
    await c.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
    updated = await c.wait_for("session.updated")
    assert updated["session"]["output_modalities"] == ["text"]


async def say(c: Client, text: str) -> None:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    await c.send({"type": "conversation.item.create", "item": item})
    await c.wait_for("conversation.item.added")


async def respond(c: Client, **response: Any) -> tuple[dict[str, Any], str]:
    """response.create → (response.done, the text of its output_text deltas)."""
    await c.send({"type": "response.create", "response": response} if response else {"type": "response.create"})
    created = await c.wait_for("response.created", timeout=30)
    rid = created["response"]["id"]
    done = await c.wait_for(lambda e: e["type"] == "response.done" and e["response"]["id"] == rid, timeout=60)
    start = c.events.index(created)
    deltas = [
        e["delta"]
        for e in c.events[start:]
        if e["type"] == "response.output_text.delta" and e.get("response_id") == rid
    ]
    # Deltas, not the text only in response.done; vLLM merges those a busy machine's gateway has
    # not read yet, so a short answer may come as one.
    assert deltas, "the text was not streamed"
    return done, "".join(deltas)


async def test_a_text_turn_streams_output_text_deltas_and_completes_with_usage(gw: RunningGateway) -> None:
    async with connect(gw.url) as c:
        await text_session(c)
        await say(c, "Hello there, how are you today?")
        done, text = await respond(c)
        resp = done["response"]
        assert resp["status"] == "completed", resp["status_details"]
        assert text.strip()
        assert resp["output"][0]["content"] == [{"type": "output_text", "text": text}]
        usage = resp["usage"]
        assert usage["input_tokens"] > 5 and usage["output_tokens"] > 1
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
        assert "response.output_audio.delta" not in c.types()


async def test_several_turns_grow_one_conversation(gw: RunningGateway) -> None:
    async with connect(gw.url) as c:
        await text_session(c)
        inputs: list[int] = []
        answers: list[str] = []
        for turn in ("Hello there.", "What is the river like in the evening?", "Thank you, my friend."):
            await say(c, turn)
            done, text = await respond(c)
            assert done["response"]["status"] in ("completed", "incomplete")
            inputs.append(done["response"]["usage"]["input_tokens"])
            answers.append(text)
        # Each turn's prompt holds the turns and answers before it.
        assert inputs == sorted(inputs) and len(set(inputs)) == 3
        assert all(a.strip() for a in answers)


async def test_max_output_tokens_ends_the_response_incomplete(gw: RunningGateway) -> None:
    async with connect(gw.url) as c:
        await text_session(c)
        await say(c, "Tell me a long story about the mountain.")
        done, _ = await respond(c, max_output_tokens=3)
        resp = done["response"]
        assert resp["status"] == "incomplete"
        assert resp["status_details"]["reason"] == "max_output_tokens"
        assert resp["usage"]["output_tokens"] == 3


async def test_an_audio_response_fails_with_a_coded_error(gw: RunningGateway) -> None:
    async with connect(gw.url) as c:
        await c.wait_for("session.created")
        await say(c, "Hello.")
        await c.send({"type": "response.create", "response": {"output_modalities": ["audio"]}})
        done = await c.wait_for("response.done", timeout=30)
        assert done["response"]["status"] == "failed"
        assert done["response"]["status_details"]["error"]["code"] == "unsupported_modality"


async def test_an_image_to_a_text_model_is_refused_naming_the_part(gw: RunningGateway) -> None:
    from support.images import data_url, png

    async with connect(gw.url) as c:
        await text_session(c)
        content = [{"type": "input_text", "text": "Look"}, {"type": "input_image", "image_url": data_url(png())}]
        item = {"type": "message", "role": "user", "content": content}
        await c.send({"type": "conversation.item.create", "item": item, "event_id": "evt_img"})
        error = (await c.wait_for("error"))["error"]
        assert (error["code"], error["param"], error["event_id"]) == ("unsupported", "item.content[1]", "evt_img")
        # The session goes on, and the model still answers text.
        await say(c, "Hello.")
        done, _ = await respond(c)
        assert done["response"]["status"] == "completed"


async def test_response_cancel_mid_generation_aborts_the_vllm_request(vllm_engine: VllmEngine) -> None:
    from vllm_support import idle

    engine = VllmEngine(vllm_engine.model, llm=vllm_engine.llm, sampling={"seed": 0, "ignore_eos": True})
    settings = Settings(engine="passthrough", video_engine="none", detach_grace_s=0.2, drain_window_s=0.5)
    async with run_gateway(settings, engine=engine, vad_factory=None) as gw, connect(gw.url) as c:
        await text_session(c)
        await say(c, "Tell me everything.")
        await c.send({"type": "response.create"})
        rid = (await c.wait_for("response.created"))["response"]["id"]
        await c.wait_for("response.output_text.delta", timeout=30)
        assert vllm_engine.llm.get_num_unfinished_requests() == 1
        await c.send({"type": "response.cancel"})
        done = await c.wait_for("response.done", timeout=30)
        assert done["response"]["id"] == rid
        assert done["response"]["status"] == "cancelled"
        await idle(vllm_engine)
        assert engine.active == set()
