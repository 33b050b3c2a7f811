"""Input streaming: incremental text (characters, LLM tokens, words) -> speakable segments.

The rules (where it cuts, never inside a word or a number, independent of chunking):
docs/architecture.md, "Segmentation".
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Segment", "Segmenter"]

_SENTENCE_END = frozenset("!?…")
_CLAUSE_END = frozenset(",;:—–")
_CLOSERS = frozenset("\"')]}»”’")
_OPENERS = "\"'([{«“‘"
# Lowercase words that, followed by a period, are abbreviations rather than sentence ends.
# Dotted forms ("e.g.", "U.S.", "a.m.") and single-letter initials are caught by rule instead.
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st mt ft vs approx dept est fig gen gov lt col capt sgt rev hon"
    " inc ltd co corp no vol pp ch sec jan feb mar apr jun jul aug sep sept oct nov dec".split()
)

# Boundary kinds, weakest first.
_WEAK = 0  # whitespace after an abbreviation: usable only to keep a segment under the max
_WORD = 1
_CLAUSE = 2
_SENTENCE = 3


@dataclass(frozen=True)
class Segment:
    """A speakable piece of the stream: ``text == full_text[start:end]``, stripped, non-empty."""

    text: str
    start: int  # offset of the first character in the stream's full text
    end: int  # offset one past the last character


class Segmenter:
    """Cuts one stream's incremental text into segments. See the module docstring for the rules."""

    def __init__(
        self,
        *,
        first_segment_min_chars: int = 20,
        min_segment_chars: int = 40,
        max_segment_chars: int = 250,
    ) -> None:
        for name, value in (
            ("first_segment_min_chars", first_segment_min_chars),
            ("min_segment_chars", min_segment_chars),
            ("max_segment_chars", max_segment_chars),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if max_segment_chars < max(first_segment_min_chars, min_segment_chars):
            raise ValueError(
                "max_segment_chars must be >= first_segment_min_chars and min_segment_chars, got "
                f"{max_segment_chars} < max({first_segment_min_chars}, {min_segment_chars})"
            )
        self.first_segment_min_chars = first_segment_min_chars
        self.min_segment_chars = min_segment_chars
        self.max_segment_chars = max_segment_chars

        self._buf = ""  # text not yet emitted
        self._base = 0  # offset of _buf[0] in the full text
        self._scan = 0  # next index of _buf to examine
        self._seg_start: int | None = None  # index of the first non-space char in _buf
        self._cuts: list[tuple[int, int]] = []  # (index, kind) candidates inside the pending text
        self._period_cut: int | None = None  # a period waiting for the next non-space char
        self._is_first = True
        self._is_ended = False

    # -- public API ---------------------------------------------------------------------------

    @property
    def pending_chars(self) -> int:
        """Characters received but not yet emitted, leading whitespace excluded."""
        return len(self._buf.lstrip())

    @property
    def is_ended(self) -> bool:
        return self._is_ended

    def push(self, text: str) -> list[Segment]:
        """Add text; return the segments that are now complete (possibly none).

        Raises ``ValueError`` after ``end``.
        """
        if self._is_ended:
            raise ValueError("push after end")
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        self._buf += text
        return self._advance()

    def flush(self) -> list[Segment]:
        """Speak everything buffered now, even mid-sentence or mid-word.

        The next segment after a flush is short again (the listener has probably caught up).
        """
        out: list[Segment] = []
        start, end = self._buf_start(), len(self._buf.rstrip())
        if end > start:
            out.append(self._emit(start, end))
        self._consume(len(self._buf))
        self._is_first = True
        return out

    def end(self) -> list[Segment]:
        """No more text: return the rest. Idempotent; ``push`` afterwards raises."""
        if self._is_ended:
            return []
        out = self.flush()
        self._is_ended = True
        return out

    # -- scanning -----------------------------------------------------------------------------

    def _buf_start(self) -> int:
        return len(self._buf) - len(self._buf.lstrip())

    def _advance(self) -> list[Segment]:
        out: list[Segment] = []
        p = self._scan
        while p < len(self._buf):
            ch = self._buf[p]
            if ch.isspace():
                if p > 0 and not self._buf[p - 1].isspace():
                    kind = self._classify_word_end(p)
                    if ch == "\n":
                        kind = _SENTENCE
                    p -= self._decide(p, kind, out)
            else:
                if self._seg_start is None:
                    self._seg_start = p
                if self._period_cut is not None:
                    cut, self._period_cut = self._period_cut, None
                    if not ch.islower():
                        p -= self._decide(cut, _SENTENCE, out)
                p -= self._enforce_max(p, out)
            p += 1
        self._scan = p
        return out

    def _classify_word_end(self, p: int) -> int:
        """Kind of the boundary at whitespace index ``p`` (the previous char is not whitespace)."""
        buf = self._buf
        q = p - 1
        while q > 0 and buf[q] in _CLOSERS and not buf[q - 1].isspace():
            q -= 1
        ch = buf[q]
        if ch in _SENTENCE_END:
            return _SENTENCE
        if ch in _CLAUSE_END:
            return _CLAUSE
        if ch == "-" and (q == 0 or buf[q - 1].isspace() or buf[q - 1] == "-"):
            return _CLAUSE  # " - " or "--" used as a dash, not a hyphen
        if ch == "." and q > 0 and buf[q - 1] == ".":
            self._period_cut = p  # an ellipsis: a sentence end unless lowercase follows
            return _WORD
        if ch == ".":
            word_start = q
            while word_start > 0 and not buf[word_start - 1].isspace():
                word_start -= 1
            word = buf[word_start:q].lstrip(_OPENERS)
            if _is_abbreviation(word):
                return _WEAK
            self._period_cut = p  # decided when the next non-space character arrives
            return _WORD
        return _WORD

    def _decide(self, cut: int, kind: int, out: list[Segment]) -> int:
        """Emit at ``cut`` if the rules say so, else remember it. Returns how far _buf shifted."""
        assert self._seg_start is not None  # a boundary always follows a non-space char
        length = cut - self._seg_start
        if kind == _SENTENCE or length >= self.max_segment_chars:
            emit = True
        elif self._is_first:
            emit = kind == _CLAUSE or (kind == _WORD and length >= self.first_segment_min_chars)
        else:
            emit = kind == _CLAUSE and length >= self.min_segment_chars
        if not emit:
            self._cuts.append((cut, kind))
            return 0
        out.append(self._emit(self._seg_start, cut))
        return self._consume(cut)

    def _enforce_max(self, p: int, out: list[Segment]) -> int:
        """At a non-space char ``p``: if the pending text is now too long, cut it earlier."""
        assert self._seg_start is not None
        if p - self._seg_start + 1 <= self.max_segment_chars or not self._cuts:
            return 0  # short enough, or one long word that must not be split: wait for its end
        clauses = [c for c, k in self._cuts if k >= _CLAUSE]
        cut = clauses[-1] if clauses else self._cuts[-1][0]
        out.append(self._emit(self._seg_start, cut))
        return self._consume(cut)

    def _emit(self, start: int, end: int) -> Segment:
        self._is_first = False
        return Segment(self._buf[start:end], self._base + start, self._base + end)

    def _consume(self, n: int) -> int:
        """Drop the first ``n`` chars of the buffer, shifting every stored index. Returns ``n``."""
        if n == 0:
            return 0
        self._buf = self._buf[n:]
        self._base += n
        self._scan = max(0, self._scan - n)
        self._cuts = [(c - n, k) for c, k in self._cuts if c > n]
        if self._period_cut is not None:
            self._period_cut = self._period_cut - n if self._period_cut > n else None
        rest = self._buf_start()
        self._seg_start = rest if rest < len(self._buf) else None
        return n


def _is_abbreviation(word: str) -> bool:
    """True for a word that, followed by a period, does not end a sentence."""
    if not word:
        return False
    if len(word) == 1 and word.isalpha():
        return True  # an initial: "J. K. Rowling"
    if "." in word and word.replace(".", "").isalpha():
        return True  # dotted: "e.g", "U.S", "a.m"
    return word.lower() in _ABBREVIATIONS
