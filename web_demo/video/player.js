// Players for streamed video chunks: fragmented MP4 through Media Source
// Extensions, and JPEG frames drawn on a canvas.

/**
 * Plays fMP4 chunks (the first carries the init segment) in a <video> element.
 *
 * - Buffers are appended strictly one after another (the next waits for
 *   `updateend`).
 * - The SourceBuffer runs in "sequence" mode: each fragment is placed right
 *   after the previous one, so chunks the server dropped for a slow client leave
 *   no hole in the timeline that playback would stall on.
 * - Live edge: when playback falls more than `maxLagS` behind the newest frame
 *   it jumps forward to `cushionS` before it (a cushion against the next chunk
 *   arriving late); media older than `keepS` behind the playhead is removed.
 */
export class MsePlayer {
  /**
   * @param {HTMLVideoElement} video
   * @param {{maxLagS?: number, cushionS?: number, keepS?: number}} [options]
   */
  constructor(video, { maxLagS = 2.5, cushionS = 1, keepS = 20 } = {}) {
    this.video = video;
    this.maxLagS = maxLagS;
    this.cushionS = Math.min(cushionS, maxLagS);
    this.keepS = keepS;
    this.mediaSource = null;
    this.buffer = null;
    this.queue = [];
    this.mime = null;
    this.appended = 0;
    this.error = null;
    this.jumps = 0;
    this._ended = false;
    this._objectUrl = null;
  }

  /**
   * Whether this browser can play `mime` through MSE.
   * @param {string} mime e.g. 'video/mp4; codecs="avc1.42C00C"'
   */
  static supports(mime) {
    return typeof MediaSource !== "undefined" && MediaSource.isTypeSupported(mime);
  }

  /** @param {string} mime the chunk metadata's mime_type */
  async open(mime) {
    if (!MsePlayer.supports(mime)) throw new Error(`This browser cannot play ${mime} through Media Source Extensions.`);
    this.mime = mime;
    const ms = new MediaSource();
    this.mediaSource = ms;
    this._objectUrl = URL.createObjectURL(ms);
    this.video.src = this._objectUrl;
    await new Promise((resolve) => ms.addEventListener("sourceopen", resolve, { once: true }));
    const sb = ms.addSourceBuffer(mime);
    sb.mode = "sequence";
    sb.addEventListener("updateend", () => {
      this._followLiveEdge();
      if (this.video.paused && this.appended === 1) this.video.play().catch(() => {});
      this._pump();
    });
    sb.addEventListener("error", () => {
      this.error = "the browser could not decode a chunk";
    });
    this.buffer = sb;
    this._pump();
  }

  /** Queue one chunk's bytes. @param {ArrayBuffer} data */
  append(data) {
    this.queue.push(data);
    this._pump();
  }

  /** No more chunks: end the stream once the queue is appended. */
  end() {
    this._ended = true;
    this._pump();
  }

  /** Seconds buffered ahead of the playhead. */
  get aheadS() {
    const b = this.buffer?.buffered;
    if (!b || b.length === 0) return 0;
    return Math.max(0, b.end(b.length - 1) - this.video.currentTime);
  }

  _pump() {
    const sb = this.buffer;
    if (!sb || sb.updating || this.mediaSource.readyState !== "open") return;
    if (this._trim()) return;
    const next = this.queue.shift();
    if (next) {
      try {
        sb.appendBuffer(next);
        this.appended++;
      } catch (err) {
        if (err.name === "QuotaExceededError") {
          this.queue.unshift(next); // make room and retry after the removal
          const t = this.video.currentTime;
          if (t > 1) sb.remove(0, t - 1);
        } else {
          this.error = err.message;
        }
      }
      return;
    }
    if (this._ended && this.mediaSource.readyState === "open") this.mediaSource.endOfStream();
  }

  /** Drop media far behind the playhead; true when a removal started. */
  _trim() {
    const b = this.buffer.buffered;
    const t = this.video.currentTime;
    if (b.length && t - b.start(0) > this.keepS + 5) {
      this.buffer.remove(0, t - this.keepS);
      return true;
    }
    return false;
  }

  _followLiveEdge() {
    const b = this.buffer.buffered;
    if (!b.length) return;
    const end = b.end(b.length - 1);
    if (end - this.video.currentTime > this.maxLagS) {
      this.video.currentTime = Math.max(b.start(b.length - 1), end - this.cushionS);
      this.jumps++;
    }
  }

  /** Detach from the element. */
  close() {
    this.queue = [];
    try {
      if (this.mediaSource?.readyState === "open") this.mediaSource.endOfStream();
    } catch {
      // already ended
    }
    this.video.removeAttribute("src");
    this.video.load();
    if (this._objectUrl) URL.revokeObjectURL(this._objectUrl);
  }
}

/**
 * Draws JPEG frames on a canvas at the stream's frame rate. A backlog beyond
 * `maxLagFrames` is skipped so the picture stays live.
 */
export class JpegPlayer {
  /**
   * @param {HTMLCanvasElement} canvas
   * @param {{fps: number, maxLagFrames?: number}} options
   */
  constructor(canvas, { fps, maxLagFrames = 24 }) {
    this.canvas = canvas;
    this.ctx = canvas.getContext("2d");
    this.fps = fps;
    this.maxLagFrames = maxLagFrames;
    this.frames = [];
    this.drawn = 0;
    this.skipped = 0;
    this._timer = null;
    this._busy = false;
  }

  /** Queue a chunk's frames. @param {Uint8Array[]} frames one JPEG each */
  push(frames) {
    this.frames.push(...frames);
    const excess = this.frames.length - this.maxLagFrames;
    if (excess > 0) {
      this.frames.splice(0, excess);
      this.skipped += excess;
    }
    if (!this._timer) this._timer = setInterval(() => this._tick(), 1000 / this.fps);
  }

  async _tick() {
    if (this._busy) return;
    const frame = this.frames.shift();
    if (!frame) return;
    this._busy = true;
    try {
      const bitmap = await createImageBitmap(new Blob([frame], { type: "image/jpeg" }));
      if (this.canvas.width !== bitmap.width || this.canvas.height !== bitmap.height) {
        this.canvas.width = bitmap.width;
        this.canvas.height = bitmap.height;
      }
      this.ctx.drawImage(bitmap, 0, 0);
      bitmap.close();
      this.drawn++;
    } finally {
      this._busy = false;
    }
  }

  close() {
    clearInterval(this._timer);
    this._timer = null;
    this.frames = [];
  }
}
