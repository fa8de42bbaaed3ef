"""GPT-Live delegation through the gateway, over a real socket, every event checked against
``openai.types.live``: client delegation end to end on the embedded cascade (real speech,
silero VAD, pocketsphinx, eSpeak NG) whose thinker is a script that calls ``delegate``
(``support.delegating_thinker``: no CPU model here decides to call a function); the
refusals and failures of Responses delegation without a reachable backend. Responses
delegation on a real backend (``vllm serve``) is tests/vllm/test_vllm_live_delegation.py's."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support.delegating_thinker import DelegatingThinker
from support.gateway import Client, RunningGateway, connect, free_port, run_gateway
from support.speech import chunks, silence, speak

from gateway.session.live_delegation import ACK_SAY
from gateway.settings import Settings
from orchestrator.engines.cascade.engine import CascadeEngine
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def thinker() -> DelegatingThinker:
    return DelegatingThinker()


@pytest.fixture
async def gw(thinker: DelegatingThinker) -> AsyncIterator[RunningGateway]:
    async with run_gateway(Settings(engine="cascade"), engine=CascadeEngine(thinker, warm_decoders=0)) as gw:
        yield gw


def url(gw: RunningGateway) -> str:
    return f"ws://127.0.0.1:{gw.port}/v1/live/sessions"


async def start(c: Client, **session: Any) -> dict[str, Any]:
    await c.send({"type": "session.start", "event_id": "start", "session": {"model": "gpt-live-1", **session}})
    return await c.wait_for(lambda e: e["type"] in ("session.started", "error"))


async def say(c: Client, pcm: bytes) -> None:
    for chunk in chunks(pcm):
        await c.send({"type": "session.input_audio.append", "audio": base64.b64encode(chunk).decode()})


def spoken(c: Client) -> str:
    return "".join(e["delta"] for e in c.events if e["type"] == "session.output_transcript.delta")


async def until_spoken(c: Client, text: str, timeout: float = 60.0) -> None:
    """Until the output transcript holds ``text`` (eSpeak says it sentence by sentence)."""
    await c.wait_for(lambda e: e["type"] == "session.output_transcript.delta" and text in spoken(c), timeout)


async def test_the_model_delegates_to_the_application_which_answers_with_commentary(
    gw: RunningGateway, thinker: DelegatingThinker
) -> None:
    speech = await speak("what is the weather in paris")
    async with connect(url(gw)) as c:
        assert (await start(c))["type"] == "session.started"
        await say(c, silence(300) + speech + silence(1200))
        created = await c.wait_for("session.delegation.created", 60)
        delegation = created["delegation"]
        assert delegation["type"] == "delegation" and delegation["target"] == "client"
        assert delegation["id"].startswith("deleg_") and "response_id" not in delegation
        heard = [e for e in c.events if e["type"] == "session.input_transcript.delta"]
        assert heard and created["offset_ms"] >= heard[-1]["end_ms"]  # on the timeline, after the request
        assert thinker.tasks and thinker.tasks[0].startswith("Answer the user:")
        # The automatic acknowledgement (acknowledgement_delay_ms 0), said as the script says what it must.
        await until_spoken(c, ACK_SAY)
        # The application answers, naming the delegation; the result is said.
        await c.send({"type": "session.thinking.append", "event_id": "t", "content": "Looked it up.",
                      "delegation_id": delegation["id"]})  # fmt: skip
        assert (await c.wait_for("session.thinking.appended"))["client_event_id"] == "t"
        await c.send({"type": "session.commentary.append", "event_id": "c", "content": "It is sunny in Paris.",
                      "delegation_id": delegation["id"]})  # fmt: skip
        await c.wait_for("session.commentary.appended")
        await until_spoken(c, "It is sunny in Paris.")
        assert spoken(c).index(ACK_SAY) < spoken(c).index("It is sunny in Paris.")
        # Nothing of the function call reached the client: Live events only, and no error.
        assert not [e for e in c.events if e["type"] == "error"]
        assert not [e for e in c.events if e["type"].startswith(("response.", "conversation."))]


async def test_thinking_before_the_acknowledgement_is_due_drops_it(gw: RunningGateway) -> None:
    speech = await speak("what is the weather in paris")
    async with connect(url(gw)) as c:
        session_id = (await start(c, delegation={"type": "client", "acknowledgement_delay_ms": 30_000}))["session"][
            "id"
        ]
        delegations = gw.runtime.hosts[session_id].session._delegations  # type: ignore[attr-defined]
        await say(c, silence(300) + speech + silence(1200))
        delegation_id = (await c.wait_for("session.delegation.created", 60))["delegation"]["id"]
        assert delegations.pending_acks == {delegation_id}  # due in 30 s
        await c.send({"type": "session.thinking.append", "content": "On it.", "delegation_id": delegation_id})
        await c.wait_for("session.thinking.appended")
        assert delegations.pending_acks == set()  # dropped: nothing is said when it falls due
        await c.send({"type": "session.commentary.append", "content": "Rain.", "delegation_id": None})
        await until_spoken(c, "Rain.")
        assert ACK_SAY not in spoken(c)


async def test_responses_delegation_is_refused_where_the_gateway_has_no_backend(gw: RunningGateway) -> None:
    async with connect(url(gw)) as c:
        refused = await start(c, delegation={"type": "responses", "responses": {"model": "tiny"}})
        assert refused["type"] == "error"
        assert (refused["error"]["code"], refused["error"]["param"]) == (
            "responses_backend_unconfigured", "session.delegation.type"
        )  # fmt: skip
        assert "live_responses_url" in refused["error"]["message"]
        assert (await start(c))["type"] == "session.started"  # nothing was opened


async def test_an_unreachable_backend_is_a_coded_error_and_the_session_goes_on() -> None:
    settings = Settings(engine="cascade", live_responses_url=f"http://127.0.0.1:{free_port()}/v1")
    async with run_gateway(settings, engine=CascadeEngine(DelegatingThinker(), warm_decoders=0)) as gw:
        async with connect(url(gw)) as c:
            assert (await start(c, delegation={"type": "responses", "responses": {"model": "tiny"}}))["type"] == (
                "session.started"
            )
            await c.send({"type": "response.item.create", "item": {"role": "user", "content": "hello"}})
            await c.send({"type": "response.create", "event_id": "go"})
            error = await c.wait_for("error")
            assert (error["error"]["code"], error["client_event_id"]) == ("responses_backend_unreachable", "go")
            await c.send({"type": "response.create", "event_id": "again"})  # not stuck: it runs (and fails) again
            assert (await c.wait_for("error"))["client_event_id"] == "again"
            await c.send({"type": "session.close"})
            await c.wait_for("session.closed")


async def test_a_request_under_way_keeps_the_session_busy_and_ends_with_it() -> None:
    """A backend that has begun its answer and goes on (a raw server on 127.0.0.1): a drain
    waits for the request (the session is not idle), and closing the session drops it."""
    dropped = asyncio.Event()

    async def backend(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
                     b'data: {"type": "response.created", "response": {"id": "r1", "output": []}}\n\n')  # fmt: skip
        await writer.drain()
        await reader.read()  # until the gateway drops the connection
        dropped.set()
        writer.close()

    server = await asyncio.start_server(backend, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    settings = Settings(engine="passthrough", live_responses_url=f"http://127.0.0.1:{port}/v1")
    try:
        async with run_gateway(settings, engine=PassthroughEngine(audio_chunks=10), vad_factory=None) as gw:
            async with connect(url(gw)) as c:
                started = await start(c, delegation={"type": "responses", "responses": {"model": "tiny"}})
                host = gw.runtime.hosts[started["session"]["id"]]
                await c.send({"type": "response.item.create", "item": {"role": "user", "content": "hello"}})
                await c.send({"type": "response.create"})
                await c.wait_for("response.event")
                assert host.backend_tasks and not host.idle()
                await c.send({"type": "session.close"})
                await c.wait_for("session.closed")
                await asyncio.wait_for(dropped.wait(), 10)
                assert not host.backend_tasks
    finally:
        server.close()
        await server.wait_closed()
