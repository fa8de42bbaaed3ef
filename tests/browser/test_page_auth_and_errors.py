"""What the pages tell a person when something is missing: a credential the
gateway requires (and then connecting with an API key, a client secret or a
token), a denied microphone, a gateway that is gone; a page of another site
that the gateway's allowed_origins does not name; a voice page opened over plain http
from another host (no secure context: no microphone, no AudioWorklet)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.server
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser_support import REPO, PageLog, browser
from support.gateway import run_gateway
from support.jwt_issuer import HS_SECRET, TestIssuer

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
        assert await page.evaluate("() => window.__voice.seen.transport") == "webrtc"
        # Kept in the field only: not in the URL, not in storage.
        assert KEY not in page.url
        stored = await page.evaluate("() => JSON.stringify({...localStorage}) + JSON.stringify({...sessionStorage})")
        assert KEY not in stored
        await page.get_by_role("button", name="Stop").click()

        # A client secret minted for video by "the page's server" with the key: the video page streams with it.
        async with httpx.AsyncClient() as http:
            minted = await http.post(
                gateway.http + "/v1/realtime/client_secrets",
                headers={"Authorization": f"Bearer {KEY}"},
                json={"expires_after": {"anchor": "created_at", "seconds": 60}, "session": {"type": "video"}},
            )
        secret = minted.json()["value"]
        assert secret.startswith("ek_")
        await page.goto(gateway.http + "/video.html")
        await page.locator("#auth summary").click()  # the Credentials panel opens
        await page.get_by_label("API key or client secret").fill(secret)
        await page.get_by_label("Size").select_option("128x96")
        await page.get_by_role("button", name="Start").click()
        await page.locator('#status[data-state="streaming"]').wait_for(timeout=15_000)
        # The refused offer (the voice page calls over WebRTC) is the browser's own console
        # line (a gateway whose ICE servers need a key refuses that GET too); the page read
        # the 401's JSON error itself.
        refused = [e for e in log.errors if "status of 401" in e]
        assert refused, log
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


# --- a page from another origin, and a token from the page's own backend ------------------

FOREIGN_PAGE = """<!doctype html><meta charset="utf-8"><title>another site</title>
<script type="module">
import { RealtimeClient } from "./sdk/realtime.js";
window.attempt = async (url, apiKey) => {
  const rt = new RealtimeClient({ url, apiKey, reconnect: false });
  try {
    const created = await rt.connect();
    rt.close();
    return { ok: true, type: created.type };
  } catch (err) {
    return { ok: false, code: err.code, message: err.message };
  }
};
window.ready = true;
</script>"""


@contextlib.contextmanager
def page_server(root: Path) -> Iterator[str]:
    """Static files from ``root`` on their own origin (another port of 127.0.0.1)."""
    handler = functools.partial(QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def foreign_site(tmp_path: Path) -> Path:
    """A page of another site that bundles the browser SDK (copied: no CORS needed)."""
    shutil.copytree(REPO / "web_demo" / "sdk", tmp_path / "sdk")
    (tmp_path / "index.html").write_text(FOREIGN_PAGE)
    return tmp_path


async def test_a_page_from_a_disallowed_origin_cannot_open_a_socket_and_an_allowed_one_can(tmp_path: Path) -> None:
    root = foreign_site(tmp_path)
    with page_server(root) as refused_site, page_server(root) as allowed_site:
        settings = Settings(engine="passthrough", video_engine="none", api_keys=(KEY,), allowed_origins=(allowed_site,))
        async with run_gateway(settings) as gateway, browser() as context:
            for site, expect_ok in ((refused_site, False), (allowed_site, True)):
                page = await context.new_page()
                await page.goto(site + "/index.html")
                await page.wait_for_function("() => window.ready === true")
                result = await page.evaluate("([u, k]) => window.attempt(u, k)", [gateway.url, KEY])
                if expect_ok:
                    assert result == {"ok": True, "type": "session.created"}, result
                else:
                    # The browser sees only a failed upgrade; the SDK finds the gateway up: "refused".
                    assert (result["ok"], result["code"]) == (False, "refused"), result
                    assert "origin" in result["message"]
            refusals = gateway.runtime.metrics.registry.get_sample_value(
                "omni_upgrade_refusals_total", {"code": "origin_not_allowed"}
            )
            assert refusals == 1
            await page.close()  # the allowed page's socket closes with it; the gateway forgets it
            async with asyncio.timeout(30):
                while gateway.runtime.connections:  # noqa: ASYNC110  (no event to wait on: the state itself)
                    await asyncio.sleep(0.01)


async def test_a_token_from_the_pages_own_backend_opens_a_session_from_the_page() -> None:
    issuer = TestIssuer()
    settings = Settings(engine="passthrough", video_engine="none", api_keys=(KEY,), jwt_secret=HS_SECRET)
    async with run_gateway(settings) as gateway, browser() as context:
        page = await context.new_page()
        log = PageLog(page)
        await page.goto(gateway.http + "/voice.html")
        await page.locator("#auth summary").click()
        await page.get_by_label("API key or client secret").fill(issuer.hs256("browser-user"))
        await page.get_by_role("button", name="Start").click()
        await page.locator('#status[data-state="open"]').wait_for(timeout=10_000)
        assert {h.principal for h in gateway.runtime.hosts.values()} == {"jwt:browser-user"}
        assert not log.errors, log


async def test_the_voice_page_over_plain_http_from_another_host_says_it_needs_a_secure_context() -> None:
    """http://voice.example:PORT/ is no secure context (only https://, localhost and loopback
    addresses are), so the page has no microphone and no AudioWorklet. Chromium resolves the
    name to 127.0.0.1 (``--host-resolver-rules``): the traffic stays on this machine."""
    async with (
        run_gateway(Settings(engine="passthrough", video_engine="none")) as gateway,
        browser(args=("--host-resolver-rules=MAP voice.example 127.0.0.1",)) as context,
    ):
        page = await context.new_page()
        log = PageLog(page)
        origin = f"http://voice.example:{gateway.port}"
        await page.goto(origin + "/voice.html")
        assert await page.evaluate("() => window.isSecureContext") is False
        error = page.locator("#error")
        await error.wait_for(state="visible", timeout=10_000)  # said at once, before Start
        said = await error.inner_text()
        assert f"{origin} is not one" in said and "https://" in said, said
        assert f"http://localhost:{gateway.port}" in said and f"ssh -L {gateway.port}:127.0.0.1:{gateway.port}" in said
        await page.get_by_role("button", name="Start").click()  # start() says it before its first await
        assert await error.inner_text() == said
        assert await page.evaluate("() => window.__voice.audio") is None  # no AudioContext was tried
        assert "addModule" not in str(log) and not log.errors, log
        assert await page.locator("#status").get_attribute("data-state") == "new"
