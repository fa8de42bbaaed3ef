"""Every example of ``examples/`` runs as written, against a real gateway on its embedded
default (``omni-gateway serve``: the cascade and the CPU video engine), and ends.

Each runs by its documented command (``python examples/NAME.py``, from the repository's
root) in a subprocess, with nothing but ``GATEWAY_URL`` set (the gateway's port is
chosen here; the default, ``ws://127.0.0.1:8000``, is the README's) and, for the video,
``VIDEO_OUT`` (where the clip goes). What each prints is checked: what the gateway heard,
its answer (the cascade's echo of it), the end of the session.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.docs import ROOT, RUNNERS, code_blocks, runs
from support.gateway import free_port
from support.serve import Served, clean_env

pytestmark = pytest.mark.timeout(300)

BIN = Path(sys.executable).parent
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.py"))
DEFAULT_URL = "ws://127.0.0.1:8000"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    port = free_port()
    log = tmp_path_factory.mktemp("examples") / "serve.log"
    # PYTHONPATH: this tree's gateway, wherever the test venv's editable install points
    env = clean_env(PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", OMNI_GATEWAY_PORT=str(port), PYTHONPATH=str(ROOT))
    gw = Served("omni-gateway serve", port=port, cwd=ROOT, log_path=log, env=env)
    try:
        gw.wait_ready(300)  # the cascade's models and torch load slowly on a busy machine
        yield gw
    finally:
        gw.stop()


def test_serve_says_what_to_do_next(gateway: Served) -> None:
    """Once it listens: the demo's address, the models and what their engine really does
    (the default is an echo), where the protocols are."""
    log = gateway.log(20_000)
    http = f"http://127.0.0.1:{gateway.port}"
    assert f"omni-gateway is serving on {http}\n" in log
    assert f"  open {http}/ for the voice and video demos" in log
    assert f"  OpenAI Realtime API: ws://127.0.0.1:{gateway.port}/v1/realtime" in log
    assert "  model omni-cascade: the cascade engine, an echo, not a language model: it transcribes" in log
    assert 'says back "You said: " and the transcript' in log
    openai_names = "gpt-realtime*, gpt-4o-realtime*, gpt-4o-mini-realtime*, gpt-live*"
    assert f"  model names {openai_names}: the same engine as omni-cascade\n" in log
    assert "  any other model name: refused (model_not_found; GET /v1/models lists the models)\n" in log
    assert f"  video: ws://127.0.0.1:{gateway.port}/v1/realtime/video, model cpu-video: Procedural CPU video" in log
    assert log.index("Uvicorn running on") < log.index("omni-gateway is serving on")


def run_example(command: str, gateway: Served, **env: str) -> str:
    environ = clean_env(PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=str(ROOT),
                        GATEWAY_URL=f"ws://127.0.0.1:{gateway.port}", **env)  # fmt: skip
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=environ, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stdout}\n{done.stderr}\n{gateway.log()}"
    return done.stdout


def heard_and_echoed(out: str) -> str:
    heard = re.search(r"^heard: (.+)$", out, re.M)
    assert heard and heard.group(1).strip(), out
    assert f"answer: You said: {heard.group(1)}\n" in out, out  # the cascade repeats what it heard
    return heard.group(1)


@runs("python examples/openai_sdk.py")
def test_the_official_sdk_example_holds_one_spoken_exchange(gateway: Served) -> None:
    heard_and_echoed(run_example("python examples/openai_sdk.py", gateway))


@runs("python examples/python_sdk.py")
def test_the_python_sdk_example_holds_one_exchange_with_a_manual_turn(gateway: Served) -> None:
    out = run_example("python examples/python_sdk.py", gateway)
    heard_and_echoed(out)
    seconds = re.search(r"^answer audio: ([\d.]+) s$", out, re.M)
    assert seconds and float(seconds.group(1)) > 0.5, out


@runs("python examples/duplex.py")
def test_the_duplex_example_holds_one_exchange_and_closes_the_session(gateway: Served) -> None:
    out = run_example("python examples/duplex.py", gateway)
    heard_and_echoed(out)
    assert out.rstrip().endswith("closed: client_close"), out


@runs("python examples/video.py")
def test_the_video_example_writes_a_clip_whose_prompt_changed(gateway: Served, tmp_path: Path) -> None:
    clip = tmp_path / "clip.mp4"
    out = run_example("python examples/video.py", gateway, VIDEO_OUT=str(clip))
    assert "interaction applied: evt_whale" in out, out
    assert re.search(rf"^done: \d+ chunks, {clip.stat().st_size} bytes in {re.escape(str(clip))}$", out, re.M), out
    assert clip.read_bytes()[4:8] == b"ftyp"  # a fragmented MP4 starts with its init segment


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_is_run_here_and_defaults_to_the_readme_url(name: str) -> None:
    text = (ROOT / "examples" / name).read_text()
    assert RUNNERS.get(f"python examples/{name}", "").startswith("test_examples::"), f"{name} is run by no test"
    assert f'os.environ.get("GATEWAY_URL", "{DEFAULT_URL}")' in text
    assert DEFAULT_URL.replace("ws://", "http://") in (ROOT / "README.md").read_text()


def test_the_readme_shows_the_example_it_names_as_the_file_is() -> None:
    blocks = [b for b in code_blocks("README.md") if b.lang == "python"]
    assert [b.text for b in blocks] == [(ROOT / "examples" / "openai_sdk.py").read_text()]
