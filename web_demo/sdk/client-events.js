// The client events of the OpenAI Realtime API as methods, and waitFor: what every
// transport's client offers (RealtimeClient over a WebSocket, WebRTCClient over the
// "oai-events" data channel). A transport implements send(event).

import { Emitter } from "./emitter.js";
import { RealtimeError } from "./errors.js";

export class ClientEvents extends Emitter {
  /**
   * Send one client event (the transport's; queued while reconnecting).
   * @param {object} event
   */
  send(event) {
    throw new RealtimeError("send() is the transport's to implement", { code: "unsupported" });
  }

  /** @param {object} session the session.update `session` object */
  sessionUpdate(session) { this.send({ type: "session.update", session }); }
  commit() { this.send({ type: "input_audio_buffer.commit" }); }
  clearInput() { this.send({ type: "input_audio_buffer.clear" }); }
  /** @param {object} item @param {string} [previousItemId] */
  createItem(item, previousItemId) {
    this.send({ type: "conversation.item.create", item, ...(previousItemId !== undefined ? { previous_item_id: previousItemId } : {}) });
  }
  /** A user message with one input_text part (then call createResponse). @param {string} text */
  sendText(text) { this.createItem({ type: "message", role: "user", content: [{ type: "input_text", text }] }); }
  /** @param {string} itemId */
  retrieveItem(itemId) { this.send({ type: "conversation.item.retrieve", item_id: itemId }); }
  /**
   * Trim an assistant item to the audio the user heard.
   * @param {string} itemId @param {number} contentIndex @param {number} audioEndMs
   */
  truncate(itemId, contentIndex, audioEndMs) {
    this.send({ type: "conversation.item.truncate", item_id: itemId, content_index: contentIndex, audio_end_ms: Math.max(0, Math.round(audioEndMs)) });
  }
  /** @param {string} itemId */
  deleteItem(itemId) { this.send({ type: "conversation.item.delete", item_id: itemId }); }
  /** @param {object} [response] the response.create `response` object */
  createResponse(response) { this.send(response ? { type: "response.create", response } : { type: "response.create" }); }
  /** @param {string} [responseId] */
  cancelResponse(responseId) { this.send(responseId ? { type: "response.cancel", response_id: responseId } : { type: "response.cancel" }); }

  /**
   * Resolve with the next event of `type` (or matching `predicate`).
   * @param {string|((event: object) => boolean)} match
   * @param {{timeoutMs?: number}} [options]
   * @returns {Promise<object>}
   */
  waitFor(match, { timeoutMs = 30000 } = {}) {
    const test = typeof match === "string" ? (e) => e.type === match : match;
    return new Promise((resolve, reject) => {
      const off = this.on("event", (e) => {
        if (!test(e)) return;
        off();
        clearTimeout(timer);
        resolve(e);
      });
      const timer = setTimeout(() => {
        off();
        reject(new RealtimeError(`timed out waiting for ${typeof match === "string" ? match : "an event"}`, { code: "timeout" }));
      }, timeoutMs);
    });
  }
}
