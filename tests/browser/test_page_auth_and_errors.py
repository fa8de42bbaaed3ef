"""What the pages tell a person when something is missing: a credential the
gateway requires (and then connecting with an API key or a client secret), a
denied microphone, a gateway that is gone."""

from __future__ import annotations

import httpx
import pytest
from browser_support import PageLog, browser
from support.gateway import run_gateway

from gateway.settings import Settings

pytestmark = pytest.mark.timeout(120)

KEY = "sk-browser-test-key"
# What getUserMedia does when the person (or the browser's policy) says no.
DENY_MICROPHONE = """
navigator.mediaDevices.getUserMedia = () =>
  Promise.reject(new DOMException("Permission denied", "NotAllowedError"));
"""


async def test_pages_ask_for_a_credential_and_connect_with_a_key_or_a_client_secret() -> None:
    async with (
        run_gateway(Settings(engine="passthrough", api_keys=(KEY,))) as gateway,
        browser() as context,
    ):
        page = await context.new_page()
        log = PageLog(page)
        await page.goto(gateway.http + "/voice.html")
        await page.get_by_role("button", name="Start").click()
        error = page.get_by_role("alert")
        await error.filter(has_text="requires a credential").wait_for(timeout=10_000)
        assert await page.locator("#auth").get_attribute("open") is not None
        assert await page.evaluate("() => document.activeElement.id") == "credential"
        assert await page.get_by_role("button", name="Start").is_enabled()

        # An API key typed into the field (Enter submits): connected.
        await page.get_by_label("API key or client secret").fill(KEY)
        await page.get_by_label("API key or client secret").press("Enter")
        await page.locator('#status[data-state="open"]').wait_for(timeout=10_000)
        assert await error.is_hidden()
        # Kept in the field only: not in the URL, not in storage.
        assert KEY not in page.url
        stored = await page.evaluate("() => JSON.stringify({...localStorage}) + JSON.stringify({...sessionStorage})")
        assert KEY not in stored
        await page.get_by_role("button", name="Stop").click()

        # A client secret minted by "the page's server" with the key: the video page streams with it.
        async with httpx.AsyncClient() as http:
            minted = await http.post(
                gateway.http + "/v1/realtime/client_secrets",
                headers={"Authorization": f"Bearer {KEY}"},
                json={"expires_after": {"anchor": "created_at", "seconds": 60}},
            )
        secret = minted.json()["value"]
        assert secret.startswith("ek_")
        await page.goto(gateway.http + "/video.html")
        await page.locator("#auth summary").click()  # the Credentials panel opens
        await page.get_by_label("API key or client secret").fill(secret)
        await page.get_by_label("Size").select_option("128x96")
        await page.get_by_role("button", name="Start").click()
        await page.locator('#status[data-state="streaming"]').wait_for(timeout=15_000)
        # The refused upgrade is the browser's own console line (a page cannot read the 401).
        refused = [e for e in log.errors if "WebSocket connection to" in e]
        assert len(refused) == 1 and "Authentication failed" in refused[0], log
        assert [e for e in log.errors if e not in refused] == [], log


async def test_a_denied_microphone_and_a_gateway_that_is_gone_are_explained() -> None:
    async with browser() as context:
        async with run_gateway(Settings(engine="passthrough", video_engine="none")) as gateway:
            denied = await context.new_page()
            await denied.add_init_script(DENY_MICROPHONE)
            await denied.goto(gateway.http + "/voice.html")
            await denied.get_by_role("button", name="Start").click()
            await denied.get_by_role("alert").filter(has_text="Microphone access was denied").wait_for(timeout=10_000)
            assert await denied.locator("#status").get_attribute("data-state") == "ended"
            assert await denied.get_by_role("button", name="Start").is_enabled()

            gone = await context.new_page()
            await gone.goto(gateway.http + "/voice.html")
        # The gateway has stopped; the page is still open.
        await gone.get_by_role("button", name="Start").click()
        await gone.get_by_role("alert").filter(has_text="Cannot reach the gateway").wait_for(timeout=15_000)
        assert await gone.locator("#status").get_attribute("data-state") == "ended"
        assert await gone.get_by_role("button", name="Start").is_enabled()
