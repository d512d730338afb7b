/**
 * Streaming windowed-sinc resampler for mono float32 audio, shared by the capture and playback
 * worklets (and importable on the main thread). Chunk boundaries are seamless: the filter keeps
 * its own history, so pushing a signal in pieces gives the same output as pushing it whole.
 */

const PHASES = 128; // kernel table resolution: samples per input-sample step (linear interpolation between)
const BLACKMAN = (x) => 0.42 + 0.5 * Math.cos(Math.PI * x) + 0.08 * Math.cos(2 * Math.PI * x);

/** Low-pass kernel h(d) = fc·sinc(fc·d)·blackman(d/half), d in input samples; DC gain 1. */
function kernelTable(cutoff, half) {
  const n = half * PHASES + 2;
  const table = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    const d = i / PHASES;
    if (d >= half) break;
    const x = Math.PI * cutoff * d;
    table[i] = cutoff * (d === 0 ? 1 : Math.sin(x) / x) * BLACKMAN(d / half);
  }
  return table;
}

export class StreamResampler {
  /**
   * @param {number} inRate input sample rate (Hz)
   * @param {number} outRate output sample rate (Hz)
   * @param {number} zeroCrossings kernel half-width in zero crossings of the cutoff sinc
   */
  constructor(inRate, outRate, zeroCrossings = 16) {
    this.inRate = inRate;
    this.outRate = outRate;
    this.isPassthrough = inRate === outRate;
    this.step = inRate / outRate; // input samples per output sample
    const ratio = Math.min(1, outRate / inRate);
    const cutoff = 0.94 * ratio; // fraction of the input Nyquist; 6 % transition band below the lower Nyquist
    this.half = Math.ceil(zeroCrossings / ratio); // taps each side, in input samples
    this.table = kernelTable(cutoff, this.half);
    this.reset();
  }

  /** Forget all history (a new stream starts at the next push). */
  reset() {
    // buf[j] holds input sample (base + j); the stream is primed with `half` zeros before index 0.
    this.buf = new Float32Array(4096);
    this.len = this.half;
    this.base = -this.half;
    this.numOut = 0; // outputs produced; output m sits at input time m·step
    this.numIn = 0; // real input samples pushed
    this.out = new Float32Array(1024);
  }

  /** Resample the next piece; returns a view that stays valid until the next call. */
  push(input) {
    if (this.isPassthrough) return input;
    this._append(input);
    this.numIn += input.length;
    return this._produce(Infinity);
  }

  /** End of stream: the outputs that still fall inside the input, then reset. */
  flush() {
    if (this.isPassthrough) return new Float32Array(0);
    const end = this.numIn;
    this._append(new Float32Array(this.half + 1));
    const out = this._produce(end).slice();
    this.reset();
    return out;
  }

  _append(input) {
    const need = this.len + input.length;
    if (need > this.buf.length) {
      const grown = new Float32Array(Math.max(need, this.buf.length * 2));
      grown.set(this.buf.subarray(0, this.len));
      this.buf = grown;
    }
    this.buf.set(input, this.len);
    this.len = need;
  }

  _produce(limit) {
    const { half, table, buf, step } = this;
    const available = this.base + this.len; // one past the newest input index
    const maxOut = Math.ceil((available - half) / step) - this.numOut + 1;
    if (maxOut > this.out.length) this.out = new Float32Array(maxOut * 2);
    const out = this.out;
    let count = 0;
    for (;;) {
      const t = this.numOut * step;
      const i0 = Math.floor(t);
      if (i0 + half >= available || t >= limit) break;
      let acc = 0;
      for (let k = i0 - half + 1; k <= i0 + half; k++) {
        const pos = Math.abs(t - k) * PHASES;
        const j = pos | 0;
        const w = table[j] + (table[j + 1] - table[j]) * (pos - j);
        acc += buf[k - this.base] * w;
      }
      out[count++] = acc;
      this.numOut++;
    }
    // Drop input no future output can reach (the oldest tap of the next output is floor(t) - half + 1).
    const keepFrom = Math.floor(this.numOut * step) - half + 1;
    const drop = keepFrom - this.base;
    if (drop > 0 && drop <= this.len) {
      buf.copyWithin(0, drop, this.len);
      this.len -= drop;
      this.base = keepFrom;
    }
    return out.subarray(0, count);
  }
}
