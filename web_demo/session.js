// Turns on one connection: start/text/end/cancel out, ready/audio/done/error in.
//
// Several turns may be open at once (type the next sentence while the last one still speaks);
// their audio plays one after another: only the head of the queue feeds the player, later
// turns keep their chunks until the turns before them are done. The session also follows
// playback (the worklet's reports): which turn, and which sample of it, is being heard.

import { Turn } from "./turn.js";

export { Turn };

const SECONDS_PER_CHAR = 0.07; // speech length per code point assumed until segments are measured

export class Session {
  /** hooks: onchange(), onerror(message, code, turn) */
  constructor(connection, player, hooks) {
    this.conn = connection;
    this.player = player;
    this.hooks = hooks;
    this.voice = null;
    this.format = "pcm_s16le";
    this.nextId = 1;
    this.turns = new Map(); // id -> Turn, until done/error
    // Turns whose audio is not all with the player yet, in order: queue[0] (the head) feeds
    // the player and is unfinished; a turn behind it may be finished already.
    this.queue = [];
    this.playlist = []; // [{start, end, turn, offset}] chunks handed to the player
    this.audible = []; // turns handed to the player and not yet played out
    this.history = []; // finished or open turns, newest last (for display and download)
    this.totals = { samplesReceived: 0, chunks: 0, bytes: 0, samplesHeard: 0 };
    this.measured = { samples: 0, chars: 0 }; // complete segments: speech length per code point
    this.bufferTrace = []; // [{t, ms, state, underruns}] for the timeline
    this.underruns = 0; // the worklet's count at its last report
    this.retired = new Set(); // ids of turns that failed or were cancelled here
  }

  get current() {
    return this.history.length ? this.history[this.history.length - 1] : null;
  }

  get openTurn() {
    const t = this.current;
    return t && t.status === "open" ? t : null;
  }

  /** Samples of speech per code point of text, measured on this session's complete segments. */
  get samplesPerChar() {
    const rate = this.player.streamRate || 24000;
    return this.measured.chars > 40 ? this.measured.samples / this.measured.chars : SECONDS_PER_CHAR * rate;
  }

  startTurn(kind) {
    const turn = new Turn(`turn-${this.nextId++}`, kind);
    const msg = { type: "start", stream: turn.id, format: this.format };
    if (this.voice) msg.voice = this.voice;
    if (!this.conn.send(msg)) {
      this.hooks.onerror("Not connected to the server yet. Wait a moment and try again.", "not_connected", null);
      return null;
    }
    this.turns.set(turn.id, turn);
    this.queue.push(turn);
    this.history.push(turn);
    if (this.history.length > 20) this.history.shift();
    this.syncPlayer();
    this.hooks.onchange();
    return turn;
  }

  sendText(turn, text) {
    if (!text || turn.status !== "open") return;
    turn.addText(text, performance.now());
    this.conn.send({ type: "text", stream: turn.id, text });
    this.hooks.onchange();
  }

  endTurn(turn) {
    if (turn.status !== "open") return;
    turn.status = "ended";
    turn.tEnd = performance.now();
    this.conn.send({ type: "end", stream: turn.id });
    this.syncPlayer();
    this.hooks.onchange();
  }

  /** Barge-in: cancel every unfinished turn and silence the player at once. */
  cancelAll() {
    const now = performance.now();
    const np = this.nowPlaying(this.player.stats.consumed);
    if (np && !np.finished) {
      const { segment, word } = np.turn.wordAt(np.pos, this.samplesPerChar);
      np.turn.cutAt = word ? word.start : segment && segment.span ? segment.span[0] : 0;
      np.turn.tCut = now;
    }
    for (const turn of this.queue) {
      if (!turn.isFinished) {
        this.conn.send({ type: "cancel", stream: turn.id });
        turn.status = "cancelled";
        this.retire(turn.id);
      }
    }
    for (const turn of [...this.audible, ...this.queue]) {
      if (turn.tPlayEnd === null) turn.tPlayEnd = now; // what was not heard by now never will be
    }
    this.queue = [];
    this.playlist = [];
    this.audible = [];
    this.player.clear();
    this.syncPlayer();
    this.hooks.onchange();
  }

  /** The connection dropped: every unfinished turn is lost; finished ones still play. */
  connectionLost() {
    let lost = 0;
    for (const turn of [...this.queue]) {
      if (!turn.isFinished) {
        turn.status = "failed";
        turn.error = "connection lost";
        lost += 1;
        this.finish(turn);
      }
    }
    this.turns.clear();
    this.syncPlayer();
    if (lost) this.hooks.onchange();
  }

  handle(msg) {
    const turn = msg.stream != null ? this.turns.get(String(msg.stream)) : undefined;
    switch (msg.type) {
      case "ready":
        if (turn) turn.sampleRate = msg.sample_rate;
        break;
      case "audio":
        if (turn && !turn.isFinished) this.onAudio(turn, msg);
        break;
      case "done":
        if (turn) this.onDone(turn, msg);
        break;
      case "error":
        this.onError(turn, msg);
        break;
      default:
        break; // unknown types are ignored, as the protocol asks
    }
  }

  onAudio(turn, msg) {
    const samples = toFloat32(msg.pcm, this.format);
    const now = performance.now();
    if (turn.tFirstAudio === null) turn.tFirstAudio = now;
    if (!turn.sampleRate) turn.sampleRate = this.player.streamRate;
    const span = Array.isArray(msg.span) ? msg.span : null;
    const before = turn.segments.length;
    const chunk = turn.addAudio(samples.length, span, msg.seq, now);
    if (turn.segments.length > before && before > 0) this.measure(turn.segments[before - 1]);
    turn.pcm.push(samples);
    this.totals.samplesReceived += samples.length;
    this.totals.chunks += 1;
    this.totals.bytes += msg.pcm.length;
    if (this.queue[0] === turn) this.forward(turn, chunk, samples);
    this.hooks.onchange();
  }

  measure(segment) {
    if (!segment.span || segment.span[1] <= segment.span[0]) return;
    this.measured.samples += segment.samples;
    this.measured.chars += segment.span[1] - segment.span[0];
  }

  forward(turn, chunk, samples) {
    const start = this.player.push(samples.slice()); // the copy is transferred to the worklet
    chunk.forwarded = true;
    if (turn.queueStart < 0) {
      turn.queueStart = start;
      this.audible.push(turn);
    }
    turn.queueEnd = this.player.pushed;
    this.playlist.push({ start, end: this.player.pushed, turn, offset: chunk.offset });
  }

  onDone(turn, msg) {
    this.turns.delete(turn.id);
    turn.serverReason = msg.reason;
    if (turn.status !== "cancelled") turn.status = msg.reason === "cancelled" ? "cancelled" : "done";
    if (typeof msg.ttfa_ms === "number") turn.serverTtfaMs = msg.ttfa_ms;
    this.finish(turn);
  }

  onError(turn, msg) {
    // Text already on its way to a turn that failed or was stopped is answered with
    // unknown_stream; that is an echo of the first problem, not news for the user.
    if (!turn && this.retired.has(String(msg.stream)) && ["unknown_stream", "stream_ended"].includes(msg.code)) return;
    if (turn && !turn.isFinished && !isNonTerminal(msg.code)) {
      this.turns.delete(turn.id);
      turn.status = "failed";
      turn.error = msg.code;
      this.finish(turn);
    }
    this.hooks.onerror(friendlyError(msg), msg.code, turn || null);
  }

  /** The turn is finished (done, failed): its audio is complete; play it when its turn comes. */
  finish(turn) {
    if (turn.status !== "done") this.retire(turn.id);
    const last = turn.segments[turn.segments.length - 1];
    if (last && !last.complete) {
      turn.closeSegments();
      if (turn.status === "done") this.measure(last);
    }
    if (!turn.samples && turn.tPlayEnd === null) turn.tPlayEnd = performance.now();
    if (this.queue[0] === turn) this.promote();
    this.syncPlayer();
    this.hooks.onchange();
  }

  /** The head has all its audio with the player: the next turns, in order, take over. */
  promote() {
    while (this.queue.length && this.queue[0].isFinished) {
      this.queue.shift();
      const head = this.queue[0];
      if (!head) break;
      head.chunks.forEach((chunk, i) => {
        if (!chunk.forwarded) this.forward(head, chunk, head.pcm[i]);
      });
    }
  }

  syncPlayer() {
    const head = this.queue[0];
    this.player.final(!head);
    this.player.expect(Boolean(head) && head.status === "ended");
  }

  retire(id) {
    this.retired.add(id);
    if (this.retired.size > 100) this.retired.delete(this.retired.values().next().value);
  }

  /**
   * What the listener hears, from the worklet's consumed count: {turn, pos, finished}, pos
   * being the sample of that turn (at the stream's rate); finished once the player has
   * played everything it was given. Null before any audio.
   */
  nowPlaying(consumed) {
    while (this.playlist.length > 1 && this.playlist[0].end <= consumed) this.playlist.shift();
    const entry = this.playlist[0];
    if (!entry || consumed < entry.start) return null;
    if (consumed >= entry.end) {
      return { turn: entry.turn, pos: entry.offset + this.player.toStreamSamples(entry.end - entry.start), finished: true };
    }
    return { turn: entry.turn, pos: entry.offset + this.player.toStreamSamples(consumed - entry.start), finished: false };
  }

  /**
   * The turn whose figures the page shows: the one being heard; between turns, the next one
   * to be heard; else the newest.
   */
  shownTurn(np) {
    if (np && !np.finished) return np.turn;
    return this.queue[0] || this.current;
  }

  /** A worklet report: follow playback (per turn) and keep the buffer trace. */
  track(stats, rate) {
    const t = performance.now();
    const np = this.nowPlaying(stats.consumed);
    if (stats.underruns > this.underruns) {
      const turn = np ? np.turn : this.queue[0];
      if (turn) turn.underruns += stats.underruns - this.underruns;
    }
    this.underruns = stats.underruns;
    this.totals.samplesHeard = this.player.toStreamSamples(stats.played);
    this.audible = this.audible.filter((turn) => {
      const played = Math.min(stats.consumed, turn.queueEnd) - turn.queueStart;
      if (played <= 0) return true;
      turn.heard = this.player.toStreamSamples(played);
      if (turn.tPlayStart === null) turn.tPlayStart = t;
      if (turn.isFinished && stats.consumed >= turn.queueEnd) {
        turn.tPlayEnd = t;
        return false;
      }
      return true;
    });
    this.bufferTrace.push({ t, ms: rate ? (stats.buffered / rate) * 1000 : 0, state: stats.state, underruns: stats.underruns });
    while (this.bufferTrace.length && this.bufferTrace[0].t < t - 120_000) this.bufferTrace.shift();
  }
}

function isNonTerminal(code) {
  return ["bad_message", "unknown_type", "stream_exists", "invalid_option"].includes(code);
}

function toFloat32(pcm, format) {
  const bytes = pcm instanceof Uint8Array ? pcm : new Uint8Array(pcm);
  const aligned = bytes.byteOffset === 0 && bytes.byteLength === bytes.buffer.byteLength
    ? bytes : bytes.slice();
  if (format === "pcm_f32le") {
    return new Float32Array(aligned.buffer, 0, aligned.byteLength >> 2);
  }
  const ints = new Int16Array(aligned.buffer, 0, aligned.byteLength >> 1);
  const out = new Float32Array(ints.length);
  for (let i = 0; i < ints.length; i++) out[i] = ints[i] / 32768;
  return out;
}

const FRIENDLY = {
  engine_restarted: "The speech engine restarted in the middle of this turn, so its audio was lost. Try again in a moment.",
  engine_unavailable: "The speech engine is starting up. Try again in a few seconds.",
  capacity: "The server is busy right now. Try again shortly.",
  unknown_voice: "That voice isn't available on this server. Pick another one from the list.",
  invalid_option: "One of the settings is out of range.",
  unsupported_format: "The server doesn't support that audio format.",
  text_too_long: "That's more text than one turn may hold. Press Stop and start a new turn.",
  too_many_streams: "Too many turns are open at once. Wait for one to finish, or press Stop.",
  model_error: "The voice model couldn't speak that text.",
  stream_ended: "That turn has already ended; start typing to begin a new one.",
  unknown_stream: "The server no longer knows that turn (it may have ended already).",
  slow_consumer: "This page fell behind reading audio, so the server closed the connection.",
  idle_timeout: "The connection was idle for a long time, so the server closed it.",
  frame_too_large: "A message was too large for the server.",
  internal: "The server hit an internal error.",
};

export function friendlyError(msg) {
  const plain = FRIENDLY[msg.code];
  const detail = typeof msg.message === "string" && msg.message ? msg.message : "";
  if (!plain) return detail || `The server reported an error (${msg.code}).`;
  return detail && !plain.includes(detail) ? `${plain} (${detail})` : plain;
}
