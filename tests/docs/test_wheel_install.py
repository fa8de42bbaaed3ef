"""The package as a wheel: built from a copy of the checkout (``pip wheel . --no-deps``),
installed with its ``cpu`` extra into a fresh virtual environment, and used from a folder
that holds nothing of the repository but a ``client.py`` of the user's own (the name the
SDK once had, which then shadowed it). ``omni-gateway serve`` starts on the embedded
default; /healthz answers; the demo page and every script it loads are served from the
wheel; a script beside that ``client.py`` opens a session with the SDK.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin

import pytest
from support.gateway import free_port
from support.serve import Served, clean_env
from test_user_install import copy_of_the_repository

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PACKAGES = {"gateway", "orchestrator", "omni_gateway_client", "web_demo"}


@dataclass
class Installed:
    wheel: Path
    venv: Path
    app: Path  # the user's folder: their own client.py, no checkout
    gateway: Served


def run(argv: list[str | Path], **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=400, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{argv}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    tmp = tmp_path_factory.mktemp("wheel")
    source = copy_of_the_repository(tmp / "checkout")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp / "dist", source], env=clean_env())
    [wheel] = (tmp / "dist").glob("omni_realtime_gateway-*.whl")
    venv = tmp / "venv"
    run(["python3", "-m", "venv", venv], env=clean_env())
    run([venv / "bin/python", "-m", "pip", "install", "-q", f"{wheel}[cpu]"], env=clean_env())
    app = tmp / "app"
    app.mkdir()
    (app / "client.py").write_text("raise SystemExit('the user client.py was imported instead of the SDK')\n")
    port = free_port()
    gw = Served(f"{venv}/bin/omni-gateway serve", port=port, cwd=app, log_path=tmp / "serve.log",
                env=clean_env(OMNI_GATEWAY_PORT=str(port)))  # fmt: skip
    try:
        gw.wait_ready(timeout_s=120)
        yield Installed(wheel, venv, app, gw)
    finally:
        gw.stop()


def test_the_wheel_holds_the_packages_and_the_demo_and_no_top_level_client(installed: Installed) -> None:
    names = zipfile.ZipFile(installed.wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == PACKAGES, tops
    assert {"web_demo/voice.html", "web_demo/video.html", "web_demo/sdk/realtime.js"} <= set(names)


def test_the_installed_code_is_the_wheels_not_the_checkouts(installed: Installed) -> None:
    code = "import gateway, omni_gateway_client, web_demo; print(gateway.__file__, omni_gateway_client.__file__)"
    out = run([installed.venv / "bin/python", "-c", code], cwd=installed.app, env=clean_env()).stdout.split()
    assert all("/site-packages/" in path for path in out), out


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read().decode()


# What a module loads: its imports, and the worklets it names with new URL("./x.js", import.meta.url).
LOADS = re.compile(r"""(?:\bfrom\s+|\bimport\s+|here\(|new URL\()["'](\.{1,2}/[^"']+\.js)["']""")


def test_serve_answers_health_and_serves_the_demo_page_and_every_script_it_loads(installed: Installed) -> None:
    http = installed.gateway.http
    assert get(http + "/healthz") == (200, '{"status":"ok"}')
    status, page = get(http + "/voice.html")
    assert status == 200 and "<html" in page.lower()
    todo = [urljoin(http + "/voice.html", src) for src in re.findall(r"""<script[^>]*\bsrc=["']([^"']+)["']""", page)]
    assert todo, "the demo page loads no script"
    seen: set[str] = set()
    while todo:
        url = todo.pop()
        if url in seen:
            continue
        seen.add(url)
        status, body = get(url)
        assert status == 200 and body.strip(), url
        todo += [urljoin(url, path) for path in LOADS.findall(body)]
    names = {u.removeprefix(http) for u in seen}
    assert {"/voice/app.js", "/sdk/connect.js", "/voice/capture-worklet.js"} <= names, names


def test_a_script_beside_a_client_py_of_its_own_opens_a_session_with_the_sdk(installed: Installed) -> None:
    (installed.app / "talk.py").write_text(
        textwrap.dedent(
            """
            import asyncio, sys
            from omni_gateway_client import RealtimeClient

            async def main() -> None:
                async with RealtimeClient(sys.argv[1], model="omni-cascade") as rt:
                    async for event in rt:
                        if event["type"] == "session.created":
                            print(event["session"]["model"])
                            return

            asyncio.run(main())
            """
        )
    )
    done = run([installed.venv / "bin/python", "talk.py", installed.gateway.url], cwd=installed.app, env=clean_env())
    assert done.stdout.strip() == "omni-cascade"
