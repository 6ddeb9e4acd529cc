// The page's controller: wires the microphone and speaker (audio-io.js), the
// conversation's transport and the DOM (panes.js, the controls). The
// transport is WebRTC (webrtc-client.js: /v1/realtime/calls, Opus over RTP)
// by default, and the /v1/realtime websocket (realtime-client.js) when the
// call's ICE never connects or the browser has no WebRTC: the page falls
// back by itself and keeps the websocket for later connections.
// ?transport=websocket or ?transport=webrtc forces one (no fallback).
// Everything a test needs to read is mirrored on `window.kame`.

import { AudioIO } from "./audio-io.js";
import { FRAME, InputClock } from "./latency.js";
import { Panes, seconds } from "./panes.js";
import { RealtimeClient, base64ToFloat32 } from "./realtime-client.js";
import { BACKOFF, backoffDelayS, retryKind, retryText } from "./reconnect.js";
import { ICE_TIMEOUT_MS, WebRtcClient, webrtcAvailable } from "./webrtc-client.js";

const $ = (id) => document.getElementById(id);
const SILENCE = new Int16Array(FRAME);
const MAX_EVENTS = 400;

const ui = {
  state: $("conn-state"),
  notice: $("notice"),
  noticeText: $("notice-text"),
  connect: $("connect"),
  talk: $("talk"),
  talkHint: $("talk-hint"),
  micState: $("mic-state"),
  micLevel: $("mic-level"),
  reset: $("reset"),
  backend: $("backend"),
  backendInfo: $("backend-info"),
  voice: $("voice"),
  voiceField: $("voice-field"),
  voiceInfo: $("voice-info"),
  policy: $("policy"),
  policyInfo: $("policy-info"),
  instructions: $("instructions"),
  apply: $("apply"),
  settingsStatus: $("settings-status"),
  access: $("access"),
  token: $("token"),
  rtt: $("m-rtt"),
  buffer: $("m-buffer"),
  reply: $("m-reply"),
  underruns: $("m-underruns"),
};
const panes = new Panes({ user: $("user-log"), oracle: $("oracle-log"), assistant: $("assistant-log") });
// ?rate=48000 (or ?rate=device) runs the audio at another rate, through the
// worklets' resamplers: what browsers that refuse a 24 kHz context get.
const rateParam = new URLSearchParams(location.search).get("rate");
const io = new AudioIO({ contextRate: rateParam ? Number(rateParam) || null : 24000 });
const params = new URLSearchParams(location.search);
const forced = ["webrtc", "websocket"].includes(params.get("transport")) ? params.get("transport") : null;
const iceTimeoutMs = Number(params.get("ice_timeout_s")) * 1000 || ICE_TIMEOUT_MS;
const clock = new InputClock();

// Mirrored on window.kame for tests and for curious users in the console.
const counters = {
  framesSent: 0, // input_audio_buffer.append messages (one 80 ms frame each)
  micFramesSent: 0, // ... carrying the microphone's audio
  silentFramesSent: 0, // ... carrying exact zeros (push to talk released)
  nonZeroSamplesWhileReleased: 0, // non-zero samples actually sent while released: must stay 0
  outputFrames: 0,
  outputSamples: 0, // handed to the playback worklet (its jitter buffer's `received` catches up)
  responseFrames: 0,
};
// Gaps over 150 ms (a frame late by more than the starting cushion) between output
// frames received (`stalls`: the server or the network was late) and between input
// frames sent (`inputStalls`: this page was late), the last 20 of each.
const latency = { roundTripMs: null, replyMs: [], stalls: [], inputStalls: [] };
const STALL_MS = 150;
let lastOutputAt = null;
let lastInputAt = null;

function noteGap(list, last, now) {
  if (last !== null && now - last > STALL_MS) {
    list.push({ at: Math.round(now), ms: Math.round(now - last) });
    if (list.length > 20) list.shift();
  }
}
const kame = {
  phase: "idle",
  micMode: "open",
  talking: false,
  counters,
  latency,
  playback: null,
  events: [],
  session: null,
  micSettings: null,
  sampleRate: null,
  reconnects: 0,
  resumes: 0,
  // "webrtc" or "websocket": what the next (or current) conversation uses; `fallback` says why the
  // page left WebRTC; `rtc` is the browser's own statistics of a WebRTC call.
  transport: forced || (webrtcAvailable() ? "webrtc" : "websocket"),
  fallback: null,
  rtc: null,
  get micOpen() {
    return io.stream !== null && io.stream.active; // the browser is capturing
  },
};
window.kame = kame;

let client = null;
// Resuming (docs/protocol.md, "Reconnecting"): the session's handle (kame.session.resumable), and whether the
// connection being opened takes that session back rather than starting a new conversation.
const resume = { handle: null, active: false };
let micPending = false; // waiting for getUserMedia (the permission prompt)
let sessionReady = false;
let closeMessage = null; // the fatal error event's text, shown when the socket closes
let framesAtReset = null;
let updateSeq = 0;
const pendingUpdates = new Map(); // event_id -> what it changed, oldest first
let markSeq = 0;
let reply = null; // {endAt, responseId, mark}: timing the reply to the last user turn
const turns = new Map(); // user item id -> {startAt, endAt}
let lastTurn = null;
const requests = new Map(); // request id -> {backend, turn, arrivedAt}
let downNotice = false;
// Reconnecting (reconnect.js): failed tries in a row, the pending timer, whether a conversation had
// started (a reconnect then starts a new one), why the last try failed (retryKind's `previous`).
// window.kame.reconnects counts reconnects made.
const retry = { failures: 0, timer: null, started: false, lastKind: null };

// ------------------------------------------------------------------ notices and state
function notice(kind, text) {
  ui.notice.dataset.kind = kind;
  ui.noticeText.textContent = text;
  ui.notice.hidden = false;
  downNotice = false;
}

function clearNotice() {
  ui.notice.hidden = true;
  downNotice = false;
}

$("notice-close").addEventListener("click", clearNotice);

function setPhase(phase, label, kind) {
  kame.phase = phase;
  ui.state.textContent = label;
  ui.state.dataset.kind = kind;
  // While connecting or waiting to reconnect the button cancels, except during the microphone prompt.
  const busy = phase === "connecting" || phase === "waiting";
  ui.connect.textContent = phase === "idle" ? "Connect" : !busy ? "Disconnect" : micPending ? "Connecting…" : "Cancel";
  ui.connect.classList.toggle("primary", phase === "idle");
  ui.connect.disabled = busy && micPending;
  ui.reset.disabled = phase !== "live";
  updateMicState();
}

function updateMicState() {
  const live = kame.phase === "live";
  let label = "Mic off";
  if (live) label = kame.micMode === "open" ? "Mic on" : kame.talking ? "Talking" : "Muted";
  ui.micState.textContent = label;
  ui.micState.dataset.kind = !live ? "off" : kame.micMode === "open" || kame.talking ? "on" : "muted";
  ui.talk.disabled = !live;
}

function recordEvent(event) {
  const { type, receivedAt } = event;
  const small = { type, at: Math.round(receivedAt) };
  for (const k of ["item_id", "response_id", "request_id", "backend", "transcript", "text", "audio_start_ms", "audio_end_ms", "reason", "error", "code"]) {
    if (event[k] !== undefined) small[k] = event[k];
  }
  if (event.error && typeof event.error === "object") small.error = event.error.code;
  if (event.response) small.response_id = event.response.id;
  kame.events.push(small);
  if (kame.events.length > MAX_EVENTS) kame.events.splice(0, kame.events.length - MAX_EVENTS);
}

// ------------------------------------------------------------------ environment checks
function environmentProblem() {
  if (!window.isSecureContext || !navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    return (
      "The microphone only works on a secure page: open this page over HTTPS, or as http://localhost " +
      `on the machine running the server. This page is ${location.origin}, which the browser does not trust.`
    );
  }
  if (typeof AudioWorkletNode === "undefined") return "This browser lacks AudioWorklet, which the page needs for audio.";
  return null;
}

function micErrorText(err) {
  switch (err && err.name) {
    case "NotAllowedError":
    case "SecurityError":
      return "Microphone access was refused. Allow the microphone for this site (the icon in the address bar), then press Connect again.";
    case "NotFoundError":
    case "OverconstrainedError":
      return "No microphone was found. Plug one in, then press Connect again.";
    case "NotReadableError":
    case "AbortError":
      return "The microphone could not be opened: another application may be using it.";
    default:
      return `The audio could not start (${(err && err.message) || err}).`;
  }
}

function closeText(code, reason, opened) {
  if (code === 1013) {
    return reason.startsWith("server starting")
      ? ["warn", "The server is still loading its models. Try again in a few seconds."]
      : ["warn", "The server is full: every conversation slot is taken. Try again in a moment."];
  }
  if (code === 1008 && reason === "unauthorized") {
    ui.access.open = true;
    return ["error", "This server needs an access token: enter it under “Server access”, then connect again."];
  }
  if (code === 1008 && reason === "origin not allowed") {
    return ["error", `This server does not accept conversations from ${location.origin} (server.allowed_origins).`];
  }
  if (code === 1001) return ["warn", "The server is shutting down. Connect again in a moment."];
  if (code === 1011) return ["error", `${closeMessage || "The server hit an error"}. Connect again to start afresh.`];
  if (code === 1000 && reason) return ["info", `The conversation ended: ${reason}.`];
  if (!opened) return ["error", `Cannot reach the server at ${location.host}.`];
  if (code === 1006) return ["error", "The connection to the server was lost."];
  return ["error", `The conversation ended (${code}${reason ? `: ${closeMessage || reason}` : ""}).`];
}

// ------------------------------------------------------------------ back-ends and settings
async function loadBackends() {
  const headers = ui.token.value ? { Authorization: `Bearer ${ui.token.value}` } : {};
  let body;
  try {
    const res = await fetch("v1/backends", { headers, cache: "no-store" });
    if (res.status === 401) {
      ui.access.open = true;
      ui.backendInfo.textContent = "Enter the server's access token to list the back-ends.";
      return;
    }
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    body = await res.json();
  } catch (err) {
    ui.backendInfo.textContent = `Back-ends unavailable (${err.message}).`;
    return;
  }
  const current = ui.backend.value;
  ui.backend.replaceChildren();
  if (!body.backends.length) {
    ui.backend.append(new Option("none (the voice model alone)", ""));
    ui.backend.disabled = true;
    return;
  }
  for (const b of body.backends) {
    const down = b.reachable === false ? " (unreachable)" : "";
    const opt = new Option(`${b.name} · ${b.kind}${down}`, b.name);
    opt.title = b.description || "";
    ui.backend.append(opt);
  }
  ui.backend.disabled = false;
  ui.backend.value = current && body.backends.some((b) => b.name === current) ? current : body.default;
  describeBackend(body.backends);
}

// A PersonaPlex checkpoint has voices (GET /health lists them): the picker shows only then. The voice and
// the instructions (its persona there) condition the session at its start: changing them restarts it.
async function loadVoices() {
  let voices;
  try {
    const res = await fetch("/health", { cache: "no-store" });
    voices = (await res.json()).voices;
  } catch (err) {
    return;
  }
  if (!voices || !voices.names || !voices.names.length) return;
  ui.voice.replaceChildren(...voices.names.map((n) => new Option(n, n)));
  ui.voice.value = voices.default || voices.names[0];
  ui.voiceField.hidden = false;
  const label = document.querySelector("label[for=instructions]");
  if (voices.persona && label) label.textContent = "Instructions (the persona, and for the back-end)";
  ui.voiceInfo.textContent = "The voice and the instructions (the persona) start the conversation: changing them starts it again.";
}

ui.voice.addEventListener("change", () => {
  if (sessionReady) sendUpdate({ audio: { output: { voice: ui.voice.value } } }, { label: `voice ${ui.voice.value}` });
});

let backendList = [];
function describeBackend(list = backendList) {
  backendList = list;
  const b = list.find((x) => x.name === ui.backend.value);
  ui.backendInfo.textContent = b ? `${b.description || b.model || b.kind}${/[.!?]$/.test(b.description || "") ? "" : "."}` : "";
}

function sendUpdate(fields, what) {
  const id = `ui_${++updateSeq}`;
  pendingUpdates.set(id, what);
  client.updateSession(fields, id);
  ui.settingsStatus.textContent = `Applying ${what.label}…`;
}

function applySession(session) {
  kame.session = session;
  const k = session.kame || {};
  if (k.backend && [...ui.backend.options].some((o) => o.value === k.backend)) ui.backend.value = k.backend;
  if (k.oracle_policy) ui.policy.value = k.oracle_policy;
  describeBackend();
  describePolicy();
  const voice = session.audio && session.audio.output && session.audio.output.voice;
  if (!ui.voiceField.hidden && voice && [...ui.voice.options].some((o) => o.value === voice)) ui.voice.value = voice;
}

ui.backend.addEventListener("change", () => {
  describeBackend();
  if (downNotice) clearNotice();
  if (sessionReady) sendUpdate({ kame: { backend: ui.backend.value } }, { label: `back-end ${ui.backend.value}` });
});
const POLICIES = {
  reset: "Each newer answer replaces the one being fed.",
  keep_if_same_start: "A newer answer that starts with the words already fed continues them.",
  freeze_when_speaking: "Once the assistant speaks after your last word, newer answers are ignored.",
};
function describePolicy() {
  ui.policyInfo.textContent = POLICIES[ui.policy.value] || "";
}

ui.policy.addEventListener("change", () => {
  describePolicy();
  if (sessionReady) sendUpdate({ kame: { oracle_policy: ui.policy.value } }, { label: `policy ${ui.policy.value}` });
});
ui.apply.addEventListener("click", () => {
  if (sessionReady) sendUpdate({ instructions: ui.instructions.value.trim() || null }, { label: "instructions" });
  else ui.settingsStatus.textContent = "The instructions apply when you connect.";
});
$("access-form").addEventListener("submit", (e) => {
  e.preventDefault();
  loadBackends();
});

// ------------------------------------------------------------------ connecting
async function connect({ reconnecting = false } = {}) {
  const problem = environmentProblem();
  if (problem) {
    notice("error", problem);
    return;
  }
  if (!reconnecting) {
    stopRetrying();
    clearNotice();
  }
  micPending = true;
  setPhase("connecting", "Connecting…", "busy");
  try {
    await io.start();
  } catch (err) {
    micPending = false;
    await io.stop().catch(() => {});
    setPhase("idle", "Disconnected", "idle");
    notice("error", micErrorText(err));
    return;
  }
  micPending = false;
  setPhase("connecting", "Connecting…", "busy");
  kame.micSettings = io.micSettings;
  kame.sampleRate = io.sampleRate;
  clock.reset();
  lastOutputAt = lastInputAt = null;
  sessionReady = false;
  closeMessage = null;
  framesAtReset = null;
  reply = null;
  lastTurn = null;
  turns.clear();
  requests.clear();
  pendingUpdates.clear();
  try {
    openTransport();
  } catch (err) {
    client = null;
    await io.stop();
    setPhase("idle", "Disconnected", "idle");
    notice("error", `Cannot open the connection (${err.message}).`);
  }
}

function openTransport() {
  const token = ui.token.value.trim();
  const c = kame.transport === "webrtc"
    ? new WebRtcClient({ token, track: io.stream.getAudioTracks()[0], iceTimeoutMs })
    : new RealtimeClient({ token, resume: resume.active ? resume.handle : null });
  client = c;
  kame.rtc = null;
  if (c.setMicOpen) c.setMicOpen(kame.micMode === "open" || kame.talking);
  c.addEventListener("event", (e) => client === c && onServerEvent(e.detail));
  c.addEventListener("close", (e) => client === c && onClose(e.detail));
  c.addEventListener("fallback", (e) => {
    if (client !== c) return;
    // The call cannot carry audio from here (UDP blocked, no calls endpoint): the websocket can, now and
    // for the rest of this page's life. A forced WebRTC page says so instead.
    if (forced === "webrtc") {
      onClose({ code: 1000, reason: `WebRTC failed: ${e.detail.reason}`, opened: false });
      return;
    }
    kame.fallback = e.detail.reason;
    kame.transport = "websocket";
    console.info(`kame: WebRTC unavailable (${e.detail.reason}); using the websocket`);
    openTransport();
  });
  c.connect();
}

function stopRetrying() {
  if (retry.timer !== null) clearTimeout(retry.timer);
  retry.timer = null;
  retry.failures = 0;
  retry.started = false;
  retry.lastKind = null;
  resume.handle = null; // the next connection is a new conversation
  resume.active = false;
}

async function disconnect() {
  if (retry.timer !== null) clearNotice(); // "Reconnecting in ..." no longer holds
  stopRetrying();
  sessionReady = false;
  if (client) client.close();
  client = null;
  await io.stop();
  setPhase("idle", "Disconnected", "idle");
}

async function readyStatus() {
  try {
    return (await fetch(new URL("ready", document.baseURI), { cache: "no-store" })).status;
  } catch {
    return null; // the server is unreachable: not a refusal
  }
}

function resumeAfter(code, opened) {
  // A dropped connection (1006), or a drain or restart (1001, 1012), of a session that has a handle: take it
  // back. A resume refused for good (1008: expired, unknown) starts a new conversation.
  if (!resume.handle || kame.transport !== "websocket") return false;
  if (resume.active && code === 1008) {
    resume.handle = null;
    resume.active = false;
    notice("warn", "The conversation could not be resumed: starting a new one.");
    setPhase("waiting", "Reconnecting…", "busy");
    retry.timer = setTimeout(() => {
      retry.timer = null;
      if (kame.phase === "waiting") connect({ reconnecting: true });
    }, 200);
    return true;
  }
  if (!(opened || resume.active) || ![1001, 1006, 1012].includes(code) || retry.failures >= BACKOFF.attempts) return false;
  retry.failures += 1;
  const delay = resume.active ? backoffDelayS(BACKOFF, retry.failures, Math.random()) : 0.2;
  resume.active = true;
  setPhase("waiting", "Resuming…", "busy");
  notice("warn", `Connection lost: resuming this conversation in ${delay.toFixed(1)} s…`);
  retry.timer = setTimeout(() => {
    retry.timer = null;
    if (kame.phase === "waiting") connect({ reconnecting: true });
  }, delay * 1000);
  return true;
}

async function onClose({ code, reason, opened }) {
  client = null;
  sessionReady = false;
  io.stop().catch(() => {}); // the microphone is released while no conversation runs
  if (resumeAfter(code, opened)) return;
  const handshakeFailed = !opened && code === 1006;
  setPhase(handshakeFailed ? "waiting" : "idle", handshakeFailed ? "Reconnecting…" : "Disconnected", handshakeFailed ? "busy" : "idle");
  const kind = retryKind({ code, reason: reason || "", opened, readyStatus: handshakeFailed ? await readyStatus() : null,
                          previous: retry.lastKind });
  const cancelled = handshakeFailed && kame.phase === "idle"; // Cancel pressed during the /ready probe
  if (cancelled) return;
  if (kind !== null && retry.failures < BACKOFF.attempts) {
    retry.failures += 1;
    retry.lastKind = kind;
    const delay = backoffDelayS(BACKOFF, retry.failures, Math.random());
    setPhase("waiting", "Reconnecting…", "busy");
    notice("warn", retryText(kind, delay, retry.failures, BACKOFF.attempts, retry.started));
    retry.timer = setTimeout(() => {
      retry.timer = null;
      if (kame.phase === "waiting") connect({ reconnecting: true });
    }, delay * 1000);
    return;
  }
  const gaveUp = kind !== null;
  stopRetrying();
  setPhase("idle", "Disconnected", "idle");
  const [level, text] = closeText(code, reason || "", opened);
  notice(level, gaveUp ? `${text} (gave up after ${BACKOFF.attempts} retries)` : text);
}

ui.connect.addEventListener("click", () => (kame.phase === "idle" ? connect() : disconnect()));
ui.reset.addEventListener("click", () => {
  if (!sessionReady) return;
  framesAtReset = clock.sent.length; // frames sent after this go to the new conversation
  client.resetSession();
  ui.settingsStatus.textContent = "Starting a new conversation…";
});

// ------------------------------------------------------------------ microphone -> server
io.addEventListener("frame", (e) => {
  const { pcm, rms } = e.detail;
  ui.micLevel.style.transform = `scaleX(${Math.min(1, Math.sqrt(rms) * 2.2).toFixed(3)})`;
  if (!sessionReady || !client) return;
  // Push to talk, released: the microphone's samples never leave the page. The
  // same number of zero samples go instead, because the server's voice model
  // steps once per 80 ms of input and would stop answering without them.
  const open = kame.micMode === "open" || kame.talking;
  if (client.setMicOpen) {
    client.setMicOpen(open); // WebRTC: the track itself is muted, the browser sends silence
    return;
  }
  const out = open ? pcm : SILENCE;
  if (!client.appendAudio(out)) return;
  const now = performance.now();
  clock.frameSent(now);
  noteGap(latency.inputStalls, lastInputAt, now);
  lastInputAt = now;
  counters.framesSent += 1;
  if (open) counters.micFramesSent += 1;
  else {
    counters.silentFramesSent += 1;
    for (let i = 0; i < out.length; i++) if (out[i] !== 0) counters.nonZeroSamplesWhileReleased += 1;
  }
});

// ------------------------------------------------------------------ server -> page
function onServerEvent(event) {
  const t = event.type;
  if (t === "response.output_audio.delta" || t === "kame.output_audio.delta") {
    onAudio(event);
    return;
  }
  recordEvent(event);
  switch (t) {
    case "session.created":
      onSessionCreated(event.session);
      break;
    case "session.updated": {
      // Updates are answered in order, each by session.updated or by an error
      // naming it: the oldest one still pending is the one applied.
      applySession(event.session);
      const [id, what] = pendingUpdates.entries().next().value || [];
      pendingUpdates.delete(id);
      ui.settingsStatus.textContent = what ? `Applied ${what.label}.` : "Settings applied.";
      break;
    }
    case "error":
      onError(event);
      break;
    case "kame.session.reset":
      clock.rebase(framesAtReset ?? clock.sent.length);
      framesAtReset = null;
      io.flush();
      panes.clear();
      reply = null;
      lastTurn = null;
      turns.clear();
      requests.clear();
      ui.settingsStatus.textContent = "New conversation started.";
      break;
    // ---- the user's side
    case "input_audio_buffer.speech_started": {
      const turn = { startAt: clock.timeOfAudio(event.audio_start_ms) ?? event.receivedAt, endAt: null };
      turns.set(event.item_id, turn);
      lastTurn = turn;
      panes.userTurn(event.item_id);
      break;
    }
    case "kame.input_audio_transcription.partial":
      panes.userPartial(event.item_id, event.text || "", event.stable || "");
      break;
    case "input_audio_buffer.speech_stopped":
      onSpeechStopped(event);
      break;
    case "conversation.item.input_audio_transcription.completed":
      panes.userFinal(event.item_id, event.transcript || "");
      break;
    case "conversation.item.input_audio_transcription.failed":
      panes.userFailed(event.item_id);
      break;
    // ---- the back-end and the oracle
    case "kame.backend.request_started":
      requests.set(event.request_id, { backend: event.backend, turn: lastTurn, arrivedAt: null });
      break;
    case "kame.backend.first_token": {
      const req = requests.get(event.request_id);
      if (req) req.ttft = event.ttft_s;
      panes.oracleStatus(event.request_id, `first token ${seconds(event.ttft_s * 1000)}`);
      break;
    }
    case "kame.oracle.reset":
    case "kame.oracle.text":
      onOracle(event);
      break;
    case "kame.backend.done":
      panes.oracleStatus(event.request_id, `done in ${seconds(event.duration_s * 1000)}`, "done");
      break;
    case "kame.backend.cancelled":
    case "kame.backend.dropped":
      panes.oracleStatus(event.request_id, t.endsWith("cancelled") ? "superseded" : "too late", "bad");
      break;
    case "kame.backend.error": {
      // A failed request gets a card too: the answer the voice model did not get.
      const req = requests.get(event.request_id);
      if (!req || req.arrivedAt === null) panes.oracleText(event.request_id, event.backend, "(no answer)");
      panes.oracleStatus(event.request_id, `failed: ${event.error}`, "bad");
      break;
    }
    case "kame.tool.call_started":
      panes.oracleTool(event.request_id, requests.get(event.request_id)?.backend, event.call_id, event.name, "running…");
      break;
    case "kame.tool.call_finished":
      panes.oracleTool(
        event.request_id,
        requests.get(event.request_id)?.backend,
        event.call_id,
        event.name,
        `${event.outcome} in ${seconds(event.duration_s * 1000)}`,
        event.ok ? "done" : "bad",
      );
      break;
    case "kame.oracle.cleared":
      panes.oracleCleared();
      break;
    case "kame.backend.down":
      notice(
        "warn",
        `The back-end “${event.backend}” is not answering (${event.error}); the assistant goes on without its ` +
          `answers. Retrying in ${Number(event.retry_in_s).toFixed(1)} s, or pick another back-end.`,
      );
      downNotice = true;
      break;
    case "kame.backend.up":
      if (downNotice) clearNotice();
      ui.settingsStatus.textContent = `Back-end ${event.backend} answers again.`;
      break;
    // ---- the assistant
    case "output_audio_buffer.started":
      // WebRTC: the reply's first audio leaves the server now (the browser's jitter buffer adds its delay).
      if (reply && !reply.mark) {
        latency.replyMs.push(Math.round(event.receivedAt - reply.endAt));
        reply = null;
      }
      break;
    case "response.created":
      if (reply && !reply.responseId) reply.responseId = event.response.id;
      break;
    case "response.output_audio_transcript.delta":
      panes.assistantText(event.response_id, event.delta || "");
      break;
    case "response.done": {
      const r = event.response;
      const item = r.output && r.output[0];
      const part = item && item.content && item.content[0];
      panes.assistantDone(r.id, (part && part.transcript) || "");
      break;
    }
    case "kame.asr.error":
      notice("warn", `Speech recognition stopped (${event.message}); the conversation goes on without transcripts.`);
      break;
    case "kame.session.resumable":
      resume.handle = event.handle;
      break;
    case "kame.session.resumed":
      kame.resumes += 1;
      notice("info", event.voice === "continued"
        ? "Resumed: the same conversation goes on, the voice where it stopped."
        : "Resumed on another server: the same conversation goes on (the voice starts fresh, the assistant remembers).");
      break;
    case "kame.session.ending":
      if (event.reason === "draining" && event.handle && client && client.transport !== "webrtc") {
        // the server hands the conversation over as soon as this connection is gone: leave now, come back
        resume.handle = event.handle;
        notice("warn", "The server is shutting down for an update: moving this conversation to another server…");
        const c = client;
        c.close();
        onClose({ code: 1001, reason: "server shutting down", opened: true }, c);
      } else if (event.reason === "draining") {
        notice("warn", `The server is shutting down for an update: this conversation ends in ${Math.round(event.seconds_left)} s, ` +
          "then the page reconnects (a new conversation).");
      } else notice("info", `This conversation reaches its maximum length in ${Math.round(event.seconds_left)} s.`);
      break;
    default:
      break;
  }
}

function onSessionCreated(session) {
  applyServerInfo(session);
  if (resume.active) { // the same session: its settings, items and panes stay
    resume.active = false;
    kame.session = session;
    sessionReady = true;
    retry.failures = 0;
    retry.lastKind = null;
    applySession(session);
    setPhase("live", "Live", "live");
    return;
  }
  const k = session.kame || {};
  // The choices made before connecting, in one update before any audio flows.
  const fields = {};
  const kameFields = {};
  if (ui.backend.value && ui.backend.value !== k.backend) kameFields.backend = ui.backend.value;
  if (ui.policy.value !== k.oracle_policy) kameFields.oracle_policy = ui.policy.value;
  // kame's own events (partials, the back-end, the oracle) are opt-in: the websocket asks with ?kame_events=1,
  // a call (whose URL is OpenAI's) with its first session.update.
  if (client && client.transport === "webrtc") kameFields.events = true;
  if (Object.keys(kameFields).length) fields.kame = kameFields;
  if (ui.instructions.value.trim()) fields.instructions = ui.instructions.value.trim();
  const voice = session.audio && session.audio.output && session.audio.output.voice;
  if (!ui.voiceField.hidden && ui.voice.value && ui.voice.value !== voice) fields.audio = { output: { voice: ui.voice.value } };
  kame.session = session;
  sessionReady = true;
  if (retry.failures > 0) {
    if (retry.started) {
      kame.reconnects += 1;
      notice("info", "Reconnected: this is a new conversation.");
    } else clearNotice();
  }
  retry.failures = 0;
  retry.lastKind = null;
  retry.started = true;
  panes.clear(); // a new session is a new conversation
  if (Object.keys(fields).length) sendUpdate(fields, { label: "your settings" });
  else applySession(session);
  setPhase("live", "Live", "live");
}

function applyServerInfo(session) {
  const server = (session.kame && session.kame.server) || {};
  if (Array.isArray(server.oracle_policies) && server.oracle_policies.length) {
    const chosen = ui.policy.value;
    ui.policy.replaceChildren(...server.oracle_policies.map((p) => new Option(p, p)));
    ui.policy.value = server.oracle_policies.includes(chosen) ? chosen : session.kame.oracle_policy;
  }
  if (!ui.backend.options.length && Array.isArray(server.backends)) {
    for (const name of server.backends) ui.backend.append(new Option(name, name));
    ui.backend.disabled = !server.backends.length;
  }
}

function onError(event) {
  const err = event.error || {};
  const what = err.event_id && pendingUpdates.get(err.event_id);
  if (what) {
    pendingUpdates.delete(err.event_id);
    ui.settingsStatus.textContent = `Not applied (${err.message}).`;
    if (kame.session) applySession(kame.session); // back to what the server has
    return;
  }
  const fatal = ["engine_error", "internal_error", "too_many_errors", "rate_limited", "audio_flood", "server_full"];
  if (fatal.includes(err.code)) closeMessage = err.message;
  else if (err.code === "input_audio_buffer_overflow") notice("warn", "The page sends audio faster than the server plays it; some was dropped.");
  else ui.settingsStatus.textContent = err.message || "The server reported an error.";
}

function onSpeechStopped(event) {
  const turn = turns.get(event.item_id) || { startAt: event.receivedAt };
  turn.endAt = clock.timeOfAudio(event.audio_end_ms) ?? event.receivedAt;
  turns.set(event.item_id, turn);
  panes.userStopped(event.item_id);
  // The next response is the reply: time it from here to its first audible sample.
  reply = { endAt: turn.endAt, responseId: null, mark: null };
  for (const [id, req] of requests) if (req.turn === turn && req.arrivedAt !== null) labelOracle(id, req);
}

function onOracle(event) {
  const req = requests.get(event.request_id) || { backend: null, turn: lastTurn, arrivedAt: null };
  requests.set(event.request_id, req);
  if (req.arrivedAt === null) req.arrivedAt = event.receivedAt;
  panes.oracleText(event.request_id, req.backend, event.text || "");
  labelOracle(event.request_id, req);
}

// When the answer reached the voice model, against the user's turn it answers.
function labelOracle(requestId, req) {
  const turn = req.turn;
  let label = "";
  if (turn && turn.endAt) {
    const d = req.arrivedAt - turn.endAt;
    label = d < 0 ? `${seconds(d)} before you stopped` : `${seconds(d)} after you stopped`;
  } else if (turn) {
    label = `while you speak (${seconds(req.arrivedAt - turn.startAt)} in)`;
  }
  panes.oracleWhen(requestId, label);
}

function onAudio(event) {
  const pcm = base64ToFloat32(event.delta);
  const rtt = clock.frameReceived(event.receivedAt);
  noteGap(latency.stalls, lastOutputAt, event.receivedAt);
  lastOutputAt = event.receivedAt;
  if (rtt !== null) latency.roundTripMs = clock.roundTrip();
  counters.outputFrames += 1;
  counters.outputSamples += pcm.length;
  let mark = null;
  if (event.type === "response.output_audio.delta") {
    counters.responseFrames += 1;
    if (reply && reply.responseId === event.response_id && reply.mark === null) mark = reply.mark = ++markSeq;
  }
  // Frames outside responses are the assistant's silence: skippable when late.
  io.play(pcm, { mark, droppable: event.type === "kame.output_audio.delta" });
}

io.addEventListener("mark", (e) => {
  if (!reply || e.detail.mark !== reply.mark) return;
  const ms = e.detail.at - reply.endAt;
  latency.replyMs.push(Math.round(ms));
  reply = null;
});

io.addEventListener("stats", (e) => {
  kame.playback = e.detail;
});

// ------------------------------------------------------------------ push to talk
function setMicMode(mode) {
  kame.micMode = mode;
  const ptt = mode === "ptt";
  ui.talk.hidden = !ptt;
  ui.talkHint.hidden = !ptt;
  if (!ptt) setTalking(false);
  updateMicState();
}

function setTalking(on) {
  if (kame.talking === on) return;
  kame.talking = on;
  ui.talk.setAttribute("aria-pressed", String(on));
  ui.talk.classList.toggle("active", on);
  updateMicState();
}

for (const input of document.querySelectorAll('input[name="mic-mode"]')) {
  input.addEventListener("change", () => input.checked && setMicMode(input.value));
}
ui.talk.addEventListener("pointerdown", (e) => {
  ui.talk.setPointerCapture(e.pointerId);
  setTalking(true);
});
for (const type of ["pointerup", "pointercancel", "lostpointercapture"]) ui.talk.addEventListener(type, () => setTalking(false));
ui.talk.addEventListener("contextmenu", (e) => e.preventDefault()); // long press on phones

// Space talks everywhere but in fields that take typing (Enter still activates buttons).
function spaceIsForTalking(e) {
  if (e.code !== "Space" || kame.micMode !== "ptt") return false;
  const t = e.target;
  return !(t instanceof HTMLInputElement && t.type !== "radio") && !(t instanceof HTMLTextAreaElement) && !(t instanceof HTMLSelectElement);
}
document.addEventListener("keydown", (e) => {
  if (!spaceIsForTalking(e)) return;
  e.preventDefault();
  if (!e.repeat) setTalking(true);
});
document.addEventListener("keyup", (e) => {
  if (!spaceIsForTalking(e)) return;
  e.preventDefault();
  setTalking(false);
});
window.addEventListener("blur", () => setTalking(false));

// ------------------------------------------------------------------ read-outs
async function pollRtc() {
  if (!client || !client.stats || !sessionReady) return;
  const c = client;
  const s = await c.stats().catch(() => null);
  if (client !== c || !s) return;
  kame.rtc = s;
  if (s.roundTripMs !== null) latency.roundTripMs = s.roundTripMs;
}

function showMetrics() {
  pollRtc();
  const rtc = kame.transport === "webrtc" ? kame.rtc : null;
  if (rtc && rtc.inbound) {
    ui.rtt.textContent = latency.roundTripMs === null ? "–" : `${Math.round(latency.roundTripMs)} ms`;
    ui.buffer.textContent = rtc.inbound.jitterBufferMs === null ? "–" : `${Math.round(rtc.inbound.jitterBufferMs)} ms`;
    const lastReply = latency.replyMs[latency.replyMs.length - 1];
    ui.reply.textContent = lastReply === undefined ? "–" : seconds(lastReply);
    ui.underruns.textContent = String(rtc.inbound.concealmentEvents ?? "–");
    return;
  }
  const rtt = latency.roundTripMs;
  ui.rtt.textContent = rtt === null ? "–" : `${Math.round(rtt)} ms`;
  ui.rtt.dataset.kind = rtt !== null && rtt > 500 ? "warn" : ""; // the server is behind real time
  const p = kame.playback;
  ui.buffer.innerHTML = "";
  if (p && kame.phase === "live") {
    ui.buffer.append(`${p.depthMs} ms`, Object.assign(document.createElement("small"), { textContent: ` target ${p.targetMs}` }));
  } else ui.buffer.textContent = "–";
  const last = latency.replyMs[latency.replyMs.length - 1];
  ui.reply.textContent = last === undefined ? "–" : seconds(last);
  ui.underruns.textContent = p ? String(p.underruns) : "–";
}
setInterval(showMetrics, 250);

// ------------------------------------------------------------------ start-up
setMicMode(document.querySelector('input[name="mic-mode"]:checked').value);
describePolicy();
setPhase("idle", "Disconnected", "idle");
const problem = environmentProblem();
if (problem) {
  notice("error", problem);
  ui.connect.disabled = true;
}
loadBackends();
loadVoices();
