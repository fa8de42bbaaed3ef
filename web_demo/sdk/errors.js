// The SDK's one error type: a stable `code` per failure, and what caused it where known.

/** An error with a stable `code` (and the close code or HTTP status that caused it). */
export class RealtimeError extends Error {
  /** @param {string} message @param {{code?: string, closeCode?: number, status?: number}} [info] */
  constructor(message, { code = "error", closeCode, status } = {}) {
    super(message);
    this.name = "RealtimeError";
    this.code = code;
    this.closeCode = closeCode;
    this.status = status;
  }
}
