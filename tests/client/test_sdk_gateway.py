"""The SDK against a real gateway (uvicorn on 127.0.0.1, the model-free
passthrough engine, manual turns): every send helper produces an event the
gateway accepts, over the JSON and the binary paths."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sdk_support import until
from support.gateway import RunningGateway, run_gateway

from gateway.settings import Settings
from omni_gateway_client import RealtimeClient, ReconnectPolicy, SessionClosed, Unauthorized
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(30)

TONE = PassthroughEngine()._chunk  # 20 ms of 24 kHz PCM16
CHUNKS = 5
TONE_10MS = PassthroughEngine(chunk_ms=10)._chunk


@pytest.fixture
async def gateway() -> AsyncIterator[RunningGateway]:
    engine = PassthroughEngine(audio_chunks=CHUNKS, paced=False)
    async with run_gateway(Settings(engine="passthrough", model="omni-test"), engine=engine, vad_factory=None) as gw:
        yield gw


async def collect_until(rt: RealtimeClient, kind: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while True:
        event = await rt.recv(timeout)
        events.append(event)
        if event["type"] == kind:
            return events


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
async def test_manual_audio_turn_is_answered_and_audio_deltas_are_bytes(gateway: RunningGateway, binary: bool) -> None:
    async with RealtimeClient(gateway.url, model="omni-test", binary=binary) as rt:
        created = await rt.recv(5)
        assert created["type"] == "session.created"
        assert rt.session_id == created["session"]["id"]
        assert created["session"]["model"] == "omni-test"
        assert rt.binary is binary
        await rt.session_update({"type": "realtime", "audio": {"input": {"turn_detection": None}}})
        updated = await rt.wait_for("session.updated", 5)
        assert updated["session"]["audio"]["input"]["turn_detection"] is None
        for _ in range(CHUNKS):
            await rt.append_audio(TONE)
        await rt.commit()
        await rt.create_response()
        events = await collect_until(rt, "response.done")
        types = [e["type"] for e in events]
        assert "error" not in types, [e for e in events if e["type"] == "error"]
        committed = next(e for e in events if e["type"] == "input_audio_buffer.committed")
        assert committed["item_id"]
        done = events[-1]
        assert done["response"]["status"] == "completed"
        deltas = [e for e in events if e["type"] == "response.output_audio.delta"]
        assert len(deltas) == CHUNKS
        assert all(isinstance(d["delta"], bytes) for d in deltas)
        assert b"".join(d["delta"] for d in deltas) == TONE * CHUNKS
        # Binary frames carry no response_id: the SDK fills it in from response.output_item.added.
        assert {d["response_id"] for d in deltas} == {done["response"]["id"]}
        assert {d["output_index"] for d in deltas} == {0}
        seqs = [created["server_event_seq"], *(e["server_event_seq"] for e in events)]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        assert rt.last_seq >= seqs[-1]  # rate_limits.updated may follow response.done
    assert rt.stats.reconnects == 0 and rt.stats.duplicates_dropped == 0 and rt.stats.gaps == 0


async def test_send_text_then_create_response_gives_a_text_answer(gateway: RunningGateway) -> None:
    async with RealtimeClient(gateway.url) as rt:
        await rt.wait_for("session.created", 5)
        await rt.send_text("hello there", event_id="evt_text")
        added = await rt.wait_for("conversation.item.added", 5)
        assert added["item"]["role"] == "user"
        assert added["item"]["content"][0]["type"] == "input_text"
        assert added["item"]["content"][0]["text"] == "hello there"
        await rt.create_response(output_modalities=["text"], instructions="be brief")
        events = await collect_until(rt, "response.done")
        assert "error" not in [e["type"] for e in events]
        assert events[-1]["response"]["status"] == "completed"
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        assert text.split() == [f"w{i}" for i in range(CHUNKS)]
        assert not any(e["type"] == "response.output_audio.delta" for e in events)


async def test_item_helpers_clear_and_cancel_are_accepted(gateway: RunningGateway) -> None:
    slow = PassthroughEngine(audio_chunks=200, chunk_ms=20, paced=True)  # 4 s: long enough to cancel
    async with run_gateway(Settings(engine="passthrough"), engine=slow, vad_factory=None) as gw, \
            RealtimeClient(gw.url, binary=True) as rt:  # fmt: skip
        await rt.wait_for("session.created", 5)
        await rt.item_create({"type": "message", "role": "user",
                              "content": [{"type": "input_text", "text": "one"}]}, event_id="evt_1")  # fmt: skip
        first = (await rt.wait_for("conversation.item.added", 5))["item"]["id"]
        await rt.item_create({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "two"}]},
                             previous_item_id=first)  # fmt: skip
        second = await rt.wait_for("conversation.item.added", 5)
        assert second["previous_item_id"] == first
        await rt.item_retrieve(first)
        retrieved = await rt.wait_for("conversation.item.retrieved", 5)
        assert retrieved["item"]["content"][0]["text"] == "one"
        await rt.item_delete(second["item"]["id"])
        assert (await rt.wait_for("conversation.item.deleted", 5))["item_id"] == second["item"]["id"]
        await rt.append_audio(TONE)
        await rt.clear()
        await rt.wait_for("input_audio_buffer.cleared", 5)

        await rt.create_response()
        delta = await rt.wait_for("response.output_audio.delta", 5)
        await rt.cancel_response()
        done = await rt.wait_for("response.done", 5)
        assert done["response"]["status"] == "cancelled"
        await rt.item_truncate(delta["item_id"], 0, 10)
        truncated = await rt.wait_for(lambda e: e["type"] in ("conversation.item.truncated", "error"), 5)
        assert truncated["type"] == "conversation.item.truncated", truncated
        assert truncated["audio_end_ms"] == 10


async def test_api_key_and_client_secret_authenticate_and_a_bad_key_is_refused() -> None:
    settings = Settings(engine="passthrough", api_keys=("sk-good",))
    async with run_gateway(settings, engine=PassthroughEngine(paced=False), vad_factory=None) as gw:
        async with RealtimeClient(gw.url, api_key="sk-good") as rt:
            assert (await rt.recv(5))["type"] == "session.created"
        with pytest.raises(Unauthorized) as refused:
            async with RealtimeClient(gw.url, api_key="sk-bad"):
                pass
        assert refused.value.close_code is None  # refused at the upgrade: HTTP 401, no socket
        assert "HTTP 401" in refused.value.message
        async with httpx.AsyncClient(base_url=gw.http) as http:
            minted = await http.post("/v1/realtime/client_secrets", json={},
                                     headers={"Authorization": "Bearer sk-good"})  # fmt: skip
        secret = minted.json()["value"]
        assert secret.startswith("ek_")
        async with RealtimeClient(gw.url, client_secret=secret) as rt:
            assert (await rt.recv(5))["type"] == "session.created"
        with pytest.raises(Unauthorized):  # single use
            async with RealtimeClient(gw.url, client_secret=secret):
                pass


async def test_close_ends_the_iterator_and_later_sends_raise(gateway: RunningGateway) -> None:
    rt = RealtimeClient(gateway.url)
    with pytest.raises(SessionClosed):
        await rt.commit()
    await rt.connect()
    await rt.close()
    await until(lambda: not rt.connected)
    assert [e["type"] async for e in rt] == ["session.created"]  # what had arrived is still delivered
    with pytest.raises(SessionClosed):
        await rt.recv(1)
    with pytest.raises(SessionClosed):
        await rt.send_text("too late")


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
async def test_an_abrupt_drop_mid_response_is_resumed_by_the_real_gateway(binary: bool) -> None:
    """Interop with the gateway's own resume: no delta lost, none duplicated."""
    engine = PassthroughEngine(audio_chunks=40, chunk_ms=10, paced=True)
    policy = ReconnectPolicy(initial_delay=0.02, max_delay=0.1)
    async with run_gateway(Settings(engine="passthrough"), engine=engine, vad_factory=None) as gw, \
            RealtimeClient(gw.url, binary=binary, reconnect=policy) as rt:  # fmt: skip
        await rt.wait_for("session.created", 5)
        assert rt.resume_token
        await rt.send_text("hi")
        await rt.create_response()
        audio: list[bytes] = []
        types: list[str] = []
        while True:
            event = await rt.recv(10)
            types.append(event["type"])
            if event["type"] == "response.output_audio.delta":
                audio.append(event["delta"])
                if len(audio) == 10:
                    assert rt._ws is not None and rt._ws.transport is not None
                    rt._ws.transport.abort()  # a network failure: no close frame
            if event["type"] == "response.done":
                break
        assert "session.resumed" in types or "session.resync_required" in types
        assert event["response"]["status"] == "completed"
        assert audio == [TONE_10MS] * 40
        assert rt.stats.reconnects == 1 and rt.stats.gaps == 0
