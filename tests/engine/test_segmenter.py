"""Tests for engine.segmenter: incremental text -> speakable segments."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.segmenter import Segment, Segmenter

TEXT = (
    "Hello there. How are you today, my friend? I am fine, thanks for asking; the weather is "
    "lovely here in the U.S. this week. Dr. Smith paid $5.99 for 1,000 apples at 10:30 a.m. "
    "on Monday... It was 3.14 exactly! \"Really?\" she asked. Yes — really, e.g. apples."
)


def segments_of(chunks: list[str], **config: int) -> list[Segment]:
    seg = Segmenter(**config)
    out: list[Segment] = []
    for chunk in chunks:
        out += seg.push(chunk)
    out += seg.end()
    return out


def texts(segments: list[Segment]) -> list[str]:
    return [s.text for s in segments]


def split_at(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted(set(c % (len(text) + 1) for c in cuts)), len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


# Text drawn from words, numbers and punctuation, with varied whitespace between tokens.
_TOKEN = st.sampled_from(
    ["the", "weather", "is", "nice", "Mr.", "Dr.", "e.g.", "U.S.", "J.", "1,000", "3.14", "10:30",
     "$5.99", "today.", "park!", "why?", "well,", "so;", "note:", "—", "-", "wait...", "\"yes.\"",
     "(really)", "supercalifragilisticexpialidocious", "A", "b", "…", "x.y"]
)
_SPACE = st.sampled_from([" ", " ", " ", "  ", "\n", " \n\n", "\t"])
_TEXTS = st.lists(st.tuples(_TOKEN, _SPACE), max_size=80).map(
    lambda pairs: "".join(t + s for t, s in pairs)
)
_CONFIGS = st.fixed_dictionaries(
    {
        "first_segment_min_chars": st.integers(1, 30),
        "min_segment_chars": st.integers(1, 60),
        "max_segment_chars": st.integers(60, 120),
    }
)


@settings(max_examples=300, deadline=None)
@given(text=_TEXTS, cuts=st.lists(st.integers(0, 10_000), max_size=40), config=_CONFIGS)
def test_segmentation_is_independent_of_chunking(text: str, cuts: list[int], config: dict) -> None:
    """Any chunking of the same text (push + end only) gives exactly the same segments."""
    whole = segments_of([text], **config)
    assert segments_of(split_at(text, cuts), **config) == whole
    assert segments_of(list(text), **config) == whole


@settings(max_examples=300, deadline=None)
@given(text=_TEXTS, cuts=st.lists(st.integers(0, 10_000), max_size=40), config=_CONFIGS)
def test_segments_cover_the_words_in_order_and_never_split_one(
    text: str, cuts: list[int], config: dict
) -> None:
    """Segment words concatenated are exactly the input's words; offsets index the input."""
    segments = segments_of(split_at(text, cuts), **config)
    assert [w for s in segments for w in s.text.split()] == text.split()
    previous_end = 0
    for s in segments:
        assert s.text and s.text == s.text.strip()
        assert text[s.start : s.end] == s.text
        assert previous_end <= s.start < s.end
        assert text[previous_end : s.start].strip() == ""
        previous_end = s.end
    assert text[previous_end:].strip() == ""


@settings(max_examples=300, deadline=None)
@given(text=_TEXTS, config=_CONFIGS)
def test_segments_stay_under_the_max_unless_one_word(text: str, config: dict) -> None:
    """A segment longer than max_segment_chars is a single word that could not be cut."""
    for s in segments_of([text], **config):
        if len(s.text) > config["max_segment_chars"]:
            assert len(s.text.split()) == 1


@settings(max_examples=200, deadline=None)
@given(text=_TEXTS, flush_points=st.lists(st.integers(0, 10_000), max_size=5))
def test_flush_speaks_everything_buffered(text: str, flush_points: list[int]) -> None:
    """After flush nothing is pending, and all non-space text is spoken exactly once."""
    seg = Segmenter()
    out: list[Segment] = []
    for chunk in split_at(text, flush_points):
        out += seg.push(chunk)
        out += seg.flush()
        assert seg.pending_chars == 0
    out += seg.end()
    assert "".join("".join(s.text.split()) for s in out) == "".join(text.split())
    for s in out:
        assert text[s.start : s.end] == s.text


def test_sentence_boundaries_cut() -> None:
    """Each sentence ending in . ! ? becomes its own segment."""
    got = texts(segments_of(["Hello there. How are you? I am fine! Good."]))
    assert got == ["Hello there.", "How are you?", "I am fine!", "Good."]


def test_first_segment_is_short() -> None:
    """The first segment ends at the first word boundary past first_segment_min_chars."""
    got = texts(segments_of(["The weather is nice today and we are going to the park."]))
    assert got == ["The weather is nice today", "and we are going to the park."]


def test_first_segment_ends_at_first_clause() -> None:
    """A clause boundary ends the first segment even when it is short."""
    got = texts(segments_of(["Well, the weather is nice today and we are going to the park."]))
    assert got[0] == "Well,"


def test_clause_cut_only_when_long_enough() -> None:
    """After the first segment, a comma cuts only once min_segment_chars are pending."""
    text = "Okay. Yes, it is, and then we walked along the quiet river for a long while, slowly home."
    got = texts(segments_of([text], min_segment_chars=40))
    assert got == [
        "Okay.",
        "Yes, it is, and then we walked along the quiet river for a long while,",
        "slowly home.",
    ]


def test_numbers_are_never_cut() -> None:
    """Commas, periods and colons inside numbers are not boundaries."""
    text = "Pay 1,000 dollars, or $5.99, at 10:30, version 3.14, then go home now."
    got = texts(segments_of(list(text), first_segment_min_chars=1, min_segment_chars=1))
    assert got == ["Pay", "1,000 dollars,", "or $5.99,", "at 10:30,", "version 3.14,", "then go home now."]


def test_abbreviations_do_not_end_sentences() -> None:
    """Mr., Dr., e.g., U.S. and initials do not end a sentence."""
    text = "I met Mr. Smith and Dr. J. Jones e.g. from the U.S. Army today. Then we left."
    got = texts(segments_of([text], first_segment_min_chars=200, max_segment_chars=200))
    assert got == ["I met Mr. Smith and Dr. J. Jones e.g. from the U.S. Army today.", "Then we left."]


def test_period_before_lowercase_is_not_a_sentence_end() -> None:
    """'approx. five' continues the sentence."""
    seg = Segmenter(first_segment_min_chars=200)
    assert seg.push("It weighs approx. five kilos. ") == []
    assert texts(seg.push("Next")) == ["It weighs approx. five kilos."]


def test_boundary_waits_for_following_whitespace() -> None:
    """A comma or question mark is not a boundary until the whitespace after it arrives."""
    seg = Segmenter()
    assert seg.push("Hi,") == []
    assert texts(seg.push(" there")) == ["Hi,"]
    assert seg.push(" friend?") == []
    assert texts(seg.push(" ")) == ["there friend?"]


def test_token_by_token_input() -> None:
    """LLM-style tokens that split words produce whole-word segments."""
    tokens = ["Hel", "lo", " wor", "ld", ".", " How", " are", " yo", "u", " do", "ing", "?"]
    got = texts(segments_of(tokens))
    assert got == ["Hello world.", "How are you doing?"]


def test_long_text_without_punctuation_cut_at_whitespace() -> None:
    """With no punctuation, segments are cut at the last whitespace before the max."""
    words = [f"w{i:03d}" for i in range(200)]
    segments = segments_of([" ".join(words)], max_segment_chars=60)
    assert all(len(s.text) <= 60 for s in segments)
    assert [w for s in segments for w in s.text.split()] == words
    assert len(segments[1].text) > 50  # later segments fill up to the max


def test_long_word_is_not_split() -> None:
    """A word longer than the max is emitted whole once it ends."""
    seg = Segmenter(max_segment_chars=20, first_segment_min_chars=5, min_segment_chars=5)
    word = "x" * 50
    assert seg.push(word) == []
    assert texts(seg.push(" tail")) == [word]


def test_flush_emits_partial_text_and_rearms_first_segment() -> None:
    """flush speaks a partial sentence; the next segment is short again."""
    seg = Segmenter(first_segment_min_chars=15)
    assert seg.push("This is only a") == []
    flushed = seg.flush()
    assert texts(flushed) == ["This is only a"]
    assert (flushed[0].start, flushed[0].end) == (0, 14)
    assert texts(seg.push(" partial thought that goes on ")) == ["partial thought"]


def test_flush_and_end_of_whitespace_emit_nothing() -> None:
    """Whitespace-only buffers never become segments."""
    seg = Segmenter()
    assert seg.push("   \n ") == []
    assert seg.flush() == []
    assert seg.push("  ") == []
    assert seg.end() == []


def test_end_is_idempotent_and_push_after_end_raises() -> None:
    """end returns the rest once; pushing afterwards is an error."""
    seg = Segmenter()
    seg.push("Good night")
    assert texts(seg.end()) == ["Good night"]
    assert seg.end() == []
    with pytest.raises(ValueError):
        seg.push("more")


def test_offsets_continue_across_segments() -> None:
    """Offsets index the stream's whole text, including leading whitespace."""
    segments = segments_of(["  Hi. ", " Bye now."])
    assert [(s.start, s.end) for s in segments] == [(2, 5), (7, 15)]


def test_pending_chars_counts_unspoken_text() -> None:
    """pending_chars counts buffered text, without leading whitespace."""
    seg = Segmenter()
    seg.push("  abc")
    assert seg.pending_chars == 3


def test_newline_ends_a_segment() -> None:
    """A line break after a word is a sentence boundary (headings, lists)."""
    got = texts(segments_of(["Shopping list\nmilk and eggs"]))
    assert got == ["Shopping list", "milk and eggs"]


@pytest.mark.parametrize(
    "config",
    [
        {"first_segment_min_chars": 0},
        {"min_segment_chars": -1},
        {"max_segment_chars": 10, "min_segment_chars": 20},
        {"max_segment_chars": 10, "first_segment_min_chars": 20},
        {"max_segment_chars": 1.5},
        {"min_segment_chars": True},
    ],
)
def test_invalid_config_raises(config: dict) -> None:
    """Bad sizes raise ValueError naming the field."""
    with pytest.raises(ValueError, match="_chars"):
        Segmenter(**config)
