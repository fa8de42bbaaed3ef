"""The browser SDK's pieces in Chromium, checked against the gateway's own code:
the binary frame codec both ways, the capture resampler, a dropped video
chunk that Media Source playback must step over, and the SDK's resumes (a lost
socket, a takeover, refusals, a drain onto another replica)."""

from __future__ import annotations

import asyncio
import base64
import math
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import numpy as np
import orjson
import pytest
import websockets
from browser_support import PageLog, browser, screenshot
from support.gateway import RunningGateway, run_gateway
from support.redis_server import REDIS_BINARY, RedisServer

from gateway.protocol.server_events import encode_audio_frame
from gateway.settings import Settings
from omni_gateway_client.frames import decode_input_frame

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def gateway() -> AsyncIterator[RunningGateway]:
    async with run_gateway(Settings(engine="passthrough")) as gw:
        yield gw


@pytest.fixture
async def page(gateway: RunningGateway) -> AsyncIterator[Any]:
    async with browser() as context:
        page = await context.new_page()
        page.log = PageLog(page)
        await page.goto(gateway.http + "/")
        yield page


async def test_frame_codec_decodes_what_the_gateway_encodes_and_encodes_what_it_decodes(page: Any) -> None:
    cases = []
    for n, item_id in enumerate(["", "i", "item_1", "item_e20849d261660003", "x" * 40]):
        samples = np.arange(-n * 100, -n * 100 + 480, dtype="<i2")
        seq = 2**40 + n if n % 2 else n + 1
        frame = encode_audio_frame(
            {"item_id": item_id, "content_index": n, "server_event_seq": seq, "delta": samples.tobytes()}
        )
        cases.append({"frame": base64.b64encode(frame).decode(), "item_id": item_id, "seq": seq, "n": n,
                      "samples": samples.tolist()})  # fmt: skip
    result = await page.evaluate(
        """async (cases) => {
          const f = await import("/sdk/frames.js");
          const decoded = cases.map((c) => {
            const e = f.decodeAudioFrame(f.base64ToBytes(c.frame).slice().buffer);
            return { type: e.type, item_id: e.item_id, seq: e.server_event_seq, content_index: e.content_index,
                     samples: Array.from(e.audio), aligned: e.audio.byteOffset % 4 === 0,
                     noCopy: e.audio.buffer === e.delta.buffer };
          });
          const input = f.bytesToBase64(f.encodeInputFrame(new Int16Array([1, -2, 32767, -32768])));
          let refused = null;
          try { f.decodeAudioFrame(new Uint8Array([2, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).buffer); }
          catch (err) { refused = err.name; }
          const sdk = await import("/sdk/index.js");
          return { decoded, input, refused, exports: Object.keys(sdk) };
        }""",
        cases,
    )
    for case, got in zip(cases, result["decoded"], strict=True):
        assert got["type"] == "response.output_audio.delta"
        assert (got["item_id"], got["seq"], got["content_index"]) == (case["item_id"], case["seq"], case["n"])
        assert got["samples"] == case["samples"]
        assert got["aligned"] and got["noCopy"]  # new Int16Array(buffer, H) straight on the frame
    audio = decode_input_frame(base64.b64decode(result["input"]))
    assert np.frombuffer(audio, "<i2").tolist() == [1, -2, 32767, -32768]
    assert result["refused"] == "FrameError"  # header length not a multiple of 4
    assert {"RealtimeClient", "VideoClient", "postInteraction", "decodeAudioFrame"} <= set(result["exports"])
    # The landing page links to both demos.
    links = await page.get_by_role("link").evaluate_all("(links) => links.map((a) => a.getAttribute('href'))")
    assert {"voice.html", "video.html"} <= set(links)
    await screenshot(page, "index_page.png")


async def test_capture_resampler_keeps_speech_band_tones_and_removes_aliases(page: Any) -> None:
    # 44.1 kHz (this Chromium's device rate) to 24 kHz: 1 kHz passes at unity, 15 kHz
    # (above the new Nyquist) must not fold back to 9 kHz.
    result = await page.evaluate(
        """async () => {
          const { Resampler } = await import("/voice/resampler.js");
          const run = (freq) => {
            const r = new Resampler(44100, 24000);
            const out = [];
            for (let block = 0; block < 100; block++) {   // 100 render quanta of 128 frames, like a worklet
              const x = new Float32Array(128);
              for (let i = 0; i < 128; i++) x[i] = 0.5 * Math.sin(2 * Math.PI * freq * (block * 128 + i) / 44100);
              out.push(...r.process(x));
            }
            return out;
          };
          return { low: run(1000), high: run(15000) };
        }"""
    )
    low = np.array(result["low"][200:])
    high = np.array(result["high"][200:])
    expected = 100 * 128 * 24000 / 44100
    assert abs(len(result["low"]) - expected) < 40  # the rate is right (minus the filter's delay)
    spectrum = np.abs(np.fft.rfft(low * np.hanning(len(low))))
    peak_hz = np.argmax(spectrum) * 24000 / len(low)
    assert abs(peak_hz - 1000) < 15
    assert math.isclose(np.sqrt(np.mean(low**2)) * math.sqrt(2), 0.5, rel_tol=0.02)
    assert np.sqrt(np.mean(high**2)) < 0.5 * 10 ** (-50 / 20)  # at least 50 dB down


async def _video_chunks(gateway: RunningGateway, n_chunks: int) -> list[tuple[dict[str, Any], bytes]]:
    url = f"ws://127.0.0.1:{gateway.port}/v1/realtime/video"
    chunks: list[tuple[dict[str, Any], bytes]] = []
    async with websockets.connect(url, max_size=None) as ws:
        start = {"type": "session.start", "prompt": "A lakeside sunrise", "format": "m4s", "width": 128,
                 "height": 96, "fps": 12, "num_frames": 6 * n_chunks}  # fmt: skip
        await ws.send(orjson.dumps(start).decode())
        meta: dict[str, Any] | None = None
        async for msg in ws:
            if isinstance(msg, bytes):
                assert meta is not None
                if meta["kind"] == "media":  # (the stream's trailer, its mfra index, is not played)
                    chunks.append((meta, msg))
                meta = None
                continue
            event = orjson.loads(msg)
            if event["type"] == "video.chunk_metadata":
                meta = event
            elif event["type"] == "session.done":
                break
    return chunks


async def test_mse_player_plays_through_a_dropped_chunk(gateway: RunningGateway, page: Any) -> None:
    chunks = await asyncio.wait_for(_video_chunks(gateway, 8), 60)
    assert len(chunks) == 8
    kept = [base64.b64encode(data).decode() for i, (_, data) in enumerate(chunks) if i != 3]  # chunk 3 "dropped"
    result = await page.evaluate(
        """async ({ mime, chunks }) => {
          const { MsePlayer } = await import("/video/player.js");
          const { base64ToBytes } = await import("/sdk/frames.js");
          const video = document.createElement("video");
          video.muted = true;
          document.body.append(video);
          const player = new MsePlayer(video);
          await player.open(mime);
          for (const c of chunks) player.append(base64ToBytes(c).slice().buffer);
          player.end();
          const deadline = performance.now() + 8000;
          while (!video.ended && performance.now() < deadline) await new Promise((r) => setTimeout(r, 100));
          const b = player.buffer.buffered;
          return { ended: video.ended, time: video.currentTime, ranges: b.length, end: b.end(b.length - 1),
                   width: video.videoWidth, error: player.error };
        }""",
        {"mime": chunks[0][0]["mime_type"], "chunks": kept},
    )
    # Seven half-second fragments, one contiguous range: playback never stalls on the hole.
    assert result["error"] is None, page.log
    assert result["ranges"] == 1
    assert abs(result["end"] - 3.5) < 0.05
    assert result["ended"] and result["time"] > 3.4, result
    assert result["width"] == 128


# (JS) Every socket a client given ``WebSocket: Recording`` opens, in ``sockets``, with the
# first event it got.
RECORDING_SOCKETS = """
  const sockets = [];
  class Recording extends WebSocket {
    constructor(url, protocols) {
      super(url, protocols);
      const socket = { url, first: null };
      sockets.push(socket);
      this.addEventListener("message", (m) => {
        if (socket.first === null) socket.first = typeof m.data === "string" ? JSON.parse(m.data).type : "binary";
      });
    }
  }
"""

RESUME_PATHS = (
    """async () => {
  const { RealtimeClient } = await import("/sdk/realtime.js");
  const log = [];
  const track = (name, c) => {
    c.on("state", (s) => log.push(`${name}:${s.state}${s.error ? ":" + s.error.code : ""}`));
    c.on("event", (e) => { if (!e.server_event_seq) log.push(`${name}:${e.type}`); });
    return c;
  };
  const kill = (c) => c.ws.close(4000, "test: the network dropped");
  const untilState = (c, state) => new Promise((resolve) => {
    if (c.state === state) return resolve();
    const off = c.on("state", (s) => { if (s.state === state) { off(); resolve(); } });
  });
  const out = {};

"""
    + RECORDING_SOCKETS
    + """
  // A: a session with one answer, then its socket dies while a request waits in the queue.
  const a = track("a", new RealtimeClient({ binary: true, WebSocket: Recording }));
  await a.connect();
  a.sessionUpdate({ type: "realtime", audio: { input: { turn_detection: null } } });
  a.sendText("hello");
  a.createResponse();
  await a.waitFor("response.done");
  const before = { id: a.sessionId, token: a.resumeToken, seq: a.lastSeq };
  kill(a);
  await untilState(a, "reconnecting");
  a.sendText("are you still there");
  a.createResponse();
  const resumed = await a.waitFor("session.resumed");
  const second = await a.waitFor("response.done");
  out.a = { before, resumed, after: { id: a.sessionId, token: a.resumeToken }, stats: { ...a.stats },
            second: second.response.status, binary: a.binary, sockets: sockets.splice(0) };

  // B takes A's session over (say, from another tab): A is told and stops.
  const b = track("b", new RealtimeClient({ binary: false }));
  await b.connect();
  Object.assign(b, { sessionId: a.sessionId, resumeToken: a.resumeToken, lastSeq: a.lastSeq });
  kill(b);
  await untilState(b, "open");
  await untilState(a, "ended");
  out.b = { id: b.sessionId, aState: a.state, aError: a.error, binary: b.binary };

  // C and D hold a token the gateway refuses: C carries on in a new session, D stops.
  const c = track("c", new RealtimeClient({ resumeFallback: "new_session", WebSocket: Recording }));
  await c.connect();
  const lostId = c.sessionId;
  c.resumeToken = "rt_not_a_real_token";
  kill(c);
  const lost = await c.waitFor("client.session_lost");
  await untilState(c, "open");
  out.c = { lost, lostId, id: c.sessionId, stats: { ...c.stats }, sockets: sockets.splice(0) };
  const d = track("d", new RealtimeClient());
  await d.connect();
  d.resumeToken = "rt_not_a_real_token";
  kill(d);
  await untilState(d, "ended");
  out.d = { state: d.state, code: d.error.code };
  for (const x of [a, b, c, d]) x.close();
  out.log = log;
  return out;
}"""
)


async def test_sdk_resumes_queues_sends_hands_over_and_handles_refusals_against_the_gateway(page: Any) -> None:
    out = await asyncio.wait_for(page.evaluate(RESUME_PATHS), 60)
    a = out["a"]
    # Resumed the same session from the last seq it had, with a rotated token; the
    # request sent during the outage went out after the resume and was answered.
    assert a["resumed"]["session_id"] == a["before"]["id"] == a["after"]["id"]
    assert a["resumed"]["replay_from"] == a["before"]["seq"] + 1
    assert a["after"]["token"] != a["before"]["token"]
    assert a["stats"]["sendsQueued"] == 2 and a["stats"]["sendsFlushed"] == 2
    assert a["stats"]["resumes"] == 1 and a["stats"]["gaps"] == 0 and a["stats"]["duplicatesDropped"] == 0
    assert a["second"] == "completed" and a["binary"] is True
    # The reconnect was resume-only (the default fallback "fail"): the gateway opened no
    # throwaway session on it, its first event was session.resumed.
    first, again = a["sockets"]
    assert "resume=1" not in first["url"] and first["first"] == "session.created"
    assert again["url"].endswith("?resume=1") and again["first"] == "session.resumed", again
    assert out["log"].count("a:session.resumed") == 1
    assert out["log"][:4] == ["a:connecting", "a:open", "a:reconnecting", "a:resuming"]
    # Taken over: A got session.replaced and ended without an error; B holds the session.
    assert out["b"]["id"] == a["before"]["id"] and out["b"]["binary"] is False
    assert out["b"]["aState"] == "ended" and out["b"]["aError"] is None
    assert "a:session.replaced" in out["log"]
    # Refused resumes.
    c = out["c"]
    assert c["lost"]["code"] == "resume_token_invalid" and c["lost"]["previous_session_id"] == c["lostId"]
    assert c["id"] != c["lostId"] and c["id"] == c["lost"]["session_id"] and c["stats"]["sessionsLost"] == 1
    # With the "new_session" fallback the reconnect is a plain socket: its own session is the fallback.
    assert [(s["url"].endswith("resume=1"), s["first"]) for s in c["sockets"]] == [(False, "session.created")] * 2
    assert out["d"] == {"state": "ended", "code": "resume_token_invalid"}


@pytest.fixture
async def replicas() -> AsyncIterator[tuple[RunningGateway, RunningGateway]]:
    """Two replicas on one Redis, the way a drain hands a session from one to the other."""
    if not REDIS_BINARY:
        pytest.skip("redis-server is not installed")
    with RedisServer() as server:
        base = Settings(engine="passthrough", redis_url=server.url, video_engine="none", drain_window_s=10.0)
        async with (
            run_gateway(replace(base, replica_id="ra")) as a,
            run_gateway(replace(base, replica_id="rb")) as b,
        ):
            yield a, b


DRAINED_BEFORE = (
    """async (other) => {
  const { RealtimeClient } = await import("/sdk/realtime.js");
"""
    + RECORDING_SOCKETS
    + """  const c = new RealtimeClient({ WebSocket: Recording });
  const states = [];
  const seqs = [];
  c.on("state", (s) => {
    states.push({ state: s.state, attempt: s.attempt, delayMs: s.delayMs, closeCode: s.closeCode });
    if (s.state === "reconnecting") c.url = other; // the load balancer sends the new socket elsewhere
  });
  c.on("event", (e) => { if (e.server_event_seq) seqs.push(e.server_event_seq); });
  await c.connect();
  c.sessionUpdate({ type: "realtime", audio: { input: { turn_detection: null } } });
  c.sendText("hello");
  c.createResponse();
  await c.waitFor("response.done");
  window.drained = { c, sockets, states, seqs, before: { id: c.sessionId, seq: c.lastSeq },
                     resumed: c.waitFor("session.resumed") };
}"""
)

DRAINED_AFTER = """async () => {
  const { c, sockets, states, seqs, before } = window.drained;
  const resumed = await window.drained.resumed;
  c.sendText("and again");
  c.createResponse();
  const done = await c.waitFor("response.done");
  c.close();
  return { sockets, states, seqs, before, resumed, status: done.response.status, id: c.sessionId,
           stats: { ...c.stats } };
}"""


async def test_sdk_resumes_a_drained_session_on_another_replica_at_once_on_a_resume_only_socket(
    replicas: tuple[RunningGateway, RunningGateway],
) -> None:
    a, b = replicas
    async with browser() as context:
        page = await context.new_page()
        page.log = PageLog(page)
        await page.goto(a.http + "/")
        await asyncio.wait_for(page.evaluate(DRAINED_BEFORE, b.url), 30)
        await asyncio.wait_for(a.runtime.drain(), 30)  # what SIGTERM runs: the idle session is handed over
        out = await asyncio.wait_for(page.evaluate(DRAINED_AFTER), 30)
    # Closed with 1012 (service restart): the first attempt did not wait for the backoff.
    reconnecting = next(s for s in out["states"] if s["state"] == "reconnecting")
    assert reconnecting == {"state": "reconnecting", "attempt": 1, "delayMs": 0, "closeCode": 1012}, out["states"]
    assert [s["state"] for s in out["states"]] == ["connecting", "open", "reconnecting", "resuming", "open", "closed"]
    # The new socket went to the other replica, resume-only: no throwaway session there.
    first, again = out["sockets"]
    assert first["url"].startswith(a.url) and again["url"] == b.url + "?resume=1"
    assert again["first"] == "session.resumed"
    # The same session, nothing lost or repeated, and it answers on the new replica.
    assert out["resumed"]["session_id"] == out["before"]["id"] == out["id"]
    assert out["seqs"] == list(range(out["seqs"][0], out["seqs"][-1] + 1)), out["seqs"]
    assert out["stats"]["gaps"] == 0 and out["stats"]["duplicatesDropped"] == 0 and out["stats"]["resumes"] == 1
    assert out["status"] == "completed"
    assert out["id"] in b.runtime.hosts and out["id"] not in a.runtime.hosts
