// Test harness: drives web_demo/session.js, turn.js and words.js under node with a fake
// connection and a fake player, for tests/web_demo/test_session.py.
// argv[2]: a folder holding copies of those modules (with a package.json saying "type": "module");
// argv[3]: the scenario to run. stdout: JSON with what the scenario observed.
import { pathToFileURL } from "node:url";
import { join } from "node:path";

const dir = process.argv[2];
const load = (name) => import(pathToFileURL(join(dir, name)).href);
const { Session } = await load("session.js");
const { estimateWordTimings, wordAt, wordsOf } = await load("words.js");

class FakeConnection {
  constructor() { this.sent = []; }
  send(msg) { this.sent.push(msg); return true; }
}

// Queues what it is pushed, plays by `play(n)`; its rate may differ from the stream's.
class FakePlayer {
  constructor(streamRate = 24000, rate = 24000) {
    this.streamRate = streamRate;
    this.rate = rate;
    this.pushed = 0;
    this.pushes = []; // [{start, n}]
    this.stats = { played: 0, dropped: 0, consumed: 0, buffered: 0, underruns: 0, state: "idle" };
    this.flags = { final: null, expect: null, cleared: 0 };
  }
  push(samples) {
    const start = this.pushed;
    const n = Math.round((samples.length * this.rate) / this.streamRate);
    this.pushed += n;
    this.pushes.push({ start, n });
    return start;
  }
  toStreamSamples(n) { return Math.round((n * this.streamRate) / this.rate); }
  final(v) { this.flags.final = v; }
  expect(v) { this.flags.expect = v; }
  clear() {
    this.flags.cleared += 1;
    this.stats = { ...this.stats, dropped: this.stats.dropped + this.pushed - this.stats.consumed, consumed: this.pushed, buffered: 0 };
  }
  /** Play n more samples (context rate); returns the report the worklet would post. */
  play(n, underruns = 0) {
    const take = Math.min(n, this.pushed - this.stats.consumed);
    const s = this.stats;
    this.stats = { ...s, played: s.played + take, consumed: s.consumed + take, buffered: this.pushed - s.consumed - take,
      underruns: s.underruns + underruns, state: take ? "playing" : "idle" };
    return this.stats;
  }
}

const pcm = (n) => new Uint8Array(n * 2); // n samples of pcm_s16le silence

function setup(streamRate, rate) {
  const conn = new FakeConnection();
  const player = new FakePlayer(streamRate, rate);
  const errors = [];
  const session = new Session(conn, player, { onchange() {}, onerror: (m, code) => errors.push(code) });
  const audio = (turn, n, span, seq = 0) => session.handle({ type: "audio", stream: turn.id, seq, offset: 0, pcm: pcm(n), span });
  const done = (turn, extra = {}) => session.handle({ type: "done", stream: turn.id, reason: "end", ...extra });
  const tick = (n, underruns = 0) => session.track(player.play(n, underruns), player.rate);
  return { conn, player, session, audio, done, tick, errors };
}

const scenarios = {
  // Pure word timings: words, proportional tiling, lookup at the edges; spans count code points.
  words() {
    const chars = Array.from("Hi 😀 there, you.");
    return {
      words: wordsOf(chars, 0, chars.length),
      timings: estimateWordTimings(chars, [0, chars.length], 1600),
      inner: estimateWordTimings(chars, [3, 11], 800),
      at: [-5, 0, 299, 300, 1599, 5000].map((s) => wordAt(estimateWordTimings(chars, [0, chars.length], 1600), s)),
      empty: wordAt([], 10),
    };
  },

  // A later turn finishing before an earlier one: both are heard, in order, none lost.
  outOfOrder() {
    const { player, session, audio, done } = setup();
    const one = session.startTurn("type");
    session.sendText(one, "First turn, long. ");
    session.endTurn(one);
    const two = session.startTurn("type");
    session.sendText(two, "Second. ");
    session.endTurn(two);
    audio(one, 2400, [0, 17]);
    audio(two, 1200, [0, 7]);
    audio(two, 1200, [0, 7], 1);
    done(two);
    const whileFirst = player.pushes.map((p) => p.n);
    audio(one, 2400, [0, 17], 1);
    done(one);
    return { whileFirst, pushes: player.pushes.map((p) => p.n), final: player.flags.final, queue: session.queue.length };
  },

  // Playback at a context rate twice the stream's: what is heard, per turn, and which turn shows.
  playback() {
    const { session, audio, done, tick } = setup(24000, 48000);
    const one = session.startTurn("type");
    session.sendText(one, "one two three four. ");
    session.endTurn(one);
    audio(one, 2400, [0, 19]);
    audio(one, 2400, [0, 19], 1);
    done(one);
    const two = session.startTurn("type"); // typed while the first one speaks
    session.sendText(two, "five six. ");
    const snap = (label) => {
      const np = session.nowPlaying(session.player.stats.consumed);
      return { label, shown: session.shownTurn(np).id, pos: np && np.pos, finished: np && np.finished,
        heard: [one.heard, two.heard], ended: [one.tPlayEnd !== null, two.tPlayEnd !== null] };
    };
    const out = [snap("before")];
    tick(4800); // 2400 stream samples
    out.push(snap("half"));
    audio(two, 2400, [0, 9]);
    tick(4700);
    out.push(snap("nearly"));
    tick(100);
    out.push(snap("first heard"));
    tick(2400);
    out.push(snap("second playing"));
    return out;
  },

  // Underruns count for the turn that was playing; Stop cuts at the start of the word heard.
  underrunAndStop() {
    const { session, audio, tick } = setup();
    const one = session.startTurn("type");
    session.sendText(one, "alpha beta gamma delta ");
    audio(one, 2000, [0, 10]); // "alpha beta"
    audio(one, 2000, [11, 22], 1); // "gamma delta": the first segment is complete now
    tick(1500, 1);
    const word = one.wordAt(1500, session.samplesPerChar).word;
    session.cancelAll();
    return { underruns: one.underruns, word, cutAt: one.cutAt, status: one.status,
      cancelled: session.conn.sent.at(-1), ended: one.tPlayEnd !== null, heard: one.heard,
      cleared: session.player.flags.cleared };
  },

  // While a segment is still arriving, the estimate assumes it lasts samplesPerChar per code
  // point, so the highlight does not run to the segment's end on the little received so far.
  incomplete() {
    const { session, audio } = setup();
    const one = session.startTurn("type");
    session.sendText(one, "alpha beta gamma delta ");
    audio(one, 2000, [0, 22]);
    const early = one.wordAt(1999, session.samplesPerChar).word;
    session.handle({ type: "done", stream: one.id, reason: "end" });
    const complete = one.wordAt(1999, session.samplesPerChar).word;
    return { early, complete, samplesPerChar: session.samplesPerChar };
  },

  // The phrase figure starts at the message that completed the first segment's text.
  phrase() {
    const { session, audio } = setup();
    const one = session.startTurn("type");
    const at = (t, text) => { one.addText(text, t); };
    at(1000, "I ");
    at(1400, "am ");
    at(1800, "so ");
    at(2200, "slow, ");
    at(2600, "really.");
    one.tFirstAudio = 2250;
    one.addAudio(100, [0, 13], 0, 2250);
    const typed = one.phraseTtfaMs;
    // With an LLM's leading spaces the cut waits for the next token's space, or for `end`.
    const two = session.startTurn("llm");
    two.addText("Hello", 0);
    two.addText(" there", 100);
    two.addText(" friend", 200);
    two.tEnd = 300;
    two.tFirstAudio = 350;
    two.addAudio(100, [0, 18], 0, 350);
    void audio;
    return { typed, ttfa: one.ttfaMs, llm: two.phraseTtfaMs };
  },
};

process.stdout.write(JSON.stringify(scenarios[process.argv[3]]()));
