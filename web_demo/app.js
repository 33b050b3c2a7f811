// The demo page: wires the connection, the session, the player and the on-screen metrics.

import { Connection } from "./connection.js";
import { PARAGRAPHS, paceTokens, tokenize } from "./llm.js";
import { renderMetrics } from "./metrics.js";
import { Player } from "./player.js";
import { Session } from "./session.js";
import { Timeline } from "./timeline.js";
import { Transcript } from "./transcript.js";
import { encodeWav } from "./wav.js";

const $ = (id) => document.getElementById(id);

const player = new Player();
const wsUrl = `${location.protocol === "https:" ? "wss:" : "ws:"}//${location.host}/v1/stream`;
const conn = new Connection(wsUrl, { onopen, onmessage, onstatus });
const session = new Session(conn, player, { onchange: () => {}, onerror: showError });
const timeline = new Timeline($("timeline"));
const transcript = new Transcript($("transcript"));

const ui = {
  connState: "connecting",
  playerReady: false,
  lastError: null,
  hello: null,
  typeTurn: null,
  sentChars: 0, // how much of the text box has been sent in the open typing turn
  wordsSent: 0,
  pacer: null,
  shown: null, // the turn the page showed at the last frame, and what was playing then
  np: null,
  connects: 0, // hello messages received (1 + reconnects)
  statsReports: 0, // stats messages from the worklet: a clock tests can wait on
  retryAt: 0,
};

// --- connection -------------------------------------------------------------------------------

async function onopen(hello) {
  ui.hello = hello;
  ui.connects += 1;
  ui.playerReady = false;
  hideBanner("connection");
  $("foot-model").textContent = `model ${hello.model} · ${formatRate(hello.sample_rate)}`;
  fillVoices(hello.voices, hello.default_voice);
  loadVoices();
  try {
    await player.open(hello.sample_rate);
    ui.playerReady = true;
  } catch (err) {
    showError(`This browser could not start audio playback (${err.message}).`, "audio");
  }
  renderControls();
}

function onmessage(msg) {
  session.handle(msg);
}

function onstatus(s) {
  ui.connState = s.state;
  const pill = $("conn");
  pill.dataset.state = s.state;
  $("retry").hidden = s.state !== "retrying";
  if (s.state === "connecting") {
    $("conn-text").textContent = s.everOpened ? "Reconnecting…" : "Connecting…";
  } else if (s.state === "open") {
    const h = conn.hello;
    $("conn-text").textContent = `Connected · ${h.model} · ${formatRate(h.sample_rate)}`;
  } else if (s.state === "retrying") {
    ui.retryAt = performance.now() + s.retryInMs;
    renderRetry();
    stopPacer();
    ui.typeTurn = null;
    ui.sentChars = $("text").value.length;
    session.connectionLost();
    const why = closeReason(s.code, s.reason);
    showError(s.everOpened
      ? `Lost the connection to the server${why}. Reconnecting automatically…`
      : `Can't reach the voxgate server at ${location.host}${why}. Retrying…`, "connection");
  } else {
    $("conn-text").textContent = "Disconnected";
  }
  renderControls();
}

function renderRetry() {
  if (ui.connState !== "retrying") return;
  const secs = Math.max(1, Math.ceil((ui.retryAt - performance.now()) / 1000));
  const text = `Offline · retrying in ${secs} s`;
  if ($("conn-text").textContent !== text) $("conn-text").textContent = text;
}

function closeReason(code, reason) {
  if (reason) return ` (${reason})`;
  if (code === 1001) return " (the server is shutting down or restarting)";
  if (code === 1013) return " (the speech engine is not ready yet)";
  return "";
}

async function loadVoices() {
  try {
    const res = await fetch("/v1/voices", { cache: "no-store" });
    if (!res.ok) return;
    const body = await res.json();
    fillVoices(body.voices, body.default_voice);
  } catch {
    // The hello message already listed the voices.
  }
}

function fillVoices(voices, defaultVoice) {
  const select = $("voice");
  const names = (voices || []).map((v) => (typeof v === "string" ? v : v.name || v.id)).filter(Boolean);
  const keep = session.voice && names.includes(session.voice) ? session.voice : defaultVoice || names[0] || null;
  const current = [...select.options].map((o) => o.value).join("\n");
  if (current !== names.join("\n")) {
    select.replaceChildren(...names.map((n) => new Option(n, n)));
  }
  select.value = keep || "";
  session.voice = keep;
}

// --- errors ---------------------------------------------------------------------------------

function showError(text, code) {
  ui.lastError = { text, code };
  $("banner-text").textContent = text;
  $("banner").dataset.kind = code === "connection" ? "connection" : "error";
  $("banner").hidden = false;
}

function hideBanner(kind) {
  if (!kind || $("banner").dataset.kind === kind) $("banner").hidden = true;
}

// --- typing mode ----------------------------------------------------------------------------

function typingTurn() {
  if (!ui.typeTurn || ui.typeTurn.status !== "open") {
    ui.typeTurn = session.startTurn("type");
    ui.wordsSent = 0;
  }
  return ui.typeTurn;
}

function sendWords(piece) {
  // One `text` message per completed word (a paste of several words sends several).
  for (const word of piece.match(/\S+\s+|\s+/g) || []) {
    if (!ui.typeTurn && !word.trim()) continue;
    const turn = typingTurn();
    if (!turn) return;
    session.sendText(turn, word);
    ui.wordsSent += 1;
  }
}

function onTyping() {
  if (!conn.isOpen) return;
  const value = $("text").value;
  if (value.length < ui.sentChars) ui.sentChars = value.length; // sent words cannot be unsent
  const boundary = Math.max(value.lastIndexOf(" "), value.lastIndexOf("\n"), value.lastIndexOf("\t")) + 1;
  if (boundary > ui.sentChars) {
    sendWords(value.slice(ui.sentChars, boundary));
    ui.sentChars = boundary;
  }
  renderControls();
}

function speakTyped() {
  player.unlock();
  const value = $("text").value;
  const rest = value.slice(ui.sentChars);
  if (rest.trim()) {
    const turn = typingTurn();
    if (!turn) return;
    session.sendText(turn, rest);
    ui.wordsSent += 1;
  }
  if (ui.typeTurn) session.endTurn(ui.typeTurn);
  ui.typeTurn = null;
  ui.sentChars = 0;
  $("text").value = "";
  renderControls();
}

// --- LLM mode ---------------------------------------------------------------------------------

function startLlm() {
  player.unlock();
  stop(); // a new reply interrupts the one still speaking
  const paragraph = PARAGRAPHS[Number($("paragraph").value)] || PARAGRAPHS[0];
  const turn = session.startTurn("llm");
  if (!turn) return;
  const tokens = tokenize(paragraph.text);
  ui.pacer = paceTokens(tokens, Number($("tps").value), (tok) => {
    if (turn.status !== "open") { // failed or stopped underneath us
      ui.pacer = null;
      $("llm-hint").textContent = "Stopped.";
      renderControls();
      return false;
    }
    session.sendText(turn, tok);
    $("llm-hint").textContent = `Token ${ui.pacer ? ui.pacer.sent : 1} of ${tokens.length}`;
  }, () => {
    session.endTurn(turn);
    ui.pacer = null;
    $("llm-hint").textContent = `All ${tokens.length} tokens sent.`;
    renderControls();
  });
  renderControls();
}

function stopPacer() {
  if (ui.pacer) ui.pacer.stop();
  ui.pacer = null;
}

// --- stop (barge-in) --------------------------------------------------------------------------

function stop() {
  stopPacer();
  session.cancelAll();
  ui.typeTurn = null;
  ui.sentChars = 0;
  ui.wordsSent = 0;
  $("text").value = "";
  renderControls();
}

// --- download -----------------------------------------------------------------------------------

function lastUtterance() {
  for (let i = session.history.length - 1; i >= 0; i--) {
    if (session.history[i].samples > 0) return session.history[i];
  }
  return null;
}

function download() {
  const turn = lastUtterance();
  if (!turn) return;
  const url = URL.createObjectURL(encodeWav(turn.pcm, turn.sampleRate || player.streamRate));
  const a = document.createElement("a");
  a.href = url;
  a.download = `voxgate-${turn.id}.wav`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

// --- rendering ----------------------------------------------------------------------------------

function renderControls() {
  const ready = conn.isOpen && ui.playerReady;
  for (const id of ["speak", "llm-start"]) $(id).disabled = !ready;
  const active = session.queue.length > 0 || ui.pacer !== null || player.stats.buffered > 0;
  for (const id of ["stop-type", "stop-llm"]) $(id).disabled = !active;
  $("type-hint").textContent = ui.typeTurn ? `Words sent: ${ui.wordsSent}` : "Words go out as you type";
}

function render() {
  const now = performance.now();
  const stats = player.stats;
  const rate = player.rate || 24000;
  const np = session.nowPlaying(stats.consumed);
  const shown = session.shownTurn(np);
  const waiting = new Set([...session.audible, ...session.queue]);
  const queued = [...waiting].filter((t) => t !== shown && t.heard === 0 && t.tPlayEnd === null).length;

  renderMetrics(shown, {
    np, queued, stats, rate, streamRate: player.streamRate, prebufferMs: player.prebufferMs,
    totals: session.totals, turnCount: session.history.filter((t) => t.heard > 0).length,
  });
  $("audio-hint").hidden = player.contextState === "running";

  transcript.render(shown, np, session.samplesPerChar);
  renderTurnStatus(shown, np, stats);
  const last = lastUtterance();
  $("download").disabled = !last;
  $("last-info").textContent = last
    ? `${last.id} · ${last.audioSeconds.toFixed(1)} s received · ${turnLabel(last)}`
    : "nothing yet";
  timeline.draw(shown, session.bufferTrace, now);
  ui.shown = shown;
  ui.np = np;
  renderControls();
  renderRetry();
}

function turnLabel(turn) {
  if (turn.status === "open" || turn.status === "ended") return "in progress";
  if (turn.status === "cancelled" || turn.cutAt !== null) return "stopped";
  return turn.status;
}

function renderTurnStatus(turn, np, stats) {
  const el = $("turn-status");
  let label = "idle";
  let state = "idle";
  if (turn) {
    const heard = np && np.turn === turn && !np.finished;
    if (heard && stats.state === "playing") { label = "speaking"; state = "speaking"; }
    else if (turn.status === "failed") { label = "failed"; state = "failed"; }
    else if (turn.status === "cancelled" || turn.cutAt !== null) label = "stopped";
    else if (turn.status === "done" && turn.tPlayEnd !== null) label = "done";
    else if (turn.status === "open" || (heard && stats.state === "waiting")) label = "listening for text";
    else label = "buffering";
  }
  el.textContent = label;
  el.dataset.state = state;
}

function formatRate(hz) {
  return hz ? `${(hz / 1000).toFixed(hz % 1000 ? 1 : 0)} kHz` : "";
}

function frame() {
  render();
  requestAnimationFrame(frame);
}

// --- set-up -------------------------------------------------------------------------------------

function selectTab(which) {
  const isType = which === "type";
  $("tab-type").setAttribute("aria-selected", String(isType));
  $("tab-llm").setAttribute("aria-selected", String(!isType));
  $("pane-type").hidden = !isType;
  $("pane-llm").hidden = isType;
}

function setup() {
  $("tab-type").addEventListener("click", () => selectTab("type"));
  $("tab-llm").addEventListener("click", () => selectTab("llm"));
  $("text").addEventListener("input", onTyping);
  $("text").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      speakTyped();
    }
  });
  $("speak").addEventListener("click", speakTyped);
  $("stop-type").addEventListener("click", stop);
  $("stop-llm").addEventListener("click", stop);
  $("llm-start").addEventListener("click", startLlm);
  $("download").addEventListener("click", download);
  $("banner-close").addEventListener("click", () => { $("banner").hidden = true; });
  $("retry").addEventListener("click", () => conn.retryNow());
  $("voice").addEventListener("change", (e) => { session.voice = e.target.value || null; });
  $("format").addEventListener("change", (e) => { session.format = e.target.value; });
  $("jitter").addEventListener("input", (e) => {
    player.setPrebufferMs(Number(e.target.value));
    $("jitter-out").textContent = `${e.target.value} ms`;
  });
  $("tps").addEventListener("input", (e) => {
    $("tps-out").textContent = `${e.target.value} tokens/s`;
    if (ui.pacer) ui.pacer.setRate(Number(e.target.value));
  });
  $("paragraph").replaceChildren(...PARAGRAPHS.map((p, i) => new Option(p.title, String(i))));
  const preview = () => { $("paragraph-preview").textContent = PARAGRAPHS[Number($("paragraph").value)].text; };
  $("paragraph").addEventListener("change", preview);
  preview();
  for (const ev of ["pointerdown", "keydown"]) document.addEventListener(ev, () => player.unlock(), { capture: true });
  player.onstats = (stats) => {
    ui.statsReports += 1;
    session.track(stats, player.rate);
  };
  window.addEventListener("resize", () => timeline.draw(ui.shown || null, session.bufferTrace, performance.now()));
  matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => { timeline.colors = null; });
  conn.connect();
  requestAnimationFrame(frame);
}

// --- test hooks -----------------------------------------------------------------------------------

function turnSummary(turn) {
  if (!turn) return null;
  return {
    id: turn.id, kind: turn.kind, status: turn.status, text: turn.text, chunks: turn.chunks.length,
    textMessages: turn.sends.length, cutAt: turn.cutAt, serverReason: turn.serverReason,
    samples: turn.samples, ttfaMs: turn.ttfaMs, serverTtfaMs: turn.serverTtfaMs,
    phraseTtfaMs: turn.phraseTtfaMs, heard: turn.heard, underruns: turn.underruns,
    tFirstText: turn.tFirstText, tFirstAudio: turn.tFirstAudio, tPlayStart: turn.tPlayStart, tPlayEnd: turn.tPlayEnd,
    sends: turn.sends.map((s) => s.t),
    spans: turn.chunks.map((c) => c.span), error: turn.error,
  };
}

window.voxgateDemo = {
  /** Counters for tests; sample counts are at the stream's rate. */
  stats() {
    const s = player.stats;
    const turn = session.current;
    return {
      state: ui.connState,
      ready: conn.isOpen && ui.playerReady,
      playerState: s.state,
      contextState: player.contextState,
      sampleRate: player.streamRate,
      samplesReceived: session.totals.samplesReceived,
      samplesPushed: player.toStreamSamples(player.pushed),
      samplesPlayed: player.toStreamSamples(s.played),
      samplesDropped: player.toStreamSamples(s.dropped),
      samplesBuffered: player.toStreamSamples(s.buffered),
      underruns: s.underruns,
      chunks: session.totals.chunks,
      ttfaMs: turn ? turn.ttfaMs : null,
      turns: session.history.length,
      activeTurns: session.queue.length,
      lastError: ui.lastError,
      bannerVisible: !$("banner").hidden,
      connects: ui.connects,
      statsReports: ui.statsReports,
      currentTurn: turnSummary(turn),
      shownTurn: ui.shown ? ui.shown.id : null, // the turn the metrics, transcript and timeline show
      playingTurn: ui.np && !ui.np.finished ? ui.np.turn.id : null,
      timeline: timeline.view || null,
    };
  },
  /** Speak text through the typing path, word by word, then Enter. */
  speak(text) {
    $("text").value = text;
    onTyping();
    speakTyped();
    return turnSummary(session.current);
  },
  stop,
  showError,
  startLlm(index = 0, tokensPerSecond = 12) {
    $("paragraph").value = String(index);
    $("paragraph").dispatchEvent(new Event("change"));
    $("tps").value = String(tokensPerSecond);
    $("tps").dispatchEvent(new Event("input"));
    startLlm();
    return turnSummary(session.current);
  },
  turns: () => session.history.map(turnSummary),
};

setup();
