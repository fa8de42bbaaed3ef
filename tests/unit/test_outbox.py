"""The outbound queue (gateway/transport/outbox.py): the direct write and its fallback.

``write_now`` stands for the server's ``omni.websocket.write`` and ``send`` for
ASGI's; both record what reached "the wire", so the order can be checked
across the two paths.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.transport.outbox import Outbox, SlowConsumer


class Wire:
    def __init__(self) -> None:
        self.frames: list[tuple[str, bytes]] = []  # (path, payload) in the order they were written
        self.writes = 0  # direct write calls
        self.accept = True  # the server can take a direct write now
        self.send_gate = asyncio.Event()  # ASGI sends wait for it (a socket that drains)
        self.send_gate.set()

    def write_now(self, frames: list[tuple[bool, bytes]]) -> bool:
        if not self.accept:
            return False
        self.writes += 1
        self.frames += [("direct", payload) for _, payload in frames]
        return True

    async def send(self, message: dict[str, Any]) -> None:
        await self.send_gate.wait()
        if message["type"] == "websocket.send":
            data = message.get("bytes")
            self.frames.append(("asgi", data if data is not None else message["text"].encode()))
        else:
            self.frames.append(("asgi", f"close {message['code']}".encode()))


async def turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_what_is_put_in_one_turn_is_written_at_its_end_in_one_call() -> None:
    wire = Wire()
    box = Outbox(wire.send, 1 << 20, write_now=wire.write_now)
    writer = asyncio.get_running_loop().create_task(box.run())
    box.put_text(b'{"a":1}')
    box.put_bytes(b"\x02pcm")
    box.put_text("é")
    assert wire.frames == []  # not yet: the turn is not over
    await turns()
    assert wire.writes == 1
    assert wire.frames == [("direct", b'{"a":1}'), ("direct", b"\x02pcm"), ("direct", "é".encode())]
    assert box.queued_bytes == 0
    box.close(1000, "")
    await asyncio.wait_for(writer, 1)
    assert wire.frames[-1] == ("asgi", b"close 1000")


async def test_when_the_server_cannot_take_it_the_writer_task_sends_in_order() -> None:
    wire = Wire()
    wire.accept = False  # over the high-water mark
    wire.send_gate.clear()  # and the socket is not draining
    box = Outbox(wire.send, 1 << 20, write_now=wire.write_now)
    writer = asyncio.get_running_loop().create_task(box.run())
    box.put_text(b"1")
    box.put_text(b"2")
    await turns()
    wire.accept = True  # the direct path could write again, but a send is under way:
    box.put_text(b"3")  # this one must wait behind it
    await turns()
    assert wire.frames == []
    wire.send_gate.set()
    await turns(6)
    assert [payload for _, payload in wire.frames] == [b"1", b"2", b"3"]
    assert {path for path, _ in wire.frames} == {"asgi"}
    box.put_text(b"4")  # idle again: the direct path
    await turns()
    assert wire.frames[-1] == ("direct", b"4")
    box.close(1000, "")
    await asyncio.wait_for(writer, 1)


async def test_without_a_direct_write_every_frame_goes_through_send() -> None:
    wire = Wire()
    box = Outbox(wire.send, 1 << 20)
    writer = asyncio.get_running_loop().create_task(box.run())
    box.put_text("x")
    box.put_bytes(b"y")
    box.close(4010, "slow")
    await asyncio.wait_for(writer, 1)
    assert wire.frames == [("asgi", b"x"), ("asgi", b"y"), ("asgi", b"close 4010")]


async def test_the_queue_bound_holds_on_both_paths() -> None:
    wire = Wire()
    wire.accept = False
    wire.send_gate.clear()
    box = Outbox(wire.send, 10, write_now=wire.write_now)
    asyncio.get_running_loop().create_task(box.run())
    box.put_bytes(b"12345")
    box.put_bytes(b"12345")
    with pytest.raises(SlowConsumer):
        box.put_bytes(b"1")
    box.abort(4010, "slow")
    wire.send_gate.set()
    await turns(4)
