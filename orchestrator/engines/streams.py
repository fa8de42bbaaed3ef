"""The streams every engine handles: the request's inputs it reads, and an output stream that fails.

``InputReader`` reads a request's input iterator in a task of its own and
keeps the items for one reader at a time (``stream``): the engine can tell
inputs already given (``items``, ``ended``) from inputs still to come, and
never cancels a pending ``__anext__`` of the caller's iterator mid-request
(``stop`` cancels the reading task instead). ``ReplayableInputs`` keeps them
as well for a retry that replays them, until ``commit()`` or a byte limit.

``failing(exc)``: an engine checks what it can when a request is made, but
raises where the caller consumes the outputs, as for any later failure.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

from orchestrator.engine import AudioChunk

T = TypeVar("T")
SETTLE_STEPS = 3  # loop turns that let the reading task take the inputs already queued


async def failing(exc: BaseException) -> AsyncIterator[Any]:
    """An output stream that raises ``exc`` on first iteration: errors surface
    where the caller consumes outputs, not where it creates the request."""
    raise exc
    yield  # pragma: no cover - makes this an async generator


class InputReader(Generic[T]):
    """A request's inputs, read once in a task of their own (see the module docstring).

    ``items``: what was read (every item: the plain reader frees nothing);
    ``ended``: the caller's iterator is done (its end, the final marker, is here).
    """

    def __init__(self, inputs: AsyncIterator[T]) -> None:
        self.items: list[T] = []
        self.freed = 0  # items dropped from the front of ``items`` once given out
        self.ended = False
        self._new = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._read(inputs))

    async def _read(self, inputs: AsyncIterator[T]) -> None:
        try:
            async for item in inputs:
                self.items.append(item)
                self._took(item)
                self._new.set()
        finally:
            self.ended = True
            self._new.set()

    def _took(self, item: T) -> None:
        """Called for each item read, once it is in ``items``."""

    def _keeps_given(self) -> bool:
        """Whether an item stays in ``items`` once ``stream`` has given it out."""
        return True

    async def settle(self) -> None:
        """Give the reading task a few loop turns to take inputs already queued."""
        for _ in range(SETTLE_STEPS):
            await asyncio.sleep(0)

    async def stream(self) -> AsyncIterator[T]:
        """Every item from the first, then each as it comes, until the inputs end."""
        i = 0  # items given out, counted from the first ever read
        while True:
            while i < self.freed + len(self.items):
                item = self.items[i - self.freed]
                i += 1
                if not self._keeps_given():  # nobody will read it again: free what was given
                    del self.items[: i - self.freed]
                    self.freed = i
                yield item
            if self.ended:
                return
            self._new.clear()
            await self._new.wait()

    def stop(self) -> None:
        if not self._task.done():
            self._task.cancel()


class ReplayableInputs(InputReader[T]):
    """Inputs kept for a retry that replays them (a second ``stream`` from the first item).

    Once ``commit()`` is called (output was produced) or more than ``max_bytes``
    of audio came, ``replayable`` is False: inputs are no longer kept (each is
    freed once given out) and a retry is off; a ``stream`` that would miss
    freed items fails with ``replay_error(message)``.
    """

    def __init__(self, inputs: AsyncIterator[T], max_bytes: int, replay_error: Callable[[str], BaseException]) -> None:
        self.replayable = True
        self._bytes = 0
        self._max = max_bytes
        self._replay_error = replay_error
        super().__init__(inputs)

    def _took(self, item: T) -> None:
        if isinstance(item, AudioChunk):
            self._bytes += len(item.pcm)
            if self._bytes > self._max:
                self.replayable = False

    def _keeps_given(self) -> bool:
        return self.replayable

    def commit(self) -> None:
        self.replayable = False

    def stream(self) -> AsyncIterator[T]:
        if self.freed:
            return failing(self._replay_error("the inputs can no longer be replayed"))
        return super().stream()
