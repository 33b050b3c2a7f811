"""Character and word timings (``Aligner``, ``Word``) from the span of text each chunk speaks,
spread over its samples at a measured speaking rate (docs/compat.md, "Timings and flushes").
Times are in samples from the start of the stream's audio.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CharTiming", "Word", "Aligner", "words_of"]

# English speech at speed 1 runs at about 14-16 characters a second (spaces included);
# characters are placed a little early (0.9) so that few are left untimed at a segment's end.
_DEFAULT_CHARS_PER_S = 15.0
_EARLY = 0.9
_MIN_CALIBRATION_CHARS = 40


@dataclass(frozen=True)
class CharTiming:
    index: int  # in the stream's text
    char: str
    start: int  # samples from the start of the stream's audio
    duration: int  # samples


@dataclass(frozen=True)
class Word:
    text: str
    start: int  # samples
    end: int  # samples


class Aligner:
    """Timings for one stream. Feed every chunk in order with ``on_chunk``."""

    def __init__(self, sample_rate: int, *, speed: float = 1.0) -> None:
        self.sample_rate = sample_rate
        self._default_spc = sample_rate / (_DEFAULT_CHARS_PER_S * max(speed, 0.1))
        self._text = ""
        self._span: tuple[int, int] | None = None
        self._next = 0  # the first character not yet timed
        self._span_samples = 0  # audio of the current span so far
        self._samples = 0  # audio of the stream so far
        self._done_chars = 0  # characters and samples of the spans spoken (calibration)
        self._done_samples = 0

    def set_text(self, text: str) -> None:
        """The stream's text so far (append-only)."""
        self._text = text

    @property
    def samples_per_char(self) -> float:
        if self._done_chars >= _MIN_CALIBRATION_CHARS:
            return self._done_samples / self._done_chars
        return self._default_spc

    def on_chunk(self, span: tuple[int, int] | None, num_samples: int) -> list[CharTiming]:
        """The characters this chunk (of ``span``, ``num_samples`` long) speaks."""
        out: list[CharTiming] = []
        chunk_start = self._samples
        if span is not None and span != self._span:
            if self._span is not None:
                self._done_chars += self._span[1] - self._span[0]
                self._done_samples += self._span_samples
            # what the last span left untimed, squeezed at this chunk's start
            out += [CharTiming(i, self._text[i], chunk_start, 0) for i in
                    range(self._next, min(self._span[1] if self._span else 0, len(self._text)))]
            self._next = max(self._next, self._span[1] if self._span else 0)
            self._span = span
            self._span_samples = 0
        if self._span is not None:
            start, end = self._span
            spc = self.samples_per_char * _EARLY
            limit = self._span_samples + num_samples
            end = min(end, len(self._text))
            while self._next < end:
                pos = max((self._next - start) * spc, 0.0)  # spaces before the span: at 0
                if pos >= limit:
                    break
                at = int(max(pos - self._span_samples, 0.0))
                dur = int(min(spc, num_samples - at)) if self._next >= start else 0
                out.append(CharTiming(self._next, self._text[self._next], chunk_start + at,
                                      max(dur, 0)))
                self._next += 1
        self._span_samples += num_samples
        self._samples += num_samples
        return out

    def finish(self) -> list[CharTiming]:
        """The characters left untimed at the end of the stream, at its end."""
        end = min(self._span[1] if self._span else 0, len(self._text))
        out = [CharTiming(i, self._text[i], self._samples, 0) for i in range(self._next, end)]
        self._next = max(self._next, end)
        return out


def words_of(chars: list[CharTiming], *, pending: list[CharTiming]) -> list[Word]:
    """Words completed by ``chars`` (a word ends at whitespace); ``pending`` holds the
    characters of a word not yet completed across calls (updated in place). Call with
    ``chars=[]`` and a whitespace-terminated flush (see ``flush_words``) at the end."""
    words: list[Word] = []
    for c in chars:
        if c.char.isspace():
            if pending:
                words.append(_word(pending))
                pending.clear()
        else:
            pending.append(c)
    return words


def flush_words(pending: list[CharTiming]) -> list[Word]:
    """The word ``pending`` holds, if any (end of a stream)."""
    if not pending:
        return []
    word = _word(pending)
    pending.clear()
    return [word]


def _word(chars: list[CharTiming]) -> Word:
    last = chars[-1]
    return Word("".join(c.char for c in chars), chars[0].start, last.start + last.duration)


__all__ += ["flush_words"]
