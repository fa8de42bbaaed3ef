// VideoClient: vLLM-Omni's streaming video protocol on the gateway's /v1/realtime/video.
//
// One socket streams one video. `start()` sends `session.start` (format "m4s":
// fragmented MP4, or "jpeg"); the server answers `video.start`, then per chunk a
// `video.chunk_metadata` event followed by exactly one binary frame, which this
// client pairs and emits as a "chunk" (a completed fMP4 stream's closing "trailer" chunk is
// emitted as "trailer"). `interact()` changes the prompt and/or the
// camera midway (blended over `transition_chunks`); each interaction's state
// (sent, queued, started, active, completed, superseded, failed) is tracked
// from the server's events and the chunk metadata, and emitted as "interaction".
//
//   const video = new VideoClient();
//   video.on("chunk", ({ meta, data }) => player.append(meta, data));
//   video.on("interaction", (i) => console.log(i.eventId, i.state));
//   await video.connect();
//   await video.start({ prompt: "A lakeside sunrise", format: "m4s" });
//   video.interact({ prompt: "A sea turtle", transitionChunks: 3 });

import { Emitter } from "./emitter.js";
import { KEY_SUBPROTOCOL_PREFIX, RealtimeError, defaultUrl } from "./realtime.js";

export const VIDEO_SUBPROTOCOL = "realtime";

/**
 * @typedef {object} ChunkMetadata the server's video.chunk_metadata event
 * @property {"video.chunk_metadata"} type
 * @property {string} kind
 * @property {number} num_frames
 * @property {number} byte_length
 * @property {number} generation_chunk_index
 * @property {number} transport_chunk_index
 * @property {string[]} started_event_ids
 * @property {string[]} active_event_ids
 * @property {string[]} completed_event_ids
 * @property {string[]} superseded_event_ids
 * @property {number} dropped_chunks chunks dropped (slow client) since the previous delivered chunk
 * @property {number[]} dropped_generation_chunk_indexes
 * @property {string} mime_type e.g. 'video/mp4; codecs="avc1.42C00C"' or "image/jpeg"
 * @property {number[]} [frame_byte_lengths] JPEG: the length of each frame in the binary frame
 */

/**
 * @typedef {object} Chunk
 * @property {ChunkMetadata} meta
 * @property {ArrayBuffer} data the binary frame (fMP4: init segment + fragment on the first chunk)
 * @property {Uint8Array[]} [frames] JPEG: one view per frame, split by frame_byte_lengths
 */

/**
 * @typedef {object} InteractionState
 * @property {string} eventId
 * @property {string} [prompt]
 * @property {object} [camera]
 * @property {number} [transitionChunks]
 * @property {"sent"|"queued"|"started"|"active"|"completed"|"superseded"|"failed"} state
 * @property {{state: string, chunk?: number, at: number}[]} history
 * @property {{code: string, message: string}} [error]
 */

/**
 * @typedef {object} CameraMove
 * @property {"target"|"velocity"} [mode] "target": the pose to reach; "velocity": the change per frame
 * @property {number[]} [translation] [x, y, z]: +x right, +y up, +z forward (zoom); 1 unit = half the shorter side
 * @property {number[]} [rotation] [yaw, pitch, roll] degrees, or a unit quaternion [x, y, z, w]
 */

/** A streaming video session. */
export class VideoClient extends Emitter {
  /**
   * @param {object} [options]
   * @param {string} [options.url] ws(s) URL of /v1/realtime/video; default: this page's origin
   * @param {string} [options.apiKey] an API key or client secret, sent as "openai-insecure-api-key.<value>"
   * @param {typeof WebSocket} [options.WebSocket]
   */
  constructor({ url, apiKey, WebSocket: WS } = {}) {
    super();
    this.url = url ?? defaultUrl("/v1/realtime/video");
    this._credential = apiKey || null;
    this._WebSocket = WS ?? globalThis.WebSocket;
    /** @type {"new"|"connecting"|"open"|"streaming"|"done"|"closed"} */
    this.state = "new";
    this.ws = null;
    this.sessionId = null;
    this.requestId = null;
    /** @type {object|null} the video.start event */
    this.started = null;
    /** @type {Map<string, InteractionState>} */
    this.interactions = new Map();
    this.stats = { chunks: 0, bytes: 0, droppedChunks: 0, unpairedFrames: 0, errors: 0, firstChunkAt: 0, lastChunkAt: 0 };
    this._pendingMeta = null;
    this._counter = 0;
  }

  /**
   * Open the socket.
   * @returns {Promise<void>}
   */
  connect() {
    if (this.state !== "new") return Promise.reject(new RealtimeError("connect() may be called once", { code: "already_connected" }));
    this._setState("connecting");
    return new Promise((resolve, reject) => {
      const protocols = [VIDEO_SUBPROTOCOL];
      if (this._credential) protocols.push(KEY_SUBPROTOCOL_PREFIX + this._credential);
      let ws;
      try {
        ws = new this._WebSocket(this.url, protocols);
      } catch (err) {
        reject(new RealtimeError(`cannot open ${this.url}: ${err.message}`, { code: "invalid_request" }));
        return;
      }
      ws.binaryType = "arraybuffer";
      this.ws = ws;
      let opened = false;
      let lastError = null;
      ws.onopen = () => {
        opened = true;
        this._setState("open");
        resolve();
      };
      ws.onmessage = (msg) => {
        const event = this._onMessage(msg.data);
        if (event?.type === "error") lastError = event;
      };
      ws.onerror = () => {};
      ws.onclose = (close) => {
        this.ws = null;
        const error = lastError && close.code !== 1000
          ? new RealtimeError(lastError.message, { code: lastError.code, closeCode: close.code })
          : close.code === 1000 ? null : new RealtimeError(`the video socket closed (${close.code} ${close.reason || ""})`.trim(), {
            code: close.code === 4001 ? "unauthorized" : close.code === 1006 ? "connect_failed" : "closed", closeCode: close.code,
          });
        if (!opened) reject(error ?? new RealtimeError("the video socket closed", { code: "closed" }));
        this._setState("closed", { closeCode: close.code, reason: close.reason, error: error ?? undefined });
      };
    });
  }

  /**
   * Start the stream (`session.start`); resolves with `video.start`.
   * @param {object} params
   * @param {string} params.prompt
   * @param {"m4s"|"jpeg"} [params.format] default "m4s" (fragmented MP4)
   * @param {number} [params.width] @param {number} [params.height] @param {number} [params.fps]
   * @param {number} [params.num_frames] total frames; omitted: until stop()
   * @param {number} [params.seed] @param {string} [params.negative_prompt]
   * @returns {Promise<object>}
   */
  start(params) {
    const ready = new Promise((resolve, reject) => {
      const offStart = this.on("video.start", (e) => {
        offStart();
        offError();
        resolve(e);
      });
      const offError = this.on("error", (e) => {
        if (this.state === "streaming") return;
        offStart();
        offError();
        reject(new RealtimeError(e.message, { code: e.code }));
      });
    });
    this._send({ type: "session.start", format: "m4s", ...params });
    return ready;
  }

  /**
   * Change the prompt and/or the camera midway; applied at the next chunk boundary.
   * @param {object} change
   * @param {string} [change.prompt]
   * @param {CameraMove} [change.camera]
   * @param {number} [change.transitionChunks] blend over this many chunks (0: hard cut; omitted: the server's default)
   * @param {string} [change.eventId] default: generated
   * @returns {string} the interaction's event_id
   */
  interact({ prompt, camera, transitionChunks, eventId } = {}) {
    const id = eventId ?? `evt_${Date.now().toString(36)}_${(++this._counter).toString(36)}`;
    const event = {};
    if (prompt !== undefined) event.prompt = prompt;
    if (camera) {
      event.multi_modal_data = {
        camera: { mode: camera.mode ?? "target", data: { translation: camera.translation ?? [0, 0, 0], rotation: camera.rotation ?? [0, 0, 0] } },
      };
    }
    const interaction = { event_id: id, event };
    if (transitionChunks !== undefined && transitionChunks !== null) interaction.transition_chunks = transitionChunks;
    this.interactions.set(id, { eventId: id, prompt, camera, transitionChunks, state: "sent", history: [{ state: "sent", at: performance.now() }] });
    this.emit("interaction", this.interactions.get(id));
    this._send({ type: "session.interaction", interaction });
    return id;
  }

  /** `session.ping` (answered by `session.pong`). */
  ping() { this._send({ type: "session.ping" }); }

  /** `session.stop`: the server ends the stream with `session.done` and closes. */
  stop() {
    if (this.ws && this.ws.readyState === 1) this._send({ type: "session.stop" });
  }

  /** Close the socket now. */
  close() {
    const ws = this.ws;
    this.ws = null;
    if (ws) {
      try {
        ws.close(1000, "client closed");
      } catch {
        // already closed
      }
    }
    if (this.state !== "closed") this._setState("closed", { closeCode: 1000 });
  }

  _send(event) {
    const ws = this.ws;
    if (!ws || ws.readyState !== 1) throw new RealtimeError("the video socket is not open", { code: "not_connected" });
    ws.send(JSON.stringify(event));
  }

  _onMessage(data) {
    if (data instanceof ArrayBuffer) {
      const meta = this._pendingMeta;
      this._pendingMeta = null;
      if (!meta) {
        this.stats.unpairedFrames++;
        return null;
      }
      this._onChunk(meta, data);
      return null;
    }
    let event;
    try {
      event = JSON.parse(data);
    } catch {
      return null;
    }
    switch (event.type) {
      case "video.start":
        this.started = event;
        this.sessionId = event.session_id;
        this.requestId = event.request_id;
        this._setState("streaming");
        break;
      case "video.chunk_metadata":
        if (this._pendingMeta) this.stats.unpairedFrames++; // metadata without its frame
        this._pendingMeta = event;
        break;
      case "session.interaction.queued":
        this._advance(event.event_id, "queued");
        break;
      case "session.done":
        this._setState("done");
        break;
      case "error":
        this.stats.errors++;
        if (event.event_id && this.interactions.has(event.event_id)) {
          const item = this.interactions.get(event.event_id);
          item.error = { code: event.code, message: event.message };
          this._advance(event.event_id, "failed");
        }
        break;
      default:
        break;
    }
    this.emit(event.type, event);
    this.emit("event", event);
    return event;
  }

  _onChunk(meta, data) {
    if (meta.kind === "trailer") {
      // The closing bytes of a completed fMP4 stream (its mfra index): for a saved file,
      // not for a Media Source buffer, so not a "chunk".
      this.emit("trailer", { meta, data });
      return;
    }
    const now = performance.now();
    const s = this.stats;
    s.chunks++;
    s.bytes += data.byteLength;
    s.droppedChunks += meta.dropped_chunks || 0;
    if (!s.firstChunkAt) s.firstChunkAt = now;
    s.lastChunkAt = now;
    const index = meta.generation_chunk_index;
    const started = new Set(meta.started_event_ids || []);
    for (const id of started) this._advance(id, "started", index);
    for (const id of meta.active_event_ids || []) if (!started.has(id)) this._advance(id, "active", index);
    const superseded = new Set(meta.superseded_event_ids || []);
    for (const id of meta.completed_event_ids || []) this._advance(id, superseded.has(id) ? "superseded" : "completed", index);
    /** @type {Chunk} */
    const chunk = { meta, data };
    if (Array.isArray(meta.frame_byte_lengths)) {
      chunk.frames = [];
      let offset = 0;
      for (const length of meta.frame_byte_lengths) {
        chunk.frames.push(new Uint8Array(data, offset, length));
        offset += length;
      }
    }
    this.emit("chunk", chunk);
  }

  _advance(eventId, state, chunk) {
    let item = this.interactions.get(eventId);
    if (!item) {
      // An interaction from elsewhere (POST .../interactions, another tab): track it too.
      item = { eventId, state: "sent", history: [] };
      this.interactions.set(eventId, item);
    }
    if (item.state === state && state === "active") return; // one "active" entry per interaction
    item.state = state;
    item.history.push({ state, chunk, at: performance.now() });
    this.emit("interaction", item);
  }

  _setState(state, details = {}) {
    const previous = this.state;
    this.state = state;
    this.emit("state", { state, previous, ...details });
  }
}

/**
 * POST an interaction to a running video session from anywhere (any replica).
 * @param {object} args
 * @param {string} args.sessionId from video.start
 * @param {object} args.interaction `{event_id?, event: {prompt?, multi_modal_data?}, transition_chunks?}`
 * @param {string} [args.apiKey] sent as Authorization: Bearer (needed when the gateway requires auth)
 * @param {string} [args.baseUrl] http(s) origin of the gateway; default: this page's
 * @returns {Promise<object>} the JSON answer (202: queued)
 */
export async function postInteraction({ sessionId, interaction, apiKey, baseUrl }) {
  const origin = baseUrl ?? globalThis.location.origin;
  const headers = { "content-type": "application/json" };
  if (apiKey) headers.authorization = `Bearer ${apiKey}`;
  const res = await fetch(`${origin}/v1/realtime/video/${encodeURIComponent(sessionId)}/interactions`, {
    method: "POST", headers, body: JSON.stringify({ interaction }),
  });
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw new RealtimeError(body?.error?.message ?? `HTTP ${res.status}`, { code: body?.error?.code ?? `http_${res.status}` });
  return body;
}
