// The page's side of /v1/realtime (docs/protocol.md section 3): one websocket
// of JSON events, audio as base64 PCM16 24 kHz mono. No UI and no audio
// devices here: the page feeds it frames and listens to its events.
//
// Events dispatched: "open", "event" (detail: the server event, plus
// `receivedAt`), "close" (detail: {code, reason, opened}).

const KEY_PROTOCOL = "openai-insecure-api-key.";

// Relative to the page, so a reverse proxy may serve it under a path prefix.
export function realtimeUrl(base = document.baseURI) {
  // kame_events=1: the page shows kame's own events (partials, the back-end, the oracle, audio between responses)
  const url = new URL("v1/realtime?model=kame&kame_events=1", base);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  return url.href;
}

export class RealtimeClient extends EventTarget {
  // resume: a handle from kame.session.resumable: this connection takes the same session back
  // (docs/protocol.md, "Reconnecting").
  constructor({ url = realtimeUrl(), token = "", resume = null } = {}) {
    super();
    this.url = resume ? `${url}&resume=${encodeURIComponent(resume)}` : url;
    this.resuming = Boolean(resume);
    this.token = token;
    this.ws = null;
    this.opened = false;
    this.bytesSent = 0;
    this.messagesSent = 0;
  }

  get isOpen() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN;
  }

  connect() {
    // Browsers cannot set an Authorization header on a websocket: the token
    // travels as a subprotocol (never in the URL, which ends up in logs).
    const protocols = ["realtime"];
    if (this.token) protocols.push(KEY_PROTOCOL + this.token);
    const ws = new WebSocket(this.url, protocols);
    this.ws = ws;
    this.opened = false;
    ws.onopen = () => {
      this.opened = true;
      this.dispatchEvent(new Event("open"));
    };
    ws.onmessage = (e) => {
      if (typeof e.data !== "string") return; // the protocol is JSON text only
      let event;
      try {
        event = JSON.parse(e.data);
      } catch {
        return;
      }
      event.receivedAt = performance.now();
      this.dispatchEvent(new CustomEvent("event", { detail: event }));
    };
    ws.onclose = (e) => {
      if (this.ws !== ws) return;
      this.ws = null;
      this.dispatchEvent(new CustomEvent("close", { detail: { code: e.code, reason: e.reason, opened: this.opened } }));
    };
    // An "error" is always followed by "close", which carries the details.
    ws.onerror = () => {};
  }

  close() {
    const ws = this.ws;
    if (!ws) return;
    this.ws = null;
    ws.onclose = null;
    ws.close(1000, "client closed");
  }

  send(event) {
    if (!this.isOpen) return false;
    const text = JSON.stringify(event);
    this.ws.send(text);
    this.bytesSent += text.length;
    this.messagesSent += 1;
    return true;
  }

  /** One input frame (Int16Array of PCM16 samples). */
  appendAudio(pcm16) {
    return this.send({ type: "input_audio_buffer.append", audio: bytesToBase64(new Uint8Array(pcm16.buffer, pcm16.byteOffset, pcm16.byteLength)) });
  }

  updateSession(fields, eventId) {
    return this.send({ type: "session.update", event_id: eventId, session: { type: "realtime", ...fields } });
  }

  resetSession() {
    return this.send({ type: "kame.session.reset" });
  }
}

// Little-endian machines (all browsers in practice) already hold PCM16 LE.
export function bytesToBase64(bytes) {
  let s = "";
  const CHUNK = 0x8000; // keeps String.fromCharCode's argument list small
  for (let i = 0; i < bytes.length; i += CHUNK) s += String.fromCharCode.apply(null, bytes.subarray(i, i + CHUNK));
  return btoa(s);
}

/** base64 PCM16 LE -> Float32Array in [-1, 1). */
export function base64ToFloat32(b64) {
  const bin = atob(b64);
  const n = bin.length >> 1;
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    let v = bin.charCodeAt(2 * i) | (bin.charCodeAt(2 * i + 1) << 8);
    if (v >= 0x8000) v -= 0x10000;
    out[i] = v / 32768;
  }
  return out;
}
