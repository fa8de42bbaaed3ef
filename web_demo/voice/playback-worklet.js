// AudioWorklet: plays 24 kHz PCM16 answer audio through a small jitter buffer.
//
// - Chunks are written into one ring of source-rate samples, so playback runs
//   across chunk boundaries without a gap; it is resampled to the context's
//   rate with cubic (Catmull-Rom) interpolation as it is read.
// - Jitter buffer: playback starts (and restarts after an underrun) only once
//   `prebufferMs` of audio waits, or at once when the answer's audio is complete.
// - Bounded delay: when more than `maxBufferMs` waits, the oldest audio is
//   skipped (counted in `droppedSamples`), so the delay can never grow past it.
// - Every item's playback position (source samples, skips included) is tracked
//   so the page can truncate the item to what was heard.
//
// Messages in:  {type: "audio", itemId, pcm: ArrayBuffer}  (PCM16 LE, transferred)
//               {type: "end", itemId}    (the item's audio is complete: play out the tail)
//               {type: "stop"}           (barge-in: drop everything, report positions)
//               {type: "config", prebufferMs?, maxBufferMs?}
// Messages out: {type: "stats", ...counters, positions}  (every `statsMs`, and on change)
//               {type: "stopped", positions, bufferedMs}   (answer to "stop")

const SOURCE_RATE = 24000;

class PlaybackProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = options.processorOptions || {};
    this.sourceRate = opts.sourceRate || SOURCE_RATE;
    this.step = this.sourceRate / sampleRate;
    this.configure(opts.prebufferMs ?? 80, opts.maxBufferMs ?? 15000);
    this.statsEvery = Math.round((sampleRate * (opts.statsMs ?? 50)) / 1000);
    this.sinceStats = 0;
    this.write = 0; // absolute source samples written
    this.read = 0; // absolute source position being played (fractional)
    this.playing = false;
    this.draining = false; // the last item's audio is complete: play out without prebuffer
    this.items = []; // [{id, start, end, ended}] in absolute source samples, oldest first
    this.receivedBytes = 0;
    this.receivedChunks = 0;
    this.playedSamples = 0; // source samples actually rendered (not skipped)
    this.droppedSamples = 0;
    this.underruns = 0;
    this.port.onmessage = (e) => this.onMessage(e.data);
  }

  configure(prebufferMs, maxBufferMs) {
    this.prebuffer = Math.round((this.sourceRate * prebufferMs) / 1000);
    this.maxBuffer = Math.max(this.prebuffer + 1, Math.round((this.sourceRate * maxBufferMs) / 1000));
    const capacity = this.maxBuffer + 64;
    if (!this.ring || this.ring.length < capacity) {
      const ring = new Float32Array(capacity);
      this.ring = ring; // a reconfigure drops queued audio: it happens between answers
      this.write = this.read = 0;
    }
  }

  onMessage(msg) {
    switch (msg?.type) {
      case "audio":
        this.append(msg.itemId, new Int16Array(msg.pcm));
        this.receivedBytes += msg.pcm.byteLength;
        this.receivedChunks++;
        break;
      case "end":
        for (const item of this.items) if (item.id === msg.itemId) item.ended = true;
        this.draining = this.items.length > 0 && this.items[this.items.length - 1].ended;
        break;
      case "stop": {
        const positions = this.positions();
        const bufferedMs = ((this.write - this.read) * 1000) / this.sourceRate;
        this.read = this.write;
        this.playing = false;
        this.draining = false;
        this.items = [];
        this.port.postMessage({ type: "stopped", positions, bufferedMs });
        this.postStats();
        break;
      }
      case "config":
        this.configure(msg.prebufferMs ?? 80, msg.maxBufferMs ?? 15000);
        break;
      default:
        break;
    }
  }

  append(itemId, pcm) {
    const last = this.items[this.items.length - 1];
    if (!last || last.id !== itemId) this.items.push({ id: itemId, start: this.write, end: this.write, ended: false });
    const item = this.items[this.items.length - 1];
    const ring = this.ring;
    const n = pcm.length;
    for (let i = Math.max(0, n - this.maxBuffer); i < n; i++) ring[(this.write + i) % ring.length] = pcm[i] / 32768;
    this.write += n;
    item.end = this.write;
    this.draining = false;
    // Bounded delay: skip the oldest audio beyond maxBuffer.
    const excess = this.write - this.read - this.maxBuffer;
    if (excess > 0) {
      this.read += excess;
      this.droppedSamples += excess;
    }
  }

  sample(i) {
    if (i < 0 || i >= this.write || i < this.write - this.ring.length + 8) return 0;
    return this.ring[i % this.ring.length];
  }

  process(_inputs, outputs) {
    const output = outputs[0];
    const out = output[0];
    const n = out.length;
    for (let i = 0; i < n; i++) {
      const available = this.write - this.read;
      if (!this.playing) {
        if (available > 0 && (available >= this.prebuffer || this.draining)) this.playing = true;
        else {
          out[i] = 0;
          continue;
        }
      }
      if (available <= 0 || (available < 3 && !this.draining)) {
        // Out of audio: an underrun if the answer is not complete yet.
        this.playing = false;
        if (!this.draining) this.underruns++;
        else this.draining = false;
        out[i] = 0;
        continue;
      }
      const base = Math.floor(this.read);
      const f = this.read - base;
      const p0 = this.sample(base - 1);
      const p1 = this.sample(base);
      const p2 = this.sample(base + 1);
      const p3 = this.sample(base + 2);
      // Catmull-Rom
      out[i] = p1 + 0.5 * f * (p2 - p0 + f * (2 * p0 - 5 * p1 + 4 * p2 - p3 + f * (3 * (p1 - p2) + p3 - p0)));
      const next = Math.min(this.read + this.step, this.write);
      this.playedSamples += Math.floor(next) - base;
      this.read = next;
    }
    for (let c = 1; c < output.length; c++) output[c].set(out);
    // Forget items played to their end (keep the current one for truncation).
    while (this.items.length > 1 && this.items[0].end <= this.read) this.items.shift();
    this.sinceStats += n;
    if (this.sinceStats >= this.statsEvery) this.postStats();
    return true;
  }

  positions() {
    const positions = {};
    for (const item of this.items) {
      positions[item.id] = {
        playedSamples: Math.max(0, Math.min(item.end, Math.floor(this.read)) - item.start),
        receivedSamples: item.end - item.start,
      };
    }
    return positions;
  }

  postStats() {
    this.sinceStats = 0;
    this.port.postMessage({
      type: "stats",
      receivedBytes: this.receivedBytes,
      receivedChunks: this.receivedChunks,
      playedSamples: this.playedSamples,
      droppedSamples: this.droppedSamples,
      underruns: this.underruns,
      bufferedMs: ((this.write - this.read) * 1000) / this.sourceRate,
      playing: this.playing,
      positions: this.positions(),
    });
  }
}

registerProcessor("playback-processor", PlaybackProcessor);
