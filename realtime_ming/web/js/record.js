/**
 * The demo's turn states and its observable record (`window.__demo`): what the page saw of a session, kept
 * up to date by VoiceChat (controller.js) for the page itself and the headless-browser tests.
 */

export const State = Object.freeze({
  DISCONNECTED: "disconnected",
  CONNECTING: "connecting",
  LISTENING: "listening",
  USER_SPEAKING: "user_speaking",
  THINKING: "thinking",
  SPEAKING: "speaking",
});

export const INPUT_RATE_HZ = 24000; // the session's input PCM rate (the GA default)
export const FRAME_MS = 20; // one input_audio_buffer.append per 20 ms of microphone audio

/** The observable record of a session; `window.__demo` points at one. */
export function newDemoRecord() {
  return {
    state: State.DISCONNECTED,
    stateLog: [State.DISCONNECTED], // every state entered, consecutive repeats collapsed
    sessionId: null,
    inputRate: INPUT_RATE_HZ,
    outputRate: null,
    contextRate: null,
    micError: null,
    micFrames: 0,
    sentAudioMs: 0,
    speechStarted: 0,
    speechStopped: 0,
    committed: 0,
    cameraOn: false,
    cameraFrames: 0, // camera frames sent as input_image items
    cameraFramesBySpeech: {}, // user speech item id -> camera frames sent while it was spoken
    transcripts: {}, // user item id -> its final transcript (Ming's own ASR), or null when it failed
    receivedSamples: 0,
    playedSamples: 0,
    droppedDeltas: 0,
    playback: { state: "idle", bufferedMs: 0, underruns: 0, prebufferMs: 0 },
    ttfaMs: [],
    serverTtfaMs: [],
    responses: {},
    bargeIns: [],
    truncates: [],
    truncated: [],
    errors: [],
    events: {},
    sent: {},
    transport: null, // "webrtc" | "websocket"
    heardMs: 0, // WebRTC: ms of the server's track that carried sound
    cleared: [], // WebRTC: output_audio_buffer.cleared {responseId, at}
  };
}
