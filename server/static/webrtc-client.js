// The page's side of /v1/realtime/calls (docs/protocol.md 3.11): the same
// JSON events as the websocket on a data channel labelled "oai-events", the
// microphone and the assistant's voice as Opus over RTP (the browser's own
// jitter buffer, loss concealment and echo cancellation). The same interface
// as RealtimeClient (realtime-client.js), so the page's controller drives
// either.
//
// Events dispatched: "open", "event" (detail: the server event, plus
// `receivedAt`), "close" (detail: {code, reason, opened}, codes as the
// websocket's so one set of rules explains and retries both), and
// "fallback" (detail: {reason}) when the call cannot carry audio here: ICE
// never connects (UDP blocked, a proxy that carries only HTTP), the browser
// lacks WebRTC, or the server has no /v1/realtime/calls. The controller then
// uses the websocket; the call is hung up first, so it frees its slot at once.

export const ICE_TIMEOUT_MS = 10000;
const HANGUP_WAIT_MS = 4000; // the server answers a hangup once the call's slot is free

export function webrtcAvailable() {
  return typeof RTCPeerConnection !== "undefined";
}

// Relative to the page, so a reverse proxy may serve it under a path prefix.
function callsUrl(base = document.baseURI) {
  return new URL("v1/realtime/calls", base).href;
}

// The websocket's close codes for the answers of POST /v1/realtime/calls.
function closeForStatus(status, body) {
  const code = (body && body.error && body.error.code) || "";
  if (status === 401) return { code: 1008, reason: "unauthorized" };
  if (status === 403) return { code: 1008, reason: "origin not allowed" };
  if (code === "server_starting") return { code: 1013, reason: "server starting" };
  if (code === "server_full" || code === "rate_limited") return { code: 1013, reason: "server full" };
  if (code === "server_draining") return { code: 1001, reason: "" };
  return null;
}

export class WebRtcClient extends EventTarget {
  /** `track`: the microphone's audio track (the client sends a clone of it and stops the clone). */
  constructor({ url = callsUrl(), token = "", track, iceTimeoutMs = ICE_TIMEOUT_MS } = {}) {
    super();
    this.url = url;
    this.token = token;
    this.track = track ? track.clone() : null;
    this.iceTimeoutMs = iceTimeoutMs;
    this.pc = null;
    this.dc = null;
    this.audio = null;
    this.location = null;
    this.opened = false;
    this.ended = false;
    this.timer = null;
    this.messagesSent = 0;
    this.bytesSent = 0;
    this.draining = false;
  }

  get isOpen() {
    return this.dc !== null && this.dc.readyState === "open";
  }

  get transport() {
    return "webrtc";
  }

  async connect() {
    if (!webrtcAvailable()) return this._fallback("this browser has no WebRTC");
    const pc = new RTCPeerConnection();
    this.pc = pc;
    this.audio = document.createElement("audio");
    this.audio.autoplay = true;
    pc.ontrack = (e) => {
      this.audio.srcObject = e.streams[0] || new MediaStream([e.track]);
    };
    if (this.track) pc.addTrack(this.track);
    else pc.addTransceiver("audio", { direction: "recvonly" });
    const dc = pc.createDataChannel("oai-events");
    this.dc = dc;
    dc.onopen = () => {
      if (this.ended) return;
      clearTimeout(this.timer);
      this.opened = true;
      this.dispatchEvent(new Event("open"));
    };
    dc.onmessage = (e) => {
      if (typeof e.data !== "string") return;
      let event;
      try {
        event = JSON.parse(e.data);
      } catch {
        return;
      }
      event.receivedAt = performance.now();
      if (event.type === "kame.session.ending" && event.reason === "draining") this.draining = true;
      this.dispatchEvent(new CustomEvent("event", { detail: event }));
    };
    dc.onclose = () => this._lost();
    pc.onconnectionstatechange = () => {
      const state = pc.connectionState;
      if (state !== "failed") return;
      if (!this.opened) this._fallback("ICE failed");
      else this._lost(); // ICE consent lost: the network went away
    };
    let res;
    let answer;
    try {
      const offer = await pc.createOffer();
      await pc.setLocalDescription(offer);
      const headers = { "Content-Type": "application/sdp", Accept: "application/sdp" };
      if (this.token) headers.Authorization = `Bearer ${this.token}`;
      res = await fetch(this.url, { method: "POST", body: offer.sdp, headers, cache: "no-store" });
      answer = await res.text();
    } catch (err) {
      if (this.ended) return;
      return this._end({ code: 1006, reason: "", opened: false });
    }
    if (res.status === 201) this.location = res.headers.get("Location");
    if (this.ended) {
      if (res.status === 201) this._hangup(); // closed while the offer was on its way
      return;
    }
    if (res.status !== 201) {
      let body = null;
      try {
        body = JSON.parse(answer);
      } catch {}
      const mapped = closeForStatus(res.status, body);
      if (mapped) return this._end({ ...mapped, opened: false });
      // No calls endpoint here (an older server, a proxy that routes only the websocket), or an offer it
      // cannot answer: the websocket still can.
      const why = (body && body.error && body.error.message) || `HTTP ${res.status}`;
      return this._fallback(`the server did not answer the call (${why})`);
    }
    this.timer = setTimeout(() => this._fallback(`ICE did not connect within ${this.iceTimeoutMs / 1000} s`), this.iceTimeoutMs);
    try {
      await pc.setRemoteDescription({ type: "answer", sdp: answer });
    } catch (err) {
      this._fallback(`the answer could not be applied (${err.message})`);
    }
  }

  /** Mute (push to talk released): the browser sends silence in the microphone's place. */
  setMicOpen(open) {
    if (this.track && this.track.enabled !== open) this.track.enabled = open;
  }

  close() {
    if (this.ended) return;
    this.ended = true;
    this._teardown(true);
  }

  send(event) {
    if (!this.isOpen) return false;
    const text = JSON.stringify(event);
    this.dc.send(text);
    this.bytesSent += text.length;
    this.messagesSent += 1;
    return true;
  }

  /** Audio travels as RTP: there is nothing to append. */
  appendAudio() {
    return false;
  }

  updateSession(fields, eventId) {
    return this.send({ type: "session.update", event_id: eventId, session: { type: "realtime", ...fields } });
  }

  resetSession() {
    return this.send({ type: "kame.session.reset" });
  }

  /** The browser's own view of the call: the remote audio, the path's round trip. */
  async stats() {
    if (!this.pc) return null;
    const out = { inbound: null, roundTripMs: null };
    (await this.pc.getStats()).forEach((s) => {
      if (s.type === "inbound-rtp" && s.kind === "audio") {
        out.inbound = {
          packetsReceived: s.packetsReceived, packetsLost: s.packetsLost, totalAudioEnergy: s.totalAudioEnergy,
          concealmentEvents: s.concealmentEvents, concealedSamples: s.concealedSamples,
          totalSamplesReceived: s.totalSamplesReceived,
          jitterBufferMs: s.jitterBufferEmittedCount ? (1000 * s.jitterBufferDelay) / s.jitterBufferEmittedCount : null,
        };
      } else if (s.type === "candidate-pair" && s.nominated && s.currentRoundTripTime !== undefined) {
        out.roundTripMs = 1000 * s.currentRoundTripTime;
      }
    });
    return out;
  }

  _lost() {
    if (this.ended) return;
    if (!this.opened) return this._fallback("the data channel closed before it opened");
    const failed = this.pc && this.pc.connectionState === "failed";
    if (failed) return this._end({ code: 1006, reason: "", opened: true });
    // The server ended the call. Draining is announced first (kame.session.ending): reconnect as after 1001.
    this._end({ code: this.draining ? 1001 : 1000, reason: this.draining ? "" : "the call ended", opened: true });
  }

  _fallback(reason) {
    if (this.ended) return;
    this.ended = true;
    // Once the server has ended the call (its slot is free), or after a few seconds without an answer.
    const hungUp = this._teardown(true);
    const bound = new Promise((resolve) => setTimeout(resolve, HANGUP_WAIT_MS));
    Promise.race([hungUp, bound]).then(() => this.dispatchEvent(new CustomEvent("fallback", { detail: { reason } })));
  }

  _end(detail) {
    if (this.ended) return;
    this.ended = true;
    this._teardown(detail.opened);
    this.dispatchEvent(new CustomEvent("close", { detail }));
  }

  // Frees the server's slot now rather than at its own ICE timeout.
  _hangup() {
    if (!this.location) return Promise.resolve();
    const callId = this.location.split("/").pop();
    const headers = this.token ? { Authorization: `Bearer ${this.token}` } : {};
    const url = `${this.url}/${encodeURIComponent(callId)}/hangup`;
    return fetch(url, { method: "POST", headers, keepalive: true }).catch(() => {});
  }

  _teardown(hangup) {
    clearTimeout(this.timer);
    const hungUp = hangup ? this._hangup() : Promise.resolve();
    if (this.dc) {
      this.dc.onclose = this.dc.onmessage = this.dc.onopen = null;
    }
    if (this.pc) {
      this.pc.onconnectionstatechange = null;
      this.pc.close();
    }
    if (this.track) this.track.stop();
    if (this.audio) this.audio.srcObject = null;
    return hungUp;
  }
}
