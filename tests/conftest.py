"""Makes ``tests/support`` importable as ``support``; shared helpers live there
(``support.gateway``: run_gateway, connect, Client), not in conftest files, so
that no test depends on which ``conftest`` module Python resolves.

Under pytest-xdist (CI: ``-n 4 --dist loadgroup``, see pyproject.toml) tests that share
something costly run on one worker, in the order collected: every test of the session's
one AsyncLLM (``vllm_engine``: ~30 s to start; the ``vllm_last`` tests that kill it come
last); every Chromium test; every benchmark test; and the tests of a module that uses a
module-scoped fixture (a local cluster, a fresh venv, an MCP server) together. A local
cluster is a module's: each cluster module is a group of its own, and a worker runs at most
one cluster at a time (one group of all of them took 16 min on one worker, as long as the
whole run). The groups are handed out before the tests that stand alone, so that the
latter fill in the workers at the end. Without xdist the marks change nothing.
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
# Run one at a time, each on one worker: the session's AsyncLLM (too costly to start on every
# worker), a Chromium, and the benchmarks the tests run (each loads the machine by design and
# reads what it gets back). A local cluster (three replicas, nginx and Redis, on free ports and
# a run directory of their own) is a module-scoped fixture: its module is its group.
HEAVY_FIXTURES = {"vllm_engine": "vllm"}
HEAVY_MARKS = {"browser": "browser"}
HEAVY_FOLDERS = {"tests/bench/": "bench"}
# The order of the groups in the collection: the longest first. (pytest-xdist hands the units
# of work out by their number of tests, most first, keeping the collection's order between
# equals: every group goes before the tests that stand alone, which fill in at the end.)
GROUP_ORDER = ("vllm", "browser", "bench")


def shared_group(item: pytest.Item) -> str | None:
    """The xdist group ``item`` must share a worker with, if any."""
    info = getattr(item, "_fixtureinfo", None)
    names = info.names_closure if info is not None else []
    for name, group in HEAVY_FIXTURES.items():
        if name in names:
            return group
    for mark, group in HEAVY_MARKS.items():
        if item.get_closest_marker(mark) is not None or f"tests/{mark}/" in item.nodeid:
            return group
    for folder, group in HEAVY_FOLDERS.items():
        if item.nodeid.startswith(folder):
            return group
    if info is not None and any(d.scope in SHARED_SCOPES for chain in info.name2fixturedefs.values() for d in chain):
        return item.nodeid.split("::", 1)[0]  # the module
    return None


def group_rank(item: pytest.Item) -> int:
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return len(GROUP_ORDER) + 1  # alone: after every group
    name = mark.args[0] if mark.args else mark.kwargs.get("name")
    return GROUP_ORDER.index(name) if name in GROUP_ORDER else len(GROUP_ORDER)


def pytest_itemcollected(item: pytest.Item) -> None:
    """Marked as collected: xdist reads the marks in its own collection_modifyitems hook."""
    group = shared_group(item)
    if group is not None and item.get_closest_marker("xdist_group") is None:
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Iterator[None]:
    items.sort(key=group_rank)  # stable: each group in its collected order, the longest units of work first
    grouped = [item for item in items if item.get_closest_marker("xdist_group") is not None]
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
