/**
 * Composition root of the demo page: finds the DOM, restores settings, loads the model's voices
 * from GET /v1/models and wires buttons, keyboard and views to a VoiceChat. Test hooks:
 * `window.__demo` (the live record, see controller.js) and `window.__chat` (the VoiceChat).
 */
import { CameraStreamer } from "./camera.js";
import { LatencyChart, median } from "./chart.js";
import { State, VoiceChat, newDemoRecord } from "./controller.js";
import { httpUrl } from "./realtime.js";
import { hasWebRtc } from "./rtc.js";
import { Banner, LevelMeter, StatusView, Transcript } from "./ui.js";
import { setupVoiceClone } from "./voiceclone.js";

const SETTINGS_KEY = "realtime-ming-demo";
const MAX_IMAGE_SIDE = 1024; // images are downscaled before upload (a message stays small)

const $ = (id) => document.getElementById(id);
const dom = {
  connect: $("connect-btn"),
  mute: $("mute-btn"),
  camera: $("camera-btn"),
  cameraPreview: $("camera-preview"),
  server: $("server-url"),
  transport: $("transport"),
  apiKey: $("api-key"),
  voice: $("voice"),
  voiceHint: $("voice-hint"),
  outputRate: $("output-rate"),
  speed: $("speed"),
  speedValue: $("speed-value"),
  emotion: $("emotion"),
  composer: $("composer"),
  composerInput: $("composer-input"),
  send: $("send-btn"),
  attach: $("attach-btn"),
  imageInput: $("image-input"),
  clear: $("clear-btn"),
  modelName: $("model-name"),
  modelNotice: $("model-notice"),
  ttfa: $("ttfa-value"),
  ttfaMedian: $("ttfa-median"),
  ttfaServer: $("ttfa-server"),
  turns: $("turn-count"),
  chart: $("latency-chart"),
};

const banner = new Banner({ root: $("banner"), title: $("banner-title"), detail: $("banner-detail"), close: $("banner-close") });
const status = new StatusView({ orb: $("orb"), text: $("vad-state"), pill: $("conn-pill"), pillText: $("conn-text") });
const meter = new LevelMeter($("mic-meter"));
const transcript = new Transcript($("transcript"));
const chart = new LatencyChart(dom.chart);

const demo = newDemoRecord();
window.__demo = demo;

const ui = {
  transcript,
  setState(state) {
    status.set(state);
    const isOnline = state !== State.DISCONNECTED && state !== State.CONNECTING;
    dom.connect.textContent = state === State.DISCONNECTED ? "Connect" : state === State.CONNECTING ? "Connecting…" : "Disconnect";
    dom.connect.classList.toggle("is-danger", isOnline);
    dom.connect.setAttribute("aria-busy", String(state === State.CONNECTING));
    dom.connect.disabled = state === State.CONNECTING;
    for (const control of [dom.composerInput, dom.send, dom.attach, dom.mute, dom.camera]) control.disabled = !isOnline;
    for (const control of [dom.server, dom.transport, dom.apiKey, dom.outputRate]) control.disabled = state !== State.DISCONNECTED;
    if (dom.transport.value === "webrtc") dom.outputRate.disabled = true; // the call's audio is 48 kHz Opus
    if (state === State.DISCONNECTED) {
      setCamera(false);
      transcript.settle();
      ui.setVoiceLocked(false);
    }
  },
  level(rms, isMuted) {
    meter.set(rms, isMuted);
  },
  latency(clientMs, serverMs) {
    if (clientMs !== null) {
      chart.push(clientMs);
      dom.ttfa.textContent = `${clientMs} ms`;
      dom.ttfaServer.textContent = "…"; // filled in when the server's timings for this turn arrive
      const med = Math.round(median(demo.ttfaMs));
      dom.ttfaMedian.textContent = `${med} ms`;
      dom.turns.textContent = String(demo.ttfaMs.length);
      dom.chart.setAttribute("aria-label",
        `Time to first audio over the last ${chart.values.length} turns: latest ${clientMs} ms, median ${med} ms`);
    }
    if (serverMs !== null) dom.ttfaServer.textContent = `${serverMs} ms`;
  },
  error(title, detail, kind) {
    banner.show(title, detail, kind === "mic-denied" || kind === "mic-missing" ? "warning" : "error");
  },
  setVoiceLocked(isLocked) {
    dom.voice.disabled = isLocked;
    dom.voiceHint.hidden = !isLocked;
  },
};

const chat = new VoiceChat(ui, demo);
window.__chat = chat;

function loadSettings() {
  let saved = {};
  try {
    saved = JSON.parse(localStorage.getItem(SETTINGS_KEY) || "{}");
  } catch {
    saved = {};
  }
  const query = new URLSearchParams(location.search);
  const origin = location.protocol.startsWith("http") ? location.origin : "http://127.0.0.1:8000";
  dom.server.value = query.get("server") || saved.server || origin;
  // WebRTC where the browser has it (what OpenAI's browser SDKs use), else WebSocket; ?transport= overrides
  if (!hasWebRtc()) dom.transport.querySelector('option[value="webrtc"]').disabled = true;
  const wanted = query.get("transport") || saved.transport;
  dom.transport.value = hasWebRtc() && wanted !== "websocket" ? "webrtc" : "websocket";
  if (saved.outputRate) dom.outputRate.value = String(saved.outputRate);
  return saved;
}

function saveSettings() {
  const settings = { server: dom.server.value, voice: dom.voice.value, outputRate: Number(dom.outputRate.value),
                     transport: dom.transport.value };
  try {
    localStorage.setItem(SETTINGS_KEY, JSON.stringify(settings)); // the API key is never stored
  } catch {
    /* private mode: settings just do not persist */
  }
}

/** GET /v1/models: the model id and its voices for the picker. */
async function loadModels(preferredVoice) {
  dom.voice.replaceChildren(new Option("Loading…", ""));
  try {
    const reply = await fetch(httpUrl(dom.server.value, "/v1/models"), { cache: "no-store", signal: AbortSignal.timeout(5000) });
    if (!reply.ok) throw new Error(`HTTP ${reply.status}`);
    const model = (await reply.json()).data?.[0] ?? {};
    dom.modelName.textContent = model.id ?? "unknown model";
    dom.modelName.dataset.model = model.id ?? "";
    // The embedded tiny default has random weights: say so where nobody can miss it.
    dom.modelNotice.hidden = model.is_tiny_default !== true;
    demo.isTinyModel = model.is_tiny_default === true;
    const voices = model.voices?.length ? model.voices : [];
    dom.voice.replaceChildren(...voices.map((v) => new Option(v, v)));
    if (voices.length === 0) dom.voice.replaceChildren(new Option("Server default", ""));
    if (preferredVoice && voices.includes(preferredVoice)) dom.voice.value = preferredVoice;
    demo.voices = voices;
    if (banner.root.dataset.kind === "unreachable") banner.hide();
  } catch (err) {
    dom.voice.replaceChildren(new Option("Server default", ""));
    dom.modelName.textContent = "server not reachable";
    dom.modelNotice.hidden = true;
    banner.show("Server unreachable", `Could not load ${httpUrl(dom.server.value, "/v1/models")} (${err.message}). Check the server address.`, "unreachable");
  }
}

async function toggleConnection() {
  if (demo.state !== State.DISCONNECTED) {
    await chat.disconnect();
    return;
  }
  banner.hide();
  saveSettings();
  await chat.connect({
    serverUrl: dom.server.value,
    apiKey: dom.apiKey.value.trim(),
    voice: dom.voice.value,
    outputRate: Number(dom.outputRate.value),
    model: dom.modelName.dataset.model || "",
    style: currentStyle(),
    transport: dom.transport.value,
  });
}

/** The speed slider and style picker as sent to the server. */
function currentStyle() {
  return { speed: Number(dom.speed.value), emotion: dom.emotion.value };
}

function setMuted(isMuted) {
  chat.setMuted(isMuted);
  dom.mute.setAttribute("aria-pressed", String(isMuted));
  dom.mute.querySelector(".label").textContent = isMuted ? "Unmute" : "Mute";
}

const camera = new CameraStreamer(dom.cameraPreview, (dataUrl) => chat.sendCameraFrame(dataUrl));

/** Turn the camera on (frames go with the user's speech) or off. */
async function setCamera(isOn) {
  if (isOn) {
    try {
      await camera.start();
    } catch (err) {
      demo.cameraError = err.name || "error";
      banner.show("Camera unavailable", `${err.message || err.name}. Voice and text still work.`, "warning");
      isOn = false;
    }
  } else {
    camera.stop();
  }
  chat.setCamera(isOn ? camera : null);
  dom.camera.setAttribute("aria-pressed", String(isOn));
  dom.camera.querySelector(".label").textContent = isOn ? "Camera off" : "Camera";
}

/** A picked image file → JPEG data URL no larger than MAX_IMAGE_SIDE on either side. */
async function imageToDataUrl(file) {
  const bitmap = await createImageBitmap(file);
  const scale = Math.min(1, MAX_IMAGE_SIDE / Math.max(bitmap.width, bitmap.height));
  const canvas = document.createElement("canvas");
  canvas.width = Math.round(bitmap.width * scale);
  canvas.height = Math.round(bitmap.height * scale);
  canvas.getContext("2d").drawImage(bitmap, 0, 0, canvas.width, canvas.height);
  bitmap.close();
  return canvas.toDataURL("image/jpeg", 0.88);
}

dom.connect.addEventListener("click", toggleConnection);
$("settings").addEventListener("submit", (e) => e.preventDefault());
dom.mute.addEventListener("click", () => setMuted(!chat.isMuted));
dom.camera.addEventListener("click", () => setCamera(!camera.isOn));
dom.server.addEventListener("change", () => loadModels(dom.voice.value));
dom.voice.addEventListener("change", () => {
  saveSettings();
  chat.setVoice(dom.voice.value);
});
dom.outputRate.addEventListener("change", saveSettings);
dom.transport.addEventListener("change", () => {
  saveSettings();
  ui.setState(demo.state);
});
for (const control of [dom.speed, dom.emotion]) {
  control.addEventListener("change", () => chat.setSpeechStyle(currentStyle()));
}
dom.speed.addEventListener("input", () => { dom.speedValue.textContent = `${Number(dom.speed.value).toFixed(2)}×`; });
dom.clear.addEventListener("click", () => transcript.clear());
dom.attach.addEventListener("click", () => dom.imageInput.click());
dom.imageInput.addEventListener("change", async () => {
  const file = dom.imageInput.files[0];
  dom.imageInput.value = "";
  if (!file) return;
  try {
    chat.attachImage(await imageToDataUrl(file), file.name);
  } catch (err) {
    banner.show("Could not read the image", err.message, "error");
  }
});
dom.composer.addEventListener("submit", (e) => {
  e.preventDefault();
  const text = dom.composerInput.value.trim();
  if (!text) return;
  dom.composerInput.value = "";
  chat.sendText(text);
});
document.addEventListener("keydown", (e) => {
  const isTyping = e.target instanceof HTMLInputElement || e.target instanceof HTMLSelectElement
    || e.target instanceof HTMLTextAreaElement;
  if (e.key === "Escape" && !$("banner").hidden) banner.hide();
  if (isTyping || e.ctrlKey || e.metaKey || e.altKey) return;
  if (e.key === "m" && !dom.mute.disabled) {
    e.preventDefault();
    dom.mute.click();
  } else if (e.key === "v" && !dom.camera.disabled) {
    e.preventDefault();
    dom.camera.click();
  } else if (e.key === "c" && !dom.connect.disabled) {
    e.preventDefault();
    dom.connect.click();
  }
});

const saved = loadSettings();
ui.setState(State.DISCONNECTED);
chart.draw();
loadModels(saved.voice);

// "Clone my voice" (POST /v1/realtime/voices): the new voice joins the picker, selected.
setupVoiceClone({
  button: $("clone-voice"),
  transcript: $("clone-text"),
  status: $("clone-status"),
  voicesUrl: () => httpUrl(dom.server.value, "/v1/realtime/voices"),
  apiKey: () => dom.apiKey.value.trim(),
  onVoice: (id, name) => {
    dom.voice.append(new Option(`${name} (cloned)`, id));
    dom.voice.value = id;
  },
});
