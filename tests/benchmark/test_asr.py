"""Tests for benchmark.asr: word error rate, resampling, and pocketsphinx on hibari speech."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmark.asr import (
    INTELLIGIBILITY_SENTENCES,
    normalize_words,
    resample,
    transcribe,
    word_error_rate,
)


def reference_edit_distance(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    """Textbook recursive Levenshtein distance, as an independent reference."""

    @functools.lru_cache(maxsize=None)
    def d(i: int, j: int) -> int:
        if i == 0 or j == 0:
            return i + j
        return min(d(i - 1, j) + 1, d(i, j - 1) + 1, d(i - 1, j - 1) + (a[i - 1] != b[j - 1]))

    return d(len(a), len(b))


@pytest.mark.parametrize(
    ("reference", "hypothesis", "expected"),
    [
        ("the cat sat down", "the cat sat down", 0.0),
        ("the cat sat down", "the dog sat down", 0.25),  # one substitution
        ("the cat sat down", "the cat sat", 0.25),  # one deletion
        ("the cat sat down", "the cat sat right down", 0.25),  # one insertion
        ("the cat sat down", "", 1.0),
        ("a b", "c d e f", 2.0),  # can exceed 1 with insertions
        ("", "", 0.0),
        ("", "noise", 1.0),
        ("Hello, World!", "hello world", 0.0),  # case and punctuation ignored
        ("We are going to the park.", "we're going to the park", 0.0),  # contractions
    ],
)
def test_word_error_rate_on_known_strings(reference: str, hypothesis: str, expected: float) -> None:
    """WER = edits / reference words on normalised words."""
    assert word_error_rate(reference, hypothesis) == pytest.approx(expected)


@given(
    st.lists(st.sampled_from("abcd"), max_size=8),
    st.lists(st.sampled_from("abcd"), max_size=8),
)
def test_word_error_rate_matches_reference_levenshtein(ref: list[str], hyp: list[str]) -> None:
    """On word lists, WER equals a textbook edit distance divided by the reference length."""
    expected = reference_edit_distance(tuple(ref), tuple(hyp)) / len(ref) if ref else float(bool(hyp))
    assert word_error_rate(ref, hyp) == pytest.approx(expected)


def test_normalize_words() -> None:
    """Lowercase, punctuation dropped, apostrophes inside words kept, contractions expanded."""
    assert normalize_words("It's  O'Brien's — car, isn't it?") == ["it", "is", "o'brien's", "car", "is", "not", "it"]


def test_resample_matches_scipy() -> None:
    """24 kHz -> 16 kHz agrees with scipy's polyphase resampler away from the edges."""
    signal = pytest.importorskip("scipy.signal")
    rng = np.random.default_rng(0)
    x = rng.standard_normal(24_000).astype(np.float32)
    ours = resample(x, 24_000, 16_000)
    theirs = signal.resample_poly(x.astype(np.float64), 2, 3)
    assert ours.dtype == np.float32 and ours.size == theirs.size == 16_000
    inner = slice(200, -200)
    rel = np.linalg.norm(ours[inner] - theirs[inner]) / np.linalg.norm(theirs[inner])
    assert rel < 0.02


def test_resample_keeps_a_low_tone_and_removes_an_alias() -> None:
    """A 1 kHz tone survives unchanged; a 10 kHz tone (above the new Nyquist) is removed."""
    t = np.arange(24_000) / 24_000
    low = resample(np.sin(2 * np.pi * 1000 * t), 24_000, 16_000)
    expected = np.sin(2 * np.pi * 1000 * np.arange(16_000) / 16_000)
    assert np.abs(low[100:-100] - expected[100:-100]).max() < 0.01
    high = resample(np.sin(2 * np.pi * 10_000 * t), 24_000, 16_000)
    assert np.sqrt(np.mean(high[100:-100] ** 2)) < 0.01


def test_resample_rejects_bad_rates() -> None:
    """Non-positive sample rates raise ValueError."""
    with pytest.raises(ValueError):
        resample(np.zeros(10), 0, 16_000)


def test_transcribe_silence_is_empty() -> None:
    """Silence and empty audio give no words."""
    assert transcribe(np.zeros(0, np.float32), 24_000) == ""
    assert normalize_words(transcribe(np.zeros(24_000, np.float32), 24_000)) == []


@pytest.fixture(scope="module")
def hibari_speak():
    from models.hibari import HibariBackend

    backend = HibariBackend()

    def speak(segments: list[str], seed: int = 0) -> np.ndarray:
        parts = []
        for job_id, text in enumerate(segments):
            backend.add_job(job_id, text, "heart", {"speed": 1.0, "seed": seed})
            while backend.has_work():
                parts += [o.pcm for o in backend.step() if o.pcm is not None]
        return np.concatenate(parts)

    return speak


@pytest.mark.parametrize("sentence", INTELLIGIBILITY_SENTENCES[:3])
def test_hibari_sentence_is_intelligible(hibari_speak, sentence: str) -> None:
    """pocketsphinx understands hibari speaking a listed sentence (WER <= 0.25)."""
    assert word_error_rate(sentence, transcribe(hibari_speak([sentence]), 24_000)) <= 0.25


def test_hibari_segmented_stream_is_intelligible(hibari_speak) -> None:
    """Sentences pushed word by word through the segmenter, spoken per segment, stay intelligible."""
    from engine.segmenter import Segmenter

    text = " ".join(INTELLIGIBILITY_SENTENCES[-4:])
    segmenter = Segmenter(first_segment_min_chars=12)
    segments = []
    for word in text.split(" "):
        segments += [s.text for s in segmenter.push(word + " ")]
    segments += [s.text for s in segmenter.end()]
    assert len(segments) >= 4
    assert word_error_rate(text, transcribe(hibari_speak(segments), 24_000)) <= 0.25
