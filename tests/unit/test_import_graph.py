"""The house's floors, kept by the import graph (DESIGN.md, "The way data flows").

Every import counts: at module level, inside functions, and under
``TYPE_CHECKING`` (a type-only import is still a dependency a reader must
follow). Read from the source with ``ast``, so nothing is imported here.

Floors, top first. A module may import its own floor and the floors below it,
never one above; a part that needs something from above receives it as an
argument, a callback or a protocol it defines itself (``hosting.peer.Peer``,
``transport.services.Services``). ``protocol`` sits below ``session`` and
``hosting``: it is the vocabulary both speak (pure decode and encode).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "orchestrator", "omni_gateway_client")

FLOORS: list[tuple[str, tuple[str, ...]]] = [
    (
        "composition",
        ("gateway.__main__", "gateway.cli", "gateway.app", "gateway.http", "gateway.runtime", "gateway.workers"),
    ),
    ("transport", ("gateway.transport",)),
    ("hosting", ("gateway.hosting", "gateway.quotas")),
    ("telemetry", ("gateway.telemetry",)),  # what hosting and transport report spans to
    ("session", ("gateway.session",)),
    ("protocol", ("gateway.protocol", "gateway.audio")),
    (
        "store and settings",
        (
            "gateway.store",
            "gateway.auth",
            "gateway.jwt_auth",
            "gateway.tenants",
            "gateway.origins",
            "gateway.routing",
            "gateway.settings",
            "gateway.logs",
            "gateway.allocator",
        ),
    ),
    ("orchestrator", ("orchestrator.orchestrator", "orchestrator.metrics")),
    ("engines", ("orchestrator.engines",)),
    ("engine protocols", ("orchestrator.engine", "orchestrator.video_engine")),
]
PACKAGE_ROOTS = {"gateway", "orchestrator"}  # docstring-only __init__ files: no floor


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The module ``name`` names, or the nearest package above it that exists here."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> set[str]:
    """Every module of ours that ``module`` imports, anywhere in its source."""
    out: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(r for a in node.names if (r := _resolve(a.name)))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            for alias in node.names:
                full = f"{source}.{alias.name}"  # ``from pkg import module`` imports the module
                target = full if full in MODULES else _resolve(source)
                if target:
                    out.add(target)
    out.discard(module)
    return out


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def floor_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, floor index)
    for index, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return None if best is None else best[1]


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_is_read_from_every_module() -> None:
    # The reader itself: if it stopped seeing imports, every test below would pass.
    assert len(MODULES) > 80
    assert "gateway.hosting.host" in GRAPH["gateway.runtime"]
    assert "gateway.transport.video" in GRAPH["gateway.runtime"]
    assert "orchestrator.engines.cascade" in GRAPH["gateway.runtime"]  # a function-level import
    assert "gateway.hosting.peer" in GRAPH["gateway.hosting.door"]
    assert "gateway.hosting.door" in GRAPH["gateway.transport.realtime"]


def test_the_import_graph_has_no_cycle() -> None:
    assert _cycles() == []


def test_the_cycle_finder_finds_a_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    looped = {**GRAPH, "gateway.store.base": GRAPH["gateway.store.base"] | {"gateway.store.writer"}}
    monkeypatch.setitem(globals(), "GRAPH", looped)
    assert ["gateway.store.base", "gateway.store.writer"] in _cycles()


def test_every_module_has_a_floor() -> None:
    ours = [m for m in MODULES if not m.startswith("omni_gateway_client") and m not in PACKAGE_ROOTS]
    assert [m for m in ours if floor_of(m) is None] == []


def _upward() -> list[str]:
    found = []
    for module, targets in sorted(GRAPH.items()):
        mine = floor_of(module)
        if mine is None:
            continue
        for target in sorted(targets):
            theirs = floor_of(target)
            if theirs is not None and theirs < mine:
                found.append(f"{module} ({FLOORS[mine][0]}) imports {target} ({FLOORS[theirs][0]})")
    return found


def test_no_floor_imports_a_higher_one() -> None:
    assert _upward() == []


def test_an_upward_import_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    looped = {**GRAPH, "gateway.session.events": GRAPH["gateway.session.events"] | {"gateway.hosting.host"}}
    monkeypatch.setitem(globals(), "GRAPH", looped)
    assert _upward() == ["gateway.session.events (session) imports gateway.hosting.host (hosting)"]


def test_the_sdk_imports_nothing_of_the_gateway() -> None:
    """``omni_gateway_client/`` ships on its own (websockets + orjson only)."""
    leaks = {
        m: sorted(t for t in GRAPH[m] if not t.startswith("omni_gateway_client"))
        for m in MODULES
        if m.startswith("omni_gateway_client")
    }
    assert {m: t for m, t in leaks.items() if t} == {}


# One door per floor: a connection of any transport reaches a session only through
# gateway/hosting/. What the transport may import besides itself: hosting (the door),
# protocol (with gateway.audio, its floor: decoding and encoding), quotas (admission at
# connect), auth (credentials, and origins: which pages may connect) and settings.
# Never the session, the store, the orchestrator, the engines or telemetry.
TRANSPORT_MAY_IMPORT = (
    "gateway.transport",
    "gateway.hosting",
    "gateway.protocol",
    "gateway.audio",
    "gateway.quotas",
    "gateway.auth",
    "gateway.origins",
    "gateway.settings",
)


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _transport_skips() -> list[str]:
    return [
        f"{m} imports {t}"
        for m, targets in sorted(GRAPH.items())
        if m.startswith("gateway.transport")
        for t in sorted(targets)
        if not _within(t, TRANSPORT_MAY_IMPORT)
    ]


def test_the_transport_reaches_sessions_only_through_hosting() -> None:
    assert _transport_skips() == []


def test_a_transport_that_skips_hosting_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    skipping = {
        **GRAPH,
        "gateway.transport.video": GRAPH["gateway.transport.video"] | {"gateway.session.video_session"},
    }
    monkeypatch.setitem(globals(), "GRAPH", skipping)
    assert _transport_skips() == ["gateway.transport.video imports gateway.session.video_session"]


def _protocol_engine_imports() -> list[str]:
    return [
        f"{m} imports {t}"
        for m, targets in sorted(GRAPH.items())
        if _within(m, ("gateway.protocol", "gateway.audio"))
        for t in sorted(targets)
        if t.startswith("orchestrator")
    ]


def test_the_protocol_imports_no_orchestrator_module() -> None:
    """The vocabulary of the wire owns its shapes (``video_events.InteractionSpec``); the
    session turns them into what an engine takes."""
    assert _protocol_engine_imports() == []


def test_a_protocol_module_importing_an_engine_type_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    looped = {
        **GRAPH,
        "gateway.protocol.video_events": GRAPH["gateway.protocol.video_events"] | {"orchestrator.video_engine"},
    }
    monkeypatch.setitem(globals(), "GRAPH", looped)
    assert _protocol_engine_imports() == ["gateway.protocol.video_events imports orchestrator.video_engine"]
