// "Speak as an LLM would": split a paragraph into LLM-like tokens and send them at a set rate.

export const PARAGRAPHS = [
  {
    title: "Travel assistant",
    text: "Sure! Your flight to Lisbon leaves at 7:45 tomorrow morning from gate B12, and boarding starts thirty minutes before departure. The weather there looks sunny, around twenty-four degrees. Would you like me to add the trip to your calendar?",
  },
  {
    title: "Recipe",
    text: "For a quick tomato soup, soften one chopped onion in a little olive oil, then add two cloves of garlic. Pour in a can of tomatoes and half a litre of stock, and let it simmer for fifteen minutes. Blend until smooth, season with salt and pepper, and serve it with warm bread.",
  },
  {
    title: "How streaming works",
    text: "Streaming speech works like a relay race. The language model hands over words as soon as it writes them, the gateway gathers them into short phrases, and the voice starts speaking the first phrase while the rest of the answer is still being written. That is why you hear the reply almost at once.",
  },
  {
    title: "Support call",
    text: "I'm sorry about the trouble with your order. I can see that the parcel left our warehouse on Monday, but it was delayed at the sorting centre. It should reach you by Thursday afternoon. If it doesn't, just reply to this message and I'll send a replacement right away.",
  },
];

/**
 * Split text into pieces that look like an LLM's tokens: a word with its leading space,
 * long words cut into sub-word pieces, punctuation and digits on their own.
 * Joining the tokens gives back the text exactly.
 */
export function tokenize(text) {
  const tokens = [];
  const re = /\s*[A-Za-z\u00C0-\u024F']+|\s*\d{1,3}|\s*[^\sA-Za-z\d]|\s+$/g;
  let m;
  let last = 0;
  while ((m = re.exec(text)) !== null) {
    if (m.index > last) tokens.push(text.slice(last, m.index));
    last = m.index + m[0].length;
    const piece = m[0];
    const word = piece.trimStart();
    if (word.length > 7 && /^[A-Za-z]/.test(word)) {
      const lead = piece.slice(0, piece.length - word.length);
      const cut = Math.ceil(word.length / 2);
      tokens.push(lead + word.slice(0, cut), word.slice(cut));
    } else {
      tokens.push(piece);
    }
    if (m[0].length === 0) re.lastIndex += 1;
  }
  if (last < text.length) tokens.push(text.slice(last));
  return tokens;
}

/**
 * Calls send(token) at tokensPerSecond, then onfinish(). send may return false to stop early.
 * Returns {stop, setRate, sent}.
 */
export function paceTokens(tokens, tokensPerSecond, send, onfinish) {
  let rate = tokensPerSecond;
  let i = 0;
  let timer = null;
  let stopped = false;
  let next = performance.now();
  const tick = () => {
    const now = performance.now();
    while (!stopped && i < tokens.length && next <= now + 1) {
      if (send(tokens[i++]) === false) stopped = true;
      next += 1000 / rate;
    }
    if (stopped) return;
    if (i >= tokens.length) {
      timer = null;
      onfinish();
      return;
    }
    timer = setTimeout(tick, Math.max(0, next - performance.now()));
  };
  tick();
  return {
    stop() { stopped = true; clearTimeout(timer); timer = null; },
    setRate(r) { rate = r; },
    get sent() { return i; },
  };
}
