"""The fMP4 stream in a real browser's Media Source Extensions (headless
Chromium, when installed: ``apt-get install chromium-headless-shell``)."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
from pathlib import Path

import pytest
from video_support import run

from orchestrator.engines.video.engine import CpuVideoEngine
from orchestrator.video_engine import Interaction, VideoChunk, VideoRequest

BROWSER = shutil.which("chromium-headless-shell") or shutil.which("chromium")
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no headless Chromium installed")

PAGE = """<!doctype html><video id=v muted></video><pre id=out></pre><script>
const mime = %(mime)s, segments = %(segments)s, lines = [];
const say = (s) => { lines.push(s); document.getElementById('out').textContent = lines.join('\\n'); };
say('supported ' + MediaSource.isTypeSupported(mime));
const v = document.getElementById('v'), ms = new MediaSource();
v.src = URL.createObjectURL(ms);
ms.addEventListener('sourceopen', async () => {
  const sb = ms.addSourceBuffer(mime);
  sb.addEventListener('error', () => say('append error'));
  for (const s of segments) {
    const bytes = Uint8Array.from(atob(s), (c) => c.charCodeAt(0));
    await new Promise((ok) => { sb.addEventListener('updateend', ok, {once: true}); sb.appendBuffer(bytes); });
    const b = sb.buffered;
    say('buffered ' + b.length + ' ' + (b.length ? b.end(b.length - 1).toFixed(3) : '-'));
  }
  ms.endOfStream();
  // Reported once playback is past 1.5 s (or over), however long a busy machine takes to get there.
  let told = false;
  const tick = () => {
    if (told || !(v.currentTime > 1.5 || v.ended)) return;
    told = true;
    // The full value: toFixed(3) would print 1.5002 as "1.500", which the test cannot tell from 1.5.
    say('played ' + v.currentTime + ' ' + v.videoWidth + 'x' + v.videoHeight);
  };
  v.addEventListener('timeupdate', tick);
  v.addEventListener('ended', tick);
  await v.play();
  tick();
});
</script>"""


async def test_chromium_media_source_buffers_and_plays_every_fragment(engine: CpuVideoEngine, tmp_path: Path) -> None:
    async def on_chunk(chunk: VideoChunk) -> None:
        if chunk.generation_chunk_index == 0:
            await engine.submit_interaction("r", Interaction("x", prompt="A sea turtle", transition_chunks=1))

    request = VideoRequest("r", "A lakeside sunrise", width=128, height=96, fps=12, num_frames=24, frames_per_chunk=6)
    chunks = await run(engine, request, on_chunk)
    page = tmp_path / "mse.html"
    segments = [base64.b64encode(c.data).decode() for c in chunks]
    page.write_text(PAGE % {"mime": json.dumps(chunks[0].mime_type), "segments": json.dumps(segments)})
    assert BROWSER is not None
    process = await asyncio.create_subprocess_exec(
        BROWSER,
        "--headless",  # Debian's chromium has no display here: without it --dump-dom prints nothing
        "--no-sandbox",
        "--disable-gpu",
        "--autoplay-policy=no-user-gesture-required",
        "--virtual-time-budget=10000",
        "--dump-dom",
        page.as_uri(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    stdout, _ = await asyncio.wait_for(process.communicate(), timeout=60)
    match = re.search(r"<pre id=\"out\">(.*?)</pre>", stdout.decode(), re.S)
    assert match is not None, stdout[:500]
    lines = match.group(1).splitlines()

    assert lines[0] == "supported true"
    # Each fragment extends one contiguous buffered range by half a second.
    assert lines[1:5] == ["buffered 1 0.500", "buffered 1 1.000", "buffered 1 1.500", "buffered 1 2.000"]
    assert lines[5].startswith("played ") and lines[5].endswith(" 128x96")
    assert float(lines[5].split()[1]) > 1.5
