// One turn (one stream): the text sent, its audio grouped by span, and how much was heard.

import { estimateWordTimings, wordAt } from "./words.js";

export class Turn {
  constructor(id, kind) {
    this.id = id;
    this.kind = kind; // "type" | "llm"
    this.text = "";
    this.chars = []; // the text as code points: spans count code points, as the server does
    this.sends = []; // [{t, chars, through}] each text message: when, its length, code points sent by then
    this.tStart = performance.now();
    this.tFirstText = null;
    this.tEnd = null; // when `end` was sent
    this.tFirstAudio = null;
    this.chunks = []; // [{t, samples, offset, seq, span, forwarded}]; offset counts this turn's samples
    this.segments = []; // [{span, first, samples, complete, words}]: the audio of one span
    this.pcm = []; // Float32Array per chunk, at sampleRate
    this.samples = 0;
    this.sampleRate = 0;
    this.status = "open"; // open | ended | done | cancelled | failed
    this.serverTtfaMs = null;
    this.serverReason = null; // the done message's reason: "end" or "cancelled"
    this.error = null;
    this.cutAt = null; // Stop pressed while this turn was heard: code points spoken by then
    this.tCut = null;
    // Playback, kept by the session from the worklet's reports.
    this.queueStart = -1; // the turn's audio in the player's queue: [queueStart, queueEnd)
    this.queueEnd = -1; //   at the audio context's rate
    this.heard = 0; // samples of this turn played, at the stream's rate
    this.tPlayStart = null; // its first sample was played
    this.tPlayEnd = null; // its last sample was played (or Stop cut it, or it had no audio)
    this.underruns = 0; // underruns while this turn was playing
  }

  /** First text sent -> first audio received, as the page saw it (includes waiting for text). */
  get ttfaMs() {
    return this.tFirstAudio === null || this.tFirstText === null ? null : this.tFirstAudio - this.tFirstText;
  }

  /**
   * The first segment's text sent -> first audio: the wait that typing or a slow LLM does not
   * explain. The server can cut a segment once the whitespace after it (or `end`) has arrived;
   * the page takes the first message that carried that as the moment the phrase was complete.
   */
  get phraseTtfaMs() {
    const seg = this.segments[0];
    if (this.tFirstAudio === null || !seg || !seg.span) return null;
    const need = seg.span[1];
    let complete = this.tEnd;
    for (const s of this.sends) {
      if (s.through > need) { complete = complete === null ? s.t : Math.min(complete, s.t); break; }
    }
    if (complete === null || complete > this.tFirstAudio) { // the server cut sooner than that rule says
      const last = this.sends.find((s) => s.through >= need);
      complete = last ? last.t : this.tFirstText;
    }
    return Math.max(0, this.tFirstAudio - complete);
  }

  get isFinished() {
    return this.status === "done" || this.status === "cancelled" || this.status === "failed";
  }

  get audioSeconds() {
    return this.sampleRate ? this.samples / this.sampleRate : 0;
  }

  get heardSeconds() {
    return this.sampleRate ? this.heard / this.sampleRate : 0;
  }

  addText(text, t) {
    if (this.tFirstText === null) this.tFirstText = t;
    this.text += text;
    for (const ch of text) this.chars.push(ch);
    this.sends.push({ t, chars: text.length, through: this.chars.length });
  }

  /** Record an audio chunk of n samples; returns the chunk. */
  addAudio(n, span, seq, t) {
    const chunk = { t, samples: n, offset: this.samples, seq, span, forwarded: false };
    const last = this.segments[this.segments.length - 1];
    if (last && sameSpan(last.span, span)) {
      last.samples += n;
    } else {
      if (last) last.complete = true;
      this.segments.push({ span, first: this.samples, samples: n, complete: false, words: null });
    }
    this.chunks.push(chunk);
    this.samples += n;
    return chunk;
  }

  /** No more audio will come: the last segment's length is final. */
  closeSegments() {
    const last = this.segments[this.segments.length - 1];
    if (last) last.complete = true;
  }

  /** The segment playing at sample `pos` of this turn (null before the first). */
  segmentAt(pos) {
    for (let i = this.segments.length - 1; i >= 0; i--) {
      if (this.segments[i].first <= pos) return this.segments[i];
    }
    return null;
  }

  /**
   * The word heard at sample `pos`: {segment, word} where word is {start, end, from, to} or
   * null (no span). A segment still arriving is assumed to last at least samplesPerChar per
   * code point, so that the estimate does not race ahead of audio not received yet.
   */
  wordAt(pos, samplesPerChar) {
    const segment = this.segmentAt(pos);
    if (!segment || !segment.span) return { segment, word: null };
    const timings = segment.words || this.estimate(segment, samplesPerChar);
    return { segment, word: wordAt(timings, pos - segment.first) };
  }

  estimate(segment, samplesPerChar) {
    const [a, b] = segment.span;
    const length = segment.complete ? segment.samples : Math.max(segment.samples, Math.round((b - a) * samplesPerChar));
    if (segment.estimated && segment.estimated.length === length) return segment.estimated.timings;
    const timings = estimateWordTimings(this.chars, segment.span, length);
    segment.estimated = { length, timings };
    return timings;
  }
}

function sameSpan(a, b) {
  if (!a || !b) return a === b;
  return a[0] === b[0] && a[1] === b[1];
}
