// Adaptive jitter buffer for the server's 80 ms output frames (pure logic,
// used by playback-worklet.js and testable in a page).
//
// The server sends one frame per 80 ms of our input, so frames arrive on our
// own clock but with network and engine-step jitter. The buffer keeps a
// "cushion": audio that should still be queued just before the next frame
// lands. Playback starts (and restarts after an underrun) once one frame plus
// the cushion is queued. An underrun grows the cushion at once, by how long
// the buffer then stayed empty (the frame's lateness) when that is more than
// the usual step; a long stable stretch shrinks it slowly. When the buffer holds clearly more than the
// cushion (a burst after a stall, or a cushion that just shrank) it skips
// frames the caller marked as droppable (the assistant's silence between
// responses); a large excess also plays slightly faster until it is gone.
// Speech is never cut.

export class JitterBuffer {
  constructor({
    rate = 24000,
    frameMs = 80,
    cushionMs = 60, // starting cushion
    minCushionMs = 20,
    maxCushionMs = 800,
    growMs = 40, // per underrun
    maxGrowMs = 200, // per underrun, when the buffer stayed empty that long
    shrinkMs = 10, // per stable stretch (or a tenth of the cushion, if more)
    stableS = 5, // no underrun for this long -> shrink
    windowS = 1, // low-water mark measured over this much playback
    excessMs = 40, // queued audio above the cushion + this when a frame lands -> skip droppable frames
    drainMs = 120, // low-water mark above the cushion + this -> play faster
    drainSpeed = 1.03,
    fastDrainMs = 300, // ... + this -> faster still
    fastDrainSpeed = 1.06,
    warmupS = 1, // underruns in the first second after a (re)start are counted apart
  } = {}) {
    const ms = (v) => Math.round((v * rate) / 1000);
    this.rate = rate;
    this.frame = ms(frameMs);
    this.cushion = ms(cushionMs);
    this.minCushion = ms(minCushionMs);
    this.maxCushion = ms(maxCushionMs);
    this.grow = ms(growMs);
    this.maxGrow = ms(maxGrowMs);
    this.shrink = ms(shrinkMs);
    this.stable = Math.round(stableS * rate);
    this.window = Math.round(windowS * rate);
    this.excess = ms(excessMs);
    this.drain = ms(drainMs);
    this.drainSpeed = drainSpeed;
    this.fastDrainSpeed = fastDrainSpeed;
    this.fastDrain = ms(fastDrainMs);
    this.warmup = Math.round(warmupS * rate);
    this.underruns = 0; // every underrun since the page started
    this.lateUnderruns = 0; // those after the first `warmupS` of each playback
    this.playedTotal = 0;
    this.skipped = 0; // droppable samples skipped to bring the latency back
    this.received = 0; // every sample pushed: played + queued + skipped + flushed, exactly
    this.flushed = 0; // samples dropped by flush() while still queued
    this.recent = []; // when the last underruns happened (s of playback since the flush)
    this.flushes = -1; // flush() below is not one
    this.flush();
  }

  /** Drop everything queued (session reset, reconnect); the learnt cushion is kept. */
  flush() {
    this.flushes += 1;
    this.flushed += this.depth ?? 0;
    this.chunks = []; // {data: Float32Array, offset, mark}
    this.depth = 0; // samples queued
    this.state = "idle"; // idle (nothing since flush) | buffering | playing
    this.played = 0; // samples played since the flush
    this.dry = null; // samples of silence played since an underrun, until audio comes back
    this.draining = 0; // 0, or the speed-up while an excess drains
    this.sinceChange = 0;
    this.windowMin = Infinity;
    this.windowPlayed = 0;
  }

  get target() {
    return this.cushion + this.frame;
  }

  get speed() {
    return this.draining || 1;
  }

  /** Queue a chunk; a `droppable` one is skipped while the buffer is too deep. */
  push(data, mark = null, droppable = false) {
    if (!data.length) return;
    this.received += data.length;
    if (droppable && mark === null && this.state === "playing" && this.depth > this.cushion + this.excess) {
      this.skipped += data.length;
      return;
    }
    if (this.dry !== null) {
      // Audio is back after an underrun: a cushion this much larger would have hidden it.
      const extra = Math.min(this.dry, this.maxGrow) - this.grow;
      if (extra > 0) this.cushion = Math.min(this.maxCushion, this.cushion + extra);
      this.dry = null;
    }
    this.chunks.push({ data, offset: 0, mark });
    this.depth += data.length;
    if (this.state === "idle") this.state = "buffering";
  }

  /**
   * Fill `out` with queued audio (zeros when there is none).
   * Returns the marks whose chunk started playing, with their offset in `out`.
   */
  pull(out) {
    const marks = [];
    if (this.state !== "playing") {
      if (this.state === "buffering" && this.depth >= this.target) {
        this.state = "playing";
      } else {
        out.fill(0);
        if (this.dry !== null && this.depth === 0) this.dry += out.length;
        return marks;
      }
    }
    let i = 0;
    while (i < out.length && this.chunks.length) {
      const c = this.chunks[0];
      if (c.offset === 0 && c.mark !== null) marks.push({ mark: c.mark, offset: i });
      const n = Math.min(out.length - i, c.data.length - c.offset);
      out.set(c.data.subarray(c.offset, c.offset + n), i);
      c.offset += n;
      i += n;
      if (c.offset === c.data.length) this.chunks.shift();
    }
    this.depth -= i;
    this.played += i;
    this.playedTotal += i;
    if (i < out.length) {
      out.fill(0, i);
      this._underrun(out.length - i);
    } else {
      this._adapt(out.length);
    }
    return marks;
  }

  _underrun(missing) {
    this.underruns += 1;
    this.dry = missing;
    this.recent.push(Math.round((this.played / this.rate) * 100) / 100);
    if (this.recent.length > 20) this.recent.shift();
    if (this.played > this.warmup) this.lateUnderruns += 1;
    this.cushion = Math.min(this.maxCushion, this.cushion + this.grow);
    this.state = "buffering";
    this.draining = 0;
    this.sinceChange = 0;
    this.windowMin = Infinity;
    this.windowPlayed = 0;
  }

  _adapt(n) {
    this.windowMin = Math.min(this.windowMin, this.depth);
    this.windowPlayed += n;
    if (this.windowPlayed >= this.window) {
      const excess = this.windowMin - this.cushion;
      if (excess > this.fastDrain) this.draining = this.fastDrainSpeed;
      else if (excess > this.drain) this.draining = this.drainSpeed;
      else if (excess <= this.excess) this.draining = 0;
      this.windowMin = Infinity;
      this.windowPlayed = 0;
    } else if (this.draining && this.depth <= this.cushion) {
      this.draining = 0; // excess gone mid-window
    }
    this.sinceChange += n;
    if (this.sinceChange >= this.stable) {
      const step = Math.max(this.shrink, Math.round(this.cushion / 10));
      this.cushion = Math.max(this.minCushion, this.cushion - step);
      this.sinceChange = 0;
    }
  }

  stats() {
    const ms = (s) => Math.round((s * 1000) / this.rate);
    return {
      state: this.state,
      depthMs: ms(this.depth),
      cushionMs: ms(this.cushion),
      targetMs: ms(this.target),
      speed: this.speed,
      underruns: this.underruns,
      lateUnderruns: this.lateUnderruns,
      played: this.playedTotal,
      skippedMs: ms(this.skipped),
      recentUnderruns: this.recent.slice(),
      flushes: this.flushes,
      // the accounting, in samples: received === played + queued + skippedSamples + flushed
      received: this.received,
      queued: this.depth,
      skippedSamples: this.skipped,
      flushed: this.flushed,
    };
  }
}
