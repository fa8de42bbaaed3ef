"""Every command line the README, docs/ and deploy/README.md give a user is run, as written.

``support.docs.command_lines`` reads the shell blocks; each test below registers the
exact lines it runs (``@runs``), and the first test fails on a documented line that no
test runs, or a registered line the documents no longer have. Placeholders are filled
the way a user would (``PATH``: a checkpoint written here; ``ws://gpu-1:8091``: gateways
started here); the port comes from ``OMNI_GATEWAY_PORT``, which every command honours.
What cannot run on this machine (a Docker engine, a Kubernetes cluster, vLLM-Omni on a
GPU) says so: the deploy files are checked statically in tests/deploy/test_deploy_files.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import http.server
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import orjson
import pytest
import test_examples  # noqa: F401  (registers the examples' commands)
import test_site  # noqa: F401  (registers the site's build command)
import test_user_install  # noqa: F401  (registers the README's first command)
from support.docs import (
    DOCS,
    ROOT,
    RUNNERS,
    SHELL_FENCES,
    TEST_COMMAND,
    UNIT_TESTS,
    code_blocks,
    command_lines,
    inline_invocations,
    runs,
)
from support.gateway import free_port
from support.redis_server import REDIS_BINARY, RedisServer
from support.serve import Served, clean_env, text_turn
from support.workers import by_worker, scrape

from gateway.cli import settings_from_args
from gateway.routing import CATCH_ALL, parse_routes
from gateway.runtime import build_engine
from gateway.settings import Settings
from gateway.tenants import KeysFile, TenantLimits, key_digest
from gateway.workers import available_cores

pytestmark = pytest.mark.timeout(300)

BIN = Path(sys.executable).parent  # this test run's venv: where `omni-gateway` is installed
LINT = "ruff check . && ruff format --check . && mypy"


def documented() -> set[str]:
    return {line for doc in DOCS for line in command_lines(doc)}


def blocks() -> set[str]:
    """The text of every block that is neither commands nor a diagram (``text``)."""
    return {b.text for doc in DOCS for b in code_blocks(doc) if b.lang not in (*SHELL_FENCES, "text")}


def test_every_documented_command_line_is_run_by_a_test() -> None:
    lines = documented()
    assert lines, "no command lines found: are the shell blocks marked ```bash?"
    missing = sorted(lines - RUNNERS.keys())
    assert not missing, f"documented but run by no test (add one here): {missing}"
    stale = sorted(RUNNERS.keys() - lines - blocks())
    assert not stale, f"tests run lines the documents no longer give: {stale}"


EXAMPLES = {p.read_text() for p in (ROOT / "examples").glob("*.py")}


def test_every_code_block_is_run_by_a_test_or_says_it_is_illustrative() -> None:
    """A block is an example file as it is (tests/docs/test_examples.py runs each), a
    block a test here runs, or one whose line before it says ``illustrative``. A diagram
    is a ``text`` block; a block names its language."""
    unchecked = []
    for doc in DOCS:
        for block in code_blocks(doc):
            assert block.lang, f"{doc}: a block after {block.before!r} names no language (`text` for a diagram)"
            if block.lang in (*SHELL_FENCES, "text"):
                continue
            if block.text in EXAMPLES or block.text in RUNNERS or "illustrative" in block.before.lower():
                continue
            unchecked.append(f"{doc}: the {block.lang} block after {block.before!r}")
    assert not unchecked, f"neither run by a test nor marked illustrative: {unchecked}"


def test_an_example_shown_in_the_docs_is_the_whole_file() -> None:
    shown = {b.text for doc in DOCS for b in code_blocks(doc) if b.lang == "python"} & EXAMPLES
    assert len(shown) == 4, "README: openai_sdk.py; docs: python_sdk.py, duplex.py, video.py"


def block_after(doc: str, marker: str) -> str:
    (text,) = [b.text for b in code_blocks(doc) if marker in b.before]
    return text


ROUTES = block_after("docs/settings.md", "engine's options:")
KEYS_FILE = block_after("docs/tenants.md", "client secrets with it")


@runs(ROUTES)
def test_the_model_routes_shown_are_what_the_gateway_parses() -> None:
    routes = {r.name: r for r in parse_routes(ROUTES, Settings())}
    assert set(routes) == {"omni-cascade", "tone", "duplex-omni", CATCH_ALL}
    assert routes["tone"].engine == "passthrough" and routes["tone"].options == {"audio_chunks": 25}
    assert build_engine(routes["duplex-omni"]).info.takes_turns  # (built: it connects only when started)


@runs(KEYS_FILE)
def test_the_keys_file_shown_is_what_the_gateway_parses() -> None:
    """Its placeholder filled as the text says: ``printf %s "$KEY" | sha256sum``."""
    env = {"KEY": "sk-acme", "PATH": os.environ["PATH"]}
    hashed = subprocess.run(["bash", "-c", 'printf %s "$KEY" | sha256sum'], env=env, capture_output=True, text=True)
    digest = hashed.stdout.split()[0]
    assert digest == key_digest("sk-acme")
    placeholder = '"<sha256 hex of the key: printf %s \\"$KEY\\" | sha256sum>"'
    assert placeholder in KEYS_FILE
    text = KEYS_FILE.replace(placeholder, f'"{digest}"')
    entry = KeysFile.parse(text, TenantLimits()).lookup("sk-acme")
    assert entry is not None and entry.principal == "tenant:acme"
    assert entry.tenant.limits.max_sessions == 20 and entry.tenant.allows_model("omni-cascade")
    assert not entry.tenant.allows_model("another") and not entry.tenant.admin


def test_every_inline_invocation_parses_with_the_real_command_line() -> None:
    """``omni-gateway serve --engine remote ...`` in prose must be a valid command too."""
    for doc in (*DOCS, "bench/README.md"):
        for span in inline_invocations(doc):
            argv = re.sub(r"\[[^\]]*\]", "", span).split()  # optional parts: [--upstream ...]
            argv = argv[1:] if argv[0] == "omni-gateway" else argv[3:]  # python -m gateway ...
            if argv and argv[0] == "serve":
                settings_from_args(argv, environ={})  # argparse exits 2 on an unknown flag or choice


# --- the README's test command and CI --------------------------------------------------


@runs(TEST_COMMAND)
def test_ci_runs_the_readme_test_command_in_a_fresh_venv() -> None:
    """This command is what CI runs (it is running now): ``.ci/run`` holds it verbatim,
    after removing any virtual environment a previous run left. Its venv is not the one
    the user's first command makes (``.venv``): a contributor keeps both."""
    ci = (ROOT / ".ci/run").read_text()
    assert TEST_COMMAND in ci.splitlines()
    venv = re.search(r"python3 -m venv (\S+) ", TEST_COMMAND)
    assert venv and venv.group(1) != ".venv" and f"{venv.group(1)}/" in (ROOT / ".gitignore").read_text().split()
    assert f"rm -rf {venv.group(1)} " in ci.split(TEST_COMMAND)[0]
    assert "bash scripts/test_lowest.sh" in ci.split(TEST_COMMAND)[1]


@runs(UNIT_TESTS)
def test_the_contributors_first_step_runs_the_unit_tests_alone() -> None:
    """The quick check the README offers a contributor, as written, in this test run's venv:
    tests/unit passes on its own (no fixture of another folder needed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # (not this run's xdist worker's)
    env["PATH"] = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    done = subprocess.run(["bash", "-c", UNIT_TESTS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert re.search(r"\d+ passed", done.stdout.splitlines()[-1]), done.stdout[-2000:]


def test_ci_fails_when_any_step_of_the_test_command_fails(tmp_path: Path) -> None:
    """A failed install (seen: apt's lock held by another apt-get) stops CI with a non-zero
    status; it must not skip the suite and carry on to a green end. ``.ci/run`` is run as
    it is, with its test command's first step failing and the steps after it recorded."""
    ci = (ROOT / ".ci/run").read_text()
    first_step = TEST_COMMAND.split(" && ")[0]
    suite = TEST_COMMAND.split(" && ")[-1]
    failing = TEST_COMMAND.replace(first_step, "echo reached-install >> trace && false", 1).replace(
        suite, "echo reached-suite >> trace"
    )
    script = re.sub(r"^rm -rf .*$", ":", ci.replace(TEST_COMMAND, failing), flags=re.M)
    script = script.replace("bash scripts/test_lowest.sh", "echo reached-lowest >> trace")
    (tmp_path / ".ci").mkdir()
    (tmp_path / ".ci/run").write_text(script)
    done = subprocess.run(["bash", ".ci/run"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0, done.stdout + done.stderr
    assert (tmp_path / "trace").read_text().split() == ["reached-install"]
    assert "test command failed" in done.stdout


@runs(LINT)
def test_the_tree_is_lint_format_and_type_clean() -> None:
    if shutil.which("ruff", path=str(BIN)) is None or shutil.which("mypy", path=str(BIN)) is None:
        pytest.skip("ruff and mypy come with the dev extra")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", "-c", LINT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout + done.stderr


# --- serve, one engine at a time ----------------------------------------------------------


@contextlib.contextmanager
def serving(command: str, tmp_path: Path, ready_s: float = 60.0, **env: str) -> Iterator[Served]:
    port = free_port()
    # PYTHONPATH: this checkout's code (the same as the editable install's in CI; in a worktree, the worktree's)
    path = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    env = clean_env(**{"PATH": path, "OMNI_GATEWAY_PORT": str(port), "PYTHONPATH": str(ROOT), **env})
    gw = Served(command, port=port, cwd=ROOT, log_path=tmp_path / f"serve-{port}.log", env=env)
    try:
        gw.wait_ready(ready_s)
        yield gw
    finally:
        gw.stop()


@runs("omni-gateway serve --engine cascade", "omni-gateway serve --engine passthrough")
@pytest.mark.parametrize("engine", ["cascade", "passthrough"])
async def test_serve_with_an_embedded_engine_answers_a_text_turn(engine: str, tmp_path: Path) -> None:
    with serving(f"omni-gateway serve --engine {engine}", tmp_path) as gw:
        response = await text_turn(gw.url)
        assert response["status"] == "completed", response


@runs("omni-gateway serve --engine remote --upstream ws://gpu-1:8091 --upstream ws://gpu-2:8091")
async def test_serve_remote_in_front_of_two_upstreams_answers_a_text_turn(tmp_path: Path) -> None:
    upstream = "omni-gateway serve --engine passthrough --video-engine none"
    with serving(upstream, tmp_path) as up1, serving(upstream, tmp_path) as up2:
        command = "omni-gateway serve --engine remote --upstream ws://gpu-1:8091 --upstream ws://gpu-2:8091"
        command = command.replace("ws://gpu-1:8091", f"ws://127.0.0.1:{up1.port}")
        command = command.replace("ws://gpu-2:8091", f"ws://127.0.0.1:{up2.port}")
        with serving(command, tmp_path) as gw:
            for _ in range(2):  # the pool may place each on either upstream
                response = await text_turn(gw.url)
                assert response["status"] == "completed", response


@runs("omni-gateway serve --engine vllm --engine-model PATH")
@pytest.mark.vllm
@pytest.mark.timeout(600)
async def test_serve_vllm_with_a_checkpoint_answers_a_text_session_named_after_it(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    sys.path.insert(0, str(ROOT / "tests" / "vllm"))
    from tiny_model import write_tiny_llama

    model = write_tiny_llama(tmp_path / "tiny-llama", max_positions=1024)
    command = f"omni-gateway serve --engine vllm --engine-model {model}"
    with serving(command, tmp_path, ready_s=400, VLLM_CPU_KVCACHE_SPACE="1") as gw:
        with urllib.request.urlopen(gw.http + "/v1/models", timeout=5) as r:
            ids = [m["id"] for m in orjson.loads(r.read())["data"]]
        assert ids == [str(model)]  # named after the checkpoint, as `vllm serve PATH` does
        response = await text_turn(gw.url, "tell me a story")
        assert response["status"] in ("completed", "incomplete"), response  # incomplete: max tokens
        text = [c.get("text") or c.get("transcript") for o in response["output"] for c in o.get("content", [])]
        assert any(text), response


@runs("omni-gateway serve --engine omni --engine-model PATH")
def test_serve_omni_without_vllm_omni_stops_with_a_clear_error(tmp_path: Path) -> None:
    """vLLM-Omni has no CPU build: here the command must fail cleanly, naming what is
    missing (on a GPU machine, bench/omni_gpu.py runs the engine for real)."""
    with contextlib.suppress(ImportError):
        import vllm_omni  # noqa: F401

        pytest.skip("vLLM-Omni is installed: the engine would load a real model (bench/omni_gpu.py)")
    port = free_port()
    env = clean_env(PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", OMNI_GATEWAY_PORT=str(port), PYTHONPATH=str(ROOT))
    gw = Served("omni-gateway serve --engine omni --engine-model PATH", port=port, cwd=ROOT,
                log_path=tmp_path / "omni.log", env=env)  # fmt: skip
    code = gw.wait_exit(120)
    gw.stop()
    assert code == 2, gw.log()
    assert gw.log().strip().splitlines() == [
        "omni-gateway: --engine omni needs vLLM-Omni, which is not installed (no module vllm_omni): "
        "install vllm-omni on a GPU host"
    ]


# --- every core, and traces -----------------------------------------------------------------


@runs("omni-gateway serve --redis-url redis://127.0.0.1:6379/0")
async def test_serve_with_redis_runs_a_worker_per_core_on_one_port(tmp_path: Path) -> None:
    if not REDIS_BINARY:
        pytest.skip("redis-server is not installed")
    cores = available_cores()
    with RedisServer() as redis:
        command = "omni-gateway serve --redis-url redis://127.0.0.1:6379/0".replace(
            "redis://127.0.0.1:6379/0", redis.url
        )
        with serving(command, tmp_path, PYTHONPATH=str(ROOT)) as gw:
            up: dict[str, float] = {}
            for _ in range(300):  # /readyz answered for one worker: wait for every one
                up = by_worker(scrape(gw.port).get("omni_worker_up", [])) if cores > 1 else {}
                if len(up) == cores and all(up.values()):
                    break
                await asyncio.sleep(0.2)
            if cores > 1:
                assert up == {str(i): 1.0 for i in range(cores)}, gw.log()
            response = await text_turn(gw.url)
            assert response["status"] == "completed", response
            assert gw.log(50_000).count("omni-gateway is serving on") == 1  # one worker speaks for the port


class Collector(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP traces endpoint: keeps each export request's body."""

    bodies: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        Collector.bodies.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@runs("omni-gateway serve --otel-traces-endpoint http://127.0.0.1:4318/v1/traces")
async def test_serve_exports_traces_over_otlp_to_the_endpoint(tmp_path: Path) -> None:
    trace_service = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")
    collector = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{collector.server_address[1]}/v1/traces"
    command = "omni-gateway serve --otel-traces-endpoint http://127.0.0.1:4318/v1/traces"
    try:
        with serving(command.replace("http://127.0.0.1:4318/v1/traces", endpoint), tmp_path,
                     PYTHONPATH=str(ROOT)) as gw:  # fmt: skip
            response = await text_turn(gw.url)
            assert response["status"] == "completed", response
            assert gw.stop() == 0  # the drain ends the session; the exporter sends what is pending
    finally:
        collector.shutdown()
    spans, services = [], set()
    for body in Collector.bodies:
        request = trace_service.ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            services |= {a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"}
            spans += [s for scope in resource_spans.scope_spans for s in scope.spans]
    assert services == {"omni-gateway"}
    names = {s.name for s in spans}
    assert {"session", "engine.response"} <= names, names
    session = next(s for s in spans if s.name == "session")
    attributes = {a.key: a.value.string_value for a in session.attributes}
    assert attributes["omni.session_id"].startswith("sess_") and attributes["omni.principal"] == "anonymous"


# --- deploy/README.md ----------------------------------------------------------------------


@runs("deploy/cluster.sh up --replicas 3 --api-key sk-local", "deploy/cluster.sh up --replicas 2 --engine cascade")
@pytest.mark.parametrize(
    ("command", "key"),
    [("deploy/cluster.sh up --replicas 3 --api-key sk-local", "sk-local"),
     ("deploy/cluster.sh up --replicas 2 --engine cascade", None)],
    ids=["passthrough-3-keyed", "cascade-2"],
)  # fmt: skip
async def test_the_local_cluster_comes_up_answers_through_nginx_and_stops_on_ctrl_c(
    command: str, key: str | None, tmp_path: Path
) -> None:
    env = clean_env(PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", PYTHON=sys.executable)
    log = tmp_path / "cluster.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(command.split(), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    try:
        url = None
        for _ in range(1200):
            text = log.read_text(errors="replace")
            if "Ctrl-C to stop." in text:
                url = re.search(r"realtime\s+(ws://\S+)", text).group(1)  # type: ignore[union-attr]
                break
            assert proc.poll() is None, text
            await asyncio.sleep(0.1)
        assert url, log.read_text()
        headers = {"Authorization": f"Bearer {key}"} if key else None
        response = await text_turn(url, headers=headers)
        assert response["status"] == "completed", response
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground group
        code = proc.wait(90)
    assert code == 0, log.read_text()
    assert "cluster stopped" in log.read_text()


@runs(
    "docker build -f deploy/Dockerfile -t omni-gateway .",
    "OMNI_GATEWAY_API_KEYS=sk-change-me docker compose -f deploy/compose.yaml up --build",
)
def test_docker_commands_need_a_docker_engine() -> None:
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "info"], capture_output=True, timeout=20).returncode != 0:
        pytest.skip("no Docker engine on this machine; tests/deploy/test_deploy_files.py checks the files")
    done = subprocess.run(["docker", "build", "-f", "deploy/Dockerfile", "-t", "omni-gateway", "."], cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@runs("kubectl apply -f deploy/k8s/")
def test_kubectl_apply_needs_a_cluster() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None or subprocess.run([kubectl, "cluster-info"], capture_output=True, timeout=20).returncode:
        pytest.skip("no Kubernetes cluster here; tests/deploy/test_deploy_files.py checks the manifests")
    done = subprocess.run([kubectl, "apply", "--dry-run=server", "-f", "deploy/k8s/"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
