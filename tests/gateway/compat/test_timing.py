"""gateway.compat.timing: character and word timings spread over the chunks of each segment."""

from __future__ import annotations

from gateway.compat.timing import Aligner, flush_words, words_of

RATE = 24000


def _run(text: str, segments: list[tuple[int, int, int]], chunk: int = 2400) -> tuple[list, int]:
    """Feed ``segments`` ([start, end) spans with their audio length in samples) in chunks."""
    aligner = Aligner(RATE)
    aligner.set_text(text)
    chars = []
    total = 0
    for start, end, samples in segments:
        for offset in range(0, samples, chunk):
            n = min(chunk, samples - offset)
            chars += aligner.on_chunk((start, end), n)
            total += n
    return chars + aligner.finish(), total


def test_every_character_once_in_order_spaces_between_segments_included() -> None:
    """The timed characters, in order, are the stream's text; times never go back and stay inside the audio."""
    text = "Hello there, friend. How are you today?"
    chars, total = _run(text, [(0, 20, 24000), (21, len(text), 30000)])
    assert "".join(c.char for c in chars) == text
    assert [c.index for c in chars] == list(range(len(text)))
    starts = [c.start for c in chars]
    assert starts == sorted(starts) and all(0 <= c.start <= total for c in chars)
    assert all(c.start + c.duration <= total for c in chars)


def test_a_segment_spoken_faster_than_estimated_leaves_nothing_untimed() -> None:
    """Characters a short segment did not reach are timed at the next chunk (or the end), none lost."""
    text = "A very long sentence spoken in very little audio. Next."
    chars, total = _run(text, [(0, 49, 4800), (50, len(text), 9600)])
    assert "".join(c.char for c in chars) == text


def test_words_group_characters_at_whitespace() -> None:
    """words_of ends a word at whitespace (across calls); flush_words returns the last one."""
    text = "Hello there friend"
    chars, _ = _run(text, [(0, len(text), 48000)])
    pending: list = []
    words = words_of(chars[:8], pending=pending) + words_of(chars[8:], pending=pending)
    words += flush_words(pending)
    assert [w.text for w in words] == ["Hello", "there", "friend"]
    assert all(w.start <= w.end for w in words)
    assert [w.start for w in words] == sorted(w.start for w in words)
