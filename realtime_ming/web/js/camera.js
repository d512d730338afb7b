/**
 * The demo's camera: a live preview, and while the user talks one downscaled JPEG frame per
 * `intervalMs` (GA `input_image` items the server adds to the conversation before the committed
 * speech, so the reply sees what the user showed while speaking). Frames are small on purpose:
 * `maxSide` pixels on the longer side (a few hundred image tokens each), JPEG quality 0.7.
 */
export const CAMERA_INTERVAL_MS = 1000; // 1 frame per second while the user speaks
export const CAMERA_MAX_SIDE = 320;

export class CameraStreamer {
  /**
   * @param {HTMLVideoElement} preview where the camera is shown (muted, inline)
   * @param {(dataUrl: string) => void} onFrame called with each captured frame
   */
  constructor(preview, onFrame, { intervalMs = CAMERA_INTERVAL_MS, maxSide = CAMERA_MAX_SIDE } = {}) {
    this.preview = preview;
    this.onFrame = onFrame;
    this.intervalMs = intervalMs;
    this.maxSide = maxSide;
    this.stream = null;
    this.timer = null;
    this.canvas = document.createElement("canvas");
  }

  get isOn() {
    return this.stream !== null;
  }

  /** Ask for the camera and show it; throws (NotAllowedError, NotFoundError…) when it cannot. */
  async start() {
    if (this.stream) return;
    this.stream = await navigator.mediaDevices.getUserMedia({ video: { width: { ideal: 640 }, height: { ideal: 480 } }, audio: false });
    this.preview.srcObject = this.stream;
    this.preview.hidden = false;
    await this.preview.play().catch(() => {}); // autoplay of a muted inline video is allowed
  }

  stop() {
    this.pause();
    if (this.stream) for (const track of this.stream.getTracks()) track.stop();
    this.stream = null;
    this.preview.srcObject = null;
    this.preview.hidden = true;
  }

  /** Send a frame now and then every `intervalMs` until `pause()` (no-op while off or already sending). */
  resume() {
    if (!this.stream || this.timer !== null) return;
    this._capture();
    this.timer = setInterval(() => this._capture(), this.intervalMs);
  }

  pause() {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  _capture() {
    const video = this.preview;
    if (!video.videoWidth || !video.videoHeight) return; // no frame decoded yet
    const scale = Math.min(1, this.maxSide / Math.max(video.videoWidth, video.videoHeight));
    this.canvas.width = Math.max(32, Math.round(video.videoWidth * scale));
    this.canvas.height = Math.max(32, Math.round(video.videoHeight * scale));
    this.canvas.getContext("2d").drawImage(video, 0, 0, this.canvas.width, this.canvas.height);
    this.onFrame(this.canvas.toDataURL("image/jpeg", 0.7));
  }
}
