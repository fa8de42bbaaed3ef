"""The voice page's GPT-Live mode (the API selector set to GPT-Live) in Chromium against a
real gateway on the CPU voice cascade: the page speaks ``/v1/live/sessions`` over the
WebSocket, streams the fake microphone (a WAV of synthesized speech, looped by Chromium),
and the model takes its own turn: what was said is transcribed, the answer's transcript
shows and its audio plays in the page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from browser_support import PageLog, browser, screenshot
from support.gateway import RunningGateway, run_gateway
from voice_support import MS, speech_wav, wait_until

from gateway.settings import Settings

pytestmark = pytest.mark.timeout(120)


def check_live_turn_latency(seen: dict[str, Any]) -> float:
    """The page's turn latency in Live mode (voice.html, #latency-definition): from the
    latest transcript of what was said arriving (Live says no turn end) to the answer's
    first sound as the page plays it. So it comes after the answer's first audio delta
    reached the page, and within the playout that follows."""
    [latency] = seen["latencies"]
    events = seen["events"]
    first_audio = next(i for i, e in enumerate(events) if e["type"] == "session.output_audio.delta")
    ended = max(e["at"] for e in events[:first_audio] if e["type"] == "session.input_transcript.delta")
    arrived = events[first_audio]["at"] - ended
    assert arrived <= latency + 25, (arrived, latency)  # heard after it arrived (one 20 ms meter window of slack)
    assert latency < arrived + 1500, (arrived, latency)  # and not a later sound
    return float(latency)


async def open_live_page(context: Any, gateway: RunningGateway) -> tuple[Any, PageLog]:
    """The voice page with GPT-Live chosen in its API selector, started as a person would."""
    page = await context.new_page()
    log = PageLog(page)
    await page.goto(gateway.http + "/voice.html")
    await page.get_by_label("API", exact=True).select_option("live")
    assert await page.locator("#text-form").is_hidden()  # Live takes no typed messages
    await page.get_by_role("button", name="Start").click()
    await wait_until(page, "v.client && v.client.state === 'open'", 15, log)
    return page, log


async def test_live_mode_holds_a_spoken_exchange(tmp_path: Path) -> None:
    wav = await speech_wav(tmp_path / "speech.wav", lead_ms=800, tail_ms=15000)
    async with (
        run_gateway(Settings(engine="cascade", video_engine="none")) as gateway,
        browser(wav) as context,
    ):
        page, log = await open_live_page(context, gateway)
        assert await page.locator("#path").inner_text() == "GPT-Live, base64 JSON"
        assert (await page.locator("#session-id").inner_text()).startswith("live_")
        answered = "Object.keys(v.seen.outputTranscripts).length >= 1 && v.seen.latencies.length >= 1 && v.seen"
        seen = await wait_until(page, answered, 60, log)
        assert seen["dialect"] == "live" and seen["session"]["model"] == "gpt-live-1"
        user_turn = next(iter(seen["inputTranscripts"]))
        heard = seen["inputTranscripts"][user_turn]
        assert "what" in heard
        # The cascade's echo thinker says what it heard: the answer is to what was said.
        said = "v.seen.outputTranscripts[Object.keys(v.seen.outputTranscripts)[0]]"
        answer = await wait_until(
            page, f"{said} && {said}.length >= {len('You said: ') + len(heard)} && {said}", 20, log
        )
        assert answer == f"You said: {heard}"
        latency = check_live_turn_latency(seen)
        assert latency > 0  # (no bound: bench/ measures speed)

        # The answer's audio reached the player and was played out.
        played = "v.audio.stats.bufferedMs === 0 && v.audio.stats.playedSamples > 0 && v.audio.stats"
        stats = await wait_until(page, played, 20, log)
        assert stats["receivedBytes"] > 2 * MS * 500  # over half a second of speech
        assert stats["playedSamples"] * 2 >= stats["receivedBytes"] - 2 * MS * 5  # all of it, within 5 ms
        assert stats["droppedSamples"] == 0

        # What a person sees.
        assert "You said:" in await page.locator("#log").inner_text()
        assert await page.locator("#status").get_attribute("data-state") == "open"
        assert "Turn 1:" in await page.locator("#latency").inner_text()
        await screenshot(page, "voice_page_live.png")
        assert not seen["errors"] and not log.errors, (seen["errors"], log)


LIVE_CLIENT = """async (key) => {
  const { LiveClient } = await import("/sdk/live.js");
  const out = {};
  // No credential on a gateway that requires one: refused at the upgrade, with the SDK's code.
  try {
    await new LiveClient().connect();
    out.refused = null;
  } catch (err) {
    out.refused = err.code;
  }
  const live = new LiveClient({ apiKey: key, session: { model: "gpt-live-1", instructions: "Answer briefly." } });
  const states = [];
  live.on("state", (s) => states.push(s.state));
  let said = "", audio = 0;
  live.on("session.output_transcript.delta", (e) => { said += e.delta; });
  live.on("session.output_audio.delta", (e) => { audio += e.audio.length; });
  const started = await live.connect();
  out.started = { id: started.session.id, model: started.session.model, connected: live.connected };
  // Commentary is said by the model (the cascade's echo thinker says it as it is).
  live.commentary("Hello from the page.");
  await new Promise((resolve) => {
    const check = () => (said.includes("Hello from the page") && audio > 0 ? resolve() : setTimeout(check, 50));
    check();
  });
  out.said = said;
  const closed = new Promise((resolve) => live.on("session.closed", resolve));
  live.close();
  out.closed = (await closed).reason;
  out.audioSamples = audio;
  out.states = states;
  out.stats = { ...live.stats };
  return out;
}"""


async def test_the_live_client_starts_speaks_commentary_and_closes() -> None:
    async with (
        run_gateway(Settings(engine="cascade", video_engine="none", api_keys=("sk-page",))) as gateway,
        browser() as context,
    ):
        page = await context.new_page()
        log = PageLog(page)
        await page.goto(gateway.http + "/voice.html")
        out = await page.evaluate(LIVE_CLIENT, "sk-page")
        assert out["refused"] == "refused", out
        assert out["started"]["id"].startswith("live_") and out["started"]["model"] == "gpt-live-1", out
        assert out["started"]["connected"] is True
        assert "Hello from the page" in out["said"] and out["audioSamples"] > 0, out
        assert out["closed"] == "close_requested", out
        assert out["states"] == ["connecting", "open", "closed"], out
        assert out["stats"]["audioBytesIn"] == 2 * out["audioSamples"]
        # (Chromium logs the refused upgrade itself; nothing else went wrong in the page.)
        assert [e for e in log.errors if "Authentication failed" not in e] == [], log
