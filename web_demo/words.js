// Which word is being heard: a playback position inside a segment -> a word of its text.
//
// A segment is the audio of one `span` (code points [start, end) of the turn's text). Word
// timings are a list of {start, end, from, to}: a word's code points, then the samples that
// speak it, counted from the segment's first sample. The server sends no word timings today,
// so `estimateWordTimings` spreads the span over the segment's samples in proportion to
// characters; a list of real timings in the same shape can be used instead, unchanged.

/** The words (runs of non-space code points) of chars[start, end): [{start, end}]. */
export function wordsOf(chars, start, end) {
  const words = [];
  let from = -1;
  for (let i = start; i < end; i++) {
    const space = /\s/u.test(chars[i]);
    if (!space && from < 0) from = i;
    if (space && from >= 0) { words.push({ start: from, end: i }); from = -1; }
  }
  if (from >= 0) words.push({ start: from, end });
  return words;
}

/**
 * Estimated timings of the words of span = [a, b) spoken by `samples` samples: each word owns
 * its characters and the whitespace after it, and gets samples in proportion to them; the
 * first word also owns what precedes it. The timings tile [0, samples) in order.
 */
export function estimateWordTimings(chars, span, samples) {
  const [a, b] = span;
  const words = wordsOf(chars, a, Math.min(b, chars.length));
  const length = Math.max(1, b - a);
  return words.map((w, i) => {
    const next = i + 1 < words.length ? words[i + 1].start : b;
    const from = i === 0 ? 0 : Math.round(((w.start - a) / length) * samples);
    const to = Math.round(((next - a) / length) * samples);
    return { start: w.start, end: w.end, from, to };
  });
}

/**
 * The timing whose samples hold `sample` (from the segment's first sample): the first word
 * before it starts, the last once it is over; null for an empty list.
 */
export function wordAt(timings, sample) {
  if (!timings.length) return null;
  let lo = 0;
  let hi = timings.length - 1;
  while (lo < hi) { // the last timing with from <= sample
    const mid = (lo + hi + 1) >> 1;
    if (timings[mid].from <= sample) lo = mid; else hi = mid - 1;
  }
  return timings[lo];
}
