// Latency bookkeeping on the page's own clock (performance.now(), ms).
//
// The protocol has no ping, but it has something better: the server answers
// every 80 ms input frame with exactly one output frame (docs/protocol.md 3.4),
// so "output frame k arrived" minus "input frame k was sent" is the audio
// round trip (network both ways + the engine step). Server events give audio
// positions (audio_start_ms, audio_end_ms) on the same input clock, which the
// timeline turns back into the moments that audio was captured.

export const RATE = 24000;
export const FRAME = 1920;

export class InputClock {
  constructor() {
    this.reset();
  }

  /** A new session (connect, or kame.session.reset): positions restart at 0. */
  reset(keepFrom = null) {
    this.sent = []; // send time of each input frame of this session, ms
    this.outputs = 0; // output frames received this session
    this.rtts = [];
    if (keepFrom !== null) this.sent = keepFrom;
  }

  /** Input frame sent now; returns its index. */
  frameSent(t) {
    this.sent.push(t);
    return this.sent.length - 1;
  }

  /** An output frame arrived; returns the round trip for it in ms (or null). */
  frameReceived(t) {
    const sentAt = this.sent[this.outputs++];
    if (sentAt === undefined) return null;
    const rtt = t - sentAt;
    this.rtts.push(rtt);
    if (this.rtts.length > 50) this.rtts.shift(); // the last 4 s
    return rtt;
  }

  /** Median of the recent round trips (robust to one slow step). */
  roundTrip() {
    if (!this.rtts.length) return null;
    const s = [...this.rtts].sort((a, b) => a - b);
    return s[Math.floor(s.length / 2)];
  }

  /** When the input audio at `ms` of this session was captured (the end of its frame was sent then). */
  timeOfAudio(ms) {
    const pos = (ms / 1000) * RATE;
    const k = Math.floor(pos / FRAME);
    const sentAt = this.sent[k];
    if (sentAt === undefined) return null;
    // The frame left when its last sample was captured; earlier samples are older.
    return sentAt - (((k + 1) * FRAME - pos) / RATE) * 1000;
  }

  /**
   * kame.session.reset was requested after `framesBefore` input frames: the
   * new session's positions count from the frames sent after that.
   */
  rebase(framesBefore) {
    this.reset(this.sent.slice(framesBefore));
  }
}
