"""The ``AsyncOmni`` shared by ``OmniEngine`` and ``OmniVideoEngine``: started
once, shut down with its last user; the admin controls (pause, sleep) and the
mapping of its exceptions to our coded errors live here."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.engine import EngineError

log = logging.getLogger("omni.engines.omni")


class OmniClient:
    """One ``AsyncOmni`` shared by the voice and video engines: started once,
    shut down when the last user closes; the admin controls live here."""

    def __init__(self, model: str | None, client: Any = None, engine_kwargs: Mapping[str, Any] | None = None) -> None:
        if client is None and not model:
            raise ValueError("OmniClient needs a model (name or path) or an AsyncOmni-like client")
        self.model = model
        self.client = client
        self.engine_kwargs = dict(engine_kwargs or {})
        self.dead: str | None = None
        self.sleeping = False
        self.paused = False
        self._users = 0
        self._lock = asyncio.Lock()
        self._owned = client is None

    async def start(self) -> Any:
        async with self._lock:
            if self.client is None:
                try:
                    from vllm_omni.entrypoints.async_omni import AsyncOmni
                except ImportError as exc:
                    raise EngineError(
                        "engine_unavailable",
                        f"vLLM-Omni is not importable ({exc}); install vllm-omni on a GPU machine",
                        fatal=True,
                    ) from exc
                self.client = AsyncOmni(model=self.model or "", **self.engine_kwargs)
            self._users += 1
            return self.client

    async def close(self) -> None:
        async with self._lock:
            self._users = max(0, self._users - 1)
            if self._users or self.client is None or not self._owned:
                return
            client, self.client = self.client, None
        shutdown = getattr(client, "shutdown", None)
        if callable(shutdown):
            result = shutdown()
            if asyncio.iscoroutine(result):
                await result

    @property
    def started(self) -> bool:
        return self.client is not None and self._users > 0

    def get(self) -> Any:
        if self.client is None or self._users == 0:
            raise EngineError("engine_not_started", "the omni engine is not running")
        if self.dead is not None:
            raise EngineError("engine_dead", f"the omni engine died: {self.dead}", fatal=True)
        return self.client

    def failure(self, exc: BaseException) -> EngineError:
        """Our coded error for an exception out of AsyncOmni."""
        if isinstance(exc, EngineError):
            return exc
        if any(cls.__name__ == "EngineDeadError" for cls in type(exc).__mro__):
            self.dead = str(exc) or type(exc).__name__
            return EngineError("engine_dead", f"the omni engine died: {self.dead}", fatal=True)
        text = str(exc)
        if isinstance(exc, RuntimeError) and "asleep" in text:
            return EngineError("engine_sleeping", "the model is asleep; wake it up first")
        if isinstance(exc, ValueError | TypeError):
            return EngineError("invalid_request", text or type(exc).__name__)
        return EngineError("engine_error", f"the omni engine failed: {type(exc).__name__}: {text}")

    async def abort(self, request_id: str) -> None:
        """``abort`` on the engine, if it runs; a failure is logged, not raised (the
        request is being given up either way)."""
        if self.client is None:
            return
        try:
            await self.client.abort(request_id)
        except Exception:
            log.debug("abort of %s failed", request_id, exc_info=True)

    # --- admin controls (the gateway exposes them on authenticated endpoints) ---

    async def pause(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        """``pause_generation``: ``mode`` abort|wait|keep says what happens to running requests."""
        await self.get().pause_generation(mode=mode, clear_cache=clear_cache)
        self.paused = True

    async def resume(self) -> None:
        await self.get().resume_generation()
        self.paused = False

    async def sleep(self, level: int = 1) -> None:
        """Free GPU memory: level 1 offloads weights to CPU RAM, level 2 discards
        them (AsyncOmni cannot wake from level 2 yet)."""
        if level not in (1, 2):
            raise EngineError("invalid_request", "sleep level must be 1 or 2")
        await self.get().sleep(level=level)
        self.sleeping = True

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        client = self.get()
        try:
            await client.wake_up(tags=list(tags) if tags is not None else None)
        except NotImplementedError as exc:
            raise EngineError("unsupported", str(exc)) from exc
        self.sleeping = False
        if not self.paused:  # AsyncOmni holds admission after an AR stage slept
            await client.resume_generation()


@dataclass(eq=False)
class RequestState:
    aborted: bool = False
    event_ids: set[str] = field(default_factory=set)
    started: bool = False


class OmniClientUser:
    """What the voice and the video engine share as users of one ``OmniClient``:
    their running requests (``_active``), ``abort``, ``close`` (every request
    aborted, then the client released) and ``healthy``."""

    def __init__(self, shared: OmniClient) -> None:
        self.shared = shared
        self._active: dict[str, RequestState] = {}
        self._closed = False

    async def close(self) -> None:
        self._closed = True
        for request_id in list(self._active):
            await self.abort(request_id)
        await self.shared.close()

    def healthy(self) -> bool:
        s = self.shared
        return s.started and s.dead is None and not s.sleeping and not self._closed

    async def abort(self, request_id: str) -> None:
        entry = self._active.get(request_id)
        if entry is not None:
            entry.aborted = True
        await self.shared.abort(request_id)


async def aclose_quietly(stream: Any) -> None:
    aclose = getattr(stream, "aclose", None)
    if callable(aclose):
        with contextlib.suppress(Exception):
            await aclose()
