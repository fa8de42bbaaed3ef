"""``orchestrator.engines.streams``: the input readers the omni and remote engines
share, and ``failing``.

The inputs come from a queue the test feeds, so that each test says which
inputs are already given and which are still to come.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from orchestrator.engine import AudioChunk, EngineError, TextChunk
from orchestrator.engines.streams import InputReader, ReplayableInputs, failing

pytestmark = pytest.mark.timeout(10)

_END = object()


class Feed:
    """An input iterator fed by the test; ``_END`` ends it."""

    def __init__(self, *items: Any) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.cancelled = False
        for item in items:
            self.queue.put_nowait(item)

    def put(self, *items: Any) -> None:
        for item in items:
            self.queue.put_nowait(item)

    async def __call__(self) -> AsyncIterator[Any]:
        try:
            while (item := await self.queue.get()) is not _END:
                yield item
        except asyncio.CancelledError:
            self.cancelled = True
            raise


class Lost(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


async def take(stream: AsyncIterator[Any], n: int) -> list[Any]:
    return [await anext(stream) for _ in range(n)]


def pcm(n: int) -> AudioChunk:
    return AudioChunk(b"\x00" * n)


# --- failing --------------------------------------------------------------------


async def test_failing_raises_where_it_is_consumed_not_where_it_is_made() -> None:
    stream = failing(EngineError("unsupported", "no"))  # nothing raised yet
    with pytest.raises(EngineError) as err:
        await anext(stream)
    assert err.value.code == "unsupported"


# --- InputReader: the plain one (omni) --------------------------------------------


async def test_settle_lets_the_reader_take_the_inputs_already_given() -> None:
    feed = Feed(TextChunk("a"), TextChunk("b"), _END)
    reader = InputReader(feed())
    await reader.settle()
    assert reader.ended
    assert reader.items == [TextChunk("a"), TextChunk("b")]
    reader.stop()


async def test_inputs_still_to_come_are_told_from_those_given() -> None:
    feed = Feed(TextChunk("a"))
    reader = InputReader(feed())
    await reader.settle()
    assert not reader.ended and reader.items == [TextChunk("a")]
    reader.stop()
    await asyncio.sleep(0)
    assert feed.cancelled  # stop ends the reading task, and with it the pending __anext__


async def test_stream_gives_what_came_then_each_input_as_it_comes_until_the_end() -> None:
    feed = Feed(TextChunk("a"))
    reader = InputReader(feed())
    stream = reader.stream()
    assert await anext(stream) == TextChunk("a")
    pending = asyncio.ensure_future(anext(stream))
    await reader.settle()
    assert not pending.done()  # waits for the next input
    feed.put(TextChunk("b"))
    assert await pending == TextChunk("b")
    feed.put(_END)
    with pytest.raises(StopAsyncIteration):
        await anext(stream)
    assert reader.items == [TextChunk("a"), TextChunk("b")]  # the plain reader frees nothing
    reader.stop()


# --- ReplayableInputs: kept for a retry (remote) -----------------------------------


async def test_a_second_stream_replays_the_inputs_from_the_first() -> None:
    feed = Feed(TextChunk("a"), pcm(4))
    inputs = ReplayableInputs(feed(), max_bytes=100, replay_error=Lost)
    first = inputs.stream()
    assert await take(first, 2) == [TextChunk("a"), pcm(4)]
    await first.aclose()  # the attempt was lost
    feed.put(pcm(2), _END)
    assert [item async for item in inputs.stream()] == [TextChunk("a"), pcm(4), pcm(2)]
    assert inputs.replayable
    inputs.stop()


async def test_once_committed_what_was_given_is_freed_and_a_replay_fails() -> None:
    feed = Feed(TextChunk("a"), TextChunk("b"))
    inputs = ReplayableInputs(feed(), max_bytes=100, replay_error=Lost)
    stream = inputs.stream()
    assert await anext(stream) == TextChunk("a")
    inputs.commit()  # output came: nobody will replay
    assert not inputs.replayable
    assert await anext(stream) == TextChunk("b")
    assert inputs.items == [] and inputs.freed == 2
    feed.put(TextChunk("c"))
    assert await anext(stream) == TextChunk("c")  # the reader goes on past the freed items
    assert inputs.items == [] and inputs.freed == 3
    with pytest.raises(Lost, match="can no longer be replayed"):
        await anext(inputs.stream())
    inputs.stop()


async def test_past_the_byte_limit_the_inputs_are_not_kept() -> None:
    feed = Feed(TextChunk("long text is not counted" * 10), pcm(60), pcm(40))
    inputs = ReplayableInputs(feed(), max_bytes=100, replay_error=Lost)
    await inputs.settle()
    assert inputs.replayable  # 100 bytes of audio: at the limit, not past it
    feed.put(pcm(1))
    await inputs.settle()
    assert not inputs.replayable
    assert len(inputs.items) == 4  # nothing given out yet, so nothing freed
    stream = inputs.stream()
    await take(stream, 4)
    assert inputs.items == []
    inputs.stop()


async def test_before_anything_is_freed_a_stream_may_start_again() -> None:
    feed = Feed(pcm(200), _END)  # past the limit before any reader
    inputs = ReplayableInputs(feed(), max_bytes=100, replay_error=Lost)
    await inputs.settle()
    assert not inputs.replayable and inputs.freed == 0
    assert [item async for item in inputs.stream()] == [pcm(200)]
    with pytest.raises(Lost):
        await anext(inputs.stream())
    inputs.stop()
