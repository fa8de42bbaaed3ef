"""The page and the flow of the test of the OpenAI Agents SDK's browser transport,
``OpenAIRealtimeWebRTC`` from ``@openai/agents-realtime`` (npm, unchanged: its
``dist/bundle``, installed by scripts/install_browser.sh into .venv-clients/npm, served to the
page by a wrapper in front of the gateway): the fake microphone asks, the agent's tool runs
in the page, its result goes back as ``function_call_output`` and the next answer, spoken on
the call's track, is made from it (tests/vllm/test_agents_realtime_webrtc.py, with a model
that decides). The package is needed: without it the test skips, except under CI, where
that fails.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser_support import REPO, PageLog, write_wav
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles
from support.speech import silence, speak

VERSION = "0.20.0"  # scripts/install_browser.sh installs this one; docs/browser.md names it
PACKAGE = Path(os.environ.get("CLIENTS_VENV", REPO / ".venv-clients")) / "npm/node_modules/@openai/agents-realtime"
PREFIX = "/vendor/agents-realtime"
KEY = "sk-agents-test-key"
RESULT = "It is sunny in {city} today."

PAGE = """<!doctype html><meta charset="utf-8"><title>agents-realtime</title><link rel="icon" href="data:,"><body>
<script type="module">
import { OpenAIRealtimeWebRTC, RealtimeAgent, RealtimeSession, tool }
  from "/vendor/agents-realtime/openai-realtime-agents.mjs";

const seen = window.seen = { tool: [], events: [], errors: [], transcripts: {}, status: null, callId: null };
// toolChoice: the session's (a model that calls only when made to: "required"); autoAfterTool:
// the tool, as it runs, lets the model decide again, so the answer after its result is spoken.
window.run = async ({ secret, iceServers, toolChoice = "auto", autoAfterTool = false }) => {
  // No zod in a plain page: the tool's parameters as JSON schema (strict).
  const getWeather = tool({
    name: "get_weather",
    description: "The weather in a city.",
    parameters: { type: "object", properties: { city: { type: "string", enum: ["Paris", "Oslo", "Lima"] } },
                  required: ["city"], additionalProperties: false },
    strict: true,
    execute: async (args) => {
      seen.tool.push({ args, at: performance.now() });
      if (autoAfterTool) {
        const update = { type: "session.update", session: { type: "realtime", tool_choice: "auto" } };
        window.session.transport.sendEvent(update);
      }
      return `It is sunny in ${args.city} today.`;
    },
  });
  const agent = new RealtimeAgent({ name: "weather", instructions: "Answer with the weather.", tools: [getWeather] });
  const transport = new OpenAIRealtimeWebRTC({
    baseUrl: location.origin + "/v1/realtime/calls",   // absolute: the SDK parses it with new URL()
    // The gateway's ICE servers (from the client secret) go on the SDK's own peer connection.
    changePeerConnection: (pc) => {
      pc.setConfiguration({ ...pc.getConfiguration(), iceServers });
      window.pc = pc;
      return pc;
    },
  });
  const session = window.session = new RealtimeSession(agent, {
    transport, model: "omni-cascade",
    config: {
      toolChoice,
      audio: { input: { transcription: { model: "whisper-1" }, turnDetection: { type: "server_vad" } } },
    },
  });
  session.on("transport_event", (e) => {
    seen.events.push({ type: e.type, at: performance.now() });
    if (e.type === "response.output_audio_transcript.done") seen.transcripts[e.item_id] = e.transcript;
  });
  session.on("error", (e) => seen.errors.push(String(e.error?.message ?? e.error ?? e)));
  await session.connect({ apiKey: secret });
  seen.status = transport.status;
  seen.callId = transport.callId;
};
window.inbound = async () => {
  let out = null;
  (await window.pc.getStats()).forEach((s) => {
    if (s.type === "inbound-rtp" && s.kind === "audio") {
      out = { packets: s.packetsReceived, energy: s.totalAudioEnergy || 0 };
    }
  });
  return out;
};
window.ready = true;
</script>"""


def bundle() -> Path:
    """The package's browser bundle, or skip (fail under CI)."""
    folder = PACKAGE / "dist" / "bundle"
    if not (folder / "openai-realtime-agents.mjs").exists():
        if os.environ.get("CI"):
            raise AssertionError(f"{folder} is missing: run scripts/install_browser.sh")
        pytest.skip("@openai/agents-realtime is not installed: run scripts/install_browser.sh")
    version = json.loads((PACKAGE / "package.json").read_text())["version"]
    assert version == VERSION, f"@openai/agents-realtime {version} installed; the test is for {VERSION}"
    return folder


def serving(folder: Path) -> Any:
    """An ASGI wrapper: the bundle at /vendor/agents-realtime/ and the test's page at
    /agents.html (served, not fulfilled by a test router: Chromium's local network checks
    want a page that came from 127.0.0.1), the gateway for the rest."""
    static = StaticFiles(directory=folder)
    page = HTMLResponse(PAGE)

    def wrap(app: Any) -> Any:
        async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope["path"].startswith(PREFIX + "/"):
                await static({**scope, "root_path": PREFIX}, receive, send)
                return
            if scope["type"] == "http" and scope["path"] == "/agents.html":
                await page(scope, receive, send)
                return
            await app(scope, receive, send)

        return wrapped

    return wrap


async def question_wav(path: Path) -> Path:
    """One question, then a long silence: one turn (the fake device loops the file)."""
    speech = silence(1500, 48000) + await speak("what is the weather in paris", 48000) + silence(30000, 48000)
    return write_wav(path, speech, 48000)


async def converse(gateway: Any, context: Any, **options: Any) -> tuple[Any, PageLog, dict[str, Any]]:
    """Mint a client secret (the page's backend, with its key), run the agent in the page
    (``options``: window.run's), wait for its tool to run and the answer after it to be
    spoken; the page, its log and what it saw."""
    async with httpx.AsyncClient() as http:
        res = await http.post(
            gateway.http + "/v1/realtime/client_secrets",
            headers={"Authorization": f"Bearer {KEY}"},
            json={"session": {"type": "realtime", "model": "omni-cascade"}},
        )
    minted = res.json()
    assert minted["value"].startswith("ek_") and "ice_servers" in minted, minted  # the SDK wants an ek_ in a browser
    page = await context.new_page()
    log = PageLog(page)
    await page.goto(gateway.http + "/agents.html")
    await page.wait_for_function("() => window.ready === true", timeout=20_000)
    run = {"secret": minted["value"], "iceServers": minted["ice_servers"], **options}
    await page.evaluate("(a) => window.run(a)", run)
    seen = await page.evaluate("() => window.seen")
    assert seen["status"] == "connected", (seen, str(log))
    [call] = gateway.runtime.calls.calls.values()
    assert seen["callId"] == call.call_id  # from the answer's Location
    await page.wait_for_function("() => window.seen.tool.length >= 1", timeout=60_000, polling=100)
    # The answer after the tool's result, spoken on the track: its audio started after the call.
    spoken = """() => {
      const events = window.seen.events, types = events.map((e) => e.type);
      const called = types.indexOf("response.function_call_arguments.done");
      return called >= 0 && types.indexOf("output_audio_buffer.stopped", called) > called;
    }"""
    await page.wait_for_function(spoken, timeout=60_000, polling=100)
    return page, log, await page.evaluate("() => window.seen")
