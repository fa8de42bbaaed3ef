"""Ending a connection's tasks without leaking one, whatever ended the connection."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from gateway.transport.ws_server import SEND_BUFFER_EXTENSION


async def settle(task: asyncio.Task[Any], timeout: float) -> None:  # noqa: ASYNC109  (a bound, not a deadline)
    """Let ``task`` end within ``timeout`` s, else cancel it. Raises neither what the task
    raised nor its cancellation (``asyncio.wait_for`` on a cancelled task would raise
    CancelledError into the caller's cleanup); only the caller's own cancellation."""
    if not task.done():
        await asyncio.wait({task}, timeout=timeout)
    if not task.done():
        task.cancel()
    elif not task.cancelled():
        task.exception()  # retrieved: no "Task exception was never retrieved" later


def drop(abort: Callable[[], None] | None, tasks: Iterable[asyncio.Task[Any] | None]) -> None:
    """Drop a connection whose client reads nothing: abort the transport when the server
    offers it (``omni.websocket.abort``), so the socket goes at once and the tasks end as
    on any disconnect; else cancel the tasks (the server then closes the socket)."""
    if abort is not None:
        abort()
        return
    for task in tasks:
        if task is not None and not task.done():
            task.cancel()


def bound_send_buffer(scope: dict[str, Any], size: int) -> None:
    """Bound the socket's kernel send buffer where the server offers it (``size`` 0: leave it)."""
    setter = scope.get("extensions", {}).get(SEND_BUFFER_EXTENSION)
    if setter is not None and size > 0:
        setter(size)
