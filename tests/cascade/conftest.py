"""Fixtures for the cascade tests: real pocketsphinx, real eSpeak NG, no mocks."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from cascade_support import EngineFactory

from orchestrator.engines.cascade.engine import CascadeEngine
from orchestrator.engines.cascade.thinker import Thinker


@pytest.fixture
async def make_engine() -> AsyncIterator[EngineFactory]:
    """Builds started engines (one per test: their asyncio primitives bind to the loop)."""
    engines: list[CascadeEngine] = []

    async def factory(thinker: Thinker | None = None, **kwargs: int) -> CascadeEngine:
        kwargs.setdefault("warm_decoders", 0)
        engine = CascadeEngine(thinker, **kwargs)
        await engine.start()
        engines.append(engine)
        return engine

    yield factory
    for engine in engines:
        await engine.close()
