/**
 * "Clone my voice": record a few seconds from the microphone, register them with
 * POST /v1/realtime/voices (16-bit WAV + the transcript the user read), and add the new voice
 * (`voice_…`) to the voice picker, selected. Self-contained: the page wires it with `setupVoiceClone`.
 */

const RECORD_SECONDS = 6;

/** Float32 mono samples → a 16-bit PCM WAV Blob. */
function wavBlob(samples, rate) {
  const view = new DataView(new ArrayBuffer(44 + samples.length * 2));
  const text = (offset, s) => [...s].forEach((c, i) => view.setUint8(offset + i, c.charCodeAt(0)));
  text(0, "RIFF"); view.setUint32(4, 36 + samples.length * 2, true); text(8, "WAVE");
  text(12, "fmt "); view.setUint32(16, 16, true); view.setUint16(20, 1, true); view.setUint16(22, 1, true);
  view.setUint32(24, rate, true); view.setUint32(28, rate * 2, true); view.setUint16(32, 2, true);
  view.setUint16(34, 16, true); text(36, "data"); view.setUint32(40, samples.length * 2, true);
  samples.forEach((x, i) => view.setInt16(44 + i * 2, Math.max(-1, Math.min(1, x)) * 0x7fff, true));
  return new Blob([view], { type: "audio/wav" });
}

/** Record `seconds` of microphone audio → { samples: Float32Array, rate }. */
async function record(seconds) {
  const stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1, echoCancellation: true } });
  const ctx = new AudioContext();
  try {
    const source = ctx.createMediaStreamSource(stream);
    const tap = ctx.createScriptProcessor(4096, 1, 1);
    const chunks = [];
    tap.onaudioprocess = (e) => chunks.push(new Float32Array(e.inputBuffer.getChannelData(0)));
    source.connect(tap);
    tap.connect(ctx.destination);
    await new Promise((done) => setTimeout(done, seconds * 1000));
    source.disconnect(); tap.disconnect();
    const samples = new Float32Array(chunks.reduce((n, c) => n + c.length, 0));
    chunks.reduce((at, c) => (samples.set(c, at), at + c.length), 0);
    return { samples, rate: ctx.sampleRate };
  } finally {
    stream.getTracks().forEach((t) => t.stop());
    ctx.close();
  }
}

/** Wire the button: `voicesUrl()` gives the endpoint, `apiKey()` the key, `onVoice(id, name)` takes the result. */
export function setupVoiceClone({ button, transcript, status, voicesUrl, apiKey, onVoice }) {
  button.addEventListener("click", async () => {
    const words = transcript.value.trim();
    if (!words) { status.textContent = "Type the sentence you will read first."; return; }
    button.disabled = true;
    try {
      status.textContent = `Recording ${RECORD_SECONDS} s: read the sentence now…`;
      const { samples, rate } = await record(RECORD_SECONDS);
      status.textContent = "Registering the voice…";
      const form = new FormData();
      form.append("audio_sample", wavBlob(samples, rate), "voice.wav");
      form.append("transcript", words);
      form.append("name", "my voice");
      const key = apiKey();
      const reply = await fetch(voicesUrl(), { method: "POST", body: form, headers: key ? { Authorization: `Bearer ${key}` } : {} });
      const body = await reply.json().catch(() => ({}));
      if (!reply.ok) throw new Error(body.error?.message ?? `HTTP ${reply.status}`);
      onVoice(body.id, body.name);
      status.textContent = `Voice ready (${body.duration_s} s): replies use it after you connect.`;
    } catch (err) {
      status.textContent = `Voice not registered: ${err.message}`;
    } finally {
      button.disabled = false;
    }
  });
}
