"""Helpers for the browser tests: Debian's Chromium driven by Python Playwright,
a fake microphone fed from a WAV synthesized at test time, and page diagnostics.

Chromium is launched from ``/usr/bin/chromium`` (``scripts/install_browser.sh``
installs it); ``playwright install`` is never needed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import tempfile
import wave
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

CHROMIUM = os.environ.get("OMNI_TEST_CHROMIUM", "/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts"
INSTALL_HINT = "run scripts/install_browser.sh (Debian's chromium + pip install playwright)"


def missing_browser() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return f"no Chromium at {CHROMIUM}: {INSTALL_HINT}"
    if importlib.util.find_spec("playwright") is None:
        return f"Python Playwright is not installed: {INSTALL_HINT}"
    return None


def write_wav(path: Path, pcm: bytes, rate: int) -> Path:
    """PCM16 mono as a WAV file (what Chromium's fake audio capture reads)."""
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)
    return path


def chromium_args(wav: Path | None = None) -> list[str]:
    args = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--use-fake-ui-for-media-stream",
        "--allow-loopback-in-peer-connection",  # WebRTC: loopback candidates (the gateway offers 127.0.0.1 alone)
        "--use-fake-device-for-media-stream",
        "--autoplay-policy=no-user-gesture-required",
        "--disable-features=MediaSessionService",
    ]
    if wav is not None:
        args.append(f"--use-file-for-fake-audio-capture={wav}")
    return args


class PageLog:
    """The page's console messages and uncaught errors, for assertion messages."""

    def __init__(self, page: Any) -> None:
        self.lines: list[str] = []
        page.on("console", lambda m: self.lines.append(f"console.{m.type}: {m.text}"))
        page.on("pageerror", lambda e: self.lines.append(f"pageerror: {e}"))

    @property
    def errors(self) -> list[str]:
        return [line for line in self.lines if line.startswith(("pageerror", "console.error"))]

    def __str__(self) -> str:
        return "\n".join(self.lines[-40:]) or "(no console output)"


@contextlib.asynccontextmanager
async def browser(
    wav: Path | None = None, *, viewport: tuple[int, int] = (1100, 1000), args: tuple[str, ...] = ()
) -> AsyncIterator[Any]:
    """A fresh Chromium (its own user-data-dir) as a Playwright persistent context; ``args``
    are more of Chromium's flags."""
    from playwright.async_api import async_playwright

    user_data = tempfile.mkdtemp(prefix="omni-chromium-")
    try:
        async with async_playwright() as p:
            context = await p.chromium.launch_persistent_context(
                user_data,
                executable_path=CHROMIUM,
                headless=True,
                args=[*chromium_args(wav), *args],
                viewport={"width": viewport[0], "height": viewport[1]},
                permissions=["microphone"],
            )
            try:
                yield context
            finally:
                await context.close()
    finally:
        shutil.rmtree(user_data, ignore_errors=True)


async def screenshot(page: Any, name: str) -> Path:
    """A full-page screenshot under artifacts/ (gitignored)."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    await page.screenshot(path=str(path), full_page=True)
    return path


async def client_event_count(http_base: str, event_type: str) -> float:
    """``omni_client_events_total{type=...}`` from the gateway's /metrics."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{http_base}/metrics")).text
    match = re.search(rf'^omni_client_events_total\{{type="{re.escape(event_type)}"\}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0
