"""Runs a third-party client script on the clients' own environment.

openai-agents requires websockets < 17, so the clients live in ``.venv-clients``
(``scripts/install_client_deps.sh``), apart from the test environment; the
gateway runs here and each client as a subprocess there. Without that
environment the tests are skipped, except under CI (``CI`` set), where that fails.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent
CLIENTS_PYTHON = Path(os.environ.get("CLIENTS_VENV", ROOT / ".venv-clients")) / "bin" / "python"


def clients_python() -> Path:
    if not CLIENTS_PYTHON.exists():
        if os.environ.get("CI"):
            raise AssertionError(f"{CLIENTS_PYTHON} is missing: run scripts/install_client_deps.sh")
        pytest.skip("the third-party clients are not installed: run scripts/install_client_deps.sh")
    return CLIENTS_PYTHON


async def run_client(script: str, tmp: Path, *, url: str, speech: bytes, timeout: float = 150.0) -> dict[str, Any]:
    """Run ``script`` (in tests/clients/) against ``url`` with ``speech`` (PCM16 24 kHz) as
    its microphone; returns the JSON report it wrote."""
    python = clients_python()
    audio, out = tmp / "speech.pcm", tmp / f"{script}.json"
    audio.write_bytes(speech)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = await asyncio.create_subprocess_exec(
        str(python), str(SCRIPTS / script), "--url", url, "--speech", str(audio), "--out", str(out),
        "--timeout", str(timeout - 20),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env,
    )  # fmt: skip
    try:
        output, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        raise
    assert out.exists(), f"{script} wrote no report (exit {proc.returncode}):\n{output.decode()[-4000:]}"
    report: dict[str, Any] = json.loads(out.read_text())
    report["output"] = output.decode()[-4000:]
    return report
