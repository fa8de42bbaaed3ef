// The video page: start a stream, play it (MSE or canvas), change the prompt and
// the camera midway, and show each interaction's state and the stream's health.
//
// `window.__video` exposes the client, the players and a pixel sampler for tests.

import { $, askForCredential, credentialFrom, explain, fmtBytes, statusView } from "../common.js";
import { VideoClient } from "../sdk/video.js";
import { JpegPlayer, MsePlayer } from "./player.js";

const ui = {
  startForm: $("start-form"), prompt: $("prompt"), format: $("format"), size: $("size"), start: $("start"), stop: $("stop"),
  auth: $("auth"), credential: $("credential"), status: $("status"), error: $("error"),
  video: $("video"), canvas: $("canvas"),
  changeForm: $("change-form"), newPrompt: $("new-prompt"), apply: $("apply"), transition: $("transition"), transitionValue: $("transition-value"),
  interactions: $("interactions"),
  chunks: $("h-chunks"), rate: $("h-rate"), bytes: $("h-bytes"), dropped: $("h-dropped"), gen: $("h-gen"), picture: $("h-picture"),
  ahead: $("h-ahead"), mime: $("h-mime"),
};
const { setStatus, showError, hideError } = statusView(ui.status, ui.error);
const cameraButtons = [...document.querySelectorAll("[data-cam]")];

const PAN = 0.5; // scene units per press (1 unit = half the shorter side)
const ZOOM = 0.5; // +1 doubles the magnification
const DRIFT = 0.02; // units per frame

let client = null;
let mse = null;
let jpeg = null;
let pose = [0, 0, 0];
let arrivals = []; // performance.now() of recent chunks, for chunks/s
let healthTimer = null;
const rows = new Map(); // event id -> <tr>

window.__video = {
  get client() { return client; },
  get mse() { return mse; },
  get jpeg() { return jpeg; },
  interactions: () => [...(client?.interactions.values() ?? [])].map(({ eventId, state, history, prompt }) => ({ eventId, state, history, prompt })),
  sample,
};

ui.transition.addEventListener("input", showTransition);
ui.startForm.addEventListener("submit", (e) => {
  e.preventDefault();
  start();
});
ui.stop.addEventListener("click", () => client?.stop());
$("credential-form").addEventListener("submit", (e) => {
  e.preventDefault();
  if (!ui.start.disabled) start();
});
ui.changeForm.addEventListener("submit", (e) => {
  e.preventDefault();
  const prompt = ui.newPrompt.value.trim();
  if (prompt) interact({ prompt }, `prompt “${prompt}”`);
});
for (const button of cameraButtons) button.addEventListener("click", () => camera(button.dataset.cam));
showTransition();

async function start() {
  hideError();
  const [width, height] = ui.size.value.split("x").map(Number);
  const format = ui.format.value;
  reset();
  const { apiKey, clientSecret } = credentialFrom(ui.credential);
  client = new VideoClient({ apiKey: apiKey ?? clientSecret });
  wire(client, format);
  setStatus("connecting", "Connecting…");
  ui.start.disabled = true;
  try {
    await client.connect();
    await client.start({ prompt: ui.prompt.value.trim() || "A lakeside sunrise", format, width, height });
  } catch (err) {
    ui.start.disabled = false;
    setStatus("ended", "Not streaming.");
    showError(explain(err, client.url));
    if (err.code === "unauthorized" || err.code === "refused") askForCredential(ui.auth, ui.credential);
    client.close();
    return;
  }
  setControls(true);
  ui.stop.disabled = false;
  ui.newPrompt.focus();
  healthTimer = setInterval(showHealth, 500);
}

function reset() {
  client?.close();
  mse?.close();
  jpeg?.close();
  mse = jpeg = null;
  pose = [0, 0, 0];
  arrivals = [];
  rows.clear();
  ui.interactions.replaceChildren();
  clearInterval(healthTimer);
}

function wire(vc, format) {
  ui.video.hidden = format === "jpeg";
  ui.canvas.hidden = format !== "jpeg";
  let opening = null;
  vc.on("video.start", (e) => {
    setStatus("streaming", `Streaming “${e.config.prompt}” (${e.config.width} × ${e.config.height}, ${e.config.fps} fps).`);
    if (format === "jpeg") jpeg = new JpegPlayer(ui.canvas, { fps: e.config.fps });
  });
  vc.on("chunk", async (chunk) => {
    arrivals.push(performance.now());
    if (chunk.frames) {
      jpeg?.push(chunk.frames);
    } else {
      if (!mse) {
        mse = new MsePlayer(ui.video);
        opening = mse.open(chunk.meta.mime_type).catch((err) => showError(err.message));
      }
      mse.append(chunk.data);
      await opening;
    }
    ui.mime.textContent = chunk.meta.mime_type;
    ui.gen.textContent = String(chunk.meta.generation_chunk_index);
    if (chunk.meta.dropped_chunks) {
      ui.dropped.textContent = `${vc.stats.droppedChunks} (last: generation chunks ${chunk.meta.dropped_generation_chunk_indexes.join(", ")})`;
    }
  });
  vc.on("interaction", renderInteraction);
  vc.on("error", (e) => showError(`Server: ${e.message} (${e.code})`));
  vc.on("session.done", (e) => {
    setStatus("done", `Stream finished: ${e.chunks} chunks${e.stopped ? " (stopped)" : ""}.`);
    mse?.end();
  });
  vc.on("state", (s) => {
    if (s.state !== "closed") return;
    setControls(false);
    ui.stop.disabled = true;
    ui.start.disabled = false;
    clearInterval(healthTimer);
    showHealth();
    if (s.error) {
      showError(explain(s.error, vc.url));
      setStatus("ended", "Disconnected.");
    } else if (vc.started && ui.status.dataset.state !== "done") {
      setStatus("done", "Stream closed.");
    }
  });
}

function interact(change, label) {
  if (!client || client.state !== "streaming") return;
  const transitionChunks = Number(ui.transition.value);
  try {
    const id = client.interact({ ...change, transitionChunks });
    const row = rows.get(id);
    if (row) row.cells[1].textContent = `${label}, over ${transitionChunks} chunk${transitionChunks === 1 ? "" : "s"}`;
  } catch (err) {
    showError(err.message);
  }
}

function camera(action) {
  const moves = {
    left: [-PAN, 0, 0], right: [PAN, 0, 0], up: [0, PAN, 0], down: [0, -PAN, 0], "zoom-in": [0, 0, ZOOM], "zoom-out": [0, 0, -ZOOM],
  };
  if (action === "drift") return interact({ camera: { mode: "velocity", translation: [DRIFT, 0, 0] } }, "camera drifts right");
  if (action === "still") return interact({ camera: { mode: "velocity", translation: [0, 0, 0] } }, "camera holds still");
  if (action === "reset") pose = [0, 0, 0];
  else pose = pose.map((v, i) => v + moves[action][i]);
  const label = action === "reset" ? "camera reset" : `camera ${action.replace("-", " ")} → [${pose.map((v) => v.toFixed(1)).join(", ")}]`;
  interact({ camera: { mode: "target", translation: [...pose] } }, label);
}

function renderInteraction(item) {
  let row = rows.get(item.eventId);
  if (!row) {
    row = document.createElement("tr");
    for (let i = 0; i < 4; i++) row.append(document.createElement("td"));
    row.cells[0].innerHTML = "<code></code>";
    row.cells[0].firstChild.textContent = item.eventId;
    row.cells[1].textContent = item.prompt ? `prompt “${item.prompt}”` : "change";
    row.cells[2].innerHTML = '<span class="state"></span>';
    rows.set(item.eventId, row);
    ui.interactions.prepend(row);
  }
  const badge = row.cells[2].firstChild;
  badge.textContent = item.state;
  badge.dataset.state = item.state;
  row.dataset.state = item.state;
  const steps = item.history.map((h) => (h.chunk === undefined ? h.state : `${h.state} #${h.chunk}`));
  row.cells[3].textContent = item.error ? `${item.error.code}: ${item.error.message}` : steps.join(" → ");
}

function showTransition() {
  const k = Number(ui.transition.value);
  ui.transitionValue.textContent = k === 0 ? "0 chunks (hard cut)" : `${k} chunk${k === 1 ? "" : "s"}`;
}

function showHealth() {
  if (!client) return;
  const s = client.stats;
  const now = performance.now();
  arrivals = arrivals.filter((t) => now - t < 3000);
  const span = arrivals.length > 1 ? (arrivals[arrivals.length - 1] - arrivals[0]) / 1000 : 0;
  ui.chunks.textContent = String(s.chunks);
  ui.rate.textContent = span > 0 ? ((arrivals.length - 1) / span).toFixed(1) : "–";
  const seconds = s.lastChunkAt > s.firstChunkAt ? (s.lastChunkAt - s.firstChunkAt) / 1000 : 0;
  ui.bytes.textContent = `${fmtBytes(s.bytes)}${seconds ? ` (${fmtBytes(s.bytes / seconds)}/s)` : ""}`;
  if (!s.droppedChunks) ui.dropped.textContent = "0";
  if (mse) {
    ui.picture.textContent = `${ui.video.videoWidth} × ${ui.video.videoHeight}, t = ${ui.video.currentTime.toFixed(1)} s`;
    ui.ahead.textContent = `${mse.aheadS.toFixed(2)} s${mse.jumps ? ` (${mse.jumps} jumps to the live edge)` : ""}`;
  } else if (jpeg) {
    ui.picture.textContent = `${ui.canvas.width} × ${ui.canvas.height}, ${jpeg.drawn} frames drawn`;
    ui.ahead.textContent = `${jpeg.frames.length} frames${jpeg.skipped ? ` (${jpeg.skipped} skipped)` : ""}`;
  }
}

function setControls(on) {
  ui.newPrompt.disabled = ui.apply.disabled = !on;
  for (const b of cameraButtons) b.disabled = !on;
}

/**
 * The picture now (the video drawn into a canvas, or the JPEG canvas): a 4 x 4
 * grid of mean RGB cells and a coarse colour histogram (4 levels per channel,
 * fractions of the pixels), and the caption's ink: per 32 column buckets, the
 * fraction of near-white pixels in the bottom quarter, where the CPU engine
 * writes the prompt. The caption tells two prompts apart whatever the motion.
 * @returns {{cells: number[][], histogram: number[], caption: number[], mean: number[], width: number, height: number, time: number}|null}
 */
function sample() {
  const fromVideo = ui.canvas.hidden;
  const width = fromVideo ? ui.video.videoWidth : ui.canvas.width;
  const height = fromVideo ? ui.video.videoHeight : ui.canvas.height;
  if (!width || !height) return null;
  const c = new OffscreenCanvas(width, height);
  const ctx = c.getContext("2d", { willReadFrequently: true });
  ctx.drawImage(fromVideo ? ui.video : ui.canvas, 0, 0, width, height);
  const data = ctx.getImageData(0, 0, width, height).data;
  const n = 4;
  const sums = Array.from({ length: n * n }, () => [0, 0, 0, 0]);
  const histogram = new Array(64).fill(0);
  const caption = new Array(32).fill(0);
  const captionTop = Math.floor((height * 3) / 4);
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const cell = sums[Math.floor((y * n) / height) * n + Math.floor((x * n) / width)];
      const i = (y * width + x) * 4;
      cell[0] += data[i];
      cell[1] += data[i + 1];
      cell[2] += data[i + 2];
      cell[3]++;
      histogram[(data[i] >> 6) * 16 + (data[i + 1] >> 6) * 4 + (data[i + 2] >> 6)] += 1 / (width * height);
      if (y >= captionTop && Math.min(data[i], data[i + 1], data[i + 2]) > 200) {
        caption[Math.floor((x * 32) / width)] += 32 / (width * (height - captionTop));
      }
    }
  }
  const cells = sums.map(([r, g, b, k]) => [r / k, g / k, b / k]);
  const mean = [0, 1, 2].map((ch) => cells.reduce((acc, cell) => acc + cell[ch], 0) / cells.length);
  return { cells, histogram, caption, mean, width, height, time: fromVideo ? ui.video.currentTime : jpeg?.drawn ?? 0 };
}
