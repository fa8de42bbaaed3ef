// The browser SDK in one import: `import { connectRealtime, RealtimeClient, WebRTCClient, VideoClient } from "/sdk/index.js";`
export { BETA_SUBPROTOCOL, DEFAULT_RECONNECT, KEY_SUBPROTOCOL_PREFIX, REALTIME_SUBPROTOCOL, RealtimeClient, RealtimeError, defaultUrl, upgradeFailure } from "./realtime.js";
export { EVENTS_CHANNEL, RESUME_HEADER, WebRTCClient, webrtcSupported } from "./webrtc.js";
export { connectRealtime } from "./connect.js";
export { LIVE_PATH, LiveClient } from "./live.js";
export { ClientEvents } from "./client-events.js";
export { VideoClient, postInteraction } from "./video.js";
export { BINARY_SUBPROTOCOL, FrameError, base64ToBytes, bytesToBase64, decodeAudioFrame, encodeAudioFrame, encodeInputFrame, pcm16 } from "./frames.js";
export { Emitter } from "./emitter.js";
