"""The command lines the documentation gives a user, so that tests run exactly those."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Every command line in these is run by a test: the README, every page of docs/, deploy's README.
DOCS = ("README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")), "deploy/README.md")
SHELL_FENCES = ("bash", "sh", "shell", "console")  # fenced blocks that hold commands (mark them so)

_FENCE = re.compile(r"^```(\w*)\s*$")


def command_lines(doc: str) -> list[str]:
    """The command lines of ``doc``'s shell blocks (comments and blank lines skipped,
    ``\\``-continued lines joined, trailing ``# comments`` kept off)."""
    lines: list[str] = []
    fence: str | None = None
    pending = ""
    for raw in (ROOT / doc).read_text().splitlines():
        match = _FENCE.match(raw.strip())
        if match:
            fence = match.group(1) if fence is None else None
            continue
        if fence is None or fence not in SHELL_FENCES:
            continue
        line = raw.strip()
        if pending:
            line, pending = pending + " " + line, ""
        if line.endswith("\\"):
            pending = line[:-1].strip()
            continue
        line = re.sub(r"\s+#\s.*$", "", line).strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def readme_commands() -> list[str]:
    return command_lines("README.md")


def readme_command(*words: str) -> str:
    """The README's first command line that holds every one of ``words``."""
    found = [line for line in readme_commands() if all(w in line for w in words)]
    assert found, f"the README has no command with {words}"
    return found[0]


# The README's commands that tests run by name (each is found by what it holds, not where it is).
INSTALL_AND_SERVE = readme_command("python3 -m venv", "pip install", "omni-gateway serve")
ADD_VIDEO = readme_command("pip install torch", "[video]")
TEST_COMMAND = readme_command("python3 -m venv", "install_test_deps.sh", "pytest")
UNIT_TESTS = readme_command("pytest tests/unit")


@dataclass(frozen=True)
class Block:
    """A fenced block of a document: its language, its text, and the last line of prose
    before it (where an illustrative block says so)."""

    doc: str
    lang: str
    text: str
    before: str


def code_blocks(doc: str) -> list[Block]:
    blocks: list[Block] = []
    lang: str | None = None
    body: list[str] = []
    before = ""
    for raw in (ROOT / doc).read_text().splitlines():
        match = _FENCE.match(raw.strip())
        if match and lang is None:
            lang, body = match.group(1), []
        elif match:
            blocks.append(Block(doc, lang or "", "\n".join(body) + "\n", before))
            lang = None
        elif lang is not None:
            body.append(raw)
        elif raw.strip():
            before = raw.strip()
    return blocks


def inline_invocations(doc: str) -> list[str]:
    """Inline code spans in ``doc`` that invoke the gateway (``omni-gateway serve ...``)."""
    text = (ROOT / doc).read_text()
    return [m for m in re.findall(r"`([^`\n]+)`", text) if m.startswith(("omni-gateway serve", "python -m gateway"))]


# What runs each documented command: a test registers the exact line it runs.
RUNNERS: dict[str, str] = {}


def runs(*lines: str) -> Callable[[Callable[..., object]], Callable[..., object]]:
    def register(test: Callable[..., object]) -> Callable[..., object]:
        for line in lines:
            RUNNERS[line] = f"{test.__module__}::{test.__name__}"
        return test

    return register
