/**
 * The conversation logic of the demo, free of DOM code: one Realtime session, the turn state
 * (listening / user speaking / thinking / speaking), per-turn TTFA, and barge-in. Two transports:
 * - WebSocket: the page sends the microphone as `input_audio_buffer.append` events, plays the audio deltas
 *   itself and barges in itself (stop playback at once, then `conversation.item.truncate` with the
 *   milliseconds actually played);
 * - WebRTC (rtc.js): the microphone and the reply travel as Opus tracks; the server paces the reply, clears
 *   it on a barge-in and truncates it to what was played, and says so (`output_audio_buffer.*`).
 * Everything the page observes is mirrored into `demo` (window.__demo) for the headless-browser tests.
 */
import { AudioIO } from "./audio.js";
import { base64ToPcm16, pcm16ToBase64 } from "./pcm.js";
import { RealtimeClient } from "./realtime.js";
import { RtcClient } from "./rtc.js";
import { RtcAudio } from "./rtcaudio.js";
import { FRAME_MS, INPUT_RATE_HZ, State } from "./record.js";

export { FRAME_MS, INPUT_RATE_HZ, State, newDemoRecord } from "./record.js";

const RTC_OUTPUT_RATE_HZ = 24000;
// Races a user need not hear about: a cancel that met a reply which had just finished.
const BENIGN_ERRORS = new Set(["response_cancel_not_active"]);
const REASON_TEXT = { turn_detected: "you spoke", client_cancelled: "stopped", max_output_tokens: "length limit" };

/** The `realtime_ming.speech` extension object for the demo's style picker (`null` = natural). */
function speechStyle({ emotion } = {}) {
  return emotion ? { emotion } : null;
}

export class VoiceChat {
  /**
   * @param {object} ui view callbacks (see main.js): setState, transcript, latency, level, error,
   *   setVoiceLocked
   * @param {object} demo the record from newDemoRecord(), updated in place
   */
  constructor(ui, demo) {
    this.ui = ui;
    this.demo = demo;
    this.client = null;
    this.audio = null;
    this.camera = null;
    this.rtcAudio = null;
    this.isRtc = false;
    this.speakingItem = null;
    this.isMuted = false;
    this._reset();
  }

  _reset() {
    this.activeResponse = null;
    this.turnEndAt = null; // when the user's turn ended (speech_stopped), the TTFA origin
    this.textSentAt = null; // or when a typed turn's response.create went out
    this.itemResponse = new Map(); // assistant item id -> response id
    this.itemPlayed = new Map(); // assistant item id -> source samples played
    this.interrupted = new Set(); // response ids whose late audio is dropped
    this.userSpeech = new Map(); // user item id -> {startMs, seconds} from the VAD events
    this.hasSpoken = false;
    this.lastTimedResponse = null; // the response whose TTFA the page shows
    this.playing = new Set(); // WebRTC: responses the server's playout is playing
  }

  get isConnected() {
    return this.client !== null && this.client.isOpen;
  }

  _setState(state) {
    if (this.demo.state !== state) this.demo.stateLog.push(state);
    this.demo.state = state;
    this.ui.setState(state);
  }

  /** Open audio, connect (`transport`: "webrtc" or "websocket"), configure the session, start the microphone. */
  async connect({ serverUrl, apiKey, voice, outputRate, model, style, transport = "websocket" }) {
    this._reset();
    this._setState(State.CONNECTING);
    this.isRtc = transport === "webrtc";
    this.demo.transport = transport;
    this.audio = new AudioIO({
      onFrame: (pcm, rms) => this._onMicFrame(pcm, rms),
      onPlayback: (msg) => this._onPlayback(msg),
    });
    const handlers = { onEvent: (ev) => this._onEvent(ev), onClose: (err) => this._onClosed(err) };
    this.client = this.isRtc
      ? new RtcClient({ ...handlers, onTrack: (stream) => this.rtcAudio?.play(stream) })
      : new RealtimeClient(handlers);
    try {
      await this.audio.open();
      this.demo.contextRate = this.audio.sampleRate;
      if (this.isRtc) {
        this.rtcAudio = new RtcAudio(this.audio.ctx, (frame) => this._onHeard(frame));
        await this._startMic(); // the microphone track goes into the offer
        await this.client.connect(serverUrl, { apiKey, model, micStream: this.audio.stream });
      } else {
        await this.client.connect(serverUrl, { apiKey, model });
      }
    } catch (err) {
      await this._teardown();
      this.ui.error(err.kind === "auth" ? "Authentication failed"
        : err.kind === "unreachable" ? "Server unreachable" : "Could not connect", err.message, err.kind);
      return false;
    }
    // WebRTC: the deltas never leave the server (the track is 48 kHz Opus): the GA standard rate keeps every event GA
    this.client.send(this._sessionUpdate(voice, this.isRtc ? RTC_OUTPUT_RATE_HZ : outputRate, style));
    this.demo.sent = this.client.sentCounts;
    if (!this.isRtc) await this._startMic();
    if (this.isConnected) this._setState(State.LISTENING);
    return this.isConnected;
  }

  async _startMic() {
    try {
      await this.audio.startMic({ targetRate: INPUT_RATE_HZ, frameMs: FRAME_MS });
    } catch (err) {
      this.demo.micError = err.kind;
      this.ui.error(err.kind === "denied" ? "Microphone blocked" : "Microphone unavailable", err.message, `mic-${err.kind}`);
    }
  }

  _sessionUpdate(voice, outputRate, style = {}) {
    const output = { format: { type: "audio/pcm", rate: outputRate }, speed: style.speed ?? 1 };
    if (voice) output.voice = voice;
    return {
      type: "session.update",
      session: {
        type: "realtime",
        output_modalities: ["audio"],
        audio: {
          input: {
            format: { type: "audio/pcm", rate: INPUT_RATE_HZ },
            turn_detection: { type: "server_vad", create_response: true, interrupt_response: true },
            // the user's words, transcribed by the served model itself (its ASR), shown in their bubble
            transcription: {},
          },
          // 44.1 kHz is this server's extension (the model's native rate); 24 kHz is standard.
          output,
        },
        realtime_ming: { timing_events: true, speech: speechStyle(style) },
      },
    };
  }

  /** Change the speaking rate and style (`audio.output.speed`, `realtime_ming.speech`) for later replies. */
  setSpeechStyle(style) {
    if (!this.isConnected) return;
    this.client.send({
      type: "session.update",
      session: { type: "realtime", audio: { output: { speed: style.speed } }, realtime_ming: { speech: speechStyle(style) } },
    });
  }

  /** Close the session and release the microphone. */
  async disconnect() {
    await this._teardown();
  }

  async _teardown() {
    const { client, audio, rtcAudio } = this;
    this.client = this.audio = this.rtcAudio = null;
    rtcAudio?.close();
    this.camera?.pause();
    this.speakingItem = null;
    if (client) client.close();
    if (audio) await audio.close();
    this.activeResponse = null;
    this.ui.level(0, true);
    this._setState(State.DISCONNECTED);
  }

  async _onClosed(err) {
    await this._teardown();
    this.ui.error("Disconnected", err.message, "closed");
  }

  /** Mute or unmute the microphone (muted: nothing is sent). */
  setMuted(isMuted) {
    this.isMuted = isMuted;
    if (this.isRtc) this.client?.setMuted(isMuted);
    if (isMuted) this.ui.level(0, true);
  }

  /** Change the voice; the server fixes it after the first spoken reply. */
  setVoice(voice) {
    if (this.isConnected && !this.hasSpoken) {
      this.client.send({ type: "session.update", session: { type: "realtime", audio: { output: { voice } } } });
    }
  }

  /** Send a typed message and ask for a reply (interrupting a reply in progress). */
  async sendText(text) {
    if (!this.isConnected) return;
    await this._interrupt(true);
    this.client.send({
      type: "conversation.item.create",
      item: { type: "message", role: "user", content: [{ type: "input_text", text }] },
    });
    this.textSentAt = performance.now();
    this.client.send({ type: "response.create" });
    this.ui.transcript.userTyped(text);
    this._setState(State.THINKING);
  }

  /** Add an image (a data URL) to the conversation; the next turn can talk about it. */
  attachImage(dataUrl, name) {
    if (!this.isConnected) return;
    this.client.send({
      type: "conversation.item.create",
      item: { type: "message", role: "user", content: [{ type: "input_image", image_url: dataUrl }] },
    });
    this.ui.transcript.image(dataUrl, name);
  }

  /**
   * The camera (a CameraStreamer) whose frames go out while the user speaks; null turns it off.
   * Frames are sent from speech_started to speech_stopped, so they precede the committed speech.
   */
  setCamera(camera) {
    this.camera?.pause();
    this.camera = camera;
    this.demo.cameraOn = camera !== null;
    if (camera && this.demo.state === State.USER_SPEAKING) camera.resume();
  }

  /** One camera frame (a JPEG data URL) as an `input_image` item of the turn being spoken. */
  sendCameraFrame(dataUrl) {
    if (!this.isConnected) return;
    this.client.send({
      type: "conversation.item.create",
      item: { type: "message", role: "user", content: [{ type: "input_image", image_url: dataUrl }] },
    });
    const d = this.demo;
    d.cameraFrames++;
    if (this.speakingItem) d.cameraFramesBySpeech[this.speakingItem] = (d.cameraFramesBySpeech[this.speakingItem] || 0) + 1;
  }

  _onMicFrame(pcm, rms) {
    const d = this.demo;
    d.micFrames++;
    if (this.isMuted || !this.isConnected) return;
    this.ui.level(rms, false);
    if (!this.isRtc) this.client.send({ type: "input_audio_buffer.append", audio: pcm16ToBase64(pcm) });
    d.sentAudioMs += (1000 * pcm.length) / INPUT_RATE_HZ; // WebRTC: what the microphone track carried
  }

  _onEvent(ev) {
    const d = this.demo;
    d.events[ev.type] = (d.events[ev.type] || 0) + 1;
    switch (ev.type) {
      case "session.created":
        d.sessionId = ev.session.id;
        break;
      case "session.updated":
        d.outputRate = ev.session.audio?.output?.format?.rate ?? 24000;
        break;
      case "input_audio_buffer.speech_started":
        d.speechStarted++;
        this.userSpeech.set(ev.item_id, { startMs: ev.audio_start_ms, seconds: null });
        this.ui.transcript.userTurn(ev.item_id);
        this._setState(State.USER_SPEAKING);
        this._interrupt(false);
        this.speakingItem = ev.item_id;
        this.camera?.resume();
        break;
      case "input_audio_buffer.speech_stopped":
        d.speechStopped++;
        this.camera?.pause();
        this.speakingItem = null;
        this.turnEndAt = performance.now();
        if (this.userSpeech.has(ev.item_id)) {
          const speech = this.userSpeech.get(ev.item_id);
          speech.seconds = (ev.audio_end_ms - speech.startMs) / 1000;
        }
        this._setState(State.THINKING);
        break;
      case "input_audio_buffer.committed":
        d.committed++;
        this.ui.transcript.userCommitted(ev.item_id, this.userSpeech.get(ev.item_id)?.seconds ?? null);
        this.userSpeech.delete(ev.item_id);
        break;
      case "conversation.item.input_audio_transcription.delta":
        this.ui.transcript.userText(ev.item_id, ev.delta, false);
        break;
      case "conversation.item.input_audio_transcription.completed":
        d.transcripts[ev.item_id] = ev.transcript;
        this.ui.transcript.userText(ev.item_id, ev.transcript, true);
        break;
      case "conversation.item.input_audio_transcription.failed":
        d.transcripts[ev.item_id] = null;
        this.ui.transcript.userTextFailed(ev.item_id);
        break;
      case "response.created":
        this._onResponseCreated(ev.response);
        break;
      case "response.output_item.added":
        if (ev.item.type === "message") {
          this.itemResponse.set(ev.item.id, ev.response_id);
          d.responses[ev.response_id]?.itemIds.push(ev.item.id);
          this.ui.transcript.assistantTurn(ev.item.id);
        }
        break;
      case "response.output_audio.delta":
        this._onAudioDelta(ev);
        break;
      case "response.output_audio.done":
        this.audio?.endItem(ev.item_id);
        break;
      case "response.output_audio_transcript.delta":
      case "response.output_text.delta":
        if (!this.interrupted.has(ev.response_id)) {
          this.ui.transcript.assistantDelta(ev.item_id, ev.delta);
          const r = d.responses[ev.response_id];
          if (r) r.transcript += ev.delta;
        }
        break;
      case "response.done":
        this._onResponseDone(ev.response);
        break;
      case "realtime_ming.response.timings":
        this._onServerTimings(ev);
        break;
      case "output_audio_buffer.started":
      case "output_audio_buffer.stopped":
      case "output_audio_buffer.cleared":
        this._onPlayout(ev);
        break;
      case "conversation.item.truncated":
        d.truncated.push({ itemId: ev.item_id, audioEndMs: ev.audio_end_ms });
        this.ui.transcript.assistantEnd(ev.item_id, "interrupted", `heard ${(ev.audio_end_ms / 1000).toFixed(1)} s`);
        break;
      case "error":
        d.errors.push({ code: ev.error.code, message: ev.error.message });
        if (BENIGN_ERRORS.has(ev.error.code)) break;
        this.ui.error("The server reported an error", `${ev.error.message}${ev.error.code ? ` (${ev.error.code})` : ""}`, ev.error.code);
        break;
      default:
        break;
    }
  }

  _onResponseCreated(response) {
    const startedAt = this.turnEndAt ?? this.textSentAt ?? performance.now();
    this.turnEndAt = this.textSentAt = null;
    this.demo.responses[response.id] = {
      id: response.id,
      status: response.status,
      reason: null,
      itemIds: [],
      audioDeltas: 0,
      receivedSamples: 0,
      playedSamples: 0,
      ttfaMs: null,
      serverTtfaMs: null,
      transcript: "",
      startedAt,
    };
    this.activeResponse = response.id;
    if (this.demo.state !== State.USER_SPEAKING) this._setState(State.THINKING);
  }

  _onAudioDelta(ev) {
    const d = this.demo;
    const r = d.responses[ev.response_id];
    if (!r || this.interrupted.has(ev.response_id) || !this.audio) {
      d.droppedDeltas++; // late audio of a response the user already talked over
      return;
    }
    const pcm = base64ToPcm16(ev.delta);
    r.audioDeltas++;
    r.receivedSamples += pcm.length;
    d.receivedSamples += pcm.length;
    if (r.ttfaMs === null) this._firstAudio(r);
    this.audio.play(ev.item_id, pcm, d.outputRate ?? 24000);
  }

  /** A reply's first audio (a delta; WebRTC: its playout started): its TTFA, and the voice is fixed now. */
  _firstAudio(r) {
    r.ttfaMs = Math.round(performance.now() - r.startedAt);
    this.demo.ttfaMs.push(r.ttfaMs);
    this.lastTimedResponse = r.id;
    this.ui.latency(r.ttfaMs, null);
    if (!this.hasSpoken) {
      this.hasSpoken = true;
      this.ui.setVoiceLocked(true);
    }
  }

  _onResponseDone(response) {
    const r = this.demo.responses[response.id];
    if (r) {
      r.status = response.status;
      r.reason = response.status_details?.reason ?? null;
    }
    if (this.activeResponse === response.id) this.activeResponse = null;
    for (const item of response.output || []) {
      this.audio?.endItem(item.id);
      this.ui.transcript.assistantEnd(item.id, response.status, REASON_TEXT[r?.reason] ?? r?.reason);
    }
    if (this.demo.state === State.THINKING && this.demo.playback.state === "idle") this._setState(State.LISTENING);
  }

  _onServerTimings(ev) {
    const ms = ev.timings.first_audio_delta;
    const r = this.demo.responses[ev.response_id];
    if (ms === undefined || !r) return;
    r.serverTtfaMs = Math.round(ms);
    this.demo.serverTtfaMs.push(r.serverTtfaMs);
    // The server's figure arrives with response.done; show it only next to its own turn.
    if (r.id === this.lastTimedResponse) this.ui.latency(null, r.serverTtfaMs);
  }

  _onPlayback(msg) {
    const d = this.demo;
    d.playback = { state: msg.state, bufferedMs: msg.bufferedMs, underruns: msg.underruns, prebufferMs: msg.prebufferMs };
    for (const it of msg.items) {
      const played = Math.max(it.played, this.itemPlayed.get(it.itemId) ?? 0);
      this.itemPlayed.set(it.itemId, played);
      const r = d.responses[this.itemResponse.get(it.itemId)];
      if (r) r.playedSamples = played;
    }
    let total = 0;
    for (const played of this.itemPlayed.values()) total += played;
    d.playedSamples = total;
    if (msg.type !== "stats" || d.state === State.USER_SPEAKING || !this.isConnected) return;
    if (msg.state === "playing") this._setState(State.SPEAKING);
    else if (msg.state === "idle" && d.state === State.SPEAKING) {
      this._setState(this.activeResponse ? State.THINKING : State.LISTENING);
    }
  }

  /**
   * Barge-in: stop playback at once and truncate the assistant item to what was heard. The server
   * cancels the active response itself on speech_started (interrupt_response); a typed message
   * (`cancel`) cancels it explicitly.
   */
  async _interrupt(cancel) {
    if (!this.audio) return;
    if (this.isRtc) {
      this._interruptRtc(cancel);
      return;
    }
    const active = this.activeResponse;
    if (active) {
      this.interrupted.add(active);
      if (cancel) this.client.send({ type: "response.cancel", response_id: active });
    }
    const cleared = await this.audio.clear();
    const record = { responseId: active, at: performance.now(), playbackState: cleared.state, items: [] };
    for (const it of cleared.items) {
      const responseId = this.itemResponse.get(it.itemId);
      const r = this.demo.responses[responseId];
      // (_onPlayback has already recorded the played counts of this message.)
      const isUnheard = it.played < it.received || (r && r.status === "in_progress");
      if (!responseId || !isUnheard) continue;
      this.interrupted.add(responseId);
      const audioEndMs = Math.floor((1000 * it.played) / it.rate);
      this.client?.send({ type: "conversation.item.truncate", item_id: it.itemId, content_index: 0, audio_end_ms: audioEndMs });
      const entry = { itemId: it.itemId, responseId, audioEndMs, receivedMs: (1000 * it.received) / it.rate };
      this.demo.truncates.push(entry);
      record.items.push(entry);
    }
    if (active || record.items.length > 0) this.demo.bargeIns.push(record);
  }

  /** WebRTC: the server plays the reply; a typed turn cancels it and clears the server's playout. */
  _interruptRtc(cancel) {
    const active = this.activeResponse;
    if (active && cancel) {
      this.interrupted.add(active);
      this.client.send({ type: "response.cancel", response_id: active });
    }
    if (cancel && this.playing.size > 0) this.client.send({ type: "output_audio_buffer.clear" });
  }

  /** WebRTC: the server's playout started, finished or was cleared (a barge-in) for a response. */
  _onPlayout(ev) {
    const d = this.demo;
    const r = d.responses[ev.response_id];
    if (ev.type === "output_audio_buffer.started") {
      this.playing.add(ev.response_id);
      if (r && r.ttfaMs === null) this._firstAudio(r);
      if (d.state !== State.USER_SPEAKING) this._setState(State.SPEAKING);
      return;
    }
    this.playing.delete(ev.response_id);
    if (r) r.playout = ev.type === "output_audio_buffer.stopped" ? "stopped" : "cleared";
    if (ev.type === "output_audio_buffer.cleared") {
      this.interrupted.add(ev.response_id);
      d.cleared.push({ responseId: ev.response_id, at: performance.now() });
    }
    if (d.state === State.SPEAKING && this.playing.size === 0) {
      this._setState(this.activeResponse ? State.THINKING : State.LISTENING);
    }
  }

  /** WebRTC: one 20 ms frame of the server's track as the page heard it. */
  _onHeard(frame) {
    const d = this.demo;
    if (frame.heard) d.heardMs += 20;
    d.playback = { ...d.playback, state: this.playing.size > 0 ? "playing" : "idle" };
  }
}
