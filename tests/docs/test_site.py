"""The documentation: the MkDocs site builds with no warning, and no link is broken.

``mkdocs build --strict`` (as docs/development.md prints it) runs in a copy of ``docs/``
and ``mkdocs.yml``: ``mkdocs.yml``'s ``validation`` turns a page missing from the nav,
a link to a file outside ``docs/`` and an anchor no heading makes into warnings, and
``--strict`` fails on any. The Markdown files outside the site (the README, deploy's,
bench's, web_demo's) are read on the repository's host: each relative link must name a
file of the repository, and each anchor a heading of its target, as GitHub spells it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.docs import ROOT, runs

BIN = Path(sys.executable).parent
SITE_COMMAND = "mkdocs build --strict"
OUTSIDE_THE_SITE = ("README.md", "deploy/README.md", "deploy/k8s/redis.md", "deploy/k8s/webrtc.md",
                    "bench/README.md", "web_demo/README.md")  # fmt: skip
PAGES = sorted((ROOT / "docs").glob("*.md"))

_LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```")


def links(path: Path) -> list[str]:
    """Every Markdown link target of ``path``, outside code blocks and code spans."""
    found: list[str] = []
    fenced = False
    for line in path.read_text().splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            found += _LINK.findall(re.sub(r"`[^`]*`", "``", line))
    return found


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    fenced = False
    found: set[str] = set()
    for line in path.read_text().splitlines():
        if _FENCE.match(line.strip()):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6} (.+)$", line)):
            found.add(github_anchor(m.group(1)))
    return found


def broken(path: Path, root: Path = ROOT) -> list[str]:
    out = []
    for target in links(path):
        if re.match(r"^[a-z]+:", target):
            if not target.startswith("https://"):
                out.append(f"{target}: a link out of the repository must be a public https:// URL")
            continue
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if root.resolve() not in resolved.parents:
            out.append(f"{target}: outside the repository")
        elif not resolved.exists():
            out.append(f"{target}: no such file")
        elif anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved)):
            out.append(f"{target}: no heading makes #{anchor}")
    return out


@runs(SITE_COMMAND)
def test_the_site_builds_strict_with_every_page_in_the_nav(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    mkdocs = shutil.which("mkdocs", path=f"{BIN}")
    assert mkdocs, "mkdocs comes with the dev extra"
    argv = SITE_COMMAND.split()
    done = subprocess.run([mkdocs, *argv[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    built = {p.stem for p in (tmp_path / "site").glob("*.html")}
    assert {p.stem for p in PAGES} <= built


def test_a_broken_anchor_fails_the_build(tmp_path: Path) -> None:
    """The check above can fail: a link to an anchor no heading makes stops the build."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    with (tmp_path / "docs" / "index.md").open("a") as page:
        page.write("\n[nowhere](sessions.md#no-such-heading)\n")
    mkdocs = shutil.which("mkdocs", path=f"{BIN}")
    assert mkdocs
    done = subprocess.run([mkdocs, *SITE_COMMAND.split()[1:]], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode != 0 and "no-such-heading" in done.stderr


@pytest.mark.parametrize("doc", [*OUTSIDE_THE_SITE, *(str(p.relative_to(ROOT)) for p in PAGES)])
def test_every_link_names_a_file_and_a_heading_of_the_repository(doc: str) -> None:
    assert not broken(ROOT / doc)


def test_the_link_checker_finds_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "sessions.md").write_text("# Sessions\n\n## Drain\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text("# A `title`: here\n\n[a](sessions.md#drain) [b](nowhere.md) [c](sessions.md#nope)"
                    " [d](#a-title-here) [e](http://example.com/) `[f](nowhere.md)` [g](../../x.md)\n")  # fmt: skip
    assert broken(page, root=tmp_path) == [
        "nowhere.md: no such file",
        "sessions.md#nope: no heading makes #nope",
        "http://example.com/: a link out of the repository must be a public https:// URL",
        "../../x.md: outside the repository",
    ]


def test_the_readme_is_a_front_door() -> None:
    """Short, and everything it points to is in the repository."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert "shared/" not in readme and all("DESIGN.md" not in p.read_text() for p in PAGES)
