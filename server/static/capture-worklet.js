// AudioWorklet that turns the microphone into 80 ms frames of 24 kHz PCM16,
// the server's frame size (one Moshi step), so each message the page sends
// is exactly one frame and output frame k answers input frame k.
// Messages out: {type: "frame", pcm: ArrayBuffer (Int16, 1920 samples), rms}.

import { Resampler } from "./resampler.js";

const RATE = 24000;
const FRAME = 1920; // 80 ms at 24 kHz

class CaptureProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.rs = sampleRate === RATE ? null : new Resampler(sampleRate, RATE);
    this.frame = new Int16Array(FRAME);
    this.fill = 0;
    this.energy = 0;
    this.mono = new Float32Array(128);
    this.resampled = new Float32Array(256); // reused: no garbage on the audio thread
  }

  process(inputs) {
    const channels = inputs[0];
    if (!channels || channels.length === 0) return true; // no source connected (yet)
    const n = channels[0].length;
    if (this.mono.length !== n) this.mono = new Float32Array(n);
    const mono = this.mono;
    mono.set(channels[0]);
    if (channels.length > 1) {
      // Down-mix: echo cancellation is done per device, the server wants one channel.
      for (let c = 1; c < channels.length; c++) {
        const ch = channels[c];
        for (let i = 0; i < n; i++) mono[i] += ch[i];
      }
      for (let i = 0; i < n; i++) mono[i] /= channels.length;
    }
    if (this.rs) {
      this.rs.write(mono);
      const n = this.rs.available();
      if (this.resampled.length < n) this.resampled = new Float32Array(2 * n);
      this.append(this.rs.read(this.resampled.subarray(0, n)));
    } else {
      this.append(mono);
    }
    return true;
  }

  append(samples) {
    for (let i = 0; i < samples.length; i++) {
      const v = Math.max(-1, Math.min(1, samples[i]));
      this.energy += v * v;
      this.frame[this.fill++] = v < 0 ? v * 32768 : v * 32767;
      if (this.fill === FRAME) {
        const pcm = this.frame.buffer;
        this.port.postMessage({ type: "frame", pcm, rms: Math.sqrt(this.energy / FRAME) }, [pcm]);
        this.frame = new Int16Array(FRAME);
        this.fill = 0;
        this.energy = 0;
      }
    }
  }
}

registerProcessor("kame-capture", CaptureProcessor);
