// Reconnecting after a refusal or a drain (docs/protocol.md, "Reconnecting"); the same rules as
// kame mic and kame eval (kame/client/reconnect.py). Pure: no page, no timers.
//
// A replica refuses a session it has no room for (close 1013), closes its sessions with 1001
// when it drains for an update, and a load balancer answers the handshake with HTTP 503 when no
// replica has room. Browsers hide the status of a failed websocket handshake (the close is 1006
// without "open"), so the page asks GET /ready afterwards: a 502/503/504 there means the same.
// A reconnect starts a new conversation: the server keeps nothing across connections.

export const BACKOFF = Object.freeze({ firstS: 0.25, factor: 2, maxS: 8, jitter: 0.5, attempts: 8 });

// Seconds before retry number `retry` (1 = the first); `draw` is uniform in [0, 1).
export function backoffDelayS(policy, retry, draw) {
  if (!(retry >= 1)) throw new RangeError("retry counts from 1");
  const ceiling = Math.min(policy.maxS, policy.firstS * policy.factor ** Math.min(retry - 1, 64));
  return ceiling * (1 - policy.jitter * draw);
}

const RETRY_CLOSE = { 1001: "draining", 1012: "restarting", 1013: "busy" };
const RETRY_HTTP = [502, 503, 504];

// "draining", "restarting", "busy", "starting", "no_room", "room_freed" or null (not worth a retry).
// `previous`: the kind of the failed try just before this one (null on a first try). A handshake that
// fails while /ready answers 200 is no refusal on its own (a proxy that blocks websockets looks the
// same), but right after refusals for room it is a slot that freed between the refusal and the probe
// (seen through HAProxy): the next try may get in.
export function retryKind({ code, reason = "", opened, readyStatus = null, previous = null }) {
  if (code === 1013 && reason.startsWith("server starting")) return "starting";
  if (RETRY_CLOSE[code]) return RETRY_CLOSE[code];
  if (!opened && RETRY_HTTP.includes(readyStatus)) return "no_room";
  if (!opened && readyStatus === 200 && ROOM_REFUSALS.includes(previous)) return "room_freed";
  return null;
}

const ROOM_REFUSALS = ["busy", "no_room", "room_freed"];

const WHY = {
  draining: "The server is shutting down for an update.",
  restarting: "The server is restarting.",
  busy: "The server is full: every conversation slot is taken.",
  starting: "The server is still loading its models.",
  no_room: "No server has room right now.",
  room_freed: "A server just made room.",
};

export function retryText(kind, delayS, retry, attempts, started) {
  const fresh = started ? " This starts a new conversation." : "";
  return `${WHY[kind]} Reconnecting in ${delayS.toFixed(1)} s (retry ${retry} of ${attempts}).${fresh}`;
}
