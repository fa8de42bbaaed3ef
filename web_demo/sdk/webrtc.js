// WebRTCClient: one realtime session over a WebRTC call that survives a lost call.
//
// The gateway's POST /v1/realtime/calls (OpenAI's GA WebRTC surface): the microphone goes
// up as an Opus track, the answer's audio comes down as one (play `remoteStream`, or pass
// `audioElement`), and every other event is JSON on the "oai-events" data channel: the
// events RealtimeClient emits, but no audio deltas (the audio is on the track). The gateway
// plays the audio, so it knows what was heard: it says output_audio_buffer.started /
// stopped / cleared, and on a barge-in or a cancel it cuts the track and truncates the item
// itself (conversation.item.truncated); the page sends no truncate.
//
// A lost call (the peer connection failed or closed, the channel closed, or "disconnected"
// for disconnectedGraceMs) is offered again, with backoff, to the same base URL (a load
// balancer may pick any replica) with the header X-Omni-Resume: the session's id, its latest
// resume token and the last server_event_seq received. The new call's channel starts with
// session.resumed and the replay; what was already emitted is dropped by seq. A re-offer
// answered 408/425/429/5xx, or that cannot reach the gateway, is retried; a refused resume
// ends the client (or, with resumeFallback "new_session", continues in a new session after
// a "client.session_lost" event).
//
//   const rt = new WebRTCClient({ apiKey });   // or getClientSecret: async () => mint(), or nothing on loopback
//   rt.on("track", ({ stream }) => (audioEl.srcObject = stream));
//   rt.on("response.output_audio_transcript.delta", (e) => show(e.delta));
//   await rt.connect();                         // asks for the microphone unless given mediaStream

import { ClientEvents } from "./client-events.js";
import { RealtimeError } from "./errors.js";
import { DEFAULT_RECONNECT, newStats } from "./realtime.js";

export const EVENTS_CHANNEL = "oai-events";
export const RESUME_HEADER = "X-Omni-Resume";
const RETRYABLE_STATUS = new Set([408, 425, 429, 500, 502, 503, 504]);
const RESUME_REFUSALS = new Set(["session_not_found", "resume_token_invalid", "resume_forbidden", "resume_seq_invalid"]);

/** True where this page can hold a WebRTC call with a microphone. */
export function webrtcSupported() {
  return typeof globalThis.RTCPeerConnection === "function" && typeof globalThis.navigator?.mediaDevices?.getUserMedia === "function";
}

/**
 * @typedef {object} WebRTCOptions
 * @property {string} [baseUrl] http(s) origin of the gateway (calls go to baseUrl + "/v1/realtime/calls"); default: this page's
 * @property {string} [model] the first call opens its session on this model (sent as the form's `session`)
 * @property {object} [session] the first call's session object (the unified form's `session`: model, instructions, audio, ...)
 * @property {string} [apiKey] an API key or token, sent as "Authorization: Bearer" with every offer
 * @property {string} [clientSecret] an ephemeral "ek_" secret; single use, so only for the first offer
 * @property {() => Promise<string|{value: string, ice_servers?: RTCIceServer[]}>} [getClientSecret]
 *   mints a fresh secret for each offer (the answer of POST /v1/realtime/client_secrets will do: its ice_servers are used)
 * @property {RTCIceServer[]} [iceServers] default: the minted client secret's (getClientSecret), else
 *   GET /v1/realtime/calls/ice_servers (with apiKey: that endpoint wants a key)
 * @property {MediaStream} [mediaStream] the microphone; default: getUserMedia({audio}) at connect (stopped by close)
 * @property {boolean|MediaTrackConstraints} [audio] getUserMedia's audio constraints (true)
 * @property {HTMLMediaElement} [audioElement] gets every call's remote stream as srcObject
 * @property {boolean|import("./realtime.js").ReconnectPolicy} [reconnect] true (default policy), false, or a policy
 * @property {"fail"|"new_session"} [resumeFallback] what a refused resume does ("fail": the client ends)
 * @property {number} [ackEvery] ack after this many new events (50)
 * @property {number} [ackIntervalMs] and this long after an unacknowledged one (1000)
 * @property {number} [connectTimeoutMs] offer posted to session.created (15000)
 * @property {number} [resumeTimeoutMs] re-offer posted to session.resumed (10000)
 * @property {number} [disconnectedGraceMs] a call "disconnected" this long is lost (3000; ICE may recover before)
 * @property {number} [maxQueuedSends] events sent while reconnecting wait here (256); more throw
 * @property {typeof RTCPeerConnection} [RTCPeerConnection] (tests)
 * @property {typeof fetch} [fetch] (tests)
 */

/** A realtime session over WebRTC that re-offers and resumes on its own. */
export class WebRTCClient extends ClientEvents {
  /** @param {WebRTCOptions} [options] */
  constructor(options = {}) {
    super();
    const o = options;
    const origin = o.baseUrl ?? globalThis.location?.origin;
    if (!origin) throw new RealtimeError("no page origin: pass baseUrl", { code: "invalid_request" });
    this.baseUrl = origin.replace(/\/+$/, "");
    this.url = `${this.baseUrl}/v1/realtime/calls`;
    this._session = o.session ?? (o.model ? { type: "realtime", model: o.model } : null);
    this._apiKey = o.apiKey || null;
    this._clientSecret = o.clientSecret || null;
    this._getClientSecret = o.getClientSecret || null;
    this._iceServers = o.iceServers ?? null;
    this._givenStream = o.mediaStream ?? null;
    this._audio = o.audio ?? true;
    this.audioElement = o.audioElement ?? null;
    this._policy = o.reconnect === false ? { ...DEFAULT_RECONNECT, maxAttempts: 0 }
      : { ...DEFAULT_RECONNECT, ...(o.reconnect && o.reconnect !== true ? o.reconnect : {}) };
    this._fallback = o.resumeFallback ?? "fail";
    this._ackEvery = o.ackEvery ?? 50;
    this._ackIntervalMs = o.ackIntervalMs ?? 1000;
    this._connectTimeoutMs = o.connectTimeoutMs ?? 15000;
    this._resumeTimeoutMs = o.resumeTimeoutMs ?? 10000;
    this._graceMs = o.disconnectedGraceMs ?? 3000;
    this._maxQueuedSends = o.maxQueuedSends ?? 256;
    this._PC = o.RTCPeerConnection ?? globalThis.RTCPeerConnection;
    this._fetch = o.fetch ?? ((...args) => globalThis.fetch(...args));

    /** @type {import("./realtime.js").ConnectionState} */
    this.state = "new";
    /** The current call's peer connection and data channel (null while reconnecting). */
    this.pc = null;
    this.channel = null;
    /** The current call's id (from the answer's Location). */
    this.callId = null;
    /** The microphone stream sent on every call. */
    this.localStream = null;
    /** The current call's remote stream: the answers' audio. */
    this.remoteStream = null;
    this.sessionId = null;
    this.resumeToken = null;
    /** The highest server_event_seq received (the audio deltas' seqs are the track's: never seen here). */
    this.lastSeq = 0;
    this.acked = 0;
    this.stats = { ...newStats(), reoffers: 0 };
    /** @type {RealtimeError|null} why the session ended */
    this.error = null;

    this._ownsStream = false;
    this._created = null; // the first call's session.created (connect() resolves with it)
    this._replaced = false; // session.replaced: another connection has the session
    this._replay = null; // [from, to] announced by session.resumed
    this._ackDue = false;
    this._pending = []; // events sent while reconnecting
    this._lostSession = null; // a refused resume, said as client.session_lost once the new session is live
    this._closing = false;
    this._ackTimer = null;
    this._retryTimer = null;
    this._graceTimer = null;
    this._abort = null; // ends the handshake in flight (close())
    this._offering = null; // the peer connection being set up (its track is already ours)
  }

  /** This client's transport. */
  get transport() {
    return "webrtc";
  }

  /** True while a call is live (not during a re-offer). */
  get connected() {
    return this.state === "open";
  }

  // --- lifecycle ------------------------------------------------------------------------------

  /**
   * Open the microphone, offer the call and wait for `session.created` (also emitted).
   * The first call is not retried: a refusal rejects with a RealtimeError whose code is the
   * gateway's (unauthorized, server_busy, webrtc_unavailable, ...; `status` the HTTP status),
   * "connect_failed" (unreachable), "microphone", or "call_failed" (answered, but the call did
   * not connect: ICE failed or timed out, as where UDP is blocked).
   * @returns {Promise<object>} the session.created event
   */
  async connect() {
    if (this.state !== "new") throw new RealtimeError("connect() may be called once", { code: "already_connected" });
    this._setState("connecting");
    let outcome;
    try {
      const credential = await this._credential(true);
      await this._prepare(credential);
      const call = await this._offer(credential, null);
      outcome = await this._handshake(call, null, this._connectTimeoutMs);
    } catch (err) {
      outcome = asError(err, "connect_failed");
    }
    if (outcome === "live") return this._created;
    const error = outcome instanceof RealtimeError ? outcome
      : outcome === "closed" ? new RealtimeError("closed before the session was created", { code: "closed" })
        : new RealtimeError(outcome, { code: "call_failed" });
    this._end(error);
    throw error;
  }

  /** End the call (the session stays resumable for the gateway's grace period). Idempotent. */
  close() {
    if (this.state === "closed") return;
    this._closing = true;
    clearTimeout(this._retryTimer);
    this._teardown();
    this._abort?.();
    this._releaseMicrophone();
    this._setState("closed");
  }

  /**
   * End the call and its session for good (POST .../hangup: needs an API key, or a gateway
   * without auth; a client secret cannot hang up).
   * @returns {Promise<boolean>} whether the gateway ended it
   */
  async hangup() {
    const callId = this.callId;
    this.close();
    if (!callId) return false;
    const headers = this._apiKey ? { Authorization: `Bearer ${this._apiKey}` } : {};
    const res = await this._fetch(`${this.url}/${encodeURIComponent(callId)}/hangup`, { method: "POST", headers }).catch(() => null);
    return !!res?.ok;
  }

  // --- sends ----------------------------------------------------------------------------------

  /**
   * Send any client event on the data channel. While reconnecting it waits in a queue
   * (maxQueuedSends) and goes out, in order, right after the resume.
   * @param {object} event
   */
  send(event) {
    this._checkUsable();
    if (this.state === "open" && this.channel?.readyState === "open") {
      this.channel.send(JSON.stringify(event));
      return;
    }
    if (this._pending.length >= this._maxQueuedSends) {
      throw new RealtimeError(`${this._pending.length} events already wait for the call (maxQueuedSends); ${event.type} was not queued`, { code: "send_queue_full" });
    }
    this._pending.push(event);
    this.stats.sendsQueued++;
  }

  /** Over WebRTC the microphone is the call's track: there is no audio to append. */
  appendAudio() {
    throw new RealtimeError("over WebRTC the microphone is sent as the call's track; use the WebSocket transport to append audio", { code: "unsupported" });
  }

  /** Cut the answer's audio now (`output_audio_buffer.clear`; the gateway truncates the item). */
  clearAudio() { this.send({ type: "output_audio_buffer.clear" }); }

  /**
   * Send the microphone (true) or silence (false: push to talk released, muted).
   * @param {boolean} on
   */
  setMicrophoneEnabled(on) {
    for (const track of this.localStream?.getAudioTracks() ?? []) track.enabled = on;
  }

  _checkUsable() {
    if (this.state === "new") throw new RealtimeError("not connected: call connect() first", { code: "not_connected" });
    if (this.state === "closed") throw new RealtimeError("the client was closed", { code: "closed" });
    if (this.state === "ended") throw new RealtimeError("the session ended", { code: this.error?.code ?? "ended" });
  }

  // --- one call -------------------------------------------------------------------------------

  /** @returns {Promise<{token: string|null, iceServers?: RTCIceServer[]}>} */
  async _credential(first) {
    if (this._apiKey) return { token: this._apiKey };
    if (this._getClientSecret) {
      const minted = await this._getClientSecret();
      return typeof minted === "string" ? { token: minted } : { token: minted?.value ?? null, iceServers: minted?.ice_servers };
    }
    if (this._clientSecret) {
      if (first) return { token: this._clientSecret };
      throw new RealtimeError("the call was lost and a client secret is single use: pass apiKey or getClientSecret to re-offer", { code: "no_credentials" });
    }
    return { token: null }; // a gateway without required auth
  }

  /** The microphone and the ICE servers, once. */
  async _prepare(credential) {
    if (!this._PC) throw new RealtimeError("this page has no RTCPeerConnection", { code: "webrtc_unsupported" });
    if (!this._iceServers) this._iceServers = credential.iceServers ?? await this._fetchIceServers();
    if (this._givenStream) {
      this.localStream = this._givenStream;
    } else {
      try {
        this.localStream = await navigator.mediaDevices.getUserMedia({ audio: this._audio });
      } catch (err) {
        throw new RealtimeError(`the microphone could not be opened: ${err?.name ?? ""} ${err?.message ?? err}`.trim(), { code: "microphone" });
      }
      this._ownsStream = true;
    }
  }

  /** GET /v1/realtime/calls/ice_servers: it wants a key or token (TURN credentials are not for
   * anyone); with none, or a client secret (which it does not take), the answer is a 401 and
   * the call gathers host candidates only: pass the minted secret's ice_servers instead. */
  async _fetchIceServers() {
    const headers = this._apiKey ? { Authorization: `Bearer ${this._apiKey}` } : {};
    let res;
    try {
      res = await this._fetch(`${this.url}/ice_servers`, { cache: "no-store", headers });
    } catch (err) {
      throw new RealtimeError(`cannot reach the gateway at ${this.baseUrl}: ${err?.message ?? err}`, { code: "connect_failed" });
    }
    if (!res.ok) return []; // a gateway that does not say: host candidates only
    const body = await res.json().catch(() => ({}));
    return Array.isArray(body.ice_servers) ? body.ice_servers : [];
  }

  /**
   * A new peer connection with the events channel and the microphone, its offer posted.
   * @param {{token: string|null, iceServers?: RTCIceServer[]}} credential
   * @param {object|null} resume the X-Omni-Resume body, or null for a new session
   */
  async _offer(credential, resume) {
    const pc = new this._PC({ iceServers: credential.iceServers ?? this._iceServers ?? [] });
    this._offering = pc;
    try {
      const channel = pc.createDataChannel(EVENTS_CHANNEL);
      const tracks = this.localStream?.getAudioTracks() ?? [];
      for (const track of tracks) pc.addTrack(track, this.localStream);
      if (!tracks.length) pc.addTransceiver("audio", { direction: "recvonly" });
      pc.ontrack = (e) => this._onTrack(pc, e);
      // Posted at once, as OpenAI's clients do (trickle ICE, no candidate yet): the
      // gateway learns this browser's address from its connectivity checks.
      await pc.setLocalDescription(await pc.createOffer());
      const { sdp, callId } = await this._post(pc.localDescription.sdp, credential.token, resume);
      await pc.setRemoteDescription({ type: "answer", sdp });
      return { pc, channel, callId };
    } catch (err) {
      safeClose(pc);
      if (this._offering === pc) this._offering = null;
      throw err;
    }
  }

  async _post(sdp, token, resume) {
    const headers = {};
    if (token) headers.Authorization = `Bearer ${token}`;
    if (resume) headers[RESUME_HEADER] = JSON.stringify(resume);
    let body = sdp;
    if (this._session && !resume) {
      body = new FormData(); // the unified form: the offer and the session it opens
      body.set("sdp", sdp);
      body.set("session", JSON.stringify(this._session));
    } else {
      headers["Content-Type"] = "application/sdp";
    }
    let res;
    try {
      res = await this._fetch(this.url, { method: "POST", headers, body });
    } catch (err) {
      throw new RealtimeError(`cannot reach the gateway at ${this.baseUrl}: ${err?.message ?? err}`, { code: "connect_failed" });
    }
    const text = await res.text();
    if (res.status !== 201) throw refusal(res.status, text);
    return { sdp: text, callId: (res.headers.get("Location") ?? "").split("/").pop() || null };
  }

  _onTrack(pc, e) {
    if (pc !== this._offering && pc !== this.pc) return;
    const stream = e.streams?.[0] ?? new MediaStream([e.track]);
    this.remoteStream = stream;
    if (this.audioElement) this.audioElement.srcObject = stream;
    this.emit("track", { stream, track: e.track });
  }

  /**
   * Wait for the call's session: `session.created` (a new session) or `session.resumed` /
   * `session.resync_required` (a re-offer). Resolves "live", "closed" (close() was called),
   * a RealtimeError (final: a refused resume), or a string saying why this call failed (retry).
   */
  _handshake({ pc, channel, callId }, resume, timeoutMs) {
    return new Promise((resolve) => {
      let settled = false;
      const finish = (outcome) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        this._abort = null;
        if (outcome !== "live") {
          detach(pc, channel);
          safeClose(pc);
        }
        if (this._offering === pc) this._offering = null;
        resolve(outcome);
      };
      this._abort = () => finish("closed");
      const timer = setTimeout(() => finish(resume ? "no session.resumed in time" : "the call did not connect in time"), timeoutMs);
      channel.onclose = () => finish("the call closed before its session started");
      pc.onconnectionstatechange = () => {
        if (pc.connectionState === "failed" || pc.connectionState === "closed") finish(`the call's connection ${pc.connectionState}`);
      };
      channel.onmessage = (msg) => {
        if (settled) return;
        const event = this._parse(msg.data);
        if (!event) return;
        const kind = event.type;
        if (kind === "error" && RESUME_REFUSALS.has(event.error?.code)) {
          return finish(new RealtimeError(event.error.message ?? event.error.code, { code: event.error.code }));
        }
        if (kind === "session.created" && !resume) {
          this._goLive(pc, channel, callId);
          finish("live");
          this._created = event;
          this._deliverLostSession(event);
          this._ingest(event);
          return;
        }
        if ((kind === "session.resumed" || kind === "session.resync_required") && resume) {
          if (kind === "session.resumed") {
            this.stats.resumes++;
            const { replay_from: from, replay_to: to } = event;
            this._replay = Number.isInteger(from) && Number.isInteger(to) && to >= from && to > this.lastSeq ? [from, to] : null;
            if (!this._replay) this._ackDue = true; // nothing to replay: ack right away
          }
          this._goLive(pc, channel, callId);
          finish("live");
          this._ingest(event);
          return;
        }
        this._ingest(event); // (nothing else comes first; if it does, it is not lost)
      };
    });
  }

  /** Make the call the live one: its events, its end, the sends that waited. */
  _goLive(pc, channel, callId) {
    this.pc = pc;
    this.channel = channel;
    this.callId = callId;
    channel.onmessage = (msg) => {
      const event = this._parse(msg.data);
      if (event) this._ingest(event);
    };
    channel.onclose = () => this._lost(pc, "the data channel closed");
    pc.onconnectionstatechange = () => {
      const state = pc.connectionState;
      if (state === "failed" || state === "closed") return this._lost(pc, `the call's connection ${state}`);
      clearTimeout(this._graceTimer);
      // "disconnected" may heal (ICE restarts its checks); a replica that is gone does not.
      if (state === "disconnected") this._graceTimer = setTimeout(() => this._lost(pc, "the call stayed disconnected"), this._graceMs);
    };
    this._startAckTimer(channel);
    if (this.state !== "connecting") this.stats.reconnects++;
    this._setState("open");
    if (this._lostSession) return; // a new session: what was queued was meant for the old one
    while (this._pending.length && channel.readyState === "open") {
      channel.send(JSON.stringify(this._pending.shift()));
      this.stats.sendsFlushed++;
    }
  }

  _deliverLostSession(created) {
    const lost = this._lostSession;
    if (!lost) return;
    this._lostSession = null;
    this._deliver({ type: "client.session_lost", ...lost, session_id: created.session?.id ?? null });
  }

  // --- incoming -------------------------------------------------------------------------------

  _parse(data) {
    if (typeof data !== "string") return null; // the dialect has no binary messages
    try {
      const event = JSON.parse(data);
      return event && typeof event === "object" && !Array.isArray(event) ? event : null;
    } catch {
      this.stats.undecodableFrames++;
      return null;
    }
  }

  /** De-duplicate by seq, observe, emit. Seqs skip the audio deltas (played on the track), so
   * a skip is no gap here. */
  _ingest(event) {
    const seq = event.server_event_seq;
    if (Number.isInteger(seq) && seq > 0) {
      if (seq <= this.lastSeq) {
        this.stats.duplicatesDropped++;
        return;
      }
      if (this._replay && seq >= this._replay[0] && seq <= this._replay[1]) this.stats.replayedEvents++;
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
    if (typeof event.resume_token === "string" && event.resume_token) this.resumeToken = event.resume_token;
    switch (event.type) {
      case "session.created":
        if (typeof event.session?.id === "string") this.sessionId = event.session.id;
        break;
      case "session.resumed":
        if (typeof event.session_id === "string") this.sessionId = event.session_id;
        break;
      case "session.resync_required":
        this.stats.resyncs++;
        if (typeof event.session_id === "string") this.sessionId = event.session_id;
        if (Number.isInteger(event.last_server_event_seq)) this.lastSeq = event.last_server_event_seq;
        this._replay = null;
        this._ackDue = true;
        break;
      case "session.replaced":
        this._replaced = true; // another connection took the session: the call's end ends this client
        break;
      default:
        break;
    }
  }

  _deliver(event) {
    this.emit(event.type, event);
    this.emit("event", event);
  }

  // --- acknowledgements (the gateway keeps the journal until acked) ---------------------------

  _ackWanted() {
    return !!this.resumeToken && (this._ackDue || this.lastSeq - this.acked >= this._ackEvery);
  }

  _ack() {
    const channel = this.channel;
    if (!this.resumeToken || this.state !== "open" || channel?.readyState !== "open") return;
    channel.send(JSON.stringify({ type: "session.event_ack", last_received_server_event_seq: this.lastSeq }));
    this.acked = this.lastSeq;
    this._ackDue = false;
    this.stats.acksSent++;
  }

  _startAckTimer(channel) {
    clearInterval(this._ackTimer);
    this._ackTimer = setInterval(() => {
      if (channel === this.channel && this.lastSeq > this.acked) this._ack();
    }, this._ackIntervalMs);
  }

  // --- a lost call: re-offer and resume -------------------------------------------------------

  _lost(pc, reason) {
    if (pc !== this.pc || this._closing || this.state === "ended" || this.state === "closed") return;
    if (this._replaced) return this._end(null);
    this._teardown();
    this._reconnect(reason);
  }

  /** Drop the live call (its peer connection closed: the gateway ends that call). */
  _teardown() {
    clearInterval(this._ackTimer);
    clearTimeout(this._graceTimer);
    const { pc, channel } = this;
    this.pc = this.channel = null;
    if (pc) {
      detach(pc, channel);
      safeClose(pc);
    }
  }

  _reconnect(reason) {
    const policy = this._policy;
    const started = Date.now();
    let attempt = 0;
    let lastError = reason;
    const next = () => {
      if (this._closing || this.state === "ended") return;
      if (policy.maxAttempts !== null && attempt >= policy.maxAttempts) return giveUp();
      const base = Math.min(policy.maxDelayMs, policy.initialDelayMs * policy.multiplier ** Math.min(attempt, 64));
      const delayMs = Math.max(0, base * (1 - policy.jitter * Math.random()));
      if (policy.maxElapsedMs !== null && Date.now() + delayMs - started > policy.maxElapsedMs) return giveUp();
      attempt++;
      this._setState("reconnecting", { attempt, delayMs: Math.round(delayMs), reason });
      this._retryTimer = setTimeout(() => this._attempt().then((outcome) => {
        if (outcome === "live" || outcome === "closed") return;
        if (outcome instanceof RealtimeError) return this._end(outcome);
        lastError = outcome;
        this.stats.failedAttempts++;
        next();
      }), delayMs);
    };
    const giveUp = () => {
      const message = attempt === 0
        ? `the call was lost (${lastError}) and re-offering is disabled`
        : `gave up re-offering after ${attempt} attempts; last: ${lastError}`;
      this._end(new RealtimeError(message, { code: attempt === 0 ? "reconnect_disabled" : "reconnect_failed" }));
    };
    next();
  }

  /** One re-offer. Resolves as _handshake does. */
  async _attempt() {
    if (this._closing) return "closed";
    const resume = this.sessionId && this.resumeToken
      ? { session_id: this.sessionId, resume_token: this.resumeToken, last_received_server_event_seq: this.lastSeq }
      : null; // the session was lost: a new one
    let call;
    try {
      const credential = await this._credential(false);
      if (this._closing) return "closed";
      this.stats.reoffers++;
      call = await this._offer(credential, resume);
    } catch (err) {
      const error = asError(err, "connect_failed");
      if (error.code === "connect_failed" || RETRYABLE_STATUS.has(error.status)) return error.message;
      if (resume && RESUME_REFUSALS.has(error.code)) return this._refused(error);
      return error;
    }
    if (this._closing) {
      safeClose(call.pc);
      return "closed";
    }
    if (resume) this._setState("resuming");
    const outcome = await this._handshake(call, resume, resume ? this._resumeTimeoutMs : this._connectTimeoutMs);
    if (outcome instanceof RealtimeError && resume && RESUME_REFUSALS.has(outcome.code)) return this._refused(outcome);
    return outcome;
  }

  /** A refused resume: end, or (resumeFallback "new_session") forget the session and offer anew. */
  _refused(error) {
    if (this._fallback !== "new_session") return error;
    const discarded = this._pending.length;
    this._lostSession = { code: error.code, message: error.message, previous_session_id: this.sessionId, discarded_sends: discarded };
    this._pending = [];
    this.stats.sendsDiscarded += discarded;
    this.stats.sessionsLost++;
    this.sessionId = this.resumeToken = null;
    this.lastSeq = this.acked = 0; // the new session counts from 1
    this._replay = null;
    this._ackDue = false;
    return this._attempt(); // at once: the gateway answered, it is there
  }

  // --- ending ---------------------------------------------------------------------------------

  _end(error) {
    if (this.state === "ended" || this.state === "closed") return;
    this.error = error;
    clearTimeout(this._retryTimer);
    this._teardown();
    this._releaseMicrophone();
    this._setState("ended", { error: error ?? undefined });
  }

  _releaseMicrophone() {
    if (!this._ownsStream) return;
    for (const track of this.localStream?.getTracks() ?? []) track.stop();
    this._ownsStream = false;
  }

  _setState(state, details = {}) {
    const previous = this.state;
    this.state = state;
    this.emit("state", { state, previous, ...details });
  }
}

// --- helpers ----------------------------------------------------------------------------------

/** A refused POST as a RealtimeError: the gateway's (OpenAI-shaped) error code and message. */
function refusal(status, text) {
  let error = null;
  try {
    error = JSON.parse(text)?.error ?? null;
  } catch {
    // not JSON (a proxy's page): the status says it
  }
  const code = error?.code || (status === 401 ? "unauthorized" : `http_${status}`);
  const message = error?.message || `the gateway refused the call (HTTP ${status})`;
  return new RealtimeError(message, { code, status });
}

function asError(err, code) {
  return err instanceof RealtimeError ? err : new RealtimeError(String(err?.message ?? err), { code });
}

function detach(pc, channel) {
  pc.ontrack = pc.onconnectionstatechange = null;
  if (channel) channel.onmessage = channel.onclose = null;
}

function safeClose(pc) {
  try {
    pc.close();
  } catch {
    // already closed
  }
}
