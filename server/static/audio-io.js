// Microphone in, assistant out: one AudioContext with two AudioWorklets
// (capture-worklet.js, playback-worklet.js). Tries a 24 kHz context first (no
// resampling at all); a browser that cannot feed a microphone into it gets
// a context at the device rate and the worklets resample.
//
// Events dispatched: "frame" (detail: {pcm: Int16Array, rms}), "stats"
// (detail: jitter buffer stats), "mark" (detail: {mark, at}: performance.now()
// time the marked chunk is heard).

const RATE = 24000;

export const MIC_CONSTRAINTS = {
  echoCancellation: true, // the assistant's voice must not come back as the user's speech
  noiseSuppression: true,
  autoGainControl: true,
  channelCount: 1,
};

export class AudioIO extends EventTarget {
  /** `contextRate`: 24000 (no resampling), another rate, or null for the device's own. */
  constructor({ contextRate = RATE } = {}) {
    super();
    this.contextRate = contextRate;
    this.ctx = null;
    this.stream = null;
    this.source = null;
    this.capture = null;
    this.playback = null;
    this.stats = null;
  }

  /** Open the microphone and start both worklets. Throws getUserMedia's errors. */
  async start() {
    if (!this.ctx) await this._openContext(this.contextRate);
    // Resume inside the user's gesture (autoplay rules), before awaiting permission.
    const resumed = this.ctx.resume();
    this.stream = await navigator.mediaDevices.getUserMedia({ audio: MIC_CONSTRAINTS });
    await resumed;
    try {
      this.source = this.ctx.createMediaStreamSource(this.stream);
    } catch (err) {
      // Some browsers refuse a microphone in a context at another rate.
      if (this.ctx.sampleRate === RATE && err.name === "NotSupportedError") {
        await this._closeContext();
        await this._openContext(null);
        await this.ctx.resume();
        this.source = this.ctx.createMediaStreamSource(this.stream);
      } else {
        throw err;
      }
    }
    this.capture = new AudioWorkletNode(this.ctx, "kame-capture", { numberOfInputs: 1, numberOfOutputs: 0 });
    this.capture.port.onmessage = (e) => {
      const { pcm, rms } = e.data;
      this.dispatchEvent(new CustomEvent("frame", { detail: { pcm: new Int16Array(pcm), rms } }));
    };
    this.source.connect(this.capture);
    this.flush();
  }

  /** Release the microphone (the browser's recording indicator goes off); playback stays ready. */
  async stop() {
    if (this.source) this.source.disconnect();
    if (this.capture) {
      this.capture.port.onmessage = null;
      this.capture.disconnect();
    }
    if (this.stream) for (const track of this.stream.getTracks()) track.stop();
    this.source = this.capture = this.stream = null;
    this.flush();
    if (this.ctx && this.ctx.state === "running") await this.ctx.suspend();
  }

  /**
   * Queue 24 kHz audio for playback; `mark` is reported back when it starts
   * playing; `droppable` audio (silence) may be skipped to catch up a delay.
   */
  play(pcm, { mark = null, droppable = false } = {}) {
    if (this.playback) this.playback.port.postMessage({ type: "audio", pcm, mark, droppable }, [pcm.buffer]);
  }

  /** Drop queued audio (session reset, reconnect). */
  flush() {
    if (this.playback) this.playback.port.postMessage({ type: "flush" });
  }

  get sampleRate() {
    return this.ctx ? this.ctx.sampleRate : null;
  }

  get micSettings() {
    const track = this.stream && this.stream.getAudioTracks()[0];
    return track ? track.getSettings() : null;
  }

  async _openContext(sampleRate) {
    const opts = { latencyHint: "interactive" };
    if (sampleRate) opts.sampleRate = sampleRate;
    const ctx = new AudioContext(opts);
    await Promise.all([
      ctx.audioWorklet.addModule(new URL("./capture-worklet.js", import.meta.url)),
      ctx.audioWorklet.addModule(new URL("./playback-worklet.js", import.meta.url)),
    ]);
    this.ctx = ctx;
    this.playback = new AudioWorkletNode(ctx, "kame-playback", {
      numberOfInputs: 0,
      numberOfOutputs: 1,
      outputChannelCount: [1],
    });
    this.playback.port.onmessage = (e) => this._onPlayback(e.data);
    this.playback.connect(ctx.destination);
  }

  async _closeContext() {
    const ctx = this.ctx;
    this.ctx = this.playback = null;
    if (ctx) await ctx.close();
  }

  _onPlayback(msg) {
    if (msg.type === "stats") {
      this.stats = msg;
      this.dispatchEvent(new CustomEvent("stats", { detail: msg }));
    } else if (msg.type === "mark") {
      this.dispatchEvent(new CustomEvent("mark", { detail: { mark: msg.mark, at: this._perfTime(msg.time) } }));
    }
  }

  // AudioContext time -> performance.now() time it reaches the speaker.
  _perfTime(contextTime) {
    const ts = this.ctx.getOutputTimestamp();
    if (!ts || !ts.performanceTime) {
      return performance.now() + (contextTime - this.ctx.currentTime + (this.ctx.outputLatency || 0)) * 1000;
    }
    return ts.performanceTime + (contextTime - ts.contextTime) * 1000;
  }
}
