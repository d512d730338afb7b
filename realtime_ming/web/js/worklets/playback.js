/**
 * Playback worklet: an adaptive jitter buffer for streamed PCM16 items, resampled to the context
 * rate. Starts after `prebufferMs` is queued (or the item has ended), fades in and out over a few
 * ms (no clicks on start, underrun or barge-in) and counts the source samples actually played per
 * item, which is what `conversation.item.truncate` needs. Messages in: push / end / clear;
 * out: stats (state, buffered, per-item played) and cleared (after a barge-in fade-out).
 */
import { StreamResampler } from "./resampler.js";

const IDLE = "idle"; // nothing queued
const BUFFERING = "buffering"; // waiting for the prebuffer to fill
const PLAYING = "playing";

class PlaybackProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const o = options.processorOptions || {};
    const ms = (v) => Math.round((v * sampleRate) / 1000);
    this.prebuffer = ms(o.prebufferMs ?? 60); // context samples queued before playback starts
    this.prebufferStep = ms(20); // grows by this much after each underrun…
    this.maxPrebuffer = ms(o.maxPrebufferMs ?? 240); // …up to this
    this.fadeStep = 1 / Math.max(1, ms(o.fadeMs ?? 4));
    this.tailLength = ms(2); // a dry buffer decays from its last sample over 2 ms
    this.statsInterval = ms(o.statsMs ?? 50);
    this.segments = []; // {item, data: Float32Array at the context rate, pos}
    this.buffered = 0; // context samples queued
    this.items = new Map(); // itemId -> {id, rate, received, producedOut, playedOut, ended}
    this.stream = null; // the item whose resampler is open
    this.resampler = null;
    this.state = IDLE;
    this.gain = 0;
    this.gainTarget = 0;
    this.isClearing = false;
    this.tailValue = 0;
    this.tailLeft = 0;
    this.underruns = 0;
    this.sinceStats = 0;
    this.port.onmessage = (e) => this._onMessage(e.data);
  }

  _onMessage(msg) {
    if (msg.type === "push") this._push(msg.itemId, msg.rate, new Int16Array(msg.pcm));
    else if (msg.type === "end") this._end(msg.itemId);
    else if (msg.type === "clear") this._clear();
  }

  _item(itemId, rate) {
    let item = this.items.get(itemId);
    if (!item) {
      item = { id: itemId, rate, received: 0, producedOut: 0, playedOut: 0, ended: false };
      this.items.set(itemId, item);
    }
    return item;
  }

  _push(itemId, rate, pcm) {
    const item = this._item(itemId, rate);
    if (item.ended) return;
    if (this.stream !== item || this.resampler.inRate !== rate) {
      this._closeStream();
      this.stream = item;
      this.resampler = new StreamResampler(rate, sampleRate);
    }
    const x = new Float32Array(pcm.length);
    for (let i = 0; i < pcm.length; i++) x[i] = pcm[i] / 32768;
    item.received += pcm.length;
    this._enqueue(item, this.resampler.push(x).slice());
  }

  _end(itemId) {
    const item = this.items.get(itemId);
    if (!item) return;
    if (this.stream === item) this._closeStream();
    item.ended = true;
  }

  _closeStream() {
    if (this.stream) this._enqueue(this.stream, this.resampler.flush());
    this.stream = null;
  }

  _enqueue(item, data) {
    if (data.length === 0) return;
    this.segments.push({ item, data, pos: 0 });
    this.buffered += data.length;
    item.producedOut += data.length;
  }

  _clear() {
    if (this.state === PLAYING && this.gain > 0) {
      this.gainTarget = 0; // fade out first; process() drops the queue once silent
      this.isClearing = true;
    } else {
      this._dropAll();
    }
  }

  _dropAll() {
    const items = this._itemStats();
    this.segments = [];
    this.buffered = 0;
    this.stream = null;
    this.resampler = null;
    this.items.clear();
    this.isClearing = false;
    this.gain = this.gainTarget = 0;
    this.state = IDLE;
    this.port.postMessage({ type: "cleared", items, ...this._summary() });
  }

  _itemStats() {
    return [...this.items.values()].map((it) => ({
      itemId: it.id,
      rate: it.rate,
      received: it.received,
      played: Math.min(it.received, Math.round((it.playedOut * it.rate) / sampleRate)),
      ended: it.ended,
      done: it.ended && this.stream !== it && it.playedOut >= it.producedOut,
    }));
  }

  _summary() {
    return {
      state: this.state,
      bufferedMs: (1000 * this.buffered) / sampleRate,
      underruns: this.underruns,
      prebufferMs: (1000 * this.prebuffer) / sampleRate,
    };
  }

  _postStats() {
    this.sinceStats = 0;
    const items = this._itemStats();
    this.port.postMessage({ type: "stats", items, ...this._summary() });
    for (const s of items) if (s.done) this.items.delete(s.itemId);
  }

  _setState(state) {
    if (state === this.state) return;
    this.state = state;
    this._postStats();
  }

  process(inputs, outputs) {
    const out = outputs[0][0];
    const n = out.length;
    if (this.state !== PLAYING && this.buffered > 0 && (this.buffered >= this.prebuffer || this.stream === null)) {
      this.gainTarget = 1; // fade in (from 0, or from where an interrupted fade left off)
      this._setState(PLAYING);
    }
    let i = 0;
    if (this.state === PLAYING) {
      while (i < n && this.segments.length > 0) {
        const seg = this.segments[0];
        const take = Math.min(n - i, seg.data.length - seg.pos);
        for (let k = 0; k < take; k++) {
          if (this.gain !== this.gainTarget) {
            this.gain = this.gain < this.gainTarget
              ? Math.min(this.gainTarget, this.gain + this.fadeStep)
              : Math.max(this.gainTarget, this.gain - this.fadeStep);
          }
          out[i + k] = seg.data[seg.pos + k] * this.gain;
        }
        seg.pos += take;
        seg.item.playedOut += take;
        this.buffered -= take;
        i += take;
        if (seg.pos === seg.data.length) this.segments.shift();
        if (this.isClearing && this.gain === 0) break;
      }
      if (this.isClearing && (this.gain === 0 || this.segments.length === 0)) {
        this.tailValue = i > 0 ? out[i - 1] : 0;
        this.tailLeft = this.tailLength;
        this._dropAll();
      } else if (i < n) {
        // Ran dry: decay from the last sample instead of stepping to zero (no click).
        this.tailValue = i > 0 ? out[i - 1] : 0;
        this.tailLeft = this.tailLength;
        this.gain = 0;
        if (this.stream === null) {
          this._setState(IDLE); // every queued item has ended: a natural end
        } else {
          this.underruns++;
          this.prebuffer = Math.min(this.maxPrebuffer, this.prebuffer + this.prebufferStep);
          this._setState(BUFFERING);
        }
      }
    }
    for (; i < n; i++) {
      out[i] = this.tailLeft > 0 ? (this.tailValue * --this.tailLeft) / this.tailLength : 0;
    }
    this.sinceStats += n;
    if (this.sinceStats >= this.statsInterval && (this.state !== IDLE || this.items.size > 0)) this._postStats();
    return true;
  }
}

registerProcessor("playback-processor", PlaybackProcessor);
