// Streaming sample-rate conversion with a windowed-sinc kernel (Blackman window).
// Used by the capture worklet (device rate -> 24 kHz); runs in an AudioWorklet
// or on the main thread alike (no DOM, no allocation per sample).

export class Resampler {
  /**
   * @param {number} inRate input sample rate (Hz)
   * @param {number} outRate output sample rate (Hz)
   * @param {{halfTaps?: number, phases?: number}} [options] kernel half-width in zero crossings
   *   (16: about 90 dB stop band), and kernel table resolution per input sample
   */
  constructor(inRate, outRate, { halfTaps = 16, phases = 256 } = {}) {
    this.inRate = inRate;
    this.outRate = outRate;
    this.step = inRate / outRate; // input samples per output sample
    this.passthrough = inRate === outRate;
    // Downsampling: the cutoff moves down to the output's Nyquist (anti-aliasing).
    const fc = Math.min(1, outRate / inRate) * 0.97;
    this.support = Math.ceil(halfTaps / fc); // input samples each side of the centre
    this.phases = phases;
    const n = this.support * phases + 2;
    this.table = new Float32Array(n);
    for (let i = 0; i < n; i++) {
      const x = i / phases;
      const r = x / this.support;
      const w = r >= 1 ? 0 : 0.42 + 0.5 * Math.cos(Math.PI * r) + 0.08 * Math.cos(2 * Math.PI * r);
      const a = Math.PI * fc * x;
      this.table[i] = (x === 0 ? 1 : Math.sin(a) / a) * w;
    }
    this.buf = new Float32Array(4096);
    this.len = this.support; // leading zeros: output starts at once
    this.t = this.support; // position of the next output sample in buf
  }

  /**
   * Convert one block; returns the output samples available so far (a new array).
   * @param {Float32Array} input
   * @returns {Float32Array}
   */
  process(input) {
    if (this.passthrough) return input.slice();
    this._append(input);
    const { support, phases, table, step } = this;
    const buf = this.buf;
    const out = new Float32Array(Math.ceil(input.length / step) + 2);
    let count = 0;
    let t = this.t;
    while (Math.floor(t) + support < this.len && count < out.length) {
      const centre = Math.floor(t);
      let acc = 0;
      let wsum = 0;
      for (let k = centre - support + 1; k <= centre + support; k++) {
        const w = table[Math.round(Math.abs(t - k) * phases)];
        acc += buf[k] * w;
        wsum += w;
      }
      out[count++] = acc / wsum;
      t += step;
    }
    // Keep only what the next outputs still need.
    const keepFrom = Math.max(0, Math.floor(t) - support);
    if (keepFrom > 0) {
      buf.copyWithin(0, keepFrom, this.len);
      this.len -= keepFrom;
      t -= keepFrom;
    }
    this.t = t;
    return out.subarray(0, count);
  }

  _append(input) {
    if (this.len + input.length > this.buf.length) {
      const bigger = new Float32Array(Math.max(this.buf.length * 2, this.len + input.length));
      bigger.set(this.buf.subarray(0, this.len));
      this.buf = bigger;
    }
    this.buf.set(input, this.len);
    this.len += input.length;
  }
}

/**
 * Float samples in [-1, 1] as PCM16.
 * @param {Float32Array} input
 * @param {Int16Array} [out]
 * @returns {Int16Array}
 */
export function floatToPcm16(input, out = new Int16Array(input.length)) {
  for (let i = 0; i < input.length; i++) {
    const s = Math.max(-1, Math.min(1, input[i]));
    out[i] = s < 0 ? s * 0x8000 : s * 0x7fff;
  }
  return out;
}
