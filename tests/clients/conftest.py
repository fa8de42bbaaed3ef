"""Makes this directory's helpers importable (``clients_support``); the gateway the client tests talk to."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support.gateway import RunningGateway, run_gateway

from gateway.settings import Settings

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
async def gateway() -> AsyncIterator[RunningGateway]:
    """The CPU cascade, as a voice client meets it."""
    async with run_gateway(Settings(engine="cascade", video_engine="none", drain_window_s=0.5)) as gw:
        yield gw
