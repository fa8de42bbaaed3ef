"""The video page (web_demo/video.html) in Chromium against a real gateway running
the CPU video engine: fMP4 through Media Source Extensions, JPEG on a canvas, and
interactions changing the picture while it plays."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from browser_support import PageLog, browser, screenshot
from support.gateway import RunningGateway, run_gateway

from gateway.settings import Settings

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def gateway() -> AsyncIterator[RunningGateway]:
    async with run_gateway(Settings(engine="passthrough")) as gw:
        yield gw


async def wait_until(page: Any, condition: str, timeout_s: float, log: PageLog) -> Any:
    """Poll a JS expression over ``window.__video`` (as ``v``) until it is truthy; its value."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = await page.evaluate(f"() => {{ const v = window.__video; return ({condition}); }}")
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            state = await page.evaluate("() => ({i: window.__video.interactions(), s: window.__video.client?.stats})")
            raise AssertionError(f"timed out waiting for {condition}\n{state}\n{log}")
        await asyncio.sleep(0.1)


def caption_distance(a: dict[str, Any], b: dict[str, Any]) -> float:
    """How different the captions (the prompt written on the frame) of two samples are."""
    return sum(abs(x - y) for x, y in zip(a["caption"], b["caption"], strict=True))


async def test_mp4_plays_through_mse_and_a_midway_prompt_change_shows_in_the_frames(gateway: RunningGateway) -> None:
    async with browser() as context:
        page = await context.new_page()
        log = PageLog(page)
        await page.goto(gateway.http + "/video.html")
        await page.get_by_label("Prompt", exact=True).fill("A lakeside sunrise")
        await page.get_by_role("button", name="Start").click()

        # Decoded and playing: the element's clock advances, at the requested size.
        first = await wait_until(page, "v.sample() && v.sample().time > 0.5 && v.sample()", 20, log)
        assert (first["width"], first["height"]) == (256, 256)
        before = await wait_until(page, f"v.sample().time > {first['time']} + 0.3 && v.sample()", 5, log)
        assert caption_distance(first, before) < 0.1  # same prompt: same caption, whatever moves

        # A midway prompt change, blended over one chunk.
        await page.get_by_label("Blend over").fill("1")
        await page.get_by_label("New prompt").fill("A sea turtle")
        await page.get_by_role("button", name="Apply").click()
        done = await wait_until(page, "v.interactions().find((i) => i.state === 'completed')", 15, log)
        states = [h["state"] for h in done["history"]]
        assert states[:2] == ["sent", "queued"] and "started" in states and states[-1] == "completed", states
        await page.locator('#interactions .state[data-state="completed"]').wait_for(timeout=5000)

        # The frames change once the playhead reaches the new chunks, and stay changed.
        deadline = asyncio.get_running_loop().time() + 10
        changing = before
        while caption_distance(before, changing) <= 0.5 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
            changing = await page.evaluate("() => window.__video.sample()")
        assert changing["time"] > before["time"]
        await asyncio.sleep(0.7)  # past the one-chunk blend
        after = await page.evaluate("() => window.__video.sample()")
        await asyncio.sleep(0.5)
        later = await page.evaluate("() => window.__video.sample()")
        assert caption_distance(before, after) > 0.5
        assert caption_distance(after, later) < 0.1  # settled on the new prompt

        # Stream health as a person sees it.
        stats = await page.evaluate("() => window.__video.client.stats")
        assert stats["chunks"] >= 4 and stats["bytes"] > 10_000 and stats["droppedChunks"] == 0
        assert stats["unpairedFrames"] == 0
        assert await page.locator("#h-mime").inner_text() == 'video/mp4; codecs="avc1.42C00C"'
        assert float(await page.locator("#h-rate").inner_text()) > 0.5
        await screenshot(page, "video_page.png")

        await page.get_by_role("button", name="Stop").click()
        await page.locator('#status[data-state="done"]').wait_for(timeout=10_000)
        assert not log.errors, log


async def test_jpeg_frames_are_drawn_on_a_canvas_and_the_camera_buttons_move_it(gateway: RunningGateway) -> None:
    async with browser() as context:
        page = await context.new_page()
        log = PageLog(page)
        await page.goto(gateway.http + "/video.html")
        await page.get_by_label("Format").select_option("jpeg")
        await page.get_by_label("Size").select_option("128x96")
        await page.get_by_role("button", name="Start").click()
        first = await wait_until(page, "v.jpeg && v.jpeg.drawn >= 6 && v.sample()", 20, log)
        assert (first["width"], first["height"]) == (128, 96)
        assert await page.locator("#video").is_hidden() and await page.locator("#canvas").is_visible()

        await page.get_by_label("Blend over").fill("0")
        await page.get_by_role("button", name="Zoom in").click()
        zoom = await wait_until(page, "v.interactions().find((i) => i.state === 'completed')", 15, log)
        assert "queued" in [h["state"] for h in zoom["history"]]
        row = page.locator(f'#interactions tr[data-state="completed"]:has-text("{zoom["eventId"]}")')
        assert "zoom in" in await row.inner_text()
        drawn = await page.evaluate("() => window.__video.jpeg.drawn")
        await asyncio.sleep(1.0)
        assert await page.evaluate("() => window.__video.jpeg.drawn") >= drawn + 6  # 12 fps, still live
        await screenshot(page, "video_page_jpeg.png")
        assert not log.errors, log
