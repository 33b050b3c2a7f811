// AudioWorklet processor: plays pushed PCM chunks through a small jitter buffer.
//
// Messages in (port):
//   {type: "push", samples: Float32Array}   append audio (mono, at the context's rate)
//   {type: "config", prebuffer: n}          samples to hold before (re)starting playback
//   {type: "expect", value: bool}           true while all text is sent and more audio is due:
//                                           running dry then is an underrun; otherwise the
//                                           player is just waiting for text
//   {type: "final", value: bool}            true once no more audio will come for now: play the
//                                           rest out even below the prebuffer threshold
//   {type: "clear"}                         drop everything buffered (barge-in)
// Messages out: {type: "stats", played, dropped, consumed, buffered, underruns, state}.
//   consumed = played + dropped: the index of the next sample to play in the pushed sequence.

const REPORT_EVERY_QUANTA = 6;

class PlayerProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.chunks = [];
    this.head = 0; // read position inside chunks[0]
    this.buffered = 0;
    this.prebuffer = Math.round(sampleRate * 0.1);
    this.expect = false;
    this.final = false;
    this.state = "idle"; // idle | buffering | playing | waiting
    this.played = 0;
    this.dropped = 0;
    this.underruns = 0;
    this.quanta = 0;
    this.port.onmessage = (event) => this.onMessage(event.data);
  }

  onMessage(msg) {
    switch (msg.type) {
      case "push":
        this.chunks.push(msg.samples);
        this.buffered += msg.samples.length;
        if (this.state === "idle") this.setState("buffering");
        break;
      case "config":
        this.prebuffer = Math.max(0, msg.prebuffer | 0);
        break;
      case "expect":
        this.expect = Boolean(msg.value);
        break;
      case "final":
        this.final = Boolean(msg.value);
        break;
      case "clear":
        this.dropped += this.buffered;
        this.chunks = [];
        this.head = 0;
        this.buffered = 0;
        this.final = false;
        this.expect = false;
        this.setState("idle");
        break;
      default:
        break;
    }
    this.report();
  }

  setState(state) {
    if (state !== this.state) {
      this.state = state;
      this.report();
    }
  }

  report() {
    this.port.postMessage({
      type: "stats",
      played: this.played,
      dropped: this.dropped,
      consumed: this.played + this.dropped,
      buffered: this.buffered,
      underruns: this.underruns,
      state: this.state,
    });
  }

  // Copy up to out.length buffered samples into out; returns how many were copied.
  drain(out) {
    let n = 0;
    while (n < out.length && this.chunks.length > 0) {
      const chunk = this.chunks[0];
      const take = Math.min(out.length - n, chunk.length - this.head);
      out.set(chunk.subarray(this.head, this.head + take), n);
      n += take;
      this.head += take;
      if (this.head >= chunk.length) {
        this.chunks.shift();
        this.head = 0;
      }
    }
    this.buffered -= n;
    this.played += n;
    return n;
  }

  process(_inputs, outputs) {
    const output = outputs[0];
    const out = output[0];
    if (!out) return true;
    if ((this.state === "buffering" || this.state === "waiting")
      && (this.buffered >= this.prebuffer || (this.final && this.buffered > 0))) {
      this.setState("playing");
    } else if (this.state !== "playing" && this.final && this.buffered === 0) {
      this.setState("idle");
    }
    let n = 0;
    if (this.state === "playing") {
      n = this.drain(out);
      if (n < out.length) {
        out.fill(0, n);
        if (this.final) {
          this.setState("idle");
        } else if (this.expect) {
          this.underruns += 1;
          this.setState("buffering");
        } else {
          this.setState("waiting");
        }
      }
    } else {
      out.fill(0);
    }
    for (let ch = 1; ch < output.length; ch++) output[ch].set(out);
    this.quanta += 1;
    if (this.quanta % REPORT_EVERY_QUANTA === 0) this.report();
    return true;
  }
}

registerProcessor("voxgate-player", PlayerProcessor);
