// The live timeline (a canvas): text sent, audio chunk arrivals, buffer level, underruns,
// following one turn until its audio has been played out.

const GUTTER = 58;
const MIN_WINDOW_MS = 4000;
const MAX_WINDOW_MS = 20000;

export class Timeline {
  constructor(canvas) {
    this.canvas = canvas;
    this.ctx = canvas.getContext("2d");
    this.colors = null;
  }

  readColors() {
    const css = getComputedStyle(this.canvas);
    const v = (name) => css.getPropertyValue(name).trim();
    this.colors = {
      text: v("--muted"), faint: v("--line"), ink: v("--ink"), accent: v("--accent"),
      text2: v("--tl-text"), buffer: v("--tl-buffer"), playing: v("--tl-playing"), bad: v("--bad"),
      good: v("--good"),
    };
  }

  resize() {
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(200, Math.round(this.canvas.clientWidth * dpr));
    const h = Math.max(100, Math.round(this.canvas.clientHeight * dpr));
    if (this.canvas.width !== w || this.canvas.height !== h) {
      this.canvas.width = w;
      this.canvas.height = h;
    }
    return dpr;
  }

  /** turn: the Turn shown (or null); trace: [{t, ms, state, underruns}]; now: performance.now() */
  draw(turn, trace, now) {
    if (!this.colors) this.readColors();
    const dpr = this.resize();
    const c = this.ctx;
    const W = this.canvas.width / dpr;
    const H = this.canvas.height / dpr;
    c.setTransform(dpr, 0, 0, dpr, 0, 0);
    c.clearRect(0, 0, W, H);
    c.font = "11px system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";
    c.textBaseline = "middle";

    const lanes = { text: [6, 26], audio: [34, 82], buffer: [90, H - 22] };
    c.fillStyle = this.colors.text;
    c.fillText("Text in", 0, mid(lanes.text));
    c.fillText("Audio out", 0, mid(lanes.audio));
    c.fillText("Buffer", 0, mid(lanes.buffer));
    for (const [y0, y1] of Object.values(lanes)) {
      c.fillStyle = this.colors.faint;
      c.fillRect(GUTTER, y1, W - GUTTER, 1);
      void y0;
    }
    if (!turn) {
      c.fillStyle = this.colors.text;
      c.textAlign = "center";
      c.fillText("Speak something to see the timeline", GUTTER + (W - GUTTER) / 2, mid(lanes.audio));
      c.textAlign = "left";
      return;
    }

    // Live until the turn is finished and its audio has been heard; then it stops where the
    // last of it was played (or where Stop cut it).
    const t0 = turn.tFirstText ?? turn.tStart;
    const live = !turn.isFinished || turn.tPlayEnd === null;
    const last = Math.max(lastEvent(turn), turn.tPlayEnd ?? 0);
    const end = live ? Math.max(now, t0 + MIN_WINDOW_MS) : Math.max(last + 400, t0 + MIN_WINDOW_MS);
    const start = Math.max(t0, end - MAX_WINDOW_MS);
    const span = Math.max(MIN_WINDOW_MS, end - start);
    const x = (t) => GUTTER + ((t - start) / span) * (W - GUTTER - 8);
    this.view = { turn: turn.id, t0, start, end, live };

    this.drawAxis(c, start, t0, span, x, H, W);

    // Shade periods when the player was playing; plot the buffer level over them.
    const [by0, by1] = lanes.buffer;
    const points = trace.filter((p) => p.t >= start - 200 && p.t <= end);
    const maxMs = Math.max(300, ...points.map((p) => p.ms));
    c.save();
    c.beginPath();
    c.rect(GUTTER, 0, W - GUTTER, H);
    c.clip();
    c.fillStyle = this.colors.playing;
    for (const [a, b] of playingRuns(points)) c.fillRect(Math.round(x(a)), by0, Math.round(x(b) - x(a)), by1 - by0);
    if (points.length > 1) {
      c.beginPath();
      c.moveTo(x(points[0].t), by1);
      for (const p of points) c.lineTo(x(p.t), by1 - (p.ms / maxMs) * (by1 - by0 - 4));
      c.lineTo(x(points[points.length - 1].t), by1);
      c.closePath();
      c.fillStyle = this.colors.buffer;
      c.globalAlpha = 0.35;
      c.fill();
      c.globalAlpha = 1;
      c.strokeStyle = this.colors.buffer;
      c.lineWidth = 1.5;
      c.beginPath();
      points.forEach((p, i) => {
        const px = x(p.t);
        const py = by1 - (p.ms / maxMs) * (by1 - by0 - 4);
        if (i === 0) c.moveTo(px, py); else c.lineTo(px, py);
      });
      c.stroke();
    }
    c.restore();
    c.fillStyle = this.colors.text;
    c.fillText(`0–${maxMs >= 1000 ? `${(maxMs / 1000).toFixed(1)} s` : `${Math.round(maxMs)} ms`}`, 0, mid(lanes.buffer) + 15);
    // Underruns: where the count went up.
    c.fillStyle = this.colors.bad;
    for (let i = 1; i < points.length; i++) {
      if (points[i].underruns > points[i - 1].underruns) {
        const px = x(points[i].t);
        c.beginPath();
        c.moveTo(px - 4, by0);
        c.lineTo(px + 4, by0);
        c.lineTo(px, by0 + 7);
        c.fill();
      }
    }

    // Text messages sent.
    c.fillStyle = this.colors.text2;
    for (const s of turn.sends) {
      if (s.t >= start) c.fillRect(x(s.t) - 0.75, lanes.text[0] + 4, 1.5, lanes.text[1] - lanes.text[0] - 4);
    }

    // Audio chunks: bar height = the chunk's duration (100 ms fills the lane).
    const [ay0, ay1] = lanes.audio;
    c.fillStyle = this.colors.accent;
    const rate = turn.sampleRate || 24000;
    for (const ch of turn.chunks) {
      if (ch.t < start) continue;
      const h = Math.max(3, Math.min(1, ch.samples / rate / 0.1) * (ay1 - ay0 - 4));
      roundRect(c, x(ch.t) - 1.5, ay1 - h, 3, h, 1.5);
    }

    // This turn's audio being heard: from its first sample played to its last (or now).
    if (turn.tPlayStart !== null) {
      const a = Math.max(start, turn.tPlayStart);
      const b = turn.tPlayEnd ?? now;
      c.fillStyle = this.colors.good;
      if (b > a) roundRect(c, x(a), ay1 + 2, Math.max(2, x(b) - x(a)), 4, 2);
    }

    // Time to first audio: a bracket from the first text to the first chunk.
    if (turn.tFirstText !== null && turn.tFirstAudio !== null && turn.tFirstText >= start) {
      const xa = x(turn.tFirstText);
      const xb = x(turn.tFirstAudio);
      c.strokeStyle = this.colors.ink;
      c.lineWidth = 1;
      c.setLineDash([3, 3]);
      c.beginPath();
      c.moveTo(xa, ay0 + 2);
      c.lineTo(xb, ay0 + 2);
      c.stroke();
      c.setLineDash([]);
      c.fillStyle = this.colors.ink;
      c.fillText(`${Math.round(turn.ttfaMs)} ms`, Math.max(xa, xb) + 6, ay0 + 2);
    }

    if (turn.tCut !== null && turn.tCut >= start) {
      const xc = x(turn.tCut);
      c.fillStyle = this.colors.bad;
      c.fillRect(xc - 0.75, lanes.text[0], 1.5, H - 22 - lanes.text[0]);
      c.textAlign = "right";
      c.fillText("stop", xc - 4, lanes.text[0] + 8);
      c.textAlign = "left";
    }

    if (live) {
      c.fillStyle = this.colors.faint;
      c.fillRect(x(now), lanes.text[0], 1, H - 22 - lanes.text[0]);
    } else if (turn.tPlayEnd !== null && turn.tCut === null && turn.samples > 0 && turn.tPlayEnd >= start) {
      const xe = x(turn.tPlayEnd);
      c.fillStyle = this.colors.text;
      c.fillRect(xe - 0.5, lanes.buffer[0], 1, lanes.buffer[1] - lanes.buffer[0]);
      c.textAlign = "right";
      c.fillText("played out", xe - 4, lanes.buffer[0] + 8);
      c.textAlign = "left";
    }
  }

  drawAxis(c, start, t0, span, x, H, W) {
    const pxPerMs = (W - GUTTER - 8) / span;
    const step = [250, 500, 1000, 2000, 5000, 10000].find((ms) => ms * pxPerMs >= 46) || 20000;
    c.fillStyle = this.colors.text;
    c.textAlign = "center";
    const first = Math.ceil((start - t0) / step) * step;
    for (let ms = first; ms <= start - t0 + span; ms += step) {
      const px = x(t0 + ms);
      c.fillStyle = this.colors.faint;
      c.fillRect(px, H - 20, 1, 4);
      c.fillStyle = this.colors.text;
      c.fillText(`${(ms / 1000).toFixed(step < 1000 ? 1 : 0)} s`, px, H - 9);
    }
    c.textAlign = "left";
  }
}

// [start, end) times of the stretches during which the player was playing.
function playingRuns(points) {
  const runs = [];
  let from = null;
  for (const p of points) {
    if (p.state === "playing" && from === null) from = p.t;
    if (p.state !== "playing" && from !== null) { runs.push([from, p.t]); from = null; }
  }
  if (from !== null && points.length) runs.push([from, points[points.length - 1].t]);
  return runs;
}

function mid([a, b]) {
  return (a + b) / 2;
}

function lastEvent(turn) {
  let t = turn.tStart;
  if (turn.sends.length) t = Math.max(t, turn.sends[turn.sends.length - 1].t);
  if (turn.chunks.length) t = Math.max(t, turn.chunks[turn.chunks.length - 1].t);
  if (turn.tCut !== null) t = Math.max(t, turn.tCut);
  return t;
}

function roundRect(c, x, y, w, h, r) {
  c.beginPath();
  c.moveTo(x + r, y);
  c.arcTo(x + w, y, x + w, y + h, r);
  c.arcTo(x + w, y + h, x, y + h, r);
  c.arcTo(x, y + h, x, y, r);
  c.arcTo(x, y, x + w, y, r);
  c.closePath();
  c.fill();
}
