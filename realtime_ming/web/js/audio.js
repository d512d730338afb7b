/**
 * Browser audio for the demo: one AudioContext with a microphone capture worklet (PCM16 frames at
 * the session rate) and a playback worklet (jitter buffer at the context rate). Mic processing is
 * the browser's own: echo cancellation, noise suppression and auto gain on (docs/protocol.md §8).
 */

const WORKLETS = ["./worklets/capture.js", "./worklets/playback.js"];

/** Why the microphone could not be opened: kind is "denied" | "missing" | "busy" | "unsupported". */
export class MicError extends Error {
  constructor(kind, message) {
    super(message);
    this.kind = kind;
  }
}

function micError(err) {
  switch (err && err.name) {
    case "NotAllowedError":
    case "SecurityError":
      return new MicError("denied", "Microphone access was denied. Allow it in the browser's site settings, or type instead.");
    case "NotFoundError":
    case "OverconstrainedError":
      return new MicError("missing", "No microphone was found. Plug one in, or type instead.");
    case "NotReadableError":
    case "AbortError":
      return new MicError("busy", "The microphone is in use by another application.");
    default:
      return new MicError("unsupported", `The microphone could not be opened (${err && err.message}).`);
  }
}

export class AudioIO {
  /**
   * @param {{onFrame: (pcm: Int16Array, rms: number, peak: number) => void,
   *          onPlayback: (msg: object) => void}} handlers
   *   onFrame gets each captured frame; onPlayback every stats / cleared message of the player.
   */
  constructor(handlers) {
    this.handlers = handlers;
    this.ctx = null;
    this.stream = null;
    this.capture = null;
    this.player = null;
    this._clearWaiters = [];
  }

  get sampleRate() {
    return this.ctx ? this.ctx.sampleRate : 0;
  }

  /**
   * Create the context and the player (call from a user gesture so audio may start). The server paces its audio
   * to `realtime_ming.output_lead_ms` (150 ms) of unplayed audio and stops sending the moment the user may be
   * interrupting it, so the reply falls silent within that lead plus this jitter buffer: the buffer starts at
   * `prebufferMs` and grows after underruns only up to `maxPrebufferMs` (docs/barge_in.md).
   */
  async open({ prebufferMs = 60, maxPrebufferMs = 100 } = {}) {
    if (!window.AudioContext || !window.AudioWorkletNode) {
      throw new MicError("unsupported", "This browser lacks AudioWorklet; use a current Chrome, Edge, Firefox or Safari.");
    }
    this.ctx = new AudioContext({ latencyHint: "interactive" });
    await Promise.all(WORKLETS.map((path) => this.ctx.audioWorklet.addModule(new URL(path, import.meta.url))));
    this.player = new AudioWorkletNode(this.ctx, "playback-processor", {
      numberOfInputs: 0,
      numberOfOutputs: 1,
      outputChannelCount: [1],
      processorOptions: { prebufferMs, maxPrebufferMs },
    });
    this.player.port.onmessage = (e) => this._onPlayerMessage(e.data);
    this.player.connect(this.ctx.destination);
    if (this.ctx.state === "suspended") await this.ctx.resume();
  }

  /** Open the microphone and stream `frameMs` PCM16 frames at `targetRate`; throws MicError. */
  async startMic({ targetRate, frameMs }) {
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
      throw new MicError("unsupported", "Microphone capture needs a secure page (https:// or localhost).");
    }
    try {
      this.stream = await navigator.mediaDevices.getUserMedia({
        audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true, channelCount: 1 },
      });
    } catch (err) {
      throw micError(err);
    }
    const source = this.ctx.createMediaStreamSource(this.stream);
    this.capture = new AudioWorkletNode(this.ctx, "capture-processor", {
      numberOfInputs: 1,
      numberOfOutputs: 1,
      outputChannelCount: [1],
      processorOptions: { targetRate, frameMs },
    });
    this.capture.port.onmessage = (e) => this.handlers.onFrame(new Int16Array(e.data.pcm), e.data.rms, e.data.peak);
    // The capture node writes silence; connecting it keeps it pulled by the rendering graph.
    const mute = new GainNode(this.ctx, { gain: 0 });
    source.connect(this.capture).connect(mute).connect(this.ctx.destination);
  }

  /** Queue PCM16 samples of assistant item `itemId` at `rate` Hz for playback. */
  play(itemId, pcm, rate) {
    if (!this.player || pcm.length === 0) return;
    const copy = pcm.slice(); // its own buffer, transferred to the worklet
    this.player.port.postMessage({ type: "push", itemId, rate, pcm: copy.buffer }, [copy.buffer]);
  }

  /** No more audio comes for `itemId`: play out whatever is queued. */
  endItem(itemId) {
    if (this.player) this.player.port.postMessage({ type: "end", itemId });
  }

  /** Stop playback at once (4 ms fade); resolves with the player's `cleared` message. */
  clear() {
    if (!this.player) return Promise.resolve({ items: [] });
    return new Promise((resolve) => {
      this._clearWaiters.push(resolve);
      this.player.port.postMessage({ type: "clear" });
    });
  }

  _onPlayerMessage(msg) {
    this.handlers.onPlayback(msg);
    if (msg.type === "cleared") {
      for (const resolve of this._clearWaiters.splice(0)) resolve(msg);
    }
  }

  /** Release the microphone and the context. */
  async close() {
    if (this.stream) for (const track of this.stream.getTracks()) track.stop();
    this.stream = null;
    for (const resolve of this._clearWaiters.splice(0)) resolve({ items: [] });
    const ctx = this.ctx;
    this.ctx = this.capture = this.player = null;
    if (ctx) await ctx.close();
  }
}
