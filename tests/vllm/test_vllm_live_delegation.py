"""GPT-Live's Responses delegation on a real backend: ``vllm serve`` (vLLM's OpenAI server,
its ``POST /v1/responses`` streaming server-sent events) with the tiny random-weight
model, on 127.0.0.1, decoding greedily (``temperature`` 0 by the server's generation
config: the same request gets the same answer). The gateway in front speaks GPT-Live on
its embedded cascade (real speech in, pocketsphinx, eSpeak NG out); every Live event is
checked against ``openai.types.live``.

Proved here: a task the client delegates (``response.item.create`` + ``response.create``)
runs on vLLM, its events come back as ``response.event`` and its text is spoken; a task the
model delegates (its thinker a script that calls ``delegate``: no CPU model here decides to
call a function, support/delegating_thinker.py) runs there with the dialogue, vLLM's call
of a client function comes back to the application, which answers it and continues the
delegation, and the result is spoken; vLLM's refusal of a request is a coded error."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.delegating_thinker import DelegatingThinker
from support.gateway import Client, RunningGateway, connect, free_port, run_gateway
from support.speech import chunks, silence, speak

from gateway.settings import Settings
from orchestrator.engines.cascade.engine import CascadeEngine

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

SERVE_START_S = 600  # vllm serve loads torch and the model: 1-3 minutes on 2 busy cores
LOOKUP = {
    "type": "function",
    "name": "lookup_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def vllm_serve(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``vllm serve`` of the tiny model on a free port of 127.0.0.1: its OpenAI API's base URL.
    Hermes tool calls (the tiny model's chat template writes them) so that a named
    ``tool_choice`` gives a function call."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("vllm-serve") / "serve.log"
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model),
        "--served-model-name", "tiny", "--dtype", "float32", "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "1024", "--enforce-eager", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--override-generation-config", '{"temperature": 0.0}',
    ]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + SERVE_START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve did not answer in {SERVE_START_S} s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # (its engine core is a child: the whole group)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
async def gw(vllm_serve: str) -> AsyncIterator[RunningGateway]:
    settings = Settings(engine="cascade", live_responses_url=vllm_serve, live_responses_api_key="sk-local")
    async with run_gateway(settings, engine=CascadeEngine(DelegatingThinker(), warm_decoders=0)) as gw:
        yield gw


def url(gw: RunningGateway) -> str:
    return f"ws://127.0.0.1:{gw.port}/v1/live/sessions"


async def start(c: Client, responses: dict[str, Any]) -> None:
    delegation = {"type": "responses", "responses": {"model": "tiny", "instructions": "Answer briefly.", **responses}}
    await c.send({"type": "session.start", "session": {"model": "gpt-live-1", "delegation": delegation}})
    await c.wait_for("session.started")


def forwarded(c: Client) -> list[dict[str, Any]]:
    return [e for e in c.events if e["type"] == "response.event"]


async def until_response_ends(c: Client) -> dict[str, Any]:
    """The next ``response.event`` that ends a Responses answer."""
    return await c.wait_for(lambda e: e["type"] == "response.event" and e["event"]["type"] in (
        "response.completed", "response.failed", "response.incomplete"), 120)  # fmt: skip


def answer_text(events: list[dict[str, Any]]) -> str:
    """What vLLM wrote, from its streamed deltas."""
    return "".join(e["event"]["delta"] for e in events if e["event"]["type"] == "response.output_text.delta")


def spoken(c: Client) -> str:
    return " ".join("".join(e["delta"] for e in c.events if e["type"] == "session.output_transcript.delta").split())


async def until_spoken(c: Client, text: str) -> None:
    words = " ".join(text.split())
    await c.wait_for(lambda e: e["type"] == "session.output_transcript.delta" and words in spoken(c), 120)


async def test_a_task_the_client_delegates_runs_on_vllm_and_its_result_is_spoken(gw: RunningGateway) -> None:
    async with connect(url(gw)) as c:
        await start(c, {"max_output_tokens": 16})
        await c.send({"type": "response.item.create", "event_id": "item",
                      "item": {"type": "message", "role": "user",
                               "content": [{"type": "input_text", "text": "Tell me a story."}]}})  # fmt: skip
        await c.send({"type": "response.create", "event_id": "go"})
        done = await until_response_ends(c)
        assert done["event"]["type"] == "response.completed"
        events = forwarded(c)
        kinds = [e["event"]["type"] for e in events]
        assert kinds[:2] == ["response.created", "response.in_progress"] and "response.output_text.delta" in kinds
        assert all(e["client_event_id"] == "go" and "delegation_id" not in e for e in events)  # the client's own
        for lifecycle in (events[0], done):  # slimmed as the API slims them
            response = lifecycle["event"]["response"]
            assert "input" not in response and response["instructions"] is None
            assert response["tools"] == [] and response["output"] == [] and response["model"] == "tiny"
        text = answer_text(events)
        assert text.strip(), kinds
        # vLLM's answer is spoken: its words in the output transcript, with audio.
        await until_spoken(c, text)
        assert [e for e in c.events if e["type"] == "session.output_audio.delta"]
        assert not [e for e in c.events if e["type"] == "error"]


async def test_the_model_delegates_to_vllm_a_function_call_comes_back_and_the_result_is_spoken(
    gw: RunningGateway,
) -> None:
    speech = await speak("what is the weather in paris")
    async with connect(url(gw)) as c:
        await start(c, {"max_output_tokens": 64, "tools": [LOOKUP],
                        "tool_choice": {"type": "function", "name": "lookup_weather"}})  # fmt: skip
        for chunk in chunks(silence(300) + speech + silence(1200)):
            await c.send({"type": "session.input_audio.append", "audio": base64.b64encode(chunk).decode()})
        created = await c.wait_for("session.delegation.created", 60)
        delegation_id = created["delegation"]["id"]
        assert created["delegation"]["target"] == "responses"
        # vLLM answers with a call of the application's function: it comes back as response.event.
        done = await until_response_ends(c)
        assert done["delegation_id"] == delegation_id and done["event"]["type"] == "response.completed"
        calls = [e["event"]["item"] for e in forwarded(c) if e["event"]["type"] == "response.output_item.done"
                 and e["event"]["item"]["type"] == "function_call"]  # fmt: skip
        assert [call["name"] for call in calls] == ["lookup_weather"], [e["event"]["type"] for e in forwarded(c)]
        assert all(e.get("delegation_id") == delegation_id for e in forwarded(c))
        # The application runs it and continues the delegation (letting the model answer in words now).
        await c.send({"type": "session.update", "session": {"delegation": {
            "type": "responses", "responses": {"tool_choice": "none", "max_output_tokens": 16}}}})  # fmt: skip
        await c.wait_for("session.updated")
        await c.send({"type": "response.item.create", "item": {
            "type": "function_call_output", "call_id": calls[0]["call_id"], "output": '{"sky": "clear"}'}})  # fmt: skip
        before = len(forwarded(c))
        await c.send({"type": "response.create", "event_id": "continue"})
        done = await until_response_ends(c)
        continued = forwarded(c)[before:]
        assert done["event"]["type"] == "response.completed"
        assert all(e["delegation_id"] == delegation_id and e["client_event_id"] == "continue" for e in continued)
        text = answer_text(continued)
        assert text.strip()
        await until_spoken(c, text)
        assert not [e for e in c.events if e["type"] == "error"]


async def test_a_request_vllm_refuses_is_a_coded_error(gw: RunningGateway) -> None:
    async with connect(url(gw)) as c:
        await start(c, {"model": "no-such-model"})
        await c.send({"type": "response.item.create", "item": {"role": "user", "content": "hi"}})
        await c.send({"type": "response.create", "event_id": "go"})
        error = (await c.wait_for("error", 60))["error"]
        assert (error["code"], error["client_event_id"]) == ("responses_backend_error", "go")
        assert "HTTP 404" in error["message"] and "no-such-model" in error["message"]
