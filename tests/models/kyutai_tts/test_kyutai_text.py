"""Text -> entries: streamed text in any pieces gives the entries of the whole text; long words
are split, never dropped; text the tokenizer cannot write is refused."""

from __future__ import annotations

import random

import pytest

from models.kyutai_tts.loader import HashTokenizer
from models.kyutai_tts.machine import MAIN
from models.kyutai_tts.text import EntryStream, script_to_entries

TEXTS = [
    "Hello world, this is a test: of (streamed) text.",
    'Pause <break time="0.5s"/> here, then go on<break time="1s"/>again.',
    "  leading and trailing spaces   ",
    "it’s <b>not</b> a break tag, < nor this >",
]


def _pieces(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_pieces_give_the_whole_texts_entries(text):
    """Any split of a text into pushes (break tags and words cut anywhere) gives the same entries."""
    tok = HashTokenizer(8000)
    whole = script_to_entries(tok, text)
    rng = random.Random(len(text))
    for _ in range(20):
        s = EntryStream(tok)
        got = []
        for piece in _pieces(text, rng):
            got += s.push(piece)
        got += s.end()
        assert got == whole


def test_entries_are_released_when_a_word_is_complete():
    """A word is released once whitespace follows it; the rest at end; the first word carries the
    main-speaker token and every word padding_between + len - 1 forced pads."""
    tok = HashTokenizer(8000)
    s = EntryStream(tok)
    assert s.push("Hello wor") != [] and len(s.push("ld")) == 0
    first = script_to_entries(tok, "Hello")[0]
    assert first.tokens[0] == MAIN and first.padding == len(first.tokens)
    rest = s.end()
    assert [e.text for e in rest] == ["world"]


def test_break_becomes_a_pause_entry():
    """<break time="0.4s"/> is a token-less entry of round(0.4 * 12.5) = 5 pad frames."""
    entries = script_to_entries(HashTokenizer(8000), 'a <break time="0.4s"/> b')
    assert [(bool(e.tokens), e.padding) for e in entries][1] == (False, 5)


def test_long_word_is_split_not_dropped():
    """A word of more tokens than the device machine takes becomes several entries, all tokens kept."""
    tok = HashTokenizer(8000)
    word = "x" * (4 * 70)  # 70 hash pieces
    entries = script_to_entries(tok, word, max_word_tokens=32)
    assert [len(e.tokens) for e in entries] == [32, 32, 7]
    assert sum((list(e.tokens) for e in entries), []) == [MAIN] + tok.encode(word)


def test_unknown_script_is_refused(tts_ckpt):
    """A word the tokenizer can only write as <unk> (another script) is a ValueError; a word with
    one unknown character is kept, as the reference keeps it."""
    from tests.models.kyutai_tts.kyutai_fixtures import load_ours

    tok = load_ours(tts_ckpt).tokenizer
    with pytest.raises(ValueError, match="unsupported"):
        script_to_entries(tok, "hello 你好世界")
    assert any(0 in e.tokens for e in script_to_entries(tok, "naïve"))
