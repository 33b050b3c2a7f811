// Audio output: an AudioContext at the server's sample rate and the jitter-buffer worklet.
//
// The context is created at the stream's rate (24 kHz for the embedded voice) so that the
// browser resamples to the device; where a browser refuses that rate we resample linearly.

export class Player {
  constructor() {
    this.ctx = null;
    this.node = null;
    this.streamRate = 0;
    this.prebufferMs = 100;
    this.stats = { played: 0, dropped: 0, consumed: 0, buffered: 0, underruns: 0, state: "idle" };
    this.pushed = 0; // samples handed to the worklet, in context-rate samples
    this.onstats = null;
  }

  get contextState() {
    return this.ctx ? this.ctx.state : "none";
  }

  get rate() {
    return this.ctx ? this.ctx.sampleRate : this.streamRate;
  }

  /** Create (or re-create for a new rate) the context and the worklet. Idempotent. */
  async open(streamRate) {
    if (this.ctx && this.streamRate === streamRate) return;
    if (this.ctx) await this.close();
    this.streamRate = streamRate;
    let ctx;
    try {
      ctx = new AudioContext({ sampleRate: streamRate, latencyHint: "interactive" });
    } catch {
      ctx = new AudioContext({ latencyHint: "interactive" });
    }
    await ctx.audioWorklet.addModule(new URL("./player-worklet.js", import.meta.url));
    const node = new AudioWorkletNode(ctx, "voxgate-player", {
      numberOfInputs: 0, numberOfOutputs: 1, outputChannelCount: [1],
    });
    node.port.onmessage = (event) => {
      this.stats = event.data;
      if (this.onstats) this.onstats(this.stats);
    };
    node.connect(ctx.destination);
    this.ctx = ctx;
    this.node = node;
    this.pushed = 0;
    this.setPrebufferMs(this.prebufferMs);
    if (ctx.state !== "running") ctx.resume().catch(() => {});
  }

  async close() {
    if (!this.ctx) return;
    const ctx = this.ctx;
    this.ctx = null;
    this.node = null;
    await ctx.close().catch(() => {});
  }

  /** Browsers start audio only after a user gesture; call this from one. */
  unlock() {
    if (this.ctx && this.ctx.state !== "running") this.ctx.resume().catch(() => {});
  }

  setPrebufferMs(ms) {
    this.prebufferMs = ms;
    if (this.node) this.post({ type: "config", prebuffer: Math.round((ms / 1000) * this.rate) });
  }

  /** Queue mono float samples at the stream rate; returns their first index in the queue. */
  push(samples) {
    if (!this.node) return this.pushed;
    const data = this.rate === this.streamRate ? samples : resample(samples, this.streamRate, this.rate);
    const start = this.pushed;
    this.pushed += data.length;
    this.node.port.postMessage({ type: "push", samples: data }, [data.buffer]);
    return start;
  }

  /** Position in stream-rate samples of a queue index (for mapping playback to text). */
  toStreamSamples(n) {
    return this.rate === this.streamRate ? n : Math.round((n * this.streamRate) / this.rate);
  }

  expect(value) { this.post({ type: "expect", value }); }
  final(value) { this.post({ type: "final", value }); }
  clear() { this.post({ type: "clear" }); }

  post(msg) {
    if (this.node) this.node.port.postMessage(msg);
  }
}

function resample(input, fromRate, toRate) {
  const n = Math.round((input.length * toRate) / fromRate);
  const out = new Float32Array(n);
  const step = fromRate / toRate;
  for (let i = 0; i < n; i++) {
    const x = i * step;
    const i0 = Math.floor(x);
    const i1 = Math.min(i0 + 1, input.length - 1);
    const f = x - i0;
    out[i] = input[i0] * (1 - f) + input[i1] * f;
  }
  return out;
}
