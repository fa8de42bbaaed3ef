// Helpers shared by the demo pages: the credential field, status text, small DOM utilities.

/** @param {string} id @returns {HTMLElement} */
export const $ = (id) => {
  const el = document.getElementById(id);
  if (!el) throw new Error(`#${id} is missing from the page`);
  return el;
};

/**
 * The credential typed into the page: an API key or an ephemeral client secret
 * (`ek_...`). It lives in the input field only: never stored, never put in a URL.
 * Empty: the gateway runs without required auth (loopback, no keys).
 * @param {HTMLInputElement} input
 * @returns {{apiKey?: string, clientSecret?: string}}
 */
export function credentialFrom(input) {
  const value = input.value.trim();
  if (!value) return {};
  return value.startsWith("ek_") ? { clientSecret: value } : { apiKey: value };
}

/**
 * Open the credentials panel and focus its field (after an "unauthorized" refusal).
 * @param {HTMLDetailsElement} details
 * @param {HTMLInputElement} input
 */
export function askForCredential(details, input) {
  details.open = true;
  input.focus();
}

/**
 * A human sentence for an SDK error.
 * @param {{code?: string, message?: string, closeCode?: number}} err
 * @param {string} url
 */
export function explain(err, url) {
  switch (err?.code) {
    case "unauthorized":
      return "The gateway requires a credential: paste an API key, a client secret (ek_…) or a token under Credentials, then press Start.";
    case "refused":
      // A refused upgrade: the browser is not told whether it was the credential or this page's origin.
      return "The gateway refused the connection: it requires a credential (paste an API key, a client secret (ek_…) or a token under Credentials, then press Start), or it does not allow pages from this origin (its allowed_origins setting).";
    case "rate_limit_exceeded":
      return `A limit of your credential was reached: ${err.message}`;
    case "model_not_allowed":
      return `Your credential may not use this model: ${err.message}`;
    case "connect_failed":
    case "reconnect_failed":
      return `Cannot reach the gateway at ${url}. Is it running? (${err.message})`;
    case "no_credentials":
      return "The connection dropped and a client secret works only once: paste a new one (or an API key) and press Start.";
    case "session_expired":
      return "The session reached its maximum lifetime. Press Start for a new one.";
    case "server_busy":
      return "The gateway is busy. Try again in a moment.";
    default:
      return err?.message || String(err);
  }
}

/**
 * The page's status line and error box.
 * @param {HTMLElement} status  its `data-state` drives the style
 * @param {HTMLElement} error
 */
export function statusView(status, error) {
  return {
    /** @param {string} state @param {string} text */
    setStatus(state, text) {
      status.dataset.state = state;
      status.textContent = text;
    },
    /** @param {string} text */
    showError(text) {
      error.hidden = false;
      error.textContent = text;
    },
    hideError() {
      error.hidden = true;
      error.textContent = "";
    },
  };
}

/** @param {number} ms */
export const fmtMs = (ms) => (ms >= 10000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms)} ms`);

/** @param {number} bytes */
export function fmtBytes(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KiB`;
  return `${(bytes / 1024 / 1024).toFixed(2)} MiB`;
}
