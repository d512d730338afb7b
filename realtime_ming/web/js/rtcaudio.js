/**
 * The reply's audio in WebRTC mode: the server's track plays through an <audio> element (the browser's jitter
 * buffer and Opus decoder; the server paces it and clears it on a barge-in), and a capture worklet on the same
 * stream measures what was actually heard, 20 ms at a time, for the page's state and the tests.
 */

const HEARD_PEAK = 0.01; // a 20 ms frame above this carried speech (Opus silence is far below)

export class RtcAudio {
  /**
   * @param {AudioContext} ctx a context with the capture worklet loaded (AudioIO.open)
   * @param {(frame: {peak: number, rms: number, heard: boolean}) => void} onFrame
   */
  constructor(ctx, onFrame) {
    this.ctx = ctx;
    this.onFrame = onFrame;
    this.element = document.createElement("audio");
    this.element.autoplay = true;
    this.element.hidden = true;
    document.body.append(this.element);
    this.nodes = [];
  }

  /** Play the server's stream and start measuring it. */
  play(stream) {
    this.element.srcObject = stream;
    this.element.play().catch(() => {}); // autoplay: the Connect click was the user gesture
    const source = this.ctx.createMediaStreamSource(stream);
    const meter = new AudioWorkletNode(this.ctx, "capture-processor", {
      numberOfInputs: 1,
      numberOfOutputs: 1,
      outputChannelCount: [1],
      processorOptions: { targetRate: 24000, frameMs: 20 },
    });
    meter.port.onmessage = (e) => this.onFrame({ peak: e.data.peak, rms: e.data.rms, heard: e.data.peak > HEARD_PEAK });
    const mute = new GainNode(this.ctx, { gain: 0 }); // pulled by the graph, heard through the element only
    source.connect(meter).connect(mute).connect(this.ctx.destination);
    this.nodes.push(source, meter, mute);
  }

  close() {
    for (const node of this.nodes) node.disconnect();
    this.nodes = [];
    this.element.srcObject = null;
    this.element.remove();
  }
}
