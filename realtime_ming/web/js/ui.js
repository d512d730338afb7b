/**
 * DOM views of the demo: the transcript (both sides, streaming), the live status (state orb and
 * text), the microphone level meter and the error banner. Views only render; VoiceChat decides.
 */

const STATE_TEXT = {
  disconnected: "Not connected",
  connecting: "Connecting…",
  listening: "Listening",
  user_speaking: "You are speaking",
  thinking: "Thinking…",
  speaking: "Ming is speaking",
};

const STATUS_TEXT = {
  cancelled: "cancelled",
  failed: "failed",
  incomplete: "cut short",
  interrupted: "interrupted",
};

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/** The conversation as a list of message bubbles, keyed by conversation item id. */
export class Transcript {
  constructor(list) {
    this.list = list;
    this.entries = new Map(); // item id -> {li, body, meta}
    this.emptyNote = list.querySelector(".transcript-empty");
  }

  _add(role, who, key) {
    if (this.emptyNote) this.emptyNote.hidden = true;
    const stick = this.list.scrollHeight - this.list.scrollTop - this.list.clientHeight < 48;
    const li = el("li", `msg msg-${role}`);
    const head = el("div", "msg-head");
    head.append(el("span", "msg-who", who));
    const meta = el("span", "msg-meta");
    head.append(meta);
    const body = el("p", "msg-body");
    li.append(head, body);
    this.list.append(li);
    const entry = { li, body, meta };
    if (key) this.entries.set(key, entry);
    if (stick) this.list.scrollTop = this.list.scrollHeight;
    return entry;
  }

  _follow() {
    if (this.list.scrollHeight - this.list.scrollTop - this.list.clientHeight < 120) {
      this.list.scrollTop = this.list.scrollHeight;
    }
  }

  /** The user started speaking (server VAD); the bubble fills in as the turn goes on. */
  userTurn(itemId) {
    const entry = this._add("user", "You", itemId);
    entry.li.classList.add("is-live");
    entry.body.append(el("span", "pulse-dots", "speaking"));
  }

  /** The user's audio became a conversation item of `seconds` (null: unknown). */
  userCommitted(itemId, seconds) {
    const entry = this.entries.get(itemId);
    if (!entry) return;
    entry.li.classList.remove("is-live");
    if (!entry.hasText) entry.body.replaceChildren(el("span", "msg-voice", "Voice message"));
    if (seconds !== null) entry.meta.textContent = `${seconds.toFixed(1)} s`;
  }

  /** Input transcription (when the server provides it). */
  userText(itemId, text, isFinal) {
    const entry = this.entries.get(itemId);
    if (!entry || !text) return;
    if (!entry.hasText || isFinal) entry.body.replaceChildren();
    entry.hasText = true;
    entry.body.append(document.createTextNode(text));
    this._follow();
  }

  /** The server could not transcribe the item: its bubble stays a voice message, marked as such. */
  userTextFailed(itemId) {
    const entry = this.entries.get(itemId);
    if (!entry) return;
    entry.meta.textContent = [entry.meta.textContent, "not transcribed"].filter(Boolean).join(" \u00b7 ");
  }

  userTyped(text) {
    this._add("user", "You").body.textContent = text;
  }

  image(dataUrl, name) {
    const entry = this._add("user", "You");
    const img = el("img", "msg-image");
    img.src = dataUrl;
    img.alt = name ? `Attached image: ${name}` : "Attached image";
    entry.body.append(img);
    entry.meta.textContent = "image";
  }

  assistantTurn(itemId) {
    const entry = this._add("assistant", "Ming", itemId);
    entry.li.classList.add("is-live");
  }

  assistantDelta(itemId, text) {
    const entry = this.entries.get(itemId) || this._add("assistant", "Ming", itemId);
    entry.body.append(document.createTextNode(text));
    this._follow();
  }

  /** An assistant turn ended; one that did not complete gets a badge and a dimmed style. */
  assistantEnd(itemId, status, detail) {
    const entry = this.entries.get(itemId);
    if (!entry) return;
    entry.li.classList.remove("is-live");
    if (!STATUS_TEXT[status] || (status === "cancelled" && entry.li.classList.contains("is-cut"))) return;
    entry.li.classList.add("is-cut");
    entry.meta.replaceChildren(el("span", "badge", STATUS_TEXT[status]));
    if (detail) entry.meta.append(el("span", "msg-detail", detail));
  }

  /** Close live bubbles (end of a session). */
  settle() {
    for (const { li } of this.entries.values()) li.classList.remove("is-live");
  }

  clear() {
    for (const { li } of this.entries.values()) li.remove();
    for (const li of this.list.querySelectorAll(".msg")) li.remove();
    this.entries.clear();
    if (this.emptyNote) this.emptyNote.hidden = false;
  }
}

/** Status orb + text (the text is an aria-live status region). */
export class StatusView {
  constructor({ orb, text, pill, pillText }) {
    Object.assign(this, { orb, text, pill, pillText });
  }

  set(state) {
    this.orb.dataset.state = state;
    this.text.textContent = STATE_TEXT[state] ?? state;
    document.body.dataset.state = state;
    const connection = state === "disconnected" ? "disconnected" : state === "connecting" ? "connecting" : "connected";
    this.pill.dataset.state = connection;
    this.pillText.textContent = connection[0].toUpperCase() + connection.slice(1);
  }
}

/** Microphone level: dBFS mapped to 0–100 with a fast attack and a slow release. */
export class LevelMeter {
  constructor(meter) {
    this.meter = meter;
    this.fill = meter.querySelector(".meter-fill");
    this.value = 0;
    this.shown = -1;
  }

  set(rms, isMuted) {
    const db = 20 * Math.log10(Math.max(rms, 1e-5));
    const level = isMuted ? 0 : Math.min(1, Math.max(0, (db + 60) / 54));
    this.value = level > this.value ? level : this.value * 0.8 + level * 0.2;
    this.meter.classList.toggle("is-muted", isMuted);
    this.fill.style.transform = `scaleX(${this.value.toFixed(3)})`;
    const percent = Math.round(this.value * 100);
    if (Math.abs(percent - this.shown) >= 5 || (percent === 0 && this.shown !== 0)) {
      this.shown = percent;
      this.meter.setAttribute("aria-valuenow", String(percent));
      this.meter.setAttribute("aria-valuetext", isMuted ? "muted" : `${percent} percent`);
    }
  }
}

/** The alert banner: one message at a time, dismissible. */
export class Banner {
  constructor({ root, title, detail, close }) {
    Object.assign(this, { root, title, detail });
    close.addEventListener("click", () => this.hide());
  }

  show(title, detail, kind) {
    this.title.textContent = title;
    this.detail.textContent = detail || "";
    this.root.dataset.kind = kind || "error";
    this.root.hidden = false;
  }

  hide() {
    this.root.hidden = true;
    this.root.dataset.kind = "";
  }
}
