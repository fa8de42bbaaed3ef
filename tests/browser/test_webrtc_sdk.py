"""The browser SDK's WebRTC transport (web_demo/sdk/webrtc.js, connect.js) in Chromium
against the gateway: sends made while a lost call is offered again go out after the resume,
once; a call whose session is gone (hung up) ends the client, or continues in a new session;
a gateway without WebRTC gets the WebSocket instead (``connectRealtime``, transport auto).
The engine is the passthrough one (no model); the microphone Chromium's fake device."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from browser_support import PageLog, browser
from support.gateway import RunningGateway, run_gateway

from gateway.settings import Settings

pytestmark = pytest.mark.timeout(120)

# Added to the gateway's own landing page: a page Chromium fetched from 127.0.0.1 (one a test
# router fulfilled is of no address space, and Chromium's local network checks then refuse
# its WebSocket to 127.0.0.1).
SCRIPT = """
import { WebRTCClient } from "/sdk/webrtc.js";
import { connectRealtime } from "/sdk/connect.js";

const record = (rt) => {
  rt.seen = { events: [], states: [] };
  rt.on("event", (e) => rt.seen.events.push({ type: e.type, seq: e.server_event_seq ?? null, e }));
  rt.on("state", (s) => rt.seen.states.push(s.state));
};
window.clients = [];
window.call = async (options = {}) => {
  const rt = new WebRTCClient({ audioElement: document.getElementById("out"), ...options });
  record(rt);
  window.clients.push(rt);
  await rt.connect();
  return window.clients.length - 1;
};
window.auto = async (options = {}) => {
  const { client, fallback } = await connectRealtime({ ...options, wire: record });
  window.clients.push(client);
  return { transport: client.transport, fallback: fallback && { code: fallback.code, status: fallback.status } };
};
window.view = (i) => {
  const rt = window.clients[i];
  return { state: rt.state, stats: rt.stats, sessionId: rt.sessionId, callId: rt.callId, lastSeq: rt.lastSeq,
           error: rt.error && { code: rt.error.code, message: rt.error.message }, ...rt.seen };
};
const out = document.createElement("audio");
out.id = "out";
out.autoplay = true;
document.body.append(out);
window.ready = true;
"""


@pytest.fixture
async def gateway() -> AsyncIterator[RunningGateway]:
    async with run_gateway(Settings(engine="passthrough", video_engine="none", detach_grace_s=30)) as gw:
        yield gw


async def load(page: Any, gateway: RunningGateway) -> None:
    await page.goto(gateway.http + "/")
    await page.add_script_tag(content=SCRIPT, type="module")
    await page.wait_for_function("() => window.ready === true")


@pytest.fixture
async def page(gateway: RunningGateway) -> AsyncIterator[Any]:
    async with browser() as context:
        page = await context.new_page()
        page.log = PageLog(page)
        await load(page, gateway)
        yield page


async def until(page: Any, index: int, condition: str, timeout_s: float = 20.0) -> dict[str, Any]:
    """Poll client ``index``'s view (``c``) until ``condition`` holds; the view."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        view: dict[str, Any] = await page.evaluate("(i) => window.view(i)", index)
        if await page.evaluate(f"(c) => !!({condition})", view):
            return view
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {condition}: {view['states']} {view['error']}\n{page.log}")
        await asyncio.sleep(0.05)


def the_call(gateway: RunningGateway) -> Any:
    [call] = gateway.runtime.calls.calls.values()
    return call


async def test_sends_made_while_the_call_is_offered_again_go_out_after_the_resume_once(
    gateway: RunningGateway, page: Any
) -> None:
    index = await page.evaluate("() => window.call()")
    first = await until(page, index, "c.state === 'open'")
    assert first["events"][0]["type"] == "session.created" and first["events"][0]["e"]["resume_token"]
    # The moment the call is lost, the page sends: the event waits for the next call.
    await page.evaluate(
        """(i) => {
          const rt = window.clients[i];
          const off = rt.on("state", (s) => {
            if (s.state !== "reconnecting") return;
            off();
            rt.sendText("sent while reconnecting");
          });
        }""",
        index,
    )
    await the_call(gateway).end("test: the call is gone")
    view = await until(page, index, "c.states.filter((s) => s === 'open').length === 2")
    view = await until(page, index, "c.events.some((x) => x.type === 'conversation.item.added')")
    assert view["states"] == ["connecting", "open", "reconnecting", "resuming", "open"]
    assert view["sessionId"] == first["sessionId"] and view["stats"]["resumes"] == 1
    assert (view["stats"]["sendsQueued"], view["stats"]["sendsFlushed"]) == (1, 1)
    added = [x["e"] for x in view["events"] if x["type"] == "conversation.item.added"]
    assert [a["item"]["content"][0]["text"] for a in added] == ["sent while reconnecting"]
    seqs = [x["seq"] for x in view["events"] if x["seq"]]
    assert seqs == sorted(set(seqs))
    assert view["callId"] == the_call(gateway).call_id
    assert not page.log.errors, page.log


@pytest.mark.parametrize("fallback", ["fail", "new_session"])
async def test_a_call_hung_up_ends_the_client_or_continues_in_a_new_session(
    gateway: RunningGateway, page: Any, fallback: str
) -> None:
    index = await page.evaluate("(f) => window.call({ resumeFallback: f })", fallback)
    first = await until(page, index, "c.state === 'open'")
    async with httpx.AsyncClient() as http:
        res = await http.post(f"{gateway.http}/v1/realtime/calls/{first['callId']}/hangup")
    assert res.status_code == 200, res.text
    # The call ends; the SDK cannot tell a hangup from a loss, offers again, and the
    # gateway says the session is gone (404 session_not_found).
    if fallback == "fail":
        view = await until(page, index, "c.state === 'ended'")
        assert view["error"]["code"] == "session_not_found", view["error"]
        assert view["states"] == ["connecting", "open", "reconnecting", "ended"]
    else:
        view = await until(page, index, "c.states.filter((s) => s === 'open').length === 2")
        view = await until(page, index, "c.events.filter((x) => x.type === 'session.created').length === 2")
        types = [x["type"] for x in view["events"]]
        lost = view["events"][types.index("client.session_lost")]["e"]
        assert (lost["code"], lost["previous_session_id"]) == ("session_not_found", first["sessionId"])
        assert types.index("client.session_lost") == types.index("session.created", 1) - 1
        assert view["sessionId"] not in (None, first["sessionId"]) and lost["session_id"] == view["sessionId"]
        assert view["stats"]["sessionsLost"] == 1


async def test_a_gateway_without_webrtc_gets_the_websocket(page: Any) -> None:
    async with run_gateway(Settings(engine="passthrough", video_engine="none", webrtc=False)) as gateway:
        await load(page, gateway)
        result = await page.evaluate("() => window.auto()")
        assert result == {"transport": "websocket", "fallback": {"code": "webrtc_unavailable", "status": 501}}
        view = await until(page, 0, "c.state === 'open'")
        assert view["events"][0]["type"] == "session.created"
        # Forced, WebRTC is refused as the gateway said.
        refused = await page.evaluate(
            "() => window.call().then(() => null, (err) => ({ code: err.code, status: err.status }))"
        )
        assert refused == {"code": "webrtc_unavailable", "status": 501}
