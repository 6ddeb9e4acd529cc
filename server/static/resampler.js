// Streaming sample-rate converter (windowed-sinc, table-driven). Shared by
// both AudioWorklets: capture (device rate -> 24 kHz) and playback (24 kHz ->
// device rate, optionally a few percent faster to drain a jitter buffer that
// grew too deep). No Web Audio APIs here, so it also runs in a page.

const PHASES = 256; // fractional positions in the kernel table (nearest one is used)

export class Resampler {
  /**
   * @param {number} inRate  input samples per second
   * @param {number} outRate output samples per second
   * @param {number} halfTaps kernel half-width, in samples of the slower rate
   */
  constructor(inRate, outRate, halfTaps = 8) {
    this.step = inRate / outRate; // input samples advanced per output sample at speed 1
    this.speed = 1;
    // Downsampling widens the kernel (in input samples) so the low-pass keeps its quality.
    this.half = Math.ceil(halfTaps * Math.max(1, this.step));
    // Cutoff in cycles per input sample: full band when not downsampling (a
    // 24 kHz -> 24 kHz copy then stays exact), below the output Nyquist otherwise.
    const fc = this.step > 1 ? (0.5 / this.step) * 0.92 : 0.5;
    this.table = buildTable(this.half, fc);
    this.buf = new Float32Array(4096);
    this.len = 0; // valid samples in buf
    this.pos = this.half - 1; // centre of the next output, in buf coordinates
    // Start with half a kernel of silence so the first output is centred on input sample 0.
    this.len = this.half - 1;
  }

  /** Input samples still needed before `n` more outputs can be read. */
  inputNeeded(n) {
    if (n <= 0) return 0;
    const last = this.pos + (n - 1) * this.step * this.speed;
    return Math.max(0, Math.floor(last) + this.half + 1 - this.len);
  }

  /** Outputs that can be read with the input written so far. */
  available() {
    const room = this.len - this.half - 1 - this.pos; // how far the centre may advance
    if (room < 0) return 0;
    return Math.floor(room / (this.step * this.speed)) + 1;
  }

  /** Append input samples. */
  write(samples) {
    this._compact();
    if (this.len + samples.length > this.buf.length) {
      const bigger = new Float32Array(Math.max(this.buf.length * 2, this.len + samples.length));
      bigger.set(this.buf.subarray(0, this.len));
      this.buf = bigger;
    }
    this.buf.set(samples, this.len);
    this.len += samples.length;
  }

  /** Fill `out` (the caller made sure enough input was written: see inputNeeded). */
  read(out) {
    const { buf, table, half } = this;
    const taps = 2 * half;
    const inc = this.step * this.speed;
    let pos = this.pos;
    for (let i = 0; i < out.length; i++) {
      const base = Math.floor(pos);
      const phase = Math.round((pos - base) * PHASES);
      const row = phase * taps;
      let acc = 0;
      let j = base - half + 1;
      for (let k = 0; k < taps; k++, j++) acc += buf[j] * table[row + k];
      out[i] = acc;
      pos += inc;
    }
    this.pos = pos;
    return out;
  }

  /** Everything that can be produced now. */
  readAvailable() {
    return this.read(new Float32Array(this.available()));
  }

  /** Forget buffered input (a flushed stream starts clean). */
  reset() {
    this.len = this.half - 1;
    this.buf.fill(0, 0, this.len);
    this.pos = this.half - 1;
  }

  _compact() {
    // Keep the samples the next kernel still reaches back to.
    const drop = Math.floor(this.pos) - this.half + 1;
    if (drop > 2048) {
      this.buf.copyWithin(0, drop, this.len);
      this.len -= drop;
      this.pos -= drop;
    }
  }
}

// Blackman-windowed sinc, one normalised row per phase (each row sums to 1:
// unity gain at DC whatever the fractional position).
function buildTable(half, fc) {
  const taps = 2 * half;
  const table = new Float32Array((PHASES + 1) * taps);
  for (let p = 0; p <= PHASES; p++) {
    const frac = p / PHASES;
    let sum = 0;
    for (let k = 0; k < taps; k++) {
      const x = k - half + 1 - frac; // distance of tap k from the output's centre
      const w = blackman(x / half);
      const v = w * (x === 0 ? 2 * fc : Math.sin(2 * Math.PI * fc * x) / (Math.PI * x));
      table[p * taps + k] = v;
      sum += v;
    }
    for (let k = 0; k < taps; k++) table[p * taps + k] /= sum;
  }
  return table;
}

function blackman(t) {
  if (t <= -1 || t >= 1) return 0;
  const a = Math.PI * (t + 1); // 0..2π across the kernel
  return 0.42 - 0.5 * Math.cos(a) + 0.08 * Math.cos(2 * a);
}
