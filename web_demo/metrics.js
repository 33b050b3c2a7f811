// The metrics card: figures of the turn being heard (or next), then the player's over all turns.

const $ = (id) => document.getElementById(id);

const NOTES = {
  type: "The first two count from your first word, so they include your typing;"
    + " the third starts once the first phrase was sent.",
  llm: "The first two count from the first token, so they include the LLM's pace;"
    + " the third starts once the first phrase was sent.",
};

function ms(value) {
  return value === null || value === undefined ? "–" : `${Math.round(value)} ms`;
}

function seconds(value) {
  return `${value.toFixed(1)} s`;
}

function setText(id, text) {
  const el = $(id);
  if (el.textContent !== text) el.textContent = text;
}

/**
 * turn: the turn shown (or null); np: the session's nowPlaying(); queued: turns waiting to be
 * heard after it; stats: the worklet's last report; rate and streamRate: the audio context's
 * and the stream's sample rates; totals: the session's; turnCount: turns heard (some or all).
 */
export function renderMetrics(turn, { np, queued, stats, rate, streamRate, prebufferMs, totals, turnCount }) {
  setText("m-turn", turnTag(turn, np, queued));
  setText("m-ttfa", ms(turn ? turn.ttfaMs : null));
  setText("m-ttfa-server", ms(turn ? turn.serverTtfaMs : null));
  setText("m-ttfa-server-sub", turn && turn.serverTtfaMs !== null
    ? "first text in → first audio out, from the turn's done"
    : "first text in → first audio out, sent when the turn ends");
  setText("m-ttfa-phrase", ms(turn ? turn.phraseTtfaMs : null));
  setText("m-ttfa-note", NOTES[turn ? turn.kind : "type"]);

  setText("m-chunks", String(turn ? turn.chunks.length : 0));
  setText("m-chunk-size", turn && turn.chunks.length
    ? `received, ~${Math.round((turn.samples / turn.chunks.length / (turn.sampleRate || rate)) * 1000)} ms each`
    : "received");
  setText("m-audio", seconds(turn ? turn.audioSeconds : 0));
  setText("m-heard", seconds(turn ? turn.heardSeconds : 0));
  setText("m-turn-underruns", String(turn ? turn.underruns : 0));

  const bufMs = (stats.buffered / rate) * 1000;
  setText("m-buffer", bufMs < 1000 ? `${Math.round(bufMs)} ms` : `${(bufMs / 1000).toFixed(1)} s`);
  $("m-buffer-bar").style.width = `${Math.min(100, (bufMs / Math.max(500, prebufferMs * 4)) * 100)}%`;
  setText("m-played", seconds(totals.samplesHeard / (streamRate || rate)));
  setText("m-turns", `over ${turnCount} turn${turnCount === 1 ? "" : "s"}`);
  setText("m-underruns", String(stats.underruns));
  setText("m-player", playerLabel(stats.state));
}

function turnTag(turn, np, queued) {
  if (!turn) return "no turn yet";
  const number = turn.id.replace("turn-", "turn ");
  let state;
  if (np && np.turn === turn && !np.finished) state = "speaking";
  else if (turn.status === "failed") state = "failed";
  else if (turn.status === "cancelled" || turn.cutAt !== null) state = "stopped";
  else if (turn.isFinished && turn.tPlayEnd !== null) state = "done";
  else state = "in progress";
  const later = queued > 0 ? ` · ${queued} more waiting` : "";
  return `${number} · ${state}${later}`;
}

export function playerLabel(state) {
  return { idle: "idle", buffering: "buffering", playing: "playing", waiting: "waiting for text" }[state] || state;
}
