"""Incremental tokenization: text pushed in pieces gives exactly the ids of the text at once."""

from __future__ import annotations

import random

import pytest
from tests.models.qwen3_tts.tiny_tokenizer import build

from models.qwen3_tts.prompt import TextStream, TextTokenizer

TEXTS = [
    "Hello world, this is a test.",
    "It's 2026: we're testing 123,456.78 numbers -- don't they'll you've I'm he'd!",
    "Ünïcödé — café, naïve façade; 東京タワー、你好世界。こんにちは! 안녕하세요? Привет мир...",
    "  Leading spaces,   runs   of spaces\tand tabs\nand new\n\nlines?!  ",
    "Emoji 🙂🚀 and symbols #$%&*()[]{} <b>tags</b> e-mail@example.com 3.14159...",
    "Combining marks: e\u0301 a\u0308 n\u0303 (NFC composes them).",
    "'quoted' \"double\" ’curly’ “quotes” and 'S 'T 'LL at starts",
    "x",
]


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    return TextTokenizer(build())


def _streamed(tok: TextTokenizer, pieces: list[str]) -> list[int]:
    s = TextStream(tok)
    ids: list[int] = []
    for p in pieces:
        ids += s.push(p)
    return ids + s.end()


def _words(text: str) -> list[str]:
    """Split keeping every character: each word with the whitespace after it (as an LLM streams)."""
    out, cur = [], ""
    for ch in text:
        if cur and ch.isspace() and not cur[-1].isspace():
            out.append(cur)
            cur = ""
        cur += ch
    return out + ([cur] if cur else [])


@pytest.mark.parametrize("text", TEXTS)
def test_word_by_word_equals_at_once(tok, text):
    """Pushing a word at a time, then end(), yields exactly text_ids(text)."""
    assert _streamed(tok, _words(text)) == tok.text_ids(text)


@pytest.mark.parametrize("text", TEXTS)
def test_char_by_char_equals_at_once(tok, text):
    """The finest split (one character a push) yields exactly text_ids(text)."""
    assert _streamed(tok, list(text)) == tok.text_ids(text)


def test_random_splits_equal_at_once(tok):
    """200 random splits of the texts (joined) yield the at-once ids."""
    rng = random.Random(7)
    whole = " ".join(TEXTS)
    expected = tok.text_ids(whole)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(whole)), rng.randint(1, 40)))
        pieces = [whole[a:b] for a, b in zip([0, *cuts], [*cuts, len(whole)])]
        assert _streamed(tok, pieces) == expected


def test_tokens_are_released_before_end(tok):
    """Completed words come out as they arrive; only the last pre-token is held back."""
    s = TextStream(tok)
    assert s.push("Hello") == []  # may still grow
    first = s.push(" world")
    assert first == tok.text_ids("Hello")
    assert s.push(", again") != []
    s.end()
    with pytest.raises(ValueError):
        s.push("more")
