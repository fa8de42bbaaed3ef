// connectRealtime: the best transport this page and gateway allow, with one API.
//
// WebRTC (WebRTCClient) where the page can hold a call (RTCPeerConnection and getUserMedia),
// else the WebSocket (RealtimeClient). With transport "auto" a first call that the gateway
// cannot take (501 webrtc_unavailable: no WebRTC there) or that never connects (UDP
// blocked on the way: code "call_failed") falls back to the WebSocket too. Both clients emit
// the same events and take the same client-event methods; over WebRTC the audio is the
// call's tracks, over the WebSocket it is appendAudio() and the audio delta events.
//
//   const { client, fallback } = await connectRealtime({ apiKey, wire: (c) => c.on("event", log) });
//   if (client.transport === "webrtc") audioEl.srcObject = client.remoteStream;

import { RealtimeClient } from "./realtime.js";
import { WebRTCClient, webrtcSupported } from "./webrtc.js";

const FALLBACK_CODES = new Set(["webrtc_unavailable", "webrtc_unsupported", "call_failed"]);

/**
 * @typedef {"auto"|"webrtc"|"websocket"} Transport
 * @typedef {object} Connected
 * @property {WebRTCClient|RealtimeClient} client connected (state "open")
 * @property {object} created its session.created
 * @property {import("./errors.js").RealtimeError|null} fallback why WebRTC was given up for the WebSocket (auto only)
 */

/**
 * Connect with `transport` ("auto": WebRTC, falling back to the WebSocket).
 * @param {object} [options] the options of WebRTCClient and RealtimeClient together (each
 *   takes its own), and:
 * @param {Transport} [options.transport] "auto" (default), "webrtc" or "websocket"
 * @param {(client: WebRTCClient|RealtimeClient) => void} [options.wire] called with each client
 *   before it connects (add listeners there: session.created is emitted while connecting)
 * @returns {Promise<Connected>}
 *   A client secret (`clientSecret`) is single use: a fallback after an offer that was answered
 *   needs `getClientSecret` (or `apiKey`) to connect again.
 */
export async function connectRealtime({ transport = "auto", wire, ...options } = {}) {
  const socket = async (fallback) => {
    const client = new RealtimeClient(socketOptions(options));
    wire?.(client);
    return { client, created: await client.connect(), fallback };
  };
  if (transport === "websocket" || (transport === "auto" && !webrtcSupported())) return socket(null);
  const call = new WebRTCClient(options);
  wire?.(call);
  try {
    return { client: call, created: await call.connect(), fallback: null };
  } catch (err) {
    if (transport !== "auto" || !FALLBACK_CODES.has(err?.code)) throw err;
    return socket(err);
  }
}

/** The WebSocket client's options from the common ones. */
function socketOptions(options) {
  const o = { ...options };
  if (!o.url && o.baseUrl) {
    const u = new URL("/v1/realtime", o.baseUrl);
    u.protocol = u.protocol === "https:" ? "wss:" : "ws:";
    o.url = u.toString();
  }
  const mint = o.getClientSecret;
  if (mint) o.getClientSecret = async () => {
    const minted = await mint();
    return typeof minted === "string" ? minted : minted.value; // the WebSocket needs the token alone
  };
  return o;
}
