/**
 * Microphone capture worklet: context-rate float audio in → PCM16 frames at the session rate out.
 * Each posted message is one frame of `frameMs` (Int16Array buffer, transferred) plus the RMS and
 * peak of the microphone signal over that frame, for the level meter.
 */
import { StreamResampler } from "./resampler.js";

class CaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const { targetRate = 24000, frameMs = 20 } = options.processorOptions || {};
    this.resampler = new StreamResampler(sampleRate, targetRate);
    this.frameSamples = Math.round((targetRate * frameMs) / 1000);
    this._newFrame();
  }

  _newFrame() {
    this.frame = new Int16Array(this.frameSamples);
    this.fill = 0;
    this.sumSquares = 0;
    this.numLevel = 0;
    this.peak = 0;
  }

  process(inputs, outputs) {
    const channel = inputs[0] && inputs[0][0];
    if (!channel) return true; // the source is not connected yet (or ended); keep the node alive
    for (let i = 0; i < channel.length; i++) {
      const s = channel[i];
      this.sumSquares += s * s;
      const a = s < 0 ? -s : s;
      if (a > this.peak) this.peak = a;
    }
    this.numLevel += channel.length;
    const out = this.resampler.push(channel);
    for (let i = 0; i < out.length; i++) {
      const v = Math.round(out[i] * 32768);
      this.frame[this.fill++] = v > 32767 ? 32767 : v < -32768 ? -32768 : v;
      if (this.fill === this.frameSamples) {
        const rms = Math.sqrt(this.sumSquares / Math.max(1, this.numLevel));
        this.port.postMessage({ pcm: this.frame.buffer, rms, peak: this.peak }, [this.frame.buffer]);
        this._newFrame();
      }
    }
    return true;
  }
}

registerProcessor("capture-processor", CaptureProcessor);
