// AudioWorklet that plays the server's 24 kHz audio through an adaptive
// jitter buffer, resampling when the AudioContext runs at another rate.
// Messages in: {type: "audio", pcm: Float32Array, mark?, droppable?},
// {type: "flush"}.
// Messages out: {type: "stats", ...} about 10 times a second, and
// {type: "mark", mark, time} when a marked chunk starts playing (time in
// AudioContext seconds), which the page uses to time the reply latency.

import { JitterBuffer } from "./jitter-buffer.js";
import { Resampler } from "./resampler.js";

const RATE = 24000;
const STATS_EVERY_S = 0.1;

class PlaybackProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.jb = new JitterBuffer({ rate: RATE });
    // Always through the resampler: at 24 kHz it is an exact copy, and it is
    // what plays a few percent faster while the buffer drains an excess.
    this.rs = new Resampler(RATE, sampleRate);
    this.scratch = new Float32Array(0);
    this.sinceStats = 0;
    this.port.onmessage = (e) => this.onMessage(e.data);
  }

  onMessage(msg) {
    if (msg.type === "audio") {
      this.jb.push(msg.pcm, msg.mark ?? null, Boolean(msg.droppable));
    } else if (msg.type === "flush") {
      this.jb.flush();
      this.rs.reset();
      this.postStats();
    }
  }

  process(_inputs, outputs) {
    const out = outputs[0][0];
    // Pull exactly what the resampler needs for this render quantum.
    this.rs.speed = this.jb.speed;
    const need = this.rs.inputNeeded(out.length);
    if (need > 0) {
      if (this.scratch.length < need) this.scratch = new Float32Array(2 * need);
      const chunk = this.scratch.subarray(0, need);
      this.report(this.jb.pull(chunk));
      this.rs.write(chunk);
    }
    this.rs.read(out);
    for (let ch = 1; ch < outputs[0].length; ch++) outputs[0][ch].set(out);
    this.sinceStats += out.length;
    if (this.sinceStats >= STATS_EVERY_S * sampleRate) {
      this.sinceStats = 0;
      this.postStats();
    }
    return true;
  }

  // A marked chunk starts `offset` samples into the input about to be written:
  // the output sample centred on it comes (len + offset - pos) / step later.
  report(marks) {
    const rs = this.rs;
    for (const { mark, offset } of marks) {
      const outIndex = (rs.len + offset - rs.pos) / (rs.step * rs.speed);
      this.port.postMessage({ type: "mark", mark, time: currentTime + outIndex / sampleRate });
    }
  }

  postStats() {
    this.port.postMessage({ type: "stats", ...this.jb.stats() });
  }
}

registerProcessor("kame-playback", PlaybackProcessor);
