"""Per-request control for the cascade: abort flags and abort-aware waiting."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any, TypeVar

T = TypeVar("T")
END = object()  # the iterator ended
ABORTED = object()  # abort(request_id) was called first


class RequestControl:
    """Per-request state that ``abort`` can reach."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.aborted = asyncio.Event()
        self.tts_cancel = threading.Event()  # read by the TTS worker thread
        self._abort_wait: asyncio.Task[Any] | None = None

    def abort(self) -> None:
        self.aborted.set()
        self.tts_cancel.set()

    async def until_abort(self, fut: asyncio.Future[Any]) -> bool:
        """Wait for ``fut`` or this request's abort; True when ``fut`` is done.
        Leaves ``fut`` running either way (the caller decides its fate)."""
        if fut.done():
            return True
        if self.aborted.is_set():
            return False
        if self._abort_wait is None:
            self._abort_wait = asyncio.ensure_future(self.aborted.wait())
        await asyncio.wait({fut, self._abort_wait}, return_when=asyncio.FIRST_COMPLETED)
        return fut.done()

    async def pull(self, it: AsyncIterator[T]) -> T | object:
        """The next item of ``it``, or ``END``, or ``ABORTED`` (abort wins the race;
        the pending ``__anext__`` is then cancelled)."""
        task = asyncio.ensure_future(_next(it))
        try:
            done = await self.until_abort(task)
        finally:
            if not task.done():
                task.cancel()
        if not done:
            return ABORTED
        more, item = task.result()
        return item if more else END

    def release(self) -> None:
        self.tts_cancel.set()  # stops a synthesis still running for us
        if self._abort_wait is not None:
            self._abort_wait.cancel()
            self._abort_wait = None


async def _next(it: AsyncIterator[T]) -> tuple[bool, T | None]:
    # StopAsyncIteration must not escape into a Task; report it as a flag.
    try:
        return True, await it.__anext__()
    except StopAsyncIteration:
        return False, None


def consume(fut: asyncio.Future[Any]) -> None:
    """Mark an abandoned future's exception as retrieved (no 'never retrieved' noise)."""
    if not fut.cancelled():
        fut.exception()
