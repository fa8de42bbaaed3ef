"""Makes ``tests/support`` importable as ``support``; shared helpers live there
(``support.gateway``: run_gateway, connect, Client), not in conftest files, so
that no test depends on which ``conftest`` module Python resolves.

Under pytest-xdist (CI: ``-n 3 --dist loadgroup``, see pyproject.toml) tests that share
something costly to start run on one worker, in the order collected: every ``vllm`` test
(one AsyncLLM, ~30 s to start, shared by the session), and the tests of a module that
uses a module-scoped fixture (a local cluster, a fresh venv, an MCP server) together.
Those groups are handed out first, so that the longest run while the rest spreads over
the other workers. Without xdist the marks change nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from support.gateway import Client, RunningGateway, connect, free_port, run_gateway

__all__ = ["Client", "RunningGateway", "connect", "free_port", "run_gateway"]

SHARED_SCOPES = ("module", "package", "class")  # a fixture of these scopes is set up once per worker that runs it


def shared_group(item: pytest.Item) -> str | None:
    """The xdist group ``item`` must share a worker with, if any."""
    if item.get_closest_marker("vllm") is not None:
        return "vllm"
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    if any(d.scope in SHARED_SCOPES for chain in defs for d in chain):
        return item.nodeid.split("::", 1)[0]  # the module
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    grouped: list[pytest.Item] = []
    alone: list[pytest.Item] = []
    for item in items:
        group = shared_group(item)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
        (grouped if group is not None else alone).append(item)
    items[:] = grouped + alone  # each group in its collected order; groups first (the longest units of work)
