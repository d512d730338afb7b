/**
 * The WebRTC side of the demo (docs/protocol.md §2.1, §2.3): what OpenAI's browser SDKs do, against this server.
 *
 * 1. An ephemeral key from `POST /v1/realtime/client_secrets`: the server-side route guarded by the real API key
 *    (the key typed in the page, when the server has keys); only the short-lived `ek_...` opens the call.
 * 2. A peer connection with the microphone track and the `oai-events` data channel; its offer (ICE candidates
 *    gathered) goes to `POST /v1/realtime/calls` with the ephemeral key; the answer completes it.
 * 3. Events travel on the data channel as JSON text; the reply's audio arrives on the remote track (Opus), paced
 *    by the server, which also clears it on a barge-in and says so (`output_audio_buffer.*`).
 *
 * `RtcClient` has the interface of `RealtimeClient` (realtime.js): connect → session.created, send, close.
 */
import { ConnectError, httpUrl } from "./realtime.js";

const EVENTS_LABEL = "oai-events";
const ICE_GATHER_MS = 3000; // the server takes no trickled candidates: wait for them (host candidates are instant)
const REQUEST_TIMEOUT_MS = 15000;

/** Why an HTTP step failed, as a ConnectError the page can show. */
async function httpError(reply, what) {
  let detail = "";
  try {
    const body = await reply.json();
    detail = body?.error?.message ? `: ${body.error.message}` : "";
  } catch {
    /* not JSON */
  }
  const kind = reply.status === 401 || reply.status === 403 ? "auth" : "closed";
  return new ConnectError(kind, `${what} failed (HTTP ${reply.status})${detail}`, reply.status);
}

function waitForIce(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      if (pc.iceGatheringState !== "complete") return;
      pc.removeEventListener("icegatheringstatechange", done);
      resolve();
    };
    pc.addEventListener("icegatheringstatechange", done);
    setTimeout(resolve, ICE_GATHER_MS);
  });
}

/** Whether this browser can make a WebRTC call. */
export function hasWebRtc() {
  return typeof window.RTCPeerConnection === "function";
}

export class RtcClient {
  /**
   * @param {{onEvent: (ev: object) => void, onClose: (err: ConnectError) => void,
   *          onTrack: (stream: MediaStream) => void}} handlers
   */
  constructor(handlers) {
    this.handlers = handlers;
    this.pc = null;
    this.dc = null;
    this.callId = null;
    this.micTrack = null;
    this.sentCounts = {};
    this._isReady = false;
  }

  get isOpen() {
    return this.dc !== null && this.dc.readyState === "open";
  }

  /** Mint a key, offer, answer; resolves with `session.created`, rejects with a ConnectError. */
  async connect(serverUrl, { apiKey = "", model = "", micStream = null } = {}) {
    const secret = await this._mint(serverUrl, apiKey, model);
    const pc = new RTCPeerConnection();
    const dc = pc.createDataChannel(EVENTS_LABEL);
    this.pc = pc;
    this.dc = dc;
    const track = micStream?.getAudioTracks()[0];
    if (track) {
      this.micTrack = track;
      pc.addTrack(track, micStream);
    } else {
      pc.addTransceiver("audio", { direction: "recvonly" }); // no microphone: listen and type
    }
    pc.ontrack = (e) => this.handlers.onTrack(e.streams[0] ?? new MediaStream([e.track]));
    const created = new Promise((resolve, reject) => {
      dc.onmessage = (msg) => {
        if (window.__recordFrames) (window.__frames ??= []).push(msg.data); // tests: every event as sent
        let ev;
        try {
          ev = JSON.parse(msg.data);
        } catch {
          return;
        }
        if (!this._isReady && ev.type === "session.created") {
          this._isReady = true;
          resolve(ev);
        }
        this.handlers.onEvent(ev);
      };
      const ended = (why) => {
        if (this.pc !== pc) return;
        if (!this._isReady) reject(new ConnectError("closed", why));
        else this._ended(why);
      };
      dc.onclose = () => ended("The server ended the call.");
      pc.onconnectionstatechange = () => {
        if (pc.connectionState === "failed") ended("The call's connection failed (ICE/DTLS).");
      };
    });
    await pc.setLocalDescription(await pc.createOffer());
    await waitForIce(pc);
    const reply = await this._post(httpUrl(serverUrl, "/v1/realtime/calls"), {
      method: "POST",
      headers: { "Content-Type": "application/sdp", Authorization: `Bearer ${secret}` },
      body: pc.localDescription.sdp,
    });
    if (!reply.ok) throw await httpError(reply, "The call");
    this.callId = reply.headers.get("Location")?.split("/").pop() ?? null;
    await pc.setRemoteDescription({ type: "answer", sdp: await reply.text() });
    return created;
  }

  async _mint(serverUrl, apiKey, model) {
    const headers = { "Content-Type": "application/json" };
    if (apiKey) headers.Authorization = `Bearer ${apiKey}`;
    const session = { type: "realtime" };
    if (model) session.model = model;
    const reply = await this._post(httpUrl(serverUrl, "/v1/realtime/client_secrets"), {
      method: "POST", headers, body: JSON.stringify({ session }),
    });
    if (!reply.ok) throw await httpError(reply, "Getting a call key");
    return (await reply.json()).value;
  }

  async _post(url, init) {
    try {
      return await fetch(url, { ...init, cache: "no-store", signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS) });
    } catch {
      throw new ConnectError("unreachable", `No server answered at ${new URL(url).origin}.`);
    }
  }

  _ended(why) {
    this.close();
    this.handlers.onClose(new ConnectError("closed", why));
  }

  /** Send one client event on the data channel (dropped when it is not open). */
  send(event) {
    if (!this.isOpen) return false;
    this.dc.send(JSON.stringify(event));
    this.sentCounts[event.type] = (this.sentCounts[event.type] || 0) + 1;
    return true;
  }

  /** Mute the microphone track (it sends silence) or unmute it. */
  setMuted(isMuted) {
    if (this.micTrack) this.micTrack.enabled = !isMuted;
  }

  /** Hang up; no onClose callback follows. */
  close() {
    const { pc, dc } = this;
    this.pc = this.dc = null;
    if (dc) dc.close();
    if (pc) pc.close();
  }
}
