// AudioWorklet: the microphone, resampled to 24 kHz PCM16, posted in 20 ms frames.
//
// Messages to the main thread: {type: "audio", pcm: ArrayBuffer (transferred), level}
// where level is the frame's RMS in [0, 1]. Messages from it: {type: "send", on: boolean}
// (false: keep listening but post nothing, e.g. push-to-talk released).

import { Resampler, floatToPcm16 } from "./resampler.js";

class CaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = options.processorOptions || {};
    this.rate = opts.targetRate || 24000;
    this.frame = Math.round((this.rate * (opts.frameMs || 20)) / 1000);
    this.resampler = new Resampler(sampleRate, this.rate);
    this.pending = new Float32Array(this.frame);
    this.fill = 0;
    this.sending = opts.sending !== false;
    this.port.onmessage = (e) => {
      if (e.data?.type === "send") this.sending = !!e.data.on;
    };
  }

  process(inputs) {
    const input = inputs[0];
    if (!input || input.length === 0) return true;
    let mono = input[0];
    if (input.length > 1) {
      mono = new Float32Array(input[0].length);
      for (const channel of input) for (let i = 0; i < mono.length; i++) mono[i] += channel[i] / input.length;
    }
    const samples = this.resampler.process(mono);
    for (let i = 0; i < samples.length; i++) {
      this.pending[this.fill++] = samples[i];
      if (this.fill === this.frame) this._post();
    }
    return true;
  }

  _post() {
    this.fill = 0;
    if (!this.sending) return;
    let sum = 0;
    for (let i = 0; i < this.frame; i++) sum += this.pending[i] * this.pending[i];
    const pcm = floatToPcm16(this.pending);
    this.port.postMessage({ type: "audio", pcm: pcm.buffer, level: Math.sqrt(sum / this.frame) }, [pcm.buffer]);
  }
}

registerProcessor("capture-processor", CaptureProcessor);
