"""A dialect is one object: no floor but the protocol asks which dialect it is.

``gateway/protocol/dialects.py`` defines each dialect a connection may speak as
one ``Dialect`` that the transport, hosting and the runtime consult (decoding,
encoding, opening rules, control events), and ``gateway/session/kinds.py``
keeps, beside each, how its sessions are built. So a new dialect adds files under
``protocol/`` and ``session/`` and touches no other floor by name. This test
reads the source of every other floor and fails on what would break that:

- a dialect's name compared with anything (``dialect.name == "duplex"``,
  ``state.get("dialect") == "live"``, ``x in ("ga", "beta")``), or a dialect
  object asked for by identity (``door.dialect is DUPLEX``);
- a session's dialect guessed by reflection (``getattr(session, "duplex")``,
  ``hasattr(self.session, ...)``);
- a dialect's session class named outside the session floor (``DuplexSession``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLOORS = [ROOT / "gateway", ROOT / "orchestrator"]
EXEMPT = ROOT / "gateway" / "protocol"  # where dialects are defined, by name
DIALECT_NAMES = frozenset({"ga", "beta", "duplex", "live", "openai"})
DIALECT_OBJECTS = frozenset({"GA", "BETA", "DUPLEX", "LIVE"})  # gateway/protocol/dialects.py
SESSION_CLASSES = frozenset({"DuplexSession", "LiveSession"})


def _sources() -> list[Path]:
    return [p for floor in FLOORS for p in sorted(floor.rglob("*.py")) if EXEMPT not in p.parents]


def _names_dialect(node: ast.expr) -> bool:
    """A string literal naming a dialect, or a tuple/list/set of them."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in DIALECT_NAMES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_dialect(e) for e in node.elts)
    return False


def _about_dialect(node: ast.expr) -> bool:
    """An expression whose source speaks of a dialect (``dialect``, ``x.dialect.name``, ``state["dialect"]``)."""
    return "dialect" in ast.unparse(node).lower()


def _is_dialect_object(node: ast.expr) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
    return name in DIALECT_OBJECTS


def _reflects_on_session(node: ast.Call) -> bool:
    if not (isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") and node.args):
        return False
    target = ast.unparse(node.args[0])
    return target == "session" or target.endswith(".session")


def offences(source: str, name: str, *, in_session_floor: bool = False) -> list[str]:
    """What ``source`` (the file ``name``) does that the module docstring forbids."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename=name)):
        where = f"{name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_names_dialect(s) for s in sides) and any(_about_dialect(s) for s in sides):
                found.append(f"{where}: dialect compared by name: {ast.unparse(node)}")
            elif any(_is_dialect_object(s) for s in sides):
                found.append(f"{where}: dialect asked for by identity: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and _reflects_on_session(node):
            found.append(f"{where}: session asked by reflection: {ast.unparse(node)}")
        elif isinstance(node, ast.Name) and node.id in SESSION_CLASSES and not in_session_floor:
            found.append(f"{where}: a dialect's session class named outside the session floor: {node.id}")
    return found


def test_no_floor_but_the_protocol_compares_dialect_names() -> None:
    session_floor = ROOT / "gateway" / "session"
    problems = [
        problem
        for path in _sources()
        for problem in offences(
            path.read_text(), str(path.relative_to(ROOT)), in_session_floor=session_floor in path.parents
        )
    ]
    assert not problems, "\n".join(problems)


def test_the_check_catches_what_it_forbids() -> None:
    """The rule is not vacuous: each forbidden form is found, and the allowed ones are not."""
    forbidden = (
        "def f(door, session, state):\n"
        "    a = door.dialect.name == 'duplex'\n"
        "    b = state.get('dialect') != 'live'\n"
        "    c = door.dialect.name in ('ga', 'beta')\n"
        "    d = getattr(session, 'duplex', None)\n"
        "    e = hasattr(self.session, 'attachment_generation')\n"
        "    f = door.dialect is dialects.DUPLEX or session.dialect == LIVE\n"
        "    return DuplexSession\n"
    )
    assert len(offences(forbidden, "hosting/sample.py")) == 8  # (line f: two comparisons)
    allowed = (
        "def f(door, session, kinds):\n"
        "    a = Door(dialect=GA)\n"
        "    b = door.dialect.opening.with_config\n"
        "    c = kinds[door.dialect].new()\n"
        "    d = event['type'] == 'session.update'\n"
        "    return DuplexSession\n"
    )
    assert offences(allowed, "session/sample.py", in_session_floor=True) == []
