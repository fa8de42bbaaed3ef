// The voice page: microphone -> gateway -> answer playback, with barge-in, push to
// talk, live transcripts, per-turn latency and the connection/resume state.
//
// Transport: a WebRTC call where the page can hold one (the microphone and the answer are
// Opus tracks; the gateway cuts the answer on a barge-in and truncates it itself), else the
// WebSocket (the page captures and plays the audio, and truncates what it played).
// `?transport=websocket` or `?transport=webrtc` forces one.
//
// API: OpenAI Realtime (above), or GPT-Live (the selector, or `?dialect=live`): the Live model
// runs its own turns, so the page streams the microphone to /v1/live/sessions over the
// WebSocket and plays what comes back (no push to talk, no typed messages, no truncate: the
// gateway stops the answer when you talk over it, and the page stops playing it).
//
// For tests and curious people, `window.__voice` holds the client, the audio and
// what the page saw (transcripts, latencies, truncations, playback counters, levels).

import { $, askForCredential, credentialFrom, explain, fmtMs, statusView } from "../common.js";
import { connectRealtime } from "../sdk/connect.js";
import { LiveClient } from "../sdk/live.js";
import { AudioIO, MicrophoneError, insecureContext } from "./audio.js";

const params = new URLSearchParams(location.search);
const MODEL = params.get("model") || undefined;
const TRANSPORT = params.get("transport") || "auto"; // auto | webrtc | websocket
const LIVE_MODEL = "gpt-live-1"; // what session.start names in Live mode (?model= overrides)
const LIVE_TURN_END_MS = 300; // Live: no audio for this long ends the model's turn (its tail plays out)
const SAMPLES_PER_MS = 24; // 24 kHz

const ui = {
  start: $("start"), stop: $("stop"), ptt: $("ptt"), talk: $("talk"), dialect: $("dialect"),
  auth: $("auth"), credential: $("credential"),
  status: $("status"), sessionId: $("session-id"), seq: $("seq"), path: $("path"),
  resumes: $("resumes"), replayed: $("replayed"),
  micLevel: $("mic-level"), playLevel: $("play-level"), playStats: $("play-stats"),
  answer: $("answer"), answerLevel: $("answer-level"), bufferedLabel: $("buffered-label"), answerLabel: $("answer-label"),
  error: $("error"), log: $("log"), textForm: $("text-form"), text: $("text"), sendText: $("send-text"),
  latency: $("latency"),
};
const { setStatus, showError, hideError } = statusView(ui.status, ui.error);

/** What the page saw; read by tests. */
const seen = {
  inputDeltas: {}, // user item id -> concatenated transcription deltas
  inputTranscripts: {}, // user item id -> completed transcript
  outputTranscripts: {}, // assistant item id -> concatenated transcript deltas
  outputDone: {}, // assistant item id -> the transcript of response.output_audio_transcript.done
  responses: [], // {id, status, reason}
  latencies: [], // ms per turn: the turn's end (speech_stopped, a commit, a typed message) -> the answer heard here
  truncations: [], // {itemId, audioEndMs, receivedMs} (WebRTC: the gateway's conversation.item.truncated, why "gateway")
  playback: [], // WebRTC: output_audio_buffer.started/stopped/cleared, {type, responseId, at}
  events: [], // {type, seq} of every server event, in order (the latest 2000)
  transport: null, // "webrtc" or "websocket"
  fallback: null, // why WebRTC was given up for the WebSocket
  bargeIns: 0,
  errors: [],
  states: [],
  session: null, // the latest session.created / session.updated configuration (Live: session.started)
  dialect: null, // "realtime" or "live": the API of the session started last
};

let client = null;
let audio = null;
let talking = false;
// Turn latency, one definition on both paths: from the end of the user's turn as this page learns
// it (speech_stopped arriving, or the commit / typed message it sends) to the answer's first
// sound in this page: the first stretch of its level above the meter's threshold, measured with
// WebAudio where the page plays it (a WebRTC call's answer track; the WebSocket path's player).
let turnEndedAt = null; // performance.now() of the turn's end, until the answer is heard
let awaitingFirstAudio = false;
const items = new Map(); // item id -> {li, body, note, role, audioDone, notes}
// Live: the turns as the page groups them (Live has no items): the user's and the model's open turn ids.
const liveTurn = { user: null, model: null, count: 0, quiet: null };
const interrupted = new Set(); // assistant items whose playback was stopped: later audio is ignored
let activeAudioItem = null; // the assistant item whose audio was last queued for playback
let playingResponse = null; // WebRTC: the response whose audio the gateway is playing
let answerMeter = null; // the answer's level as this page plays it (the call's track, or the player)
let micMeter = null;

window.__voice = {
  seen, start, stop,
  get client() { return client; },
  get audio() { return audio; },
  get answerLevel() { return answerMeter?.stats ?? null; }, // the answer's audio as this page plays it
};

// --- controls --------------------------------------------------------------------------------

ui.start.addEventListener("click", () => start());
if (params.get("dialect") === "live") ui.dialect.value = "live";
ui.dialect.addEventListener("change", () => showDialect());
showDialect();
if (insecureContext()) showError(insecureContext()); // said before Start: nothing here can use the microphone
$("credential-form").addEventListener("submit", (e) => {
  e.preventDefault();
  if (!ui.start.disabled) start();
});
ui.stop.addEventListener("click", () => stop());
ui.ptt.addEventListener("change", () => applyTurnMode());
ui.talk.addEventListener("click", () => (talking ? endTalk() : beginTalk()));
ui.textForm.addEventListener("submit", (e) => {
  e.preventDefault();
  const text = ui.text.value.trim();
  if (!text || !client?.connected) return;
  bargeIn("typed");
  addEntry(`typed-${Date.now()}`, "user", text);
  client.sendText(text);
  client.createResponse();
  turnEndedAt = performance.now();
  awaitingFirstAudio = true;
  ui.text.value = "";
});

async function start() {
  hideError();
  const insecure = insecureContext();
  if (insecure) return showError(insecure);
  setBusy(true);
  try {
    audio = await AudioIO.create({ onStats: showPlayback }); // inside the click: the context may start
  } catch (err) {
    setBusy(false);
    return showError(err instanceof MicrophoneError ? err.message : `Audio could not start: ${err.message}`);
  }
  // The microphone first: a WebRTC call offers it as its track (the WebSocket path sends
  // nothing of it before the session is open).
  let stream;
  try {
    stream = await audio.openMicrophone({ echoCancellation: params.get("ec") !== "0" });
  } catch (err) {
    await teardown();
    setStatus("ended", "Not connected: the microphone is unavailable.");
    return showError(err instanceof MicrophoneError ? err.message : `The microphone failed: ${err.message}`);
  }
  for (const track of stream.getAudioTracks()) track.enabled = !ui.ptt.checked; // push to talk: silent until Talk
  if (ui.dialect.value === "live") return startLive(stream);
  setStatus("connecting", "Connecting…");
  seen.dialect = "realtime";
  let connected;
  try {
    connected = await connectRealtime({
      transport: TRANSPORT, model: MODEL, binary: true, resumeFallback: "new_session", ...credentialFrom(ui.credential),
      mediaStream: stream, audioElement: ui.answer, wire,
    });
  } catch (err) {
    await teardown();
    setStatus("ended", "Not connected.");
    showError(explain(err, client?.url ?? "the gateway"));
    if (err.code === "unauthorized" || err.code === "refused") askForCredential(ui.auth, ui.credential);
    return;
  }
  seen.transport = client.transport;
  seen.fallback = connected.fallback ? { code: connected.fallback.code, message: connected.fallback.message } : null;
  showTransport();
  applyTurnMode(); // transcription on, server VAD or push to talk, before any speech
  if (client.transport === "webrtc") {
    micMeter = audio.meter(stream, (s) => (ui.micLevel.value = Math.min(1, s.level * 4)));
  } else {
    for (const track of stream.getAudioTracks()) track.enabled = true; // the capture worklet holds push to talk
    await audio.startMicrophone(onMicrophone);
    answerMeter = audio.meter(audio.player, onAnswerLevel); // what the player plays
  }
  ui.stop.disabled = false;
  ui.talk.disabled = !ui.ptt.checked; // the microphone is open now
  ui.text.disabled = ui.sendText.disabled = false;
  ui.stop.focus();
}

/** GPT-Live: the session over the WebSocket, the microphone streamed, the answer played here. */
async function startLive(stream) {
  setStatus("connecting", "Connecting (GPT-Live)…");
  seen.dialect = "live";
  const live = new LiveClient({ session: { model: MODEL ?? LIVE_MODEL }, ...credentialFrom(ui.credential) });
  wireLive(live);
  try {
    await live.connect();
  } catch (err) {
    await teardown();
    setStatus("ended", "Not connected.");
    showError(explain(err, live.url));
    if (err.code === "unauthorized" || err.code === "refused") askForCredential(ui.auth, ui.credential);
    return;
  }
  seen.transport = "websocket";
  showTransport();
  for (const track of stream.getAudioTracks()) track.enabled = true;
  await audio.startMicrophone(onMicrophone);
  answerMeter = audio.meter(audio.player, onAnswerLevel);
  ui.stop.disabled = false;
  ui.stop.focus();
}

async function stop() {
  client?.close();
  await teardown();
  setStatus("closed", "Stopped. Press Start to talk again.");
  ui.start.focus();
}

async function teardown() {
  const a = audio;
  audio = null;
  talking = false;
  answerMeter = micMeter = null; // (stopped with the audio)
  playingResponse = null;
  ui.answer.srcObject = null;
  if (a) await a.close();
  setBusy(false);
  ui.stop.disabled = true;
  ui.talk.disabled = true;
  ui.text.disabled = ui.sendText.disabled = true;
  ui.micLevel.value = 0;
}

function setBusy(busy) {
  ui.start.disabled = busy;
  ui.dialect.disabled = busy;
  showDialect();
}

/** Live mode has no push to talk and no typed messages (the model takes its own turns). */
function showDialect() {
  const live = ui.dialect.value === "live";
  ui.ptt.disabled = live;
  if (live) ui.ptt.checked = false;
  ui.textForm.hidden = live;
}

/** Server VAD (hands-free) or push to talk; sent whenever the switch changes. */
function applyTurnMode() {
  const ptt = ui.ptt.checked;
  if (!ptt && talking) {
    talking = false; // hands-free again: the half-spoken turn is left to server VAD
    setTalkLabel();
  }
  ui.talk.hidden = !ptt;
  ui.talk.disabled = !ptt || !client?.connected || !audio?.capture;
  if (!client || (client.state !== "open" && client.state !== "reconnecting" && client.state !== "resuming")) return;
  client.sessionUpdate({
    type: "realtime",
    audio: { input: { transcription: { model: "whisper-1" }, turn_detection: ptt ? null : { type: "server_vad" } } },
  });
  setSending(!ptt || talking);
  if (ptt && !talking) setTalkLabel();
}

/** The microphone goes to the gateway (true) or not (false: push to talk released). */
function setSending(on) {
  audio?.setSending(on); // the WebSocket path's capture
  if (client?.transport === "webrtc") client.setMicrophoneEnabled(on); // the call's track: silence when off
}

function beginTalk() {
  if (!client?.connected) return;
  talking = true;
  bargeIn("push_to_talk");
  client.clearInput();
  setSending(true);
  setTalkLabel();
}

function endTalk() {
  talking = false;
  setSending(false);
  setTalkLabel();
  if (!client?.connected) return;
  client.commit();
  client.createResponse();
  turnEndedAt = performance.now();
  awaitingFirstAudio = true;
}

function setTalkLabel() {
  ui.talk.setAttribute("aria-pressed", String(talking));
  ui.talk.textContent = talking ? "Done talking: send" : "Talk";
}

function onMicrophone(pcm, level) {
  ui.micLevel.value = Math.min(1, level * 4);
  // While reconnecting the SDK drops (and counts) the audio: too old to matter once back.
  if (client && (client.connected || client.state === "reconnecting" || client.state === "resuming")) client.appendAudio(pcm);
}

// --- server events ---------------------------------------------------------------------------

/** GPT-Live's events: its transcripts and audio, grouped into turns for the log. */
function wireLive(rt) {
  client = rt;
  rt.on("state", (change) => rt === client && onState(change));
  rt.on("event", (e) => {
    seen.events.push({ type: e.type, seq: e.server_event_seq ?? null, at: performance.now() });
    if (seen.events.length > 2000) seen.events.shift();
    showCounters();
  });
  rt.on("session.started", (e) => {
    seen.session = e.session;
    ui.sessionId.textContent = e.session.id;
    ui.path.textContent = "GPT-Live, base64 JSON";
  });
  rt.on("session.input_transcript.delta", (e) => {
    const id = liveTurn.user ?? openLiveTurn("user");
    seen.inputDeltas[id] = (seen.inputDeltas[id] ?? "") + e.delta;
    seen.inputTranscripts[id] = seen.inputDeltas[id].trim(); // (Live has no completed transcript: the turn's text)
    setText(id, "user", seen.inputDeltas[id], { pending: true });
    // Your turn ends, as this page learns it, with its latest transcript: the answer follows it.
    turnEndedAt = performance.now();
    awaitingFirstAudio = true;
  });
  rt.on("session.output_transcript.delta", (e) => {
    const id = liveTurn.model ?? openLiveTurn("model");
    seen.outputTranscripts[id] = (seen.outputTranscripts[id] ?? "") + e.delta;
    setText(id, "assistant", seen.outputTranscripts[id]);
  });
  rt.on("session.output_audio.delta", (e) => {
    const id = liveTurn.model ?? openLiveTurn("model");
    if (!audio || !e.audio) return;
    activeAudioItem = id;
    audio.play(id, e.audio);
    clearTimeout(liveTurn.quiet);
    liveTurn.quiet = setTimeout(() => endLiveAnswer(id), LIVE_TURN_END_MS);
  });
  rt.on("session.closed", (e) => setStatus("closed", `The session closed (${e.reason}).`));
  rt.on("error", (e) => {
    seen.errors.push(e.error);
    showError(`Server: ${e.error?.message ?? "error"} (${e.error?.code ?? "?"})`);
  });
}

/** A new turn in the log; the other speaker's open turn ends (its text is final). */
function openLiveTurn(who) {
  const id = `live-${who}-${++liveTurn.count}`;
  if (who === "user") {
    if (liveTurn.model) {
      stopLiveAnswer(liveTurn.model); // you talk over the answer: the gateway stops it, this page stops playing it
      endLiveAnswer(liveTurn.model);
    }
    liveTurn.user = id;
    addEntry(id, "user", "", { pending: true });
  } else {
    if (liveTurn.user) setText(liveTurn.user, "user", seen.inputDeltas[liveTurn.user] ?? "");
    liveTurn.user = null;
    liveTurn.model = id;
    addEntry(id, "assistant", "", { pending: true });
  }
  return id;
}

/** The model's turn is over (no audio for a while, or you spoke): its tail plays out. */
function endLiveAnswer(id) {
  clearTimeout(liveTurn.quiet);
  audio?.end(id);
  const entry = items.get(id);
  if (entry) entry.audioDone = true;
  if (liveTurn.model === id) {
    liveTurn.model = null;
    setText(id, "assistant", seen.outputTranscripts[id] ?? "");
  }
}

async function stopLiveAnswer(id) {
  if (!audio || interrupted.has(id) || (audio.stats.bufferedMs <= 0 && items.get(id)?.audioDone)) return;
  interrupted.add(id);
  seen.bargeIns++;
  const { positions } = await audio.stopPlayback();
  const played = (positions[id]?.playedSamples ?? 0) / SAMPLES_PER_MS;
  seen.truncations.push({ itemId: id, audioEndMs: Math.floor(played), receivedMs: (positions[id]?.receivedSamples ?? 0) / SAMPLES_PER_MS, why: "live_speech" });
  markEntry(id, "barge-in", `you interrupted after ${fmtMs(played)}`);
}

function wire(rt) {
  client = rt; // (a fallback to the WebSocket wires a second client)
  rt.on("state", (change) => rt === client && onState(change));
  rt.on("event", (e) => {
    seen.events.push({ type: e.type, seq: e.server_event_seq ?? null, at: performance.now() });
    if (seen.events.length > 2000) seen.events.shift();
    showCounters();
  });
  rt.on("session.updated", (e) => {
    seen.session = e.session;
  });
  rt.on("session.created", (e) => {
    seen.session = e.session;
    ui.sessionId.textContent = e.session.id;
    ui.path.textContent = rt.transport === "webrtc" ? "WebRTC (Opus tracks, oai-events)"
      : rt.binary ? "binary frames (omni-binary.v1)" : "base64 JSON";
  });
  rt.on("session.resumed", (e) => {
    const n = Math.max(0, e.replay_to - e.replay_from + 1);
    setStatus("open", `Connected again: session resumed, ${n} missed event${n === 1 ? "" : "s"} replayed.`);
    showCounters();
  });
  rt.on("session.resync_required", () => setStatus("open", "Connected again: the gap could not be replayed; the state was rebuilt."));
  rt.on("client.session_lost", (e) => showError(`The session could not be resumed (${e.code}); this is a new one.`));
  rt.on("input_audio_buffer.speech_started", (e) => {
    bargeIn("speech_started");
    addEntry(e.item_id, "user", "", { pending: true });
  });
  rt.on("input_audio_buffer.speech_stopped", () => {
    turnEndedAt = performance.now();
    awaitingFirstAudio = true;
  });
  rt.on("conversation.item.input_audio_transcription.delta", (e) => {
    seen.inputDeltas[e.item_id] = (seen.inputDeltas[e.item_id] ?? "") + e.delta;
    setText(e.item_id, "user", seen.inputDeltas[e.item_id], { pending: true });
  });
  rt.on("conversation.item.input_audio_transcription.completed", (e) => {
    seen.inputTranscripts[e.item_id] = e.transcript;
    setText(e.item_id, "user", e.transcript || "(nothing heard)");
  });
  rt.on("conversation.item.input_audio_transcription.failed", (e) => {
    setText(e.item_id, "user", `(transcription failed: ${e.error?.message ?? "unknown"})`);
  });
  rt.on("response.output_item.added", (e) => addEntry(e.item.id, "assistant", "", { pending: true }));
  for (const type of ["response.output_audio_transcript.delta", "response.output_text.delta"]) {
    rt.on(type, (e) => {
      seen.outputTranscripts[e.item_id] = (seen.outputTranscripts[e.item_id] ?? "") + e.delta;
      setText(e.item_id, "assistant", seen.outputTranscripts[e.item_id]);
    });
  }
  for (const type of ["response.output_audio_transcript.done", "response.output_text.done"]) {
    rt.on(type, (e) => {
      seen.outputDone[e.item_id] = e.transcript ?? e.text;
    });
  }
  rt.on("response.output_audio.delta", (e) => {
    if (!audio || interrupted.has(e.item_id) || !e.audio) return;
    activeAudioItem = e.item_id;
    audio.play(e.item_id, e.audio);
  });
  rt.on("response.output_audio.done", (e) => {
    audio?.end(e.item_id);
    const entry = items.get(e.item_id);
    if (entry) entry.audioDone = true;
  });
  rt.on("response.done", (e) => {
    const r = e.response;
    seen.responses.push({ id: r.id, status: r.status, reason: r.status_details?.reason ?? null });
    if (r.status !== "completed") {
      const why = r.status_details?.reason ? ` (${r.status_details.reason.replaceAll("_", " ")})` : "";
      for (const item of r.output ?? []) markEntry(item.id, "status", `${r.status}${why}`);
    }
  });
  rt.on("conversation.item.truncated", (e) => {
    markEntry(e.item_id, "truncated", `trimmed to what you heard (${fmtMs(e.audio_end_ms)})`);
    if (rt.transport === "webrtc") {
      // The gateway played the audio: it cut the track and says how much had gone out.
      seen.truncations.push({ itemId: e.item_id, audioEndMs: e.audio_end_ms, why: "gateway" });
      markEntry(e.item_id, "barge-in", `you interrupted after ${fmtMs(e.audio_end_ms)}`);
    }
  });
  // WebRTC: the gateway plays the answer on the track and says when it starts, ends or is cut.
  rt.on("track", ({ stream }) => {
    answerMeter?.stop();
    answerMeter = audio?.meter(stream, onAnswerLevel) ?? null;
  });
  rt.on("output_audio_buffer.started", (e) => {
    seen.playback.push({ type: "started", responseId: e.response_id, at: performance.now() });
    playingResponse = e.response_id;
  });
  for (const type of ["output_audio_buffer.stopped", "output_audio_buffer.cleared"]) {
    rt.on(type, (e) => {
      seen.playback.push({ type: type.split(".")[1], responseId: e.response_id, at: performance.now() });
      if (playingResponse === e.response_id) playingResponse = null;
      if (type.endsWith("cleared")) seen.bargeIns++;
    });
  }
  rt.on("error", (e) => {
    seen.errors.push(e.error);
    showError(`Server: ${e.error?.message ?? "error"} (${e.error?.code ?? "?"})`);
  });
}

function onState(change) {
  seen.states.push(change.state);
  showCounters();
  switch (change.state) {
    case "open":
      if (change.previous === "connecting") setStatus("open", "Connected. Speak: the answer plays here.");
      ui.talk.disabled = !ui.ptt.checked || !audio?.capture;
      break;
    case "reconnecting":
      setStatus("reconnecting", `Connection lost (${change.closeCode ?? "network"}). Reconnecting, attempt ${change.attempt} in ${change.delayMs} ms…`);
      ui.talk.disabled = true;
      break;
    case "resuming":
      setStatus("resuming", "Reconnected. Resuming the session…");
      break;
    case "ended":
      if (change.previous === "connecting") break; // a first connection that failed: start() says why
      setStatus("ended", change.error ? "Disconnected." : "The session ended.");
      if (change.error) {
        showError(explain(change.error, client?.url ?? "the gateway"));
        if (["unauthorized", "refused", "no_credentials"].includes(change.error.code)) askForCredential(ui.auth, ui.credential);
      }
      teardown();
      break;
    default:
      break;
  }
}

/**
 * Barge-in: the user talks over the answer. Stop playback at once and tell the
 * server how much of the answer was heard (conversation.item.truncate).
 */
async function bargeIn(why) {
  if (!audio || !client) return;
  if (client.transport === "webrtc") {
    // The gateway plays the answer: on speech (server VAD) it cuts it itself; for a typed
    // message or push to talk, ask it to (it truncates the item to what went out).
    if (why !== "speech_started" && playingResponse && client.connected) client.clearAudio();
    return;
  }
  const item = activeAudioItem;
  const stats = audio.stats;
  const unplayed = item && (stats.bufferedMs > 0 || !items.get(item)?.audioDone);
  if (!item || interrupted.has(item) || !unplayed) return;
  interrupted.add(item);
  seen.bargeIns++;
  const { positions } = await audio.stopPlayback();
  const position = positions[item];
  const playedMs = position ? position.playedSamples / SAMPLES_PER_MS : 0;
  const receivedMs = position ? position.receivedSamples / SAMPLES_PER_MS : 0;
  seen.truncations.push({ itemId: item, audioEndMs: Math.floor(playedMs), receivedMs, why });
  if (client.connected || client.state === "reconnecting" || client.state === "resuming") {
    client.truncate(item, 0, Math.floor(playedMs));
  }
  markEntry(item, "barge-in", `you interrupted after ${fmtMs(playedMs)}`);
}

// --- rendering -------------------------------------------------------------------------------

function addEntry(itemId, role, text, { pending = false } = {}) {
  if (items.has(itemId)) return items.get(itemId);
  const li = document.createElement("li");
  li.className = `entry ${role}`;
  li.dataset.itemId = itemId;
  const who = document.createElement("span");
  who.className = "who";
  who.textContent = role === "user" ? "You" : "Model";
  const body = document.createElement("span");
  body.className = "text";
  const note = document.createElement("span");
  note.className = "note";
  li.append(who, body, note);
  ui.log.append(li);
  const entry = { li, body, note, role, audioDone: false, notes: new Map() };
  items.set(itemId, entry);
  setText(itemId, role, text, { pending });
  return entry;
}

function setText(itemId, role, text, { pending = false } = {}) {
  const entry = items.get(itemId) ?? addEntry(itemId, role, "");
  entry.body.textContent = text || (pending ? "…" : "");
  entry.li.classList.toggle("pending", pending);
  entry.li.scrollIntoView({ block: "nearest" });
}

/** Add or replace one kind of note under an entry ("barge-in", "truncated", "status"). */
function markEntry(itemId, kind, text) {
  const entry = items.get(itemId);
  if (!entry) return;
  entry.notes.set(kind, text);
  entry.note.textContent = [...entry.notes.values()].join(" · ");
}

function addLatency(ms) {
  seen.latencies.push(ms);
  const li = document.createElement("li");
  li.textContent = `Turn ${seen.latencies.length}: ${fmtMs(ms)}`;
  ui.latency.prepend(li);
}

function showPlayback(stats) {
  ui.playLevel.value = Math.min(2000, stats.bufferedMs);
  ui.playStats.textContent = `${fmtMs(stats.playedSamples / SAMPLES_PER_MS)} played · ${stats.underruns} underruns · ${fmtMs(stats.droppedSamples / SAMPLES_PER_MS)} skipped`;
}

/** The answer's level as this page plays it: the meter, and the turn's latency at its first sound. */
function onAnswerLevel(stats) {
  ui.answerLevel.value = Math.min(1, stats.level * 4);
  const burst = stats.bursts[stats.bursts.length - 1];
  if (awaitingFirstAudio && turnEndedAt !== null && burst && burst[0] >= turnEndedAt) {
    awaitingFirstAudio = false; // a stretch of sound that began after the turn ended: the answer
    addLatency(burst[0] - turnEndedAt);
  }
}

function showTransport() {
  const rtc = client?.transport === "webrtc";
  ui.playLevel.hidden = ui.bufferedLabel.hidden = ui.playStats.hidden = rtc;
  ui.answerLevel.hidden = ui.answerLabel.hidden = !rtc;
  if (seen.fallback) setStatus("open", `Connected over the WebSocket (WebRTC: ${seen.fallback.message}).`);
}

function showCounters() {
  if (!client) return;
  const s = client.stats;
  ui.resumes.textContent = String(s.resumes);
  ui.replayed.textContent = `${s.replayedEvents} / ${s.duplicatesDropped}`;
  ui.seq.textContent = String(client.lastSeq || "–");
}
