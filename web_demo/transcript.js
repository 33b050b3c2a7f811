// "Now speaking": the turn's text, with what was heard, the word being heard, and the rest.

/**
 * What of the turn's text has been heard: {spokenEnd, word} in code points, word being the
 * [start, end) of the word playing now (or null). np is the session's nowPlaying().
 */
export function heardRange(turn, np, samplesPerChar) {
  const n = turn.chars.length;
  if (!turn.segments.some((s) => s.span)) return { spokenEnd: turn.chunks.length ? n : 0, word: null };
  if (turn.cutAt !== null) return { spokenEnd: Math.min(turn.cutAt, n), word: null };
  const here = np && np.turn === turn;
  if (here && !np.finished) {
    const { segment, word } = turn.wordAt(np.pos, samplesPerChar);
    if (word) return { spokenEnd: word.start, word: [word.start, word.end] };
    return { spokenEnd: spanEndBefore(turn, segment ? segment.first + 1 : 0), word: null };
  }
  if (turn.tPlayEnd !== null && turn.status === "done") return { spokenEnd: n, word: null };
  if (here || turn.tPlayEnd !== null) return { spokenEnd: spanEndBefore(turn, here ? np.pos : turn.heard), word: null };
  return { spokenEnd: 0, word: null };
}

// The end of the last span whose audio starts before sample pos.
function spanEndBefore(turn, pos) {
  let end = 0;
  for (const s of turn.segments) {
    if (s.first >= pos) break;
    if (s.span) end = Math.max(end, s.span[1]);
  }
  return end;
}

export class Transcript {
  constructor(el) {
    this.el = el;
    this.key = "";
  }

  render(turn, np, samplesPerChar) {
    if (!turn || !turn.text) {
      if (this.key !== "empty") {
        this.el.innerHTML = '<span class="placeholder">The text being spoken appears here, highlighted word by word as you hear it.</span>';
        this.key = "empty";
      }
      return;
    }
    const chars = turn.chars;
    const { spokenEnd, word } = heardRange(turn, np, samplesPerChar);
    const [a, b] = word || [spokenEnd, spokenEnd];
    const key = `${turn.id}|${chars.length}|${spokenEnd}|${a}|${b}`;
    if (key === this.key) return;
    this.key = key;
    const parts = [["spoken", 0, spokenEnd], ["speaking", a, b], ["unspoken", Math.max(spokenEnd, b), chars.length]]
      .filter(([, from, to]) => to > from)
      .map(([cls, from, to]) => {
        const span = document.createElement("span");
        span.className = cls;
        span.textContent = chars.slice(from, to).join("");
        return span;
      });
    this.el.replaceChildren(...parts);
  }
}
