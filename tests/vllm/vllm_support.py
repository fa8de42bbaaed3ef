"""Helpers for the vLLM tests (a plain module: conftest files are not reliably importable)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from orchestrator.engine import EngineInput, EngineOutput, Finished, Message, TextChunk, TextDelta
from orchestrator.engines.vllm_engine import VllmEngine


def user(text: str) -> tuple[Message, ...]:
    return (Message(role="user", text=text),)


def texts(outs: Sequence[EngineOutput]) -> str:
    return "".join(o.text for o in outs if isinstance(o, TextDelta))


def finished(outs: Sequence[EngineOutput]) -> Finished:
    assert outs and isinstance(outs[-1], Finished), outs[-3:]
    assert sum(isinstance(o, Finished) for o in outs) == 1
    return outs[-1]


async def no_input() -> AsyncIterator[EngineInput]:
    return
    yield  # makes this an async generator


async def fed(
    chunks: Sequence[str], gap_s: float = 0.0, before: Callable[[int], Any] | None = None
) -> AsyncIterator[EngineInput]:
    """``chunks`` as TextChunks, ``gap_s`` apart; ``before(i)`` is awaited before chunk i."""
    for i, text in enumerate(chunks):
        if before is not None:
            await before(i)
        elif gap_s:
            await asyncio.sleep(gap_s)
        yield TextChunk(text)


async def collect(outputs: AsyncIterator[EngineOutput], timeout: float = 60.0) -> list[EngineOutput]:
    async def run() -> list[EngineOutput]:
        return [o async for o in outputs]

    return await asyncio.wait_for(run(), timeout)


async def idle(engine: VllmEngine, timeout: float = 10.0) -> None:
    """Wait until vLLM has no unfinished request (aborts land asynchronously)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while engine.llm.get_num_unfinished_requests():
        assert loop.time() < deadline, f"{engine.llm.get_num_unfinished_requests()} vLLM requests left unfinished"
        await asyncio.sleep(0.02)


class AddSpy:
    """Records every request the AsyncLLM sends its engine core: (id, resumable), and
    its prompt as sent: (token ids, placeholders expanded; modality of each
    ``mm_features`` entry). Copied: vLLM extends a streaming request's list in place."""

    def __init__(self, engine: VllmEngine) -> None:
        self.core = engine.llm.engine_core
        self.sent: list[tuple[str, bool]] = []
        self.prompts: list[tuple[list[int], list[str]]] = []
        self._orig = self.core.add_request_async

    async def _add(self, request: Any) -> Any:
        self.sent.append((request.request_id, bool(request.resumable)))
        features = [f.modality for f in request.mm_features or ()]
        self.prompts.append((list(request.prompt_token_ids or ()), features))
        return await self._orig(request)

    def __enter__(self) -> AddSpy:
        self.core.add_request_async = self._add
        return self

    def __exit__(self, *exc: object) -> None:
        self.core.add_request_async = self._orig


@contextlib.contextmanager
def prompts(engine: VllmEngine) -> Iterator[list[str]]:
    """The prompt of every vLLM request while inside, decoded (the AsyncLLM's
    ``generate`` is wrapped, not replaced: vLLM still serves each request)."""
    llm, seen = engine.llm, []
    original = llm.generate

    def decode(prompt: Any) -> str:
        return str(engine.tokenizer.decode(prompt["prompt_token_ids"]))

    async def streamed(chunks: Any) -> AsyncIterator[Any]:  # a streaming-input request: its first chunk
        first = True
        async for chunk in chunks:
            if first:
                seen.append(decode(chunk.prompt))
                first = False
            yield chunk

    def spy(prompt: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(prompt, dict):
            seen.append(decode(prompt))
        else:
            prompt = streamed(prompt)
        return original(prompt, *args, **kwargs)

    llm.generate = spy
    try:
        yield seen
    finally:
        llm.generate = original
