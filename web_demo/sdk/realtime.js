// RealtimeClient: one realtime session over a browser WebSocket that survives drops.
//
// The browser twin of the Python SDK (omni_gateway_client/realtime.py): it connects to the
// gateway's /v1/realtime (OpenAI Realtime API, GA), sends typed client events,
// takes audio on the binary fast path ("omni-binary.v1"), and when the socket is
// lost it reconnects with backoff and resumes the session: `session.resume` with
// the latest (rotated) resume token and the last `server_event_seq` received. With
// resumeFallback "fail" (the default) the new socket is resume-only (`?resume=1`: the
// gateway opens no throwaway session first, and the resume goes out as it opens); with
// "new_session", or on a server that opens a session anyway, the provisional
// `session.created` of the new socket is ignored (or kept, for the fallback); the replay is
// de-duplicated by `server_event_seq`; what was received is acknowledged with
// `session.event_ack`. Connection and resume state are emitted as "state" events.
//
//   const rt = new RealtimeClient({ model: "omni-cascade" });
//   rt.on("response.output_audio.delta", (e) => play(e.audio));  // Int16Array, both paths
//   rt.on("state", (s) => console.log(s.state));
//   await rt.connect();
//   rt.sessionUpdate({ type: "realtime", audio: { input: { transcription: { model: "whisper-1" } } } });
//   rt.appendAudio(int16Samples);

import { ClientEvents } from "./client-events.js";
import { RealtimeError } from "./errors.js";
import { BINARY_SUBPROTOCOL, FrameError, base64ToBytes, bytesToBase64, decodeAudioFrame, encodeInputFrame, pcm16 } from "./frames.js";

export const REALTIME_SUBPROTOCOL = "realtime";
export const BETA_SUBPROTOCOL = "openai-beta.realtime-v1";
export const KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key.";
export { RealtimeError };

const AUDIO_DELTAS = new Set(["response.output_audio.delta", "response.audio.delta"]);
const RESUME_REFUSALS = new Set(["session_not_found", "resume_token_invalid", "resume_forbidden", "resume_seq_invalid"]);
const PROTOCOL_FAULTS = new Set([1002, 1003, 1007, 1008, 1009, 1010]); // a reconnect would fail the same way
const MAX_TRACKED_ITEMS = 256;

/**
 * @typedef {object} ReconnectPolicy
 * Attempt n (from 0) waits min(maxDelayMs, initialDelayMs * multiplier ** n), scaled by a
 * random factor in [1 - jitter, 1]. The client gives up (state "ended", code
 * "reconnect_failed") after maxAttempts failed attempts in a row or maxElapsedMs
 * since the loss (null: no limit). A successful resume resets both. After a close
 * with 1012 (service restart: a drain handed the session over) the first attempt does not wait.
 * @property {number} [initialDelayMs] 100
 * @property {number} [maxDelayMs] 5000
 * @property {number} [multiplier] 2
 * @property {number} [jitter] 0.5
 * @property {number|null} [maxAttempts] 10
 * @property {number|null} [maxElapsedMs] 60000
 */
export const DEFAULT_RECONNECT = Object.freeze({
  initialDelayMs: 100, maxDelayMs: 5000, multiplier: 2, jitter: 0.5, maxAttempts: 10, maxElapsedMs: 60000,
});

/**
 * @typedef {object} RealtimeOptions
 * @property {string} [url] ws:// or wss:// URL of /v1/realtime; default: this page's origin
 * @property {string} [model] added as ?model=
 * @property {string} [apiKey] an API key, offered as the subprotocol "openai-insecure-api-key.<key>" on every connection
 * @property {string} [clientSecret] an ephemeral "ek_" secret; single use, so only for the first connection
 * @property {() => Promise<string>} [getClientSecret] mints a fresh secret for each reconnection
 * @property {boolean} [binary] offer the binary fast path (default true)
 * @property {boolean} [beta] offer "openai-beta.realtime-v1" (beta event names)
 * @property {boolean|ReconnectPolicy} [reconnect] true (default policy), false, or a policy
 * @property {"fail"|"new_session"} [resumeFallback] a refused resume ends the client ("fail", default)
 *   or continues in the new session after a synthetic "client.session_lost" event
 * @property {number} [ackEvery] ack after this many new events (50)
 * @property {number} [ackIntervalMs] and this long after an unacknowledged one (1000)
 * @property {number} [openTimeoutMs] socket open + session.created (10000)
 * @property {number} [resumeTimeoutMs] reconnected socket to session.resumed (10000)
 * @property {number} [maxQueuedSends] events sent while disconnected wait here (256); more throw
 * @property {typeof WebSocket} [WebSocket] the WebSocket class (tests)
 */

/**
 * @typedef {"new"|"connecting"|"open"|"reconnecting"|"resuming"|"ended"|"closed"} ConnectionState
 * @typedef {object} StateChange
 * @property {ConnectionState} state
 * @property {ConnectionState} previous
 * @property {number} [attempt] reconnect attempt (from 1)
 * @property {number} [delayMs] backoff before this attempt
 * @property {number} [closeCode] the close code that caused the change
 * @property {string} [reason]
 * @property {RealtimeError} [error] why the session ended
 */

/** Counters since the client was created (read `client.stats`). */
export function newStats() {
  return {
    reconnects: 0, // connections re-established after a loss
    resumes: 0, // of those, resumed with the gap replayed (session.resumed)
    resyncs: 0, // session.resync_required received
    sessionsLost: 0, // resume refused, continued in a new session
    failedAttempts: 0, // reconnect attempts that failed and were retried
    replayedEvents: 0, // events delivered from a replay window
    duplicatesDropped: 0, // events with 0 < server_event_seq <= last delivered
    gaps: 0, // live events whose seq skipped ahead (should stay 0)
    acksSent: 0,
    sendsQueued: 0, // events queued while disconnected
    sendsFlushed: 0, // queued events sent after a resume
    sendsDiscarded: 0, // queued events dropped because the session was lost
    audioAppendsDropped: 0, // appendAudio calls while disconnected
    audioBytesDropped: 0,
    undecodableFrames: 0,
  };
}

/** A realtime session that reconnects and resumes on its own. */
export class RealtimeClient extends ClientEvents {
  /** @param {RealtimeOptions} [options] */
  constructor(options = {}) {
    super();
    const o = options;
    this.url = withModel(o.url ?? defaultUrl("/v1/realtime"), o.model);
    this._apiKey = o.apiKey || null;
    this._clientSecret = o.clientSecret || null;
    this._getClientSecret = o.getClientSecret || null;
    this._wantBinary = o.binary ?? true;
    this._beta = !!o.beta;
    this._policy = o.reconnect === false ? { ...DEFAULT_RECONNECT, maxAttempts: 0 }
      : { ...DEFAULT_RECONNECT, ...(o.reconnect && o.reconnect !== true ? o.reconnect : {}) };
    this._fallback = o.resumeFallback ?? "fail";
    this._ackEvery = Math.max(1, o.ackEvery ?? 50);
    this._ackIntervalMs = o.ackIntervalMs ?? 1000;
    this._openTimeoutMs = o.openTimeoutMs ?? 10000;
    this._resumeTimeoutMs = o.resumeTimeoutMs ?? 10000;
    this._maxQueuedSends = o.maxQueuedSends ?? 256;
    this._WebSocket = o.WebSocket ?? globalThis.WebSocket;
    this._audioType = this._beta ? "response.audio.delta" : "response.output_audio.delta";

    /** @type {ConnectionState} */
    this.state = "new";
    /** The current socket (null while reconnecting). */
    this.ws = null;
    /** True when the binary fast path was negotiated on the current socket. */
    this.binary = false;
    /** The session's id; stable across resumes. */
    this.sessionId = null;
    /** The current resume token (rotated on every resume). */
    this.resumeToken = null;
    /** The highest server_event_seq received. */
    this.lastSeq = 0;
    /** The highest seq acknowledged. */
    this.acked = 0;
    this.stats = newStats();
    /** @type {RealtimeError|null} why the session ended */
    this.error = null;

    this._replay = null; // [from, to] announced by session.resumed
    this._ackDue = false;
    this._replaced = false;
    this._pending = []; // JSON events queued while disconnected
    this._items = new Map(); // output item id -> [response_id, output_index]
    this._ackTimer = null;
    this._retryTimer = null;
    this._closing = false;
    this._abortConnect = null;
    this._abortHandshake = null;
  }

  // --- lifecycle ------------------------------------------------------------------------------

  /**
   * Open the socket and wait for `session.created` (also emitted as an event).
   * The first connection is not retried: a refusal rejects with a RealtimeError
   * (code "refused": the gateway is up but refused the upgrade, a credential or the page's
   * origin; "unauthorized", "server_busy", "rate_limit_exceeded", "connect_failed", ...).
   * @returns {Promise<object>} the session.created event
   */
  connect() {
    if (this.state !== "new") return Promise.reject(new RealtimeError("connect() may be called once", { code: "already_connected" }));
    this._setState("connecting");
    return new Promise((resolve, reject) => {
      let ws;
      try {
        ws = this._open(this._clientSecret || this._apiKey);
      } catch (err) {
        this._end(asError(err, "connect_failed"));
        reject(this.error);
        return;
      }
      let refusal = null;
      let opened = false;
      let settled = false;
      const timer = setTimeout(() => fail(new RealtimeError("no session.created in time", { code: "timeout" }), true), this._openTimeoutMs);
      const fail = (err, closeIt) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        this._abortConnect = null;
        detach(ws);
        if (closeIt) safeClose(ws);
        this._end(err);
        reject(err);
      };
      this._abortConnect = () => fail(new RealtimeError("closed before the session was created", { code: "closed" }), true);
      ws.onmessage = (msg) => {
        const event = this._parse(msg.data);
        if (!event) return;
        if (event.type === "error") refusal = event.error || {};
        if (event.type !== "session.created") return;
        clearTimeout(timer);
        this._abortConnect = null;
        this.binary = ws.protocol === BINARY_SUBPROTOCOL;
        this._goLive(ws); // sends made while connecting go out now
        this._ingest(msg.data, event);
        resolve(event);
      };
      ws.onopen = () => { opened = true; };
      ws.onclose = (close) => {
        if (opened || refusal || close.code !== 1006) return fail(refusalError(refusal, close), false);
        clearTimeout(timer);
        upgradeFailure(this.url, close).then((err) => fail(err, false));
      };
      ws.onerror = () => {}; // the close event follows with the reason
    });
  }

  /** Close normally (1000). Idempotent; no reconnect follows. */
  close() {
    if (this.state === "closed") return;
    this._closing = true;
    clearTimeout(this._retryTimer);
    this._stopAckTimer();
    const ws = this.ws;
    this.ws = null;
    if (ws) {
      detach(ws);
      safeClose(ws, 1000, "client closed");
    }
    this._setState("closed");
    this._abortHandshake?.();
    this._abortConnect?.(); // a connect() in flight rejects with code "closed"
  }

  /** True while a socket is open and live (not during a reconnect). */
  get connected() {
    return this.state === "open";
  }

  /** This client's transport (WebRTCClient says "webrtc"). */
  get transport() {
    return "websocket";
  }

  // --- sends ----------------------------------------------------------------------------------

  /**
   * Send any client event as JSON. While reconnecting it waits in a queue (see
   * maxQueuedSends) and goes out, in order, right after the resume.
   * @param {object} event
   */
  send(event) {
    this._checkUsable();
    if (this.state === "open" && this.ws && this.ws.readyState === 1) {
      this.ws.send(JSON.stringify(event));
      return;
    }
    if (this._pending.length >= this._maxQueuedSends) {
      throw new RealtimeError(`${this._pending.length} events already wait for the connection (maxQueuedSends); ${event.type} was not queued`, { code: "send_queue_full" });
    }
    this._pending.push(event);
    this.stats.sendsQueued++;
  }

  /**
   * Append input audio (PCM16 24 kHz mono for "audio/pcm"): one binary frame on the
   * fast path, else base64 JSON. Dropped (and counted in stats) while disconnected.
   * @param {Int16Array|ArrayBuffer|Uint8Array} audio
   */
  appendAudio(audio) {
    this._checkUsable();
    const ws = this.ws;
    if (this.state !== "open" || !ws || ws.readyState !== 1) {
      this.stats.audioAppendsDropped++;
      this.stats.audioBytesDropped += audio.byteLength;
      return;
    }
    if (this.binary) ws.send(encodeInputFrame(audio));
    else ws.send(JSON.stringify({ type: "input_audio_buffer.append", audio: bytesToBase64(audio) }));
  }

  _checkUsable() {
    if (this.state === "new") throw new RealtimeError("not connected: call connect() first", { code: "not_connected" });
    if (this.state === "closed") throw new RealtimeError("the client was closed", { code: "closed" });
    if (this.state === "ended") throw new RealtimeError("the session ended", { code: this.error?.code ?? "ended" });
  }

  // --- sockets --------------------------------------------------------------------------------

  /**
   * @param {string|null} credential
   * @param {boolean} [resumeOnly] `?resume=1`: the gateway opens no session on this socket
   *   (its first event must be session.resume)
   */
  _open(credential, resumeOnly = false) {
    const protocols = this._wantBinary ? [BINARY_SUBPROTOCOL, REALTIME_SUBPROTOCOL] : [REALTIME_SUBPROTOCOL];
    if (this._beta) protocols.push(BETA_SUBPROTOCOL);
    if (credential) protocols.push(KEY_SUBPROTOCOL_PREFIX + credential);
    let ws;
    try {
      ws = new this._WebSocket(resumeOnly ? withQuery(this.url, "resume", "1") : this.url, protocols);
    } catch (err) {
      throw new RealtimeError(`cannot open ${this.url}: ${err.message}`, { code: "invalid_request" });
    }
    ws.binaryType = "arraybuffer";
    return ws;
  }

  async _openReconnect(resumeOnly) {
    if (this._apiKey) return this._open(this._apiKey, resumeOnly);
    if (this._getClientSecret) return this._open(await this._getClientSecret(), resumeOnly);
    if (this._clientSecret) {
      throw new RealtimeError("the connection was lost and a client secret is single use: pass apiKey or getClientSecret to reconnect", { code: "no_credentials" });
    }
    return this._open(null, resumeOnly); // a gateway without required auth
  }

  /** Route a socket's messages and close into the live handlers. */
  _live(ws) {
    ws.onmessage = (msg) => this._ingest(msg.data);
    ws.onclose = (close) => this._onLiveClose(ws, close);
    ws.onerror = () => {};
    this._startAckTimer(ws);
  }

  _onLiveClose(ws, close) {
    if (ws !== this.ws) return;
    this.ws = null;
    this._stopAckTimer();
    if (this._closing) return;
    const verdict = this._classify(close.code, close.reason);
    if (verdict === "end") {
      this._end(null, close);
    } else if (verdict instanceof RealtimeError) {
      this._end(verdict, close);
    } else {
      this._reconnect(close.code, close.reason);
    }
  }

  _classify(code, reason) {
    if (this._replaced || code === 4009) return "end";
    if (code === 1000) return "end";
    if (code === 4001) return new RealtimeError(`the server closed the session: unauthorized (${reason})`, { code: "unauthorized", closeCode: code });
    if (code === 4008) return new RealtimeError("the session reached its maximum lifetime", { code: "session_expired", closeCode: code });
    // Refusals a reconnect would meet again (a 4029 tenant limit is retried with backoff).
    if (code === 4003 || code === 4004) {
      const refused = code === 4003 ? "model_not_allowed" : "model_not_found";
      return new RealtimeError(`the server refused the session: ${refused} (${reason})`, { code: refused, closeCode: code });
    }
    if (PROTOCOL_FAULTS.has(code)) return new RealtimeError(`the server closed the connection with ${code} ${reason}`.trim(), { code: "protocol_error", closeCode: code });
    return "retry";
  }

  // --- incoming -------------------------------------------------------------------------------

  _parse(data) {
    if (typeof data !== "string") return null;
    try {
      const event = JSON.parse(data);
      return event && typeof event === "object" && !Array.isArray(event) ? event : null;
    } catch {
      this.stats.undecodableFrames++;
      return null;
    }
  }

  /** Decode, de-duplicate, observe and emit one message. */
  _ingest(data, parsed) {
    let event = parsed;
    if (!event) {
      if (data instanceof ArrayBuffer) {
        try {
          event = decodeAudioFrame(data, this._audioType);
        } catch (err) {
          if (!(err instanceof FrameError)) throw err;
          this.stats.undecodableFrames++;
          return;
        }
        const ids = this._items.get(event.item_id);
        if (ids) [event.response_id, event.output_index] = ids;
      } else {
        event = this._parse(data);
        if (!event) return;
      }
    }
    const seq = event.server_event_seq;
    if (Number.isInteger(seq) && seq > 0) {
      if (seq <= this.lastSeq) {
        this.stats.duplicatesDropped++;
        return;
      }
      if (this._replay && seq >= this._replay[0] && seq <= this._replay[1]) {
        this.stats.replayedEvents++;
      } else if (seq !== this.lastSeq + 1 && this.lastSeq > 0) {
        this.stats.gaps++;
      }
      this.lastSeq = seq;
      if (this._replay && seq >= this._replay[1]) {
        this._replay = null;
        this._ackDue = true;
      }
    }
    this._observe(event);
    this._deliver(event);
    if (this._ackWanted()) this._ack();
  }

  _observe(event) {
    const kind = event.type;
    if (typeof event.resume_token === "string" && event.resume_token) this.resumeToken = event.resume_token;
    if (AUDIO_DELTAS.has(kind)) {
      if (typeof event.delta === "string") {
        try {
          event.delta = base64ToBytes(event.delta);
          event.audio = pcm16(event.delta);
        } catch {
          this.stats.undecodableFrames++;
        }
      }
    } else if (kind === "session.created") {
      if (typeof event.session?.id === "string") this.sessionId = event.session.id;
    } else if (kind === "session.resync_required") {
      this.stats.resyncs++;
      if (typeof event.session_id === "string") this.sessionId = event.session_id;
      if (Number.isInteger(event.last_server_event_seq)) this.lastSeq = event.last_server_event_seq;
      this._replay = null;
      this._ackDue = true;
      this._items.clear();
    } else if (kind === "session.replaced") {
      this._replaced = true;
    } else if (kind === "response.output_item.added") {
      const id = event.item?.id;
      if (typeof id === "string") {
        this._items.set(id, [event.response_id, event.output_index]);
        if (this._items.size > MAX_TRACKED_ITEMS) this._items.delete(this._items.keys().next().value);
      }
    } else if (kind === "response.done") {
      for (const item of event.response?.output ?? []) this._items.delete(item?.id);
    }
  }

  _deliver(event) {
    this.emit(event.type, event);
    this.emit("event", event);
  }

  // --- acknowledgements -----------------------------------------------------------------------

  _ackWanted() {
    if (!this.resumeToken) return false;
    return this._ackDue || this.lastSeq - this.acked >= this._ackEvery;
  }

  _ack() {
    const ws = this.ws;
    if (!this.resumeToken || this.state !== "open" || !ws || ws.readyState !== 1) return;
    const seq = this.lastSeq;
    ws.send(JSON.stringify({ type: "session.event_ack", last_received_server_event_seq: seq }));
    this.acked = seq;
    this._ackDue = false;
    this.stats.acksSent++;
  }

  _startAckTimer(ws) {
    this._stopAckTimer();
    this._ackTimer = setInterval(() => {
      if (ws === this.ws && this.lastSeq > this.acked) this._ack();
    }, this._ackIntervalMs);
  }

  _stopAckTimer() {
    clearInterval(this._ackTimer);
    this._ackTimer = null;
  }

  // --- reconnecting and resuming --------------------------------------------------------------

  _reconnect(closeCode, reason) {
    const policy = this._policy;
    const started = Date.now();
    let attempt = 0;
    let lastError = `closed with ${closeCode} ${reason || ""}`.trim();
    const next = () => {
      if (this._closing || this.state === "ended") return;
      if (policy.maxAttempts !== null && attempt >= policy.maxAttempts) return giveUp();
      const base = Math.min(policy.maxDelayMs, policy.initialDelayMs * policy.multiplier ** Math.min(attempt, 64));
      // 1012 (service restart): a drain handed the session over on purpose (it paces its
      // handovers), so the first attempt goes at once; later ones back off.
      const delayMs = attempt === 0 && closeCode === 1012 ? 0 : Math.max(0, base * (1 - policy.jitter * Math.random()));
      if (policy.maxElapsedMs !== null && Date.now() + delayMs - started > policy.maxElapsedMs) return giveUp();
      attempt++;
      this._setState("reconnecting", { attempt, delayMs: Math.round(delayMs), closeCode, reason });
      this._retryTimer = setTimeout(async () => {
        if (this._closing) return;
        // Resume-only unless a refusal should continue in a new session (which needs the
        // session the server opens on the socket).
        const resumeOnly = this._fallback !== "new_session" && !!(this.sessionId && this.resumeToken);
        let ws;
        try {
          ws = await this._openReconnect(resumeOnly);
        } catch (err) {
          if (err instanceof RealtimeError && err.code === "no_credentials") return this._end(err);
          lastError = String(err?.message ?? err);
          this.stats.failedAttempts++;
          return next();
        }
        const outcome = await this._handshake(ws, resumeOnly);
        if (outcome === "live") return;
        if (outcome instanceof RealtimeError) return this._end(outcome);
        if (outcome === "replaced") return this._end(null);
        if (outcome === "closed") return;
        lastError = outcome;
        this.stats.failedAttempts++;
        next();
      }, delayMs);
    };
    const giveUp = () => {
      const message = attempt === 0
        ? `the connection was lost (${lastError}) and reconnecting is disabled`
        : `gave up reconnecting after ${attempt} attempts; last: ${lastError}`;
      this._end(new RealtimeError(message, { code: attempt === 0 ? "reconnect_disabled" : "reconnect_failed", closeCode }));
    };
    next();
  }

  /**
   * Resume on a fresh socket. Resolves "live" (resumed, resynced or fallen back),
   * "replaced", "closed" (close() was called), a RealtimeError (final), or a string
   * saying why this attempt failed (retry). `resumeFirst`: a resume-only socket, the
   * session.resume goes as it opens; otherwise after the session.created of the session
   * the server opened.
   */
  _handshake(ws, resumeFirst = false) {
    return new Promise((resolve) => {
      let provisional = null;
      let highest = 0; // highest seq seen in the provisional session
      let refusal = null;
      let settled = false;
      let asked = resumeFirst;
      const askResume = () => {
        this._setState("resuming");
        ws.send(JSON.stringify({
          type: "session.resume",
          session_id: this.sessionId,
          resume_token: this.resumeToken,
          last_received_server_event_seq: this.lastSeq,
        }));
      };
      const finish = (outcome, { keep = false } = {}) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        this._abortHandshake = null;
        if (!keep) {
          detach(ws);
          if (outcome !== "live") safeClose(ws);
        }
        resolve(outcome);
      };
      this._abortHandshake = () => finish("closed");
      const timer = setTimeout(() => finish("no session.resumed in time"), this._resumeTimeoutMs);
      ws.onerror = () => {};
      if (resumeFirst) {
        ws.onopen = () => {
          if (settled) return;
          this.binary = ws.protocol === BINARY_SUBPROTOCOL;
          askResume();
        };
      }
      ws.onclose = (close) => {
        if (settled) return;
        const message = refusal?.message || `closed with ${close.code} ${close.reason}`.trim();
        if (close.code === 4001 || refusal?.code === "unauthorized") {
          return finish(new RealtimeError(message, { code: "unauthorized", closeCode: close.code }));
        }
        if (close.code === 4009) return finish("replaced");
        const verdict = this._classify(close.code, close.reason);
        if (verdict instanceof RealtimeError) return finish(verdict);
        finish(message);
      };
      ws.onmessage = (msg) => {
        if (settled) return;
        const event = this._parse(msg.data);
        if (!event) return; // binary frames of the provisional session: not ours
        const kind = event.type;
        const seq = event.server_event_seq;
        if (kind === "session.replaced") {
          this._observe(event);
          this._deliver(event);
          return finish("replaced");
        }
        if (!provisional && kind === "session.created") {
          // The new socket's own session: ignored, we resume ours (a server that knows no
          // resume-only sockets opens one anyway).
          provisional = event;
          highest = Number.isInteger(seq) ? seq : 0;
          this.binary = ws.protocol === BINARY_SUBPROTOCOL;
          if (asked) return;
          if (!this.sessionId || !this.resumeToken) {
            return this._refused(ws, provisional, highest, "resume_unsupported", "the server gave no resume token for this session", finish);
          }
          asked = true;
          askResume();
          return;
        }
        if (!asked) { // waiting for the session.created
          if (kind === "error") refusal = event.error || {};
          return;
        }
        if (kind === "session.resumed") {
          this.stats.resumes++;
          if (typeof event.session_id === "string") this.sessionId = event.session_id;
          this._observe(event); // the rotated token
          const from = event.replay_from;
          const to = event.replay_to;
          if (Number.isInteger(from) && Number.isInteger(to) && to >= from && to > this.lastSeq) {
            this._replay = [from, to];
          } else {
            this._replay = null;
            this._ackDue = true; // nothing to replay: ack right away
          }
          this._goLive(ws);
          finish("live", { keep: true });
          this._deliver(event);
          if (this._ackWanted()) this._ack();
          return;
        }
        if (kind === "session.resync_required") {
          this._observe(event);
          this._goLive(ws);
          finish("live", { keep: true });
          this._deliver(event);
          this._ack();
          return;
        }
        if (Number.isInteger(seq)) highest = Math.max(highest, seq);
        if (kind === "error") {
          refusal = event.error || {};
          const code = refusal.code;
          if (RESUME_REFUSALS.has(code)) return this._refused(ws, provisional, highest, code, event.error?.message ?? "", finish);
          if (code === "unknown_event") {
            return this._refused(ws, provisional, highest, "resume_unsupported", "the server does not support session.resume", finish);
          }
        }
      };
    });
  }

  _refused(ws, provisional, highest, code, message, finish) {
    if (this._fallback !== "new_session" || !provisional) { // (resume-only sockets: "fail" only)
      return finish(new RealtimeError(message || `resume refused: ${code}`, { code }));
    }
    const previous = this.sessionId;
    this.sessionId = null;
    this.resumeToken = null;
    this.acked = 0;
    this._replay = null;
    this._ackDue = false;
    this._items.clear();
    this._observe(provisional);
    this.lastSeq = highest;
    const discarded = this._pending.length;
    this._pending = [];
    this.stats.sendsDiscarded += discarded;
    this.stats.sessionsLost++;
    this._goLive(ws, { flush: false });
    finish("live", { keep: true });
    this._deliver({ type: "client.session_lost", code, message, previous_session_id: previous, session_id: this.sessionId, discarded_sends: discarded });
    this._deliver(provisional);
  }

  /** Make `ws` the live socket: flush the sends queued during the outage, in order. */
  _goLive(ws, { flush = true } = {}) {
    this.ws = ws;
    this._live(ws);
    if (this.state !== "connecting") this.stats.reconnects++;
    this._setState("open");
    if (!flush) return;
    while (this._pending.length && ws.readyState === 1) {
      ws.send(JSON.stringify(this._pending.shift()));
      this.stats.sendsFlushed++;
    }
  }

  // --- ending ---------------------------------------------------------------------------------

  _end(error, close) {
    if (this.state === "ended" || this.state === "closed") return;
    this.error = error;
    this._stopAckTimer();
    clearTimeout(this._retryTimer);
    const ws = this.ws;
    this.ws = null;
    if (ws) {
      detach(ws);
      safeClose(ws);
    }
    this._setState("ended", { error: error ?? undefined, closeCode: close?.code ?? error?.closeCode, reason: close?.reason });
  }

  _setState(state, details = {}) {
    const previous = this.state;
    this.state = state;
    /** @type {StateChange} */
    const change = { state, previous, ...details };
    this.emit("state", change);
  }
}

// --- helpers ----------------------------------------------------------------------------------

/**
 * The ws(s):// URL of `path` on this page's origin.
 * @param {string} path
 * @returns {string}
 */
export function defaultUrl(path) {
  const loc = globalThis.location;
  if (!loc) throw new RealtimeError("no page origin: pass url", { code: "invalid_request" });
  return `${loc.protocol === "https:" ? "wss" : "ws"}://${loc.host}${path}`;
}

function withModel(url, model) {
  return model ? withQuery(url, "model", model) : url;
}

/** `url` with the query parameter `key` set to `value` (replacing any). */
function withQuery(url, key, value) {
  const u = new URL(url);
  u.searchParams.set(key, value);
  return u.toString();
}

/**
 * Why a socket closed before it opened (1006), which a browser does not tell a page. The
 * gateway answers a refused credential or page origin at the upgrade (HTTP 401/403): to a
 * page that looks like a gateway that is down. A no-cors fetch of /healthz (it needs no
 * credential and no CORS) tells the two apart: reachable means refused (code "refused").
 * @param {string} wsUrl
 * @param {CloseEvent} close
 * @returns {Promise<RealtimeError>}
 */
export async function upgradeFailure(wsUrl, close) {
  const probe = new URL(wsUrl);
  probe.protocol = probe.protocol === "wss:" ? "https:" : "http:";
  probe.pathname = "/healthz";
  probe.search = "";
  try {
    await fetch(probe, { mode: "no-cors", cache: "no-store" });
  } catch {
    return new RealtimeError(`cannot reach the gateway at ${wsUrl} (closed ${close.code})`, { code: "connect_failed", closeCode: close.code });
  }
  return new RealtimeError(
    "the gateway refused the connection before it opened: a missing or refused credential (API key, client " +
      "secret or token), or a page origin it does not allow (a browser is not told which)",
    { code: "refused", closeCode: close.code },
  );
}

function refusalError(refusal, close) {
  const message = refusal?.message || `the server closed the connection (${close.code} ${close.reason || ""})`.trim();
  if (close.code === 4001 || refusal?.code === "unauthorized") return new RealtimeError(message, { code: "unauthorized", closeCode: close.code });
  if (close.code === 4008) return new RealtimeError(message, { code: "session_expired", closeCode: close.code });
  const code = refusal?.code || (close.code === 1006 ? "connect_failed" : "closed");
  return new RealtimeError(message, { code, closeCode: close.code });
}

function asError(err, code) {
  return err instanceof RealtimeError ? err : new RealtimeError(String(err?.message ?? err), { code });
}

function detach(ws) {
  ws.onmessage = ws.onclose = ws.onerror = ws.onopen = null;
}

function safeClose(ws, code, reason) {
  try {
    if (code === undefined) ws.close();
    else ws.close(code, reason);
  } catch {
    // already closed
  }
}
