"""Makes ``tests/support`` importable as ``support``; shared helpers live there
(``support.gateway``: run_gateway, connect, Client), not in conftest files, so
that no test depends on which ``conftest`` module Python resolves.

Under pytest-xdist (CI: ``-n 3 --dist loadgroup``, see pyproject.toml) tests that share
something costly to start run on one worker, in the order collected: every test of the
session's one AsyncLLM (``vllm_engine``: ~30 s to start; the ``vllm_last`` tests that kill
it come last), and the tests of a module that uses a module-scoped fixture (a local
cluster, a fresh venv, an MCP server) together.
Those groups are handed out first, so that the longest run while the rest spreads over
the other workers. Without xdist the marks change nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from support.gateway import Client, RunningGateway, connect, free_port, run_gateway

__all__ = ["Client", "RunningGateway", "connect", "free_port", "run_gateway"]

SHARED_SCOPES = ("module", "package", "class")  # a fixture of these scopes is set up once per worker that runs it
COSTLY_SESSION_FIXTURES = {"vllm_engine": "vllm"}  # session-scoped, and too costly to start on every worker


def shared_group(item: pytest.Item) -> str | None:
    """The xdist group ``item`` must share a worker with, if any."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for name, group in COSTLY_SESSION_FIXTURES.items():
        if name in info.names_closure:
            return group
    if any(d.scope in SHARED_SCOPES for chain in info.name2fixturedefs.values() for d in chain):
        return item.nodeid.split("::", 1)[0]  # the module
    return None


def pytest_itemcollected(item: pytest.Item) -> None:
    """Marked as collected: xdist reads the marks in its own collection_modifyitems hook."""
    group = shared_group(item)
    if group is not None and item.get_closest_marker("xdist_group") is None:
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Iterator[None]:
    grouped = [item for item in items if item.get_closest_marker("xdist_group") is not None]
    alone = [item for item in items if item.get_closest_marker("xdist_group") is None]
    items[:] = grouped + alone  # each group in its collected order; groups first (the longest units of work)
    yield  # the other hooks, xdist's among them: on a worker it adds "@<group>" to each grouped nodeid
    if config.getoption("loadgroup", False):
        for item in grouped:
            suffix_group(item)


def suffix_group(item: pytest.Item) -> None:
    """The nodeid suffix that ``--dist loadgroup`` schedules by. pytest-xdist 3.8 writes it to
    ``item._nodeid``, which pytest 9.2 no longer reads (nodeids are structured: ``item._id``),
    so the groups would be ignored without a word (pytest-dev/pytest-xdist#1386): where the
    suffix did not take, it is set on the structured id, and if that is not there either,
    the run stops rather than spread a group over workers."""
    mark = item.get_closest_marker("xdist_group")
    assert mark is not None
    suffix = f"@{mark.args[0] if mark.args else mark.kwargs.get('name', 'default')}"
    if item.nodeid.endswith(suffix):
        return  # xdist's own way worked
    node_id = getattr(item, "_id", None)
    if node_id is not None and hasattr(type(node_id), "parse"):
        item._id = type(node_id).parse(item.nodeid + suffix)  # type: ignore[attr-defined]
    if not item.nodeid.endswith(suffix):
        raise pytest.UsageError(f"cannot mark {item.nodeid} for --dist loadgroup on this pytest/xdist pair")
