"""Fixtures for the vLLM engine tests: a tiny random-weight Llama written at
test time and ONE ``AsyncLLM`` (vLLM's CPU build) shared by every test of the
session, since starting one takes about 30 s on 2 cores.

The tests are marked ``vllm`` (``pytest -m vllm`` selects them) and run in CI:
``scripts/install_vllm_cpu.sh`` installs vLLM first. Where vLLM is not
installed they are skipped, except under CI (``CI`` set), where that fails.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

# Before vLLM is imported: a small KV cache (GiB) and quiet logs.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

MAX_MODEL_LEN = 1024


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vllm: runs vLLM's AsyncLLM on the CPU (scripts/install_vllm_cpu.sh)")
    config.addinivalue_line("markers", "vllm_last: kills the shared vLLM engine, so runs after every other test")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("vllm_last") is not None)  # stable


collect_ignore_glob: list[str] = []
try:
    import vllm  # noqa: F401
except ImportError:
    if os.environ.get("CI"):
        raise
    collect_ignore_glob.append("test_*.py")  # not installed here: run scripts/install_vllm_cpu.sh

from support.gateway import RunningGateway, run_gateway  # noqa: E402

from gateway.settings import Settings  # noqa: E402
from orchestrator.engines.vllm_engine import VllmEngine  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_model import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def vllm_engine(tiny_model: Path) -> AsyncIterator[VllmEngine]:
    """The one engine that owns the session's AsyncLLM (seeded sampling)."""
    engine = VllmEngine(str(tiny_model), max_model_len=MAX_MODEL_LEN, enforce_eager=True, sampling={"seed": 0})
    await engine.start()
    yield engine
    await engine.close()


@pytest_asyncio.fixture(loop_scope="session")
async def gw(vllm_engine: VllmEngine) -> AsyncIterator[RunningGateway]:
    """A gateway whose engine is a view of the shared AsyncLLM: the gateway starts and closes
    the view, the AsyncLLM stays for the session."""
    engine = VllmEngine(vllm_engine.model, llm=vllm_engine.llm, sampling={"seed": 0})
    settings = Settings(engine="passthrough", model="tiny", video_engine="none", detach_grace_s=0.2, drain_window_s=0.5)
    async with run_gateway(settings, engine=engine, vad_factory=None) as gw:
        yield gw
