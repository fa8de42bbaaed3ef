// The page's audio: microphone capture and answer playback, each in an AudioWorklet
// (the WebSocket path), and level meters on streams (a WebRTC call's tracks).

const here = (path) => new URL(path, import.meta.url).href;

/**
 * Why this page cannot use audio here: the microphone (getUserMedia) and AudioWorklets exist
 * only in a secure context (https://, or http://localhost and 127.0.0.1 on this machine).
 * null in a secure context.
 */
export function insecureContext() {
  if (window.isSecureContext) return null;
  const port = location.port ? `:${location.port}` : "";
  return (
    `The microphone needs a secure context, and ${location.origin} is not one. Open this page over https:// ` +
    `(TLS in front of the gateway), or as http://localhost${port} or http://127.0.0.1${port} on the machine that ` +
    `runs the gateway. From another machine, forward the port over SSH (ssh -L ${location.port || 80}:127.0.0.1:` +
    `${location.port || 80} the-gateway-host) and open http://127.0.0.1${port}/ on yours.`
  );
}

/** A microphone that cannot be opened, with a message a person can act on. */
export class MicrophoneError extends Error {
  /** @param {string} message @param {string} code "denied" | "not_found" | "busy" | "insecure" | "unknown" */
  constructor(message, code) {
    super(message);
    this.name = "MicrophoneError";
    this.code = code;
  }
}

/**
 * One AudioContext at the device's rate: the capture worklet resamples the
 * microphone to 24 kHz PCM16, the playback worklet plays 24 kHz PCM16 answers.
 */
export class AudioIO {
  /**
   * Create inside a user gesture (a click), so that the context may start.
   * @param {{prebufferMs?: number, maxBufferMs?: number, onStats?: (stats: object) => void}} [options]
   */
  static async create({ prebufferMs = 80, maxBufferMs = 15000, onStats } = {}) {
    const insecure = insecureContext(); // else AudioWorklet is undefined and addModule throws a TypeError
    if (insecure) throw new MicrophoneError(insecure, "insecure");
    const ctx = new AudioContext({ latencyHint: "interactive" });
    await ctx.audioWorklet.addModule(here("./capture-worklet.js"));
    await ctx.audioWorklet.addModule(here("./playback-worklet.js"));
    const player = new AudioWorkletNode(ctx, "playback-processor", {
      numberOfInputs: 0,
      numberOfOutputs: 1,
      outputChannelCount: [1],
      processorOptions: { sourceRate: 24000, prebufferMs, maxBufferMs },
    });
    player.connect(ctx.destination);
    if (ctx.state !== "running") await ctx.resume();
    return new AudioIO(ctx, player, onStats);
  }

  constructor(ctx, player, onStats) {
    this.ctx = ctx;
    this.player = player;
    this.stream = null;
    this.capture = null;
    this.sending = true;
    this.meters = new Set();
    /** The playback worklet's latest counters (receivedBytes, playedSamples, underruns, ...). */
    this.stats = { receivedBytes: 0, receivedChunks: 0, playedSamples: 0, droppedSamples: 0, underruns: 0, bufferedMs: 0, playing: false, positions: {} };
    this._onStats = onStats;
    this._stopWaiters = [];
    player.port.onmessage = (e) => {
      const msg = e.data;
      if (msg.type === "stats") {
        this.stats = msg;
        this._onStats?.(msg);
      } else if (msg.type === "stopped") {
        for (const resolve of this._stopWaiters.splice(0)) resolve(msg);
      }
    };
  }

  /**
   * Ask for the microphone (MicrophoneError when it cannot be had).
   * @param {{echoCancellation?: boolean}} [options]
   * @returns {Promise<MediaStream>}
   */
  async openMicrophone({ echoCancellation = true } = {}) {
    if (!navigator.mediaDevices?.getUserMedia) {
      throw new MicrophoneError(insecureContext() ?? "This browser gives this page no microphone.", "insecure");
    }
    try {
      this.stream = await navigator.mediaDevices.getUserMedia({
        audio: { channelCount: 1, echoCancellation, noiseSuppression: echoCancellation, autoGainControl: echoCancellation },
      });
    } catch (err) {
      throw micError(err);
    }
    return this.stream;
  }

  /**
   * Stream the microphone as 20 ms PCM16 frames at 24 kHz to `onAudio` (the WebSocket path).
   * @param {(pcm: ArrayBuffer, level: number) => void} onAudio
   * @param {{echoCancellation?: boolean}} [options] frames are posted while `setSending(true)` holds (the default)
   */
  async startMicrophone(onAudio, options) {
    const stream = this.stream ?? await this.openMicrophone(options);
    const source = this.ctx.createMediaStreamSource(stream);
    const capture = new AudioWorkletNode(this.ctx, "capture-processor", {
      numberOfInputs: 1,
      numberOfOutputs: 1,
      outputChannelCount: [1],
      processorOptions: { targetRate: 24000, frameMs: 20, sending: this.sending },
    });
    capture.port.onmessage = (e) => {
      if (e.data.type === "audio") onAudio(e.data.pcm, e.data.level);
    };
    source.connect(capture);
    // Connected (silently) so that the graph pulls it on every render quantum.
    const mute = new GainNode(this.ctx, { gain: 0 });
    capture.connect(mute).connect(this.ctx.destination);
    this.capture = capture;
  }

  /**
   * A level meter on a stream (the microphone, or a WebRTC call's answer track) or on a node
   * of this context (the player: what the WebSocket path plays), read every 20 ms; it adds
   * nothing to what the speakers play.
   * @param {MediaStream | AudioNode} source
   * @param {(level: LevelStats) => void} [onLevel]
   */
  meter(source, onLevel) {
    const m = new LevelMeter(this.ctx, source, onLevel);
    this.meters.add(m);
    return m;
  }

  /**
   * Post captured frames (true) or keep them (false: push-to-talk released).
   * Remembered when called before the microphone is open.
   * @param {boolean} on
   */
  setSending(on) {
    this.sending = on;
    this.capture?.port.postMessage({ type: "send", on });
  }

  /**
   * Queue answer audio for playback.
   * @param {string} itemId the assistant item the audio belongs to
   * @param {Int16Array} samples PCM16 at 24 kHz (copied: the frame it views is not transferred)
   */
  play(itemId, samples) {
    const copy = samples.slice();
    this.player.port.postMessage({ type: "audio", itemId, pcm: copy.buffer }, [copy.buffer]);
  }

  /** The item's audio is complete: play out its tail without waiting for the jitter buffer. @param {string} itemId */
  end(itemId) {
    this.player.port.postMessage({ type: "end", itemId });
  }

  /**
   * Stop playback now and drop what waits.
   * @returns {Promise<{positions: Object<string, {playedSamples: number, receivedSamples: number}>, bufferedMs: number}>}
   */
  stopPlayback() {
    return new Promise((resolve) => {
      this._stopWaiters.push(resolve);
      this.player.port.postMessage({ type: "stop" });
    });
  }

  /** Release the microphone and the audio device. */
  async close() {
    for (const m of this.meters) m.stop();
    this.meters.clear();
    for (const track of this.stream?.getTracks() ?? []) track.stop();
    this.stream = null;
    this.capture?.disconnect();
    this.player.disconnect();
    await this.ctx.close().catch(() => {});
  }
}

/**
 * @typedef {object} LevelStats
 * @property {number} level RMS of the latest window, in [0, 1]
 * @property {number} peak the highest level so far
 * @property {number} activeMs how long the level was above `threshold`
 * @property {number} energy the sum of level^2 * seconds (audio energy, as WebRTC's stats count it)
 * @property {number} lastActiveAt performance.now() of the latest window above threshold (0: none yet)
 * @property {number[][]} bursts [from, to] (performance.now()) of the stretches above threshold, the latest 200
 * @property {number} samples windows read
 */

/**
 * The level of a MediaStream (a WebRTC track's audio) or of an AudioNode's output (the
 * player), through an AnalyserNode: the audio as the page plays it, measured in the page.
 */
export class LevelMeter {
  /**
   * @param {AudioContext} ctx
   * @param {MediaStream | AudioNode} source
   * @param {(stats: LevelStats) => void} [onLevel]
   * @param {{intervalMs?: number, threshold?: number}} [options]
   */
  constructor(ctx, source, onLevel, { intervalMs = 20, threshold = 0.01 } = {}) {
    this.ownSource = source instanceof MediaStream; // a node of the page's graph is tapped, never disconnected
    this.source = this.ownSource ? ctx.createMediaStreamSource(source) : source;
    this.analyser = new AnalyserNode(ctx, { fftSize: 1024 });
    this.source.connect(this.analyser);
    this.threshold = threshold;
    /** @type {LevelStats} */
    this.stats = { level: 0, peak: 0, activeMs: 0, energy: 0, lastActiveAt: 0, bursts: [], samples: 0 };
    const buf = new Float32Array(this.analyser.fftSize);
    let last = performance.now();
    // A timer, not requestAnimationFrame: it keeps measuring in a background tab.
    this._timer = setInterval(() => {
      const now = performance.now();
      const dt = (now - last) / 1000;
      last = now;
      this.analyser.getFloatTimeDomainData(buf);
      let sum = 0;
      for (let i = 0; i < buf.length; i++) sum += buf[i] * buf[i];
      const level = Math.sqrt(sum / buf.length);
      const s = this.stats;
      s.level = level;
      s.peak = Math.max(s.peak, level);
      s.energy += level * level * dt;
      s.samples++;
      if (level > threshold) {
        s.activeMs += dt * 1000;
        const burst = s.bursts[s.bursts.length - 1];
        // A pause shorter than ~3 windows is within one stretch of speech.
        if (burst && now - burst[1] <= 3 * intervalMs + 10) burst[1] = now;
        else s.bursts.push([now, now]);
        if (s.bursts.length > 200) s.bursts.shift();
        s.lastActiveAt = now;
      }
      onLevel?.(s);
    }, intervalMs);
  }

  stop() {
    clearInterval(this._timer);
    if (this.ownSource) this.source.disconnect();
    else this.source.disconnect(this.analyser);
  }
}

function micError(err) {
  switch (err?.name) {
    case "NotAllowedError":
    case "SecurityError":
      return new MicrophoneError(
        "Microphone access was denied. Allow the microphone for this site (the icon in the address bar), then press Start again.",
        "denied",
      );
    case "NotFoundError":
    case "OverconstrainedError":
      return new MicrophoneError("No microphone was found. Plug one in, then press Start again.", "not_found");
    case "NotReadableError":
    case "AbortError":
      return new MicrophoneError("The microphone is busy or failed to start (another application may hold it).", "busy");
    default:
      return new MicrophoneError(`The microphone could not be opened: ${err?.message ?? err}`, "unknown");
  }
}
