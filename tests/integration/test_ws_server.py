"""The streaming WebSocket protocol (gateway/transport/ws_server.py) over a real socket.

A raw TCP client writes hand-made frames, so frame boundaries fall where the
test says: several frames in one write, one frame over many writes, control
frames between data frames, fragments, and frames the parser must refuse; then
the direct receive path (and its fallback to the read loop, in order), the
read-ahead bound, the send fast path, and the gateway on uvicorn's own protocol.
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from support.gateway import RunningGateway, run_gateway
from support.raw_ws import BINARY, CONT, PING, PONG, TEXT, RawClient, frame, open_raw
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from gateway.hosting.door import Door
from gateway.settings import Settings
from gateway.transport import ws_compat, ws_server
from gateway.transport.realtime import RealtimeSocket


def retrieve(item_id: str) -> bytes:
    """A client event whose answer (item_not_found, echoing the id) shows it was read."""
    return orjson.dumps({"type": "conversation.item.retrieve", "item_id": item_id, "event_id": item_id})


async def connect(gw: RunningGateway) -> RawClient:
    client = await open_raw(gw.port)
    assert (await client.event())["type"] == "session.created"
    return client


@pytest.fixture
async def gw() -> AsyncIterator[RunningGateway]:
    async with run_gateway(Settings(engine="passthrough", max_frame_bytes=256 << 10)) as g:
        yield g


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The messages the fast path delivered (the rest came through websockets' parser)."""
    delivered: list[dict[str, Any]] = []
    original = ws_server.StreamingWebSocketProtocol._deliver

    def deliver(self: ws_server.StreamingWebSocketProtocol, message: dict[str, Any]) -> None:
        delivered.append(message)
        original(self, message)

    monkeypatch.setattr(ws_server.StreamingWebSocketProtocol, "_deliver", deliver)
    return delivered


async def test_several_frames_in_one_write_are_each_read(gw: RunningGateway, fast: list[dict[str, Any]]) -> None:
    c = await connect(gw)
    ids = [f"item_{i}" for i in range(20)]
    await c.send(b"".join(frame(TEXT, retrieve(i)) for i in ids))
    assert await c.errors(20) == ids
    assert [orjson.loads(m["text"])["item_id"] for m in fast] == ids


async def test_a_frame_split_over_many_writes_is_read_once_whole(
    gw: RunningGateway, fast: list[dict[str, Any]]
) -> None:
    c = await connect(gw)
    data = frame(TEXT, retrieve("item_a")) + frame(TEXT, retrieve("item_b"))
    for i in range(0, len(data), 3):  # 3 bytes a write: headers and payloads cut everywhere
        await c.send(data[i : i + 3])
        await asyncio.sleep(0.001)
    assert await c.errors(2) == ["item_a", "item_b"]
    assert len(fast) == 2


async def test_ping_between_data_frames_gets_its_pong(gw: RunningGateway) -> None:
    c = await connect(gw)
    await c.send(frame(TEXT, retrieve("item_1")) + frame(PING, b"hi") + frame(TEXT, retrieve("item_2")))
    seen: list[tuple[int, bytes]] = []
    errors: list[str] = []
    while len(errors) < 2:
        opcode, payload = await asyncio.wait_for(c.read_frame(), 5)
        seen.append((opcode, payload))
        if opcode == TEXT and orjson.loads(payload)["type"] == "error":
            errors.append(orjson.loads(payload)["error"]["event_id"])
    assert errors == ["item_1", "item_2"]
    assert (PONG, b"hi") in seen


async def test_fragmented_message_goes_through_the_parser(gw: RunningGateway, fast: list[dict[str, Any]]) -> None:
    c = await connect(gw)
    data = retrieve("item_frag")
    await c.send(
        frame(TEXT, data[:10], fin=False)
        + frame(CONT, data[10:20], fin=False)
        + frame(PING, b"p")  # a control frame may sit between fragments
        + frame(CONT, data[20:])
        + frame(TEXT, retrieve("item_after"))  # and the fast path takes over again
    )
    assert await c.errors(2) == ["item_frag", "item_after"]
    assert [orjson.loads(m["text"])["item_id"] for m in fast] == ["item_after"]


async def test_large_frame_streams_to_the_parser_and_is_read(gw: RunningGateway) -> None:
    c = await connect(gw)
    big = retrieve("item_" + "x" * (ws_server.FAST_FRAME_MAX + 1000))
    data = frame(TEXT, big) + frame(TEXT, retrieve("item_small"))
    for i in range(0, len(data), 7000):
        await c.send(data[i : i + 7000])
    errors = await c.errors(2)
    assert errors[0].startswith("item_xxx") and len(errors[0]) == len("item_") + ws_server.FAST_FRAME_MAX + 1000
    assert errors[1] == "item_small"


async def test_binary_audio_frames_take_the_fast_path(gw: RunningGateway, fast: list[dict[str, Any]]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        f"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: omni-binary.v1\r\n\r\n"
        .encode()
    )  # fmt: skip
    await reader.readuntil(b"\r\n\r\n")
    c = RawClient(reader, writer)
    await c.event()
    update = {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}}
    pcm = b"\x00\x01" * 2400  # 100 ms at 24 kHz
    await c.send(
        frame(TEXT, orjson.dumps(update))
        + b"".join(frame(BINARY, b"\x01\x00\x00\x00" + pcm[i : i + 960]) for i in range(0, len(pcm), 960))
        + frame(TEXT, orjson.dumps({"type": "input_audio_buffer.commit"}))
    )
    while (ev := await c.event())["type"] != "input_audio_buffer.committed":
        assert ev["type"] != "error", ev
    assert sum("bytes" in m for m in fast) == len(pcm) // 960


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (frame(TEXT, b"\xff\xfe not utf-8"), 1007),
        (frame(TEXT, retrieve("x"), mask=False), 1002),
        (frame(TEXT, retrieve("x"), rsv=0x40), 1002),
        (frame(CONT, b"nothing to continue"), 1002),
        (frame(BINARY, b"\x00" * ((256 << 10) + 1))[:1000], 1009),  # refused on its header
    ],
    ids=["invalid-utf8", "unmasked", "reserved-bit", "stray-continuation", "too-big"],
)
async def test_frames_the_parser_refuses_close_the_socket(gw: RunningGateway, data: bytes, code: int) -> None:
    c = await connect(gw)
    await c.send(frame(TEXT, retrieve("item_before")))
    assert await c.errors(1) == ["item_before"]
    await c.send(data)
    assert await c.close_code() == code


async def test_messages_queue_behind_one_the_read_loop_takes_and_reading_pauses_at_the_bound(
    gw: RunningGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``session.resume`` goes to the read loop (it awaits the store), so the
    messages after it queue behind it, in order; once MAX_QUEUED_MESSAGES wait,
    the socket is paused (not after each message, as uvicorn's protocol does)."""
    slow_resume = Door._resume

    async def resume_slowly(self: Door, event: Any) -> None:
        await asyncio.sleep(0.5)  # a slow store: the queue fills (MESSAGES_PER_TURN a turn) meanwhile
        await slow_resume(self, event)

    monkeypatch.setattr(Door, "_resume", resume_slowly)
    pauses: list[int] = []
    original = ws_server.StreamingWebSocketProtocol._deliver

    def deliver(self: ws_server.StreamingWebSocketProtocol, message: dict[str, Any]) -> None:
        before = self.read_paused
        original(self, message)
        if self.read_paused and not before:
            pauses.append(self.queue.qsize())

    monkeypatch.setattr(ws_server.StreamingWebSocketProtocol, "_deliver", deliver)
    taken: list[bool] = []
    on_message = RealtimeSocket.on_message

    def spy(self: RealtimeSocket, message: dict[str, Any]) -> bool:
        taken.append(on_message(self, message))
        return taken[-1]

    monkeypatch.setattr(RealtimeSocket, "on_message", spy)  # before the connection registers it
    c = await connect(gw)
    n = ws_server.MAX_QUEUED_MESSAGES * 3
    resume = {"type": "session.resume", "session_id": "sess_nope", "resume_token": "rt_x",
              "last_received_server_event_seq": 0, "event_id": "resume"}  # fmt: skip
    # One write, read in one data_received: the read loop cannot run in between.
    await c.send(frame(TEXT, orjson.dumps(resume)) + b"".join(frame(TEXT, retrieve(f"item_{i}")) for i in range(n)))
    assert await c.errors(n + 1) == ["resume"] + [f"item_{i}" for i in range(n)]
    assert pauses and pauses[0] == ws_server.MAX_QUEUED_MESSAGES
    await c.send(frame(TEXT, retrieve("item_direct")))  # the queue drained: taken directly again
    assert await c.errors(1) == ["item_direct"]
    # Offered directly: the resume (taken: it waits on the store in a task of its own), then
    # only messages that found the queue empty, each declined while the resume or the read
    # loop is busy (so it queues behind), then the last one (taken).
    assert taken[0] is True and taken[-1] is True, taken
    assert len(taken) >= 3 and not any(taken[1:-1]), taken


async def test_one_socket_gets_at_most_its_messages_per_turn_of_the_loop(
    gw: RunningGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that writes many messages at once (one read holds them all) gets
    MESSAGES_PER_TURN of them handled per turn of the event loop, so every other
    socket (and /healthz) gets a turn in between; none is lost, the order holds."""
    log: list[str] = []
    on_message = RealtimeSocket.on_message

    def spy(self: RealtimeSocket, message: dict[str, Any]) -> bool:
        log.append("m")
        return on_message(self, message)

    monkeypatch.setattr(RealtimeSocket, "on_message", spy)
    c = await connect(gw)
    loop = asyncio.get_running_loop()
    ticking = True

    def tick() -> None:  # one mark per turn of the loop
        log.append("|")
        if ticking:
            loop.call_soon(tick)

    n = 200
    tick()
    await c.send(b"".join(frame(TEXT, retrieve(f"item_{i}")) for i in range(n)))
    assert await c.errors(n) == [f"item_{i}" for i in range(n)]
    ticking = False
    turns = [len(run) for run in "".join(log).split("|") if run]
    assert sum(turns) == n
    assert max(turns) <= ws_server.MESSAGES_PER_TURN, turns
    assert len(turns) >= n // ws_server.MESSAGES_PER_TURN


async def test_reading_also_pauses_at_the_byte_bound_of_queued_messages(
    gw: RunningGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind a ``session.resume``, a few large messages pause the socket long before
    MAX_QUEUED_MESSAGES: what waits for the session is bounded in bytes too."""
    pauses: list[tuple[int, int]] = []
    original = ws_server.StreamingWebSocketProtocol._deliver

    def deliver(self: ws_server.StreamingWebSocketProtocol, message: dict[str, Any]) -> None:
        before = self.read_paused
        original(self, message)
        if self.read_paused and not before:
            pauses.append((self.inbox.qsize(), self.inbox.bytes))

    monkeypatch.setattr(ws_server.StreamingWebSocketProtocol, "_deliver", deliver)
    monkeypatch.setattr(ws_server, "MAX_QUEUED_BYTES", 1 << 20)
    slow_resume = Door._resume

    async def resume_slowly(self: Door, event: Any) -> None:
        await asyncio.sleep(0.5)  # a slow store: the read loop is busy while the messages arrive
        await slow_resume(self, event)

    monkeypatch.setattr(Door, "_resume", resume_slowly)
    c = await connect(gw)
    resume = {"type": "session.resume", "session_id": "sess_nope", "resume_token": "rt_x",
              "last_received_server_event_seq": 0, "event_id": "resume"}  # fmt: skip
    big = [{"type": "conversation.item.retrieve", "item_id": f"item_{i}", "event_id": f"item_{i}",
            "pad": "x" * 60_000} for i in range(40)]  # fmt: skip
    await c.send(frame(TEXT, orjson.dumps(resume)) + b"".join(frame(TEXT, orjson.dumps(e)) for e in big))
    assert await c.errors(len(big) + 1) == ["resume"] + [e["event_id"] for e in big]  # nothing lost, in order
    assert pauses, "reading never paused"
    count, queued = pauses[0]
    assert count < ws_server.MAX_QUEUED_MESSAGES and queued >= 1 << 20


async def test_the_gateway_works_on_uvicorns_own_protocol_too() -> None:
    """No ``omni.websocket.direct`` extension: every message comes through ``receive``."""
    async with run_gateway(Settings(engine="passthrough"), ws="websockets-sansio") as gw:
        c = await connect(gw)
        resume = {"type": "session.resume", "session_id": "sess_nope", "resume_token": "rt_x",
                  "last_received_server_event_seq": 0, "event_id": "resume"}  # fmt: skip
        await c.send(frame(TEXT, orjson.dumps(resume)) + frame(TEXT, retrieve("item_1")) + frame(PING, b"p"))
        assert await c.errors(2) == ["resume", "item_1"]


async def test_server_frames_of_every_length_encoding_arrive_whole(
    gw: RunningGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Short (< 126), 16-bit and 64-bit payload lengths, as written by the send fast path."""
    parent_sends: list[str] = []
    parent = WebSocketsSansIOProtocol.send

    async def counted(self: WebSocketsSansIOProtocol, message: Any) -> None:
        parent_sends.append(message["type"])
        await parent(self, message)

    monkeypatch.setattr(WebSocketsSansIOProtocol, "send", counted)
    c = await connect(gw)
    for size in (10, 2_000, 70_000):
        text = "y" * size
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        await c.send(frame(TEXT, orjson.dumps({"type": "conversation.item.create", "item": item})))
        while (ev := await c.event())["type"] != "conversation.item.added":
            pass
        assert ev["item"]["content"][0]["text"] == text
    assert "websocket.accept" in parent_sends
    assert "websocket.send" not in parent_sends  # only the accept went through uvicorn's own send


# --- the start-up check (gateway/transport/ws_compat.py) ------------------------------


def test_the_installed_uvicorn_and_websockets_pass_the_start_up_check() -> None:
    assert ws_compat.probe(ws_server.StreamingWebSocketProtocol) is None
    assert ws_server.server_protocol() is ws_server.StreamingWebSocketProtocol


class _RenamedAttribute(ws_server.StreamingWebSocketProtocol):
    """A uvicorn release that renamed an attribute the fast path uses."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        del self.close_sent


class _DropsFragments(ws_server.StreamingWebSocketProtocol):
    """A release whose parser hands fragments over differently (the app never gets them)."""

    def _parse(self, data: bytes) -> None:
        if data[:1] != bytes([0x80 | CONT]):
            super()._parse(data)


@pytest.mark.parametrize(
    ("broken", "reason"),
    [(_RenamedAttribute, "lacks close_sent"), (_DropsFragments, "the app received")],
    ids=["renamed-attribute", "changed-behaviour"],
)
async def test_a_protocol_that_fails_the_check_is_replaced_by_uvicorns_stock_one(
    broken: type, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="omni.transport"):
        chosen = ws_compat.choose(broken)
    assert chosen == ws_compat.STOCK_PROTOCOL
    lines = [r.getMessage() for r in caplog.records if r.name == "omni.transport"]
    assert len(lines) == 1 and "fast path off" in lines[0] and reason in lines[0]
    async with run_gateway(Settings(engine="passthrough"), ws=chosen) as gw:  # and sessions work on it
        c = await connect(gw)
        await c.send(frame(TEXT, retrieve("item_1")) + frame(BINARY, b"\x01\x00\x00\x00" + b"\x00\x00" * 480))
        assert await c.errors(1) == ["item_1"]


def test_the_pure_python_mask_matches_websockets_own() -> None:
    from websockets.frames import Frame, Opcode

    for n in (0, 1, 3, 4, 5, 960, 1281):
        payload = os.urandom(n)
        key = os.urandom(4)
        masked = ws_compat._xor_mask(payload, key)
        assert ws_compat._xor_mask(masked, key) == payload
        # websockets' own serializer (a client frame is masked) agrees byte for byte
        wire = Frame(Opcode.BINARY, payload).serialize(mask=True, extensions=[])
        head = len(wire) - n - 4
        assert ws_compat._xor_mask(wire[head + 4 :], wire[head : head + 4]) == payload
