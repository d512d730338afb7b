/**
 * The WebSocket side of the demo: connects to `/v1/realtime` with browser auth by subprotocol
 * (["realtime", "openai-insecure-api-key.<key>"], docs/protocol.md §2), parses server events
 * and classifies failures into what the user must do: server unreachable, auth failed, or closed.
 */

const KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key.";
// RFC 6455 subprotocols are RFC 2616 tokens: visible ASCII without separators.
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
const PROBE_TIMEOUT_MS = 4000;

/** Why a connection failed or ended: kind is "unreachable" | "auth" | "closed" | "invalid". */
export class ConnectError extends Error {
  constructor(kind, message, code = null) {
    super(message);
    this.kind = kind;
    this.code = code;
  }
}

/** `http(s)://host[:port]/...` → the realtime WebSocket URL on the same host. */
export function realtimeUrl(serverUrl, model) {
  const url = new URL(serverUrl, location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  url.pathname = "/v1/realtime";
  url.search = model ? `?model=${encodeURIComponent(model)}` : "";
  url.hash = "";
  return url.href;
}

/** `/path` resolved against the server's HTTP origin. */
export function httpUrl(serverUrl, path) {
  return new URL(path, new URL(serverUrl, location.href)).href;
}

/** Human text for a close code the server uses on purpose (Python websockets CloseCode). */
function describeClose(code, reason) {
  const why = reason ? `: ${reason}` : "";
  switch (code) {
    case 1000: return `The server ended the session${why}.`;
    case 1001: return `The server is shutting down${why}.`;
    case 1008: return `The server closed the session (policy)${why}.`;
    case 1009: return "A message was too large for the server.";
    case 1011: return `The server hit an internal error${why}.`;
    case 1013: return "The server is at its session limit. Try again in a moment.";
    default: return `The connection was lost (code ${code})${why}.`;
  }
}

export class RealtimeClient {
  /**
   * @param {{onEvent: (ev: object) => void, onClose: (err: ConnectError) => void}} handlers
   *   onEvent receives every server event (session.created included); onClose fires once when an
   *   established session ends for any reason other than close().
   */
  constructor(handlers) {
    this.handlers = handlers;
    this.ws = null;
    this.sentCounts = {};
  }

  get isOpen() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN;
  }

  /** Open the socket; resolves with `session.created`, rejects with a ConnectError. */
  connect(serverUrl, { apiKey = "", model = "" } = {}) {
    const protocols = ["realtime"];
    if (apiKey) {
      if (!TOKEN.test(apiKey)) {
        return Promise.reject(new ConnectError(
          "invalid", "This API key has characters a browser cannot send as a WebSocket subprotocol."));
      }
      protocols.push(KEY_SUBPROTOCOL_PREFIX + apiKey);
    }
    let ws;
    try {
      ws = new WebSocket(realtimeUrl(serverUrl, model), protocols);
    } catch (err) {
      return Promise.reject(new ConnectError("invalid", `Invalid server address: ${err.message}`));
    }
    this.ws = ws;
    return new Promise((resolve, reject) => {
      let isOpened = false;
      let isReady = false;
      ws.onopen = () => { isOpened = true; };
      ws.onmessage = (msg) => {
        if (window.__recordFrames) (window.__frames ??= []).push(msg.data); // tests: every event as sent
        let ev;
        try {
          ev = JSON.parse(msg.data);
        } catch {
          return; // the server only sends JSON text; ignore anything else
        }
        if (!isReady && ev.type === "session.created") {
          isReady = true;
          resolve(ev);
        }
        this.handlers.onEvent(ev);
      };
      ws.onclose = async (e) => {
        const wasMine = this.ws === ws;
        if (wasMine) this.ws = null;
        if (!isReady) {
          reject(isOpened
            ? new ConnectError("closed", describeClose(e.code, e.reason), e.code)
            : await this._classifyRefusal(serverUrl, e.code));
        } else if (wasMine) {
          this.handlers.onClose(new ConnectError("closed", describeClose(e.code, e.reason), e.code));
        }
      };
    });
  }

  /** A refused handshake hides its HTTP status from scripts: probe /health to tell why. */
  async _classifyRefusal(serverUrl, code) {
    try {
      const reply = await fetch(httpUrl(serverUrl, "/health"), {
        cache: "no-store", signal: AbortSignal.timeout(PROBE_TIMEOUT_MS),
      });
      if (reply.ok) {
        return new ConnectError("auth",
          "The server refused the connection: the API key is missing or wrong (or this page's origin is not allowed).",
          code);
      }
      return new ConnectError("unreachable", `The server answered HTTP ${reply.status} instead of connecting.`, code);
    } catch {
      return new ConnectError("unreachable", `No server answered at ${new URL(serverUrl, location.href).origin}.`, code);
    }
  }

  /** Send one client event (dropped when the socket is not open). */
  send(event) {
    if (!this.isOpen) return false;
    this.ws.send(JSON.stringify(event));
    this.sentCounts[event.type] = (this.sentCounts[event.type] || 0) + 1;
    return true;
  }

  /** Close normally (1000); no onClose callback follows. */
  close() {
    const ws = this.ws;
    this.ws = null;
    if (ws && ws.readyState <= WebSocket.OPEN) ws.close(1000, "client closed");
  }
}
