// The binary fast path's frame codec (subprotocol "omni-binary.v1") and the
// base64 helpers of the JSON path. All integers are big-endian.
//
//   client -> server (= input_audio_buffer.append)
//     u8 kind = 1 | u8 0 | u8 0 | u8 0 | audio bytes (session input format)
//
//   server -> client (= response.output_audio.delta)
//     u8 kind = 2 | u8 header length H (multiple of 4) | u16 content_index
//     | u64 server_event_seq | u8 item_id length L | L bytes item_id (ASCII)
//     | zero padding to H | audio bytes
//
// H is a multiple of 4, so the audio starts 4-byte aligned: `new Int16Array(buffer, H)`
// reads PCM16 without a copy.

/** The subprotocol that turns the binary fast path on. */
export const BINARY_SUBPROTOCOL = "omni-binary.v1";
export const KIND_INPUT_AUDIO = 1;
export const KIND_OUTPUT_AUDIO = 2;
const OUT_FIXED = 13; // kind, H, content_index (2), seq (8), L

/** A binary frame that does not follow the layout. */
export class FrameError extends Error {
  constructor(message) {
    super(message);
    this.name = "FrameError";
  }
}

/**
 * Input audio as one client -> server frame.
 * @param {ArrayBuffer|ArrayBufferView} audio bytes in the session's input format (PCM16 LE for audio/pcm)
 * @returns {ArrayBuffer}
 */
export function encodeInputFrame(audio) {
  const bytes = toBytes(audio);
  const frame = new Uint8Array(4 + bytes.byteLength);
  frame[0] = KIND_INPUT_AUDIO;
  frame.set(bytes, 4);
  return frame.buffer;
}

/**
 * @typedef {object} AudioDelta
 * @property {"response.output_audio.delta"|"response.audio.delta"} type
 * @property {number} server_event_seq
 * @property {string} item_id
 * @property {number} content_index
 * @property {Uint8Array} delta the audio bytes (a view into the frame, no copy)
 * @property {Int16Array} [audio] the same bytes as PCM16 samples (even lengths only)
 */

/**
 * A server -> client frame as the event a JSON audio delta would give,
 * with `delta` as bytes instead of base64.
 * @param {ArrayBuffer} buffer one binary WebSocket message
 * @param {string} [type] the event type to report (beta sessions: "response.audio.delta")
 * @returns {AudioDelta}
 */
export function decodeAudioFrame(buffer, type = "response.output_audio.delta") {
  if (!(buffer instanceof ArrayBuffer)) throw new FrameError("a binary frame must be an ArrayBuffer");
  if (buffer.byteLength < OUT_FIXED) {
    throw new FrameError(`binary frame of ${buffer.byteLength} bytes is shorter than its fixed header`);
  }
  const view = new DataView(buffer);
  const kind = view.getUint8(0);
  if (kind !== KIND_OUTPUT_AUDIO) throw new FrameError(`not an output audio frame (kind ${kind})`);
  const headerLength = view.getUint8(1);
  const contentIndex = view.getUint16(2);
  const seq = Number(view.getBigUint64(4));
  const idLength = view.getUint8(12);
  if (headerLength % 4 !== 0 || headerLength < OUT_FIXED + idLength || headerLength > buffer.byteLength) {
    throw new FrameError(`bad header length ${headerLength} (item id length ${idLength}, frame ${buffer.byteLength} bytes)`);
  }
  let itemId = "";
  const idBytes = new Uint8Array(buffer, OUT_FIXED, idLength);
  for (const b of idBytes) {
    if (b > 0x7f) throw new FrameError("item_id is not ASCII");
    itemId += String.fromCharCode(b);
  }
  const delta = new Uint8Array(buffer, headerLength);
  /** @type {AudioDelta} */
  const event = { type, server_event_seq: seq, item_id: itemId, content_index: contentIndex, delta };
  if (delta.byteLength % 2 === 0) event.audio = new Int16Array(buffer, headerLength, delta.byteLength / 2);
  return event;
}

/**
 * An output audio frame (for fakes and tests; the gateway makes the real ones).
 * @param {{itemId: string, contentIndex?: number, seq: number, audio: ArrayBuffer|ArrayBufferView}} args
 * @returns {ArrayBuffer}
 */
export function encodeAudioFrame({ itemId, contentIndex = 0, seq, audio }) {
  const bytes = toBytes(audio);
  const fixed = OUT_FIXED + itemId.length;
  const headerLength = (fixed + 3) & ~3;
  if (headerLength > 255) throw new FrameError("item_id too long for a binary frame header");
  const frame = new Uint8Array(headerLength + bytes.byteLength);
  const view = new DataView(frame.buffer);
  view.setUint8(0, KIND_OUTPUT_AUDIO);
  view.setUint8(1, headerLength);
  view.setUint16(2, contentIndex);
  view.setBigUint64(4, BigInt(seq));
  view.setUint8(12, itemId.length);
  for (let i = 0; i < itemId.length; i++) frame[OUT_FIXED + i] = itemId.charCodeAt(i);
  frame.set(bytes, headerLength);
  return frame.buffer;
}

/**
 * Base64 text to bytes (the JSON path's `audio` and `delta` fields).
 * @param {string} text
 * @returns {Uint8Array}
 */
export function base64ToBytes(text) {
  const raw = atob(text);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}

/**
 * Bytes to base64 text.
 * @param {ArrayBuffer|ArrayBufferView} data
 * @returns {string}
 */
export function bytesToBase64(data) {
  const bytes = toBytes(data);
  let raw = "";
  const step = 0x8000; // String.fromCharCode takes a bounded number of arguments
  for (let i = 0; i < bytes.length; i += step) raw += String.fromCharCode.apply(null, bytes.subarray(i, i + step));
  return btoa(raw);
}

/**
 * PCM16 little-endian bytes as samples. Copies only when the bytes are not 2-aligned.
 * @param {Uint8Array} bytes
 * @returns {Int16Array}
 */
export function pcm16(bytes) {
  if (bytes.byteOffset % 2 === 0) return new Int16Array(bytes.buffer, bytes.byteOffset, bytes.byteLength >> 1);
  return new Int16Array(bytes.slice(0, bytes.byteLength & ~1).buffer);
}

/** @param {ArrayBuffer|ArrayBufferView} data */
function toBytes(data) {
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  throw new TypeError("audio must be an ArrayBuffer or a typed array");
}
