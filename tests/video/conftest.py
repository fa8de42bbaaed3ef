"""Fixtures for the CPU video engine tests (real torch, real PyAV)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import torch

from orchestrator.engines.video.engine import CpuVideoEngine


@pytest.fixture
async def engine() -> AsyncIterator[CpuVideoEngine]:
    # crf 18: less codec noise in the pixel measurements of transitions.
    eng = CpuVideoEngine(workers=2, crf=18)
    await eng.warm()  # (torch's import is not the first chunk's time)
    try:
        yield eng
    finally:
        await eng.close()


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    # The frames here are small; torch's intra-op threads only add contention.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
