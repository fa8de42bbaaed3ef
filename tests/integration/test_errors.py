"""Every error code a client can provoke, over a real socket: the error
envelope, the client's event_id echoed, and the session still usable after."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
import websockets
from support.gateway import Client, RunningGateway, connect, run_gateway

from gateway.protocol.errors import Code
from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(60)

MS = 48  # bytes of 24 kHz PCM16 per millisecond


def settings(**kwargs: Any) -> Settings:
    """A dropped socket's session stays resumable ``detach_grace_s``; short here so
    that requests are cancelled at once. ``drain_window_s`` bounds shutdown."""
    kwargs.setdefault("detach_grace_s", 0.2)
    kwargs.setdefault("drain_window_s", 0.5)
    kwargs.setdefault("video_engine", "none")
    return Settings(engine="passthrough", **kwargs)


@pytest.fixture
async def gw() -> AsyncIterator[RunningGateway]:
    engine = PassthroughEngine(audio_chunks=5, paced=False)
    async with run_gateway(settings(), engine=engine, vad_factory=None) as gw:
        yield gw


@pytest.fixture
async def paced_gw() -> AsyncIterator[RunningGateway]:
    engine = PassthroughEngine(audio_chunks=200, paced=True)
    async with run_gateway(settings(), engine=engine, vad_factory=None) as gw:
        yield gw


@contextlib.asynccontextmanager
async def session(url: str, **kwargs: Any) -> AsyncIterator[Client]:
    async with connect(url, **kwargs) as c:
        await c.wait_for("session.created")
        yield c


def check_envelope(event: dict[str, Any], code: str, *, event_id: str | None, param: Any = ...) -> dict[str, Any]:
    """The error event shape every client relies on."""
    assert event["type"] == "error"
    assert isinstance(event["event_id"], str) and event["event_id"].startswith("event_")
    assert isinstance(event["server_event_seq"], int)
    err = event["error"]
    assert set(err) == {"type", "code", "message", "param", "event_id"}
    assert err["code"] == code, err
    assert err["type"] == "invalid_request_error"
    assert isinstance(err["message"], str) and err["message"]
    assert err["event_id"] == event_id
    if param is not ...:
        assert err["param"] == param
    return err


async def expect_error(
    c: Client, event: dict[str, Any] | str | bytes, code: str, *, param: Any = ..., echo: bool = True
) -> dict[str, Any]:
    """Send ``event`` (with a fresh event_id when it is a dict) and check the error it earns."""
    event_id = None
    if isinstance(event, dict):
        event_id = "evt_" + secrets.token_hex(4)
        event = {**event, "event_id": event_id}
        await c.send(event)
    else:
        await c.ws.send(event)
    got = await c.wait_for("error", timeout=10)
    return check_envelope(got, code, event_id=event_id if echo else None, param=param)


ADDED = ("conversation.item.added", "conversation.item.created")


async def still_works(c: Client) -> None:
    """A following valid event succeeds: the session went on after the error."""
    item_id = "ok_" + secrets.token_hex(4)
    await c.send(
        {
            "type": "conversation.item.create",
            "item": {
                "id": item_id,
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "still here"}],
            },
        }
    )
    added = await c.wait_for(
        lambda e: (
            e["type"] == "error" or (e["type"] in ADDED and e["item"]["id"] == item_id)
        ),  # beta clients: conversation.item.created
        timeout=10,
    )
    assert added["type"] in ADDED, added
    assert added["item"]["id"] == item_id


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# --- decoding errors: one gateway, every malformed event -----------------------------

DECODE_ERRORS: list[tuple[str, dict[str, Any], str, str | None]] = [
    ("unknown_event", {"type": "conversation.clear"}, Code.UNKNOWN_EVENT, "type"),
    ("missing_required_parameter", {"type": "conversation.item.retrieve"}, Code.MISSING_FIELD, "item_id"),
    ("missing_type", {"item_id": "x"}, Code.MISSING_FIELD, "type"),
    ("invalid_type", {"type": "conversation.item.delete", "item_id": 12}, Code.INVALID_TYPE, "item_id"),
    (
        "invalid_type_truncate",
        {"type": "conversation.item.truncate", "item_id": "i", "content_index": "0", "audio_end_ms": 0},
        Code.INVALID_TYPE,
        "content_index",
    ),
    ("invalid_base64", {"type": "input_audio_buffer.append", "audio": "***"}, Code.INVALID_BASE64, "audio"),
    (
        "invalid_audio_format",
        {"type": "input_audio_buffer.append", "audio": b64(b"\x00\x01\x02")},
        Code.INVALID_AUDIO,
        "audio",
    ),
    (
        "unsupported_audio_format",
        {
            "type": "session.update",
            "session": {"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}},
        },
        Code.UNSUPPORTED_FORMAT,
        "session.audio.input.format.rate",
    ),
    (
        "unknown_parameter",
        {"type": "session.update", "session": {"type": "realtime", "instructions": "x", "loudness": 11}},
        Code.UNKNOWN_PARAMETER,
        "session.loudness",
    ),
    (
        "invalid_value_voice",
        {"type": "session.update", "session": {"type": "realtime", "audio": {"output": {"voice": "robot"}}}},
        Code.INVALID_VALUE,
        "session.audio.output.voice",
    ),
    (
        "unsupported_output_audio_buffer_clear",
        {"type": "output_audio_buffer.clear"},
        Code.UNSUPPORTED,
        "type",
    ),
    (
        "invalid_value_tool_choice_names_no_tool",
        {
            "type": "session.update",
            "session": {"type": "realtime", "tool_choice": {"type": "function", "name": "nowhere"}},
        },
        Code.INVALID_VALUE,
        "session.tool_choice.name",
    ),
    (
        "invalid_value_noise_reduction",
        {
            "type": "session.update",
            "session": {"type": "realtime", "audio": {"input": {"noise_reduction": {"type": "loud"}}}},
        },
        Code.INVALID_VALUE,
        "session.audio.input.noise_reduction.type",
    ),
    (
        "invalid_value_vad",
        {
            "type": "session.update",
            "session": {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad"}}}},
        },
        Code.INVALID_VALUE,
        "session.audio.input.turn_detection",
    ),
    (
        "invalid_value_transcription_delay",
        {
            "type": "session.update",
            "session": {"type": "realtime", "audio": {"input": {"transcription": {"delay": "soon"}}}},
        },
        Code.INVALID_VALUE,
        "session.audio.input.transcription.delay",
    ),
    ("input_audio_buffer_commit_empty", {"type": "input_audio_buffer.commit"}, Code.BUFFER_TOO_SMALL, None),
    ("response_cancel_not_active", {"type": "response.cancel"}, Code.RESPONSE_NOT_ACTIVE, None),
    ("item_not_found", {"type": "conversation.item.retrieve", "item_id": "ghost"}, Code.ITEM_NOT_FOUND, "item_id"),
    ("item_not_found_delete", {"type": "conversation.item.delete", "item_id": "ghost"}, Code.ITEM_NOT_FOUND, "item_id"),
    (
        "item_not_found_previous",
        {
            "type": "conversation.item.create",
            "previous_item_id": "ghost",
            "item": {"role": "user", "content": [{"type": "input_text", "text": "x"}]},
        },
        Code.ITEM_NOT_FOUND,
        "previous_item_id",
    ),
    (
        "invalid_truncate_missing_item",
        {"type": "conversation.item.truncate", "item_id": "ghost", "content_index": 0, "audio_end_ms": 0},
        Code.ITEM_NOT_FOUND,
        "item_id",
    ),
]


@pytest.mark.parametrize(("event", "code", "param"), [d[1:] for d in DECODE_ERRORS], ids=[d[0] for d in DECODE_ERRORS])
async def test_client_error_is_reported_with_its_event_id_and_the_session_goes_on(
    gw: RunningGateway, event: dict[str, Any], code: str, param: str | None
) -> None:
    async with session(gw.url) as c:
        await expect_error(c, event, code, param=param)
        await still_works(c)


async def test_invalid_json_is_reported_and_the_session_goes_on(gw: RunningGateway) -> None:
    async with session(gw.url) as c:
        await expect_error(c, "{this is not json", Code.INVALID_JSON, echo=False)  # no event_id can be read
        await expect_error(c, "[1, 2]", Code.INVALID_JSON, echo=False)
        await still_works(c)


async def test_malformed_binary_frame_is_invalid_audio_format(gw: RunningGateway) -> None:
    async with session(gw.url, subprotocols=["omni-binary.v1"]) as c:
        await expect_error(c, b"\x07\x00\x00\x00abcd", Code.INVALID_AUDIO, param="binary", echo=False)
        await expect_error(c, b"\x01", Code.INVALID_AUDIO, param="binary", echo=False)
        await still_works(c)


async def test_odd_length_binary_audio_is_invalid_audio_format(gw: RunningGateway) -> None:
    async with session(gw.url, subprotocols=["omni-binary.v1"]) as c:
        await expect_error(c, b"\x01\x00\x00\x00abc", Code.INVALID_AUDIO, param="audio", echo=False)
        await still_works(c)


async def test_item_already_exists(gw: RunningGateway) -> None:
    async with session(gw.url) as c:
        item = {"id": "dup", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]}
        await c.send({"type": "conversation.item.create", "item": item})
        await c.wait_for("conversation.item.added")
        await expect_error(c, {"type": "conversation.item.create", "item": item}, Code.ITEM_EXISTS, param="item.id")
        await still_works(c)


async def test_invalid_truncate(gw: RunningGateway) -> None:
    async with session(gw.url) as c:
        await still_works(c)  # a user item
        user_id = c.events[-1]["item"]["id"]
        truncate = {"type": "conversation.item.truncate", "item_id": user_id, "content_index": 0, "audio_end_ms": 0}
        await expect_error(c, truncate, Code.INVALID_TRUNCATE, param="item_id")
        await c.send({"type": "response.create"})
        done = await c.wait_for("response.done")
        item_id = done["response"]["output"][0]["id"]
        too_far = {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 9999}
        await expect_error(c, too_far, Code.INVALID_TRUNCATE, param="audio_end_ms")
        await still_works(c)


async def test_conversation_already_has_active_response(paced_gw: RunningGateway) -> None:
    async with session(paced_gw.url) as c:
        await c.send({"type": "response.create"})
        await c.wait_for("response.created")
        await expect_error(c, {"type": "response.create"}, Code.RESPONSE_ACTIVE)
        await c.send({"type": "response.cancel"})
        assert (await c.wait_for("response.done"))["response"]["status"] == "cancelled"
        await still_works(c)


async def test_response_cancel_with_a_wrong_response_id(paced_gw: RunningGateway) -> None:
    async with session(paced_gw.url) as c:
        await c.send({"type": "response.create"})
        await c.wait_for("response.created")
        await expect_error(
            c, {"type": "response.cancel", "response_id": "resp_nope"}, Code.RESPONSE_NOT_ACTIVE, param="response_id"
        )
        await c.send({"type": "response.cancel"})
        assert (await c.wait_for("response.done"))["response"]["status"] == "cancelled"


async def test_beta_format_object_is_refused_and_the_session_goes_on(gw: RunningGateway) -> None:
    async with session(gw.url, headers={"OpenAI-Beta": "realtime=v1"}) as c:
        update = {"type": "session.update", "session": {"input_audio_format": {"type": "audio/pcm"}}}
        await expect_error(c, update, Code.UNSUPPORTED_FORMAT, param="session.input_audio_format")
        await still_works(c)


# --- limits set by Settings ----------------------------------------------------------------


async def test_message_too_large() -> None:
    async with run_gateway(
        settings(max_message_bytes=2000), engine=PassthroughEngine(paced=False), vad_factory=None
    ) as gw:
        async with session(gw.url) as c:
            big = {"type": "session.update", "event_id": "big", "session": {"instructions": "x" * 3000}}
            # Too large to be read: the event_id inside it is not known.
            await expect_error(c, orjson.dumps(big).decode(), Code.MESSAGE_TOO_LARGE, echo=False)
            await still_works(c)
            instructions = next(e for e in c.events if e["type"] == "session.created")["session"]["instructions"]
            assert instructions == ""  # the dropped update applied nothing


async def test_an_append_of_up_to_15_mib_is_accepted_and_a_larger_message_refused() -> None:
    """OpenAI's limits, by default: a message of up to 15 MiB (an append of that much audio)."""
    async with run_gateway(settings(), engine=PassthroughEngine(paced=False), vad_factory=None) as gw:
        async with session(gw.url) as c:
            limit = Settings().max_message_bytes
            assert limit == 15 << 20
            envelope = len(orjson.dumps({"type": "input_audio_buffer.append", "audio": ""}))
            pcm = bytes((limit - envelope) // 4 * 3 // 2 * 2)  # the most whole PCM16 samples that fit
            append = orjson.dumps({"type": "input_audio_buffer.append", "audio": b64(pcm)}).decode()
            assert limit - 4 < len(append) <= limit
            await c.ws.send(append)
            await c.send({"type": "input_audio_buffer.commit"})
            committed = await c.wait_for("input_audio_buffer.committed", timeout=30)
            assert committed["item_id"]
            await expect_error(c, append + " " * 5, Code.MESSAGE_TOO_LARGE, echo=False)
            await still_works(c)


async def test_message_size_counts_bytes_not_characters() -> None:
    async with run_gateway(
        settings(max_message_bytes=2000), engine=PassthroughEngine(paced=False), vad_factory=None
    ) as gw:
        async with session(gw.url) as c:
            two_byte = {"type": "session.update", "event_id": "wide", "session": {"instructions": "é" * 1200}}
            assert len(orjson.dumps(two_byte).decode()) < 2000 < len(orjson.dumps(two_byte))
            error = await expect_error(c, orjson.dumps(two_byte).decode(), Code.MESSAGE_TOO_LARGE, echo=False)
            assert "at most 2000 bytes" in error["message"]
            await still_works(c)


async def test_binary_message_too_large() -> None:
    async with run_gateway(
        settings(max_message_bytes=2000), engine=PassthroughEngine(paced=False), vad_factory=None
    ) as gw:
        async with session(gw.url, subprotocols=["omni-binary.v1"]) as c:
            await expect_error(c, b"\x01\x00\x00\x00" + bytes(4000), Code.MESSAGE_TOO_LARGE, echo=False)
            await still_works(c)


async def test_audio_append_too_large() -> None:
    async with run_gateway(settings(max_append_ms=100), engine=PassthroughEngine(paced=False), vad_factory=None) as gw:
        async with session(gw.url) as c:
            append = {"type": "input_audio_buffer.append", "audio": b64(bytes(200 * MS))}
            await expect_error(c, append, Code.APPEND_TOO_LARGE, param="audio")
            await c.append(bytes(100 * MS))  # within the limit: accepted
            await c.send({"type": "input_audio_buffer.commit"})
            await c.wait_for("input_audio_buffer.committed")
            await still_works(c)


async def test_input_audio_buffer_full() -> None:
    async with run_gateway(settings(max_buffer_ms=300), engine=PassthroughEngine(paced=False), vad_factory=None) as gw:
        async with session(gw.url) as c:
            await c.append(bytes(200 * MS))
            append = {"type": "input_audio_buffer.append", "audio": b64(bytes(200 * MS))}
            await expect_error(c, append, Code.BUFFER_FULL, param="audio")
            await c.send({"type": "input_audio_buffer.commit"})
            await c.wait_for("input_audio_buffer.committed")
            await c.append(bytes(200 * MS))  # the commit emptied the buffer
            await still_works(c)
            assert c.types().count("error") == 1


# --- server_busy -----------------------------------------------------------------------


@contextlib.asynccontextmanager
async def holding_the_only_slot(gw: RunningGateway) -> AsyncIterator[Client]:
    """A session whose 4 s answer holds the one response slot; cancelled (and its
    socket drained) on the way out, so that the slot frees and the socket closes cleanly."""
    async with session(gw.url) as a:
        await a.send({"type": "response.create"})
        await a.wait_for("response.output_audio.delta")
        try:
            yield a
        finally:
            if not any(e["type"] == "response.done" for e in a.events):
                await a.send({"type": "response.cancel"})
                await a.wait_for("response.done")


def busy_settings() -> Settings:
    return settings(max_responses=1, admission_timeout_s=0.2)


async def test_server_busy_when_every_response_slot_is_taken() -> None:
    async with run_gateway(
        busy_settings(), engine=PassthroughEngine(audio_chunks=200, paced=True), vad_factory=None
    ) as gw:
        async with session(gw.url) as b:
            async with holding_the_only_slot(gw):
                await b.send({"type": "response.create", "event_id": "busy_1"})
                got = await b.wait_for("error")
                check_envelope(got, Code.SERVER_BUSY, event_id=got["error"]["event_id"])
                done = await b.wait_for("response.done")
                assert done["response"]["status"] == "failed"
                assert done["response"]["status_details"]["error"]["code"] == Code.SERVER_BUSY
                await still_works(b)
            # The slot is free again: b's next answer is admitted.
            await b.send({"type": "response.create"})
            await b.wait_for("response.output_audio.delta")
            await b.send({"type": "response.cancel"})
            assert (await b.wait_for("response.done"))["response"]["status"] == "cancelled"
        assert gw.runtime.metrics.registry.get_sample_value("omni_errors_total", {"code": "server_busy"}) == 1.0


async def test_server_busy_echoes_the_event_id_of_the_response_create() -> None:
    async with run_gateway(
        busy_settings(), engine=PassthroughEngine(audio_chunks=200, paced=True), vad_factory=None
    ) as gw:
        async with session(gw.url) as b:
            async with holding_the_only_slot(gw):
                await b.send({"type": "response.create", "event_id": "busy_1"})
                got = await b.wait_for("error")
                await b.wait_for("response.done")
            check_envelope(got, Code.SERVER_BUSY, event_id="busy_1")


async def test_server_busy_while_generation_is_paused() -> None:
    s = settings(admission_timeout_s=0.2)
    async with run_gateway(s, engine=PassthroughEngine(audio_chunks=3, paced=False), vad_factory=None) as gw:
        async with httpx.AsyncClient(base_url=gw.http) as http:
            assert (await http.post("/admin/pause")).json()["paused"] is True
            async with session(gw.url) as c:
                await c.send({"type": "response.create", "event_id": "p1"})
                got = await c.wait_for("error")
                check_envelope(got, Code.SERVER_BUSY, event_id=got["error"]["event_id"])
                assert (await c.wait_for("response.done"))["response"]["status"] == "failed"
                await still_works(c)
                assert (await http.post("/admin/resume")).json()["paused"] is False
                await c.send({"type": "response.create"})
                assert (await c.wait_for("response.done"))["response"]["status"] == "completed"


# --- session lifetime ------------------------------------------------------------------


async def test_session_lives_its_whole_lifetime() -> None:
    lifetime = 0.6
    async with run_gateway(
        settings(session_lifetime_s=lifetime), engine=PassthroughEngine(paced=False), vad_factory=None
    ) as gw:
        # Open the session just before a whole second: created_at + lifetime then
        # crosses the next whole second, which truncation would make the deadline.
        while not 0.70 <= time.time() % 1 < 0.75:  # noqa: ASYNC110
            await asyncio.sleep(0.002)
        opened = time.monotonic()
        async with connect(gw.url) as c:
            await c.wait_for("session.created")
            got = await c.wait_for("error", timeout=5)
            lived = time.monotonic() - opened
        assert got["error"]["code"] == Code.SESSION_EXPIRED
        assert lived >= lifetime - 0.05, f"expired after {lived:.2f} s of a {lifetime} s lifetime"


async def test_session_expired_is_reported_then_closed_with_4008() -> None:
    async with run_gateway(
        settings(session_lifetime_s=0.5), engine=PassthroughEngine(paced=False), vad_factory=None
    ) as gw:
        async with connect(gw.url) as c:
            created = await c.wait_for("session.created")
            assert created["session"]["expires_at"] > 0
            got = await c.wait_for("error", timeout=5)
            check_envelope(got, Code.SESSION_EXPIRED, event_id=None)
            with pytest.raises(websockets.ConnectionClosed) as info:
                await asyncio.wait_for(c.ws.recv(), 5)
            assert info.value.rcvd is not None
            assert info.value.rcvd.code == 4008
        await asyncio.sleep(0.05)
        assert not gw.runtime.connections


async def test_session_expired_mid_response_aborts_the_engine_request() -> None:
    engine = PassthroughEngine(audio_chunks=400, paced=True)
    async with run_gateway(settings(session_lifetime_s=2), engine=engine, vad_factory=None) as gw:
        async with connect(gw.url) as c:
            await c.wait_for("session.created")
            await c.send({"type": "response.create"})
            resp_id = (await c.wait_for("response.created"))["response"]["id"]
            got = await c.wait_for("error", timeout=5)
            assert got["error"]["code"] == Code.SESSION_EXPIRED
            assert c.types().count("response.done") == 0  # it expired mid-response
            with pytest.raises(websockets.ConnectionClosed):
                while True:
                    await asyncio.wait_for(c.ws.recv(), 5)
        async with asyncio.timeout(5):
            while gw.runtime.orchestrator.pending or engine.active:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert resp_id in engine.aborted


async def test_errors_are_counted_by_code(gw: RunningGateway) -> None:
    async with session(gw.url) as c:
        await expect_error(c, {"type": "conversation.item.retrieve", "item_id": "a"}, Code.ITEM_NOT_FOUND)
        await expect_error(c, {"type": "conversation.item.retrieve", "item_id": "b"}, Code.ITEM_NOT_FOUND)
        await expect_error(c, {"type": "nope"}, Code.UNKNOWN_EVENT)
    get = gw.runtime.metrics.registry.get_sample_value
    assert get("omni_errors_total", {"code": "item_not_found"}) == 2.0
    assert get("omni_errors_total", {"code": "unknown_event"}) == 1.0
