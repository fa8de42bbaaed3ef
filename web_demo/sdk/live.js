// LiveClient: one GPT-Live session (OpenAI's Live API) over a browser WebSocket to the
// gateway's /v1/live/sessions.
//
// The Live model runs its own turns: the page streams the microphone and plays what comes
// back; there is no commit, no response.create for speech, no truncate. The client sends
// `session.start` as the socket opens and resolves `connect()` with `session.started`;
// audio goes out as `session.input_audio.append` (base64 JSON: Live has no binary frames)
// and comes back as `session.output_audio.delta`, emitted with `e.audio` (an Int16Array at
// 24 kHz) beside the event's fields. Every server event is emitted under its type and as
// "event"; connection changes as "state" ({state, previous}: connecting, open, ended, closed).
// It does not reconnect: a lost socket ends the client (state "ended", with `error`).
//
//   const live = new LiveClient({ session: { model: "gpt-live-1", instructions: "Answer briefly." } });
//   live.on("session.output_audio.delta", (e) => play(e.audio));
//   live.on("session.output_transcript.delta", (e) => show(e.delta));
//   await live.connect();
//   live.appendAudio(int16Samples);

import { Emitter } from "./emitter.js";
import { RealtimeError } from "./errors.js";
import { base64ToBytes, bytesToBase64, pcm16 } from "./frames.js";
import { KEY_SUBPROTOCOL_PREFIX, REALTIME_SUBPROTOCOL, defaultUrl, upgradeFailure } from "./realtime.js";

export const LIVE_PATH = "/v1/live/sessions";

/**
 * @typedef {object} LiveOptions
 * @property {string} [url] ws:// or wss:// URL of /v1/live/sessions; default: this page's origin
 * @property {object} [session] `session.start`'s session (default `{model: "gpt-live-1"}`)
 * @property {string} [apiKey] offered as the subprotocol "openai-insecure-api-key.<key>" (beside "realtime")
 * @property {string} [clientSecret] an ephemeral "ek_" secret, offered the same way (single use)
 * @property {number} [openTimeoutMs] socket open + session.started (10000)
 * @property {typeof WebSocket} [WebSocket] the WebSocket class (tests)
 */

export class LiveClient extends Emitter {
  /** @param {LiveOptions} [options] */
  constructor(options = {}) {
    super();
    this.url = options.url ?? defaultUrl(LIVE_PATH);
    this.session = { model: "gpt-live-1", ...(options.session ?? {}) };
    this._credential = options.apiKey || options.clientSecret || null;
    this._openTimeoutMs = options.openTimeoutMs ?? 10000;
    this._WebSocket = options.WebSocket ?? globalThis.WebSocket;
    /** "new" | "connecting" | "open" | "ended" | "closed" */
    this.state = "new";
    this.ws = null;
    this.transport = "websocket";
    this.sessionId = null;
    /** The highest server_event_seq received. */
    this.lastSeq = 0;
    this.stats = { eventsReceived: 0, audioBytesIn: 0, audioBytesOut: 0, resumes: 0, replayedEvents: 0, duplicatesDropped: 0 };
  }

  get connected() {
    return this.state === "open";
  }

  /** Open the socket and start the session; resolves with `session.started`. */
  connect() {
    if (this.state !== "new") return Promise.reject(new RealtimeError("connect() once per client", { code: "invalid_request" }));
    this._setState("connecting");
    // A browser fails a handshake that offered subprotocols and got none back, and the key is
    // never echoed: "realtime" is offered beside it for the gateway to echo.
    const protocols = this._credential ? [REALTIME_SUBPROTOCOL, `${KEY_SUBPROTOCOL_PREFIX}${this._credential}`] : [];
    return new Promise((resolve, reject) => {
      let settled = false;
      const fail = (err) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        this._end(err);
        reject(err);
      };
      const timer = setTimeout(() => fail(new RealtimeError("no session.started in time", { code: "connect_failed" })), this._openTimeoutMs);
      let ws;
      try {
        ws = this.ws = new this._WebSocket(this.url, protocols);
      } catch (err) {
        fail(new RealtimeError(String(err?.message ?? err), { code: "connect_failed" }));
        return;
      }
      let opened = false;
      ws.onopen = () => {
        opened = true;
        this._send({ type: "session.start", session: this.session });
      };
      ws.onmessage = (msg) => {
        if (typeof msg.data !== "string") return; // (Live sends JSON text only)
        const event = JSON.parse(msg.data);
        if (!settled && event.type === "error") {
          fail(new RealtimeError(event.error?.message ?? "session.start was refused", { code: event.error?.code ?? "error" }));
          return;
        }
        this._receive(event);
        if (!settled && event.type === "session.started") {
          settled = true;
          clearTimeout(timer);
          this.sessionId = event.session?.id ?? null;
          this._setState("open");
          resolve(event);
        }
      };
      ws.onclose = async (close) => {
        if (!settled) {
          fail(opened ? new RealtimeError(`closed before session.started (${close.code} ${close.reason})`, { code: "closed", closeCode: close.code })
            : await upgradeFailure(this.url, close));
          return;
        }
        if (this.state === "closed") return;
        const clean = close.code === 1000;
        this._end(clean ? null : new RealtimeError(`the connection was lost (${close.code} ${close.reason || ""})`.trim(), { code: "connect_failed", closeCode: close.code }));
      };
    });
  }

  /** Microphone audio (PCM16 at 24 kHz) as `session.input_audio.append`. */
  appendAudio(samples) {
    if (!this.connected) return;
    const bytes = samples instanceof Int16Array ? new Uint8Array(samples.buffer, samples.byteOffset, samples.byteLength) : samples;
    this.stats.audioBytesOut += bytes.byteLength;
    this._send({ type: "session.input_audio.append", audio: bytesToBase64(bytes) });
  }

  /** Context the model says in its own words (`session.commentary.append`). */
  commentary(content, delegationId = null) {
    this._send({ type: "session.commentary.append", content, delegation_id: delegationId });
  }

  /** The model hears silence (true) or the microphone (false). */
  mute(on) {
    this._send({ type: on ? "session.input_audio.mute" : "session.input_audio.unmute" });
  }

  /** `session.close`: the gateway answers `session.closed` and closes the socket. */
  close() {
    if (this.connected) this._send({ type: "session.close" });
    this._setState("closed");
    const ws = this.ws;
    if (ws) setTimeout(() => ws.readyState <= 1 && ws.close(1000), 2000); // if session.closed never comes
  }

  _send(event) {
    if (this.ws?.readyState === 1) this.ws.send(JSON.stringify(event));
  }

  _receive(event) {
    this.stats.eventsReceived++;
    if (event.server_event_seq) this.lastSeq = Math.max(this.lastSeq, event.server_event_seq);
    if (event.type === "session.output_audio.delta") {
      const bytes = base64ToBytes(event.delta);
      this.stats.audioBytesIn += bytes.byteLength;
      event.audio = pcm16(bytes);
    }
    if (event.type === "session.closed" && this.ws) this.ws.close(1000);
    this.emit("event", event);
    this.emit(event.type, event);
  }

  _end(error) {
    if (this.state === "ended" || this.state === "closed") return;
    this._setState("ended", error ? { error } : {});
  }

  _setState(state, extra = {}) {
    const previous = this.state;
    if (previous === state) return;
    this.state = state;
    this.emit("state", { state, previous, ...extra });
  }
}
