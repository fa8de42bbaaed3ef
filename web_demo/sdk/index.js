// The browser SDK in one import: `import { RealtimeClient, VideoClient } from "/sdk/index.js";`
export { BETA_SUBPROTOCOL, DEFAULT_RECONNECT, KEY_SUBPROTOCOL_PREFIX, REALTIME_SUBPROTOCOL, RealtimeClient, RealtimeError, defaultUrl, upgradeFailure } from "./realtime.js";
export { VideoClient, postInteraction } from "./video.js";
export { BINARY_SUBPROTOCOL, FrameError, base64ToBytes, bytesToBase64, decodeAudioFrame, encodeAudioFrame, encodeInputFrame, pcm16 } from "./frames.js";
export { Emitter } from "./emitter.js";
