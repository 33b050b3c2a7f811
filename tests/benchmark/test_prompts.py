"""The shipped prompt set matches what docs/benchmark.md says about it; loading and filtering."""

from __future__ import annotations

import pytest

from benchmark.bench.prompts import filter_prompts, length_summary, load_prompts, word_count


def test_shipped_prompt_set_matches_the_documented_distribution() -> None:
    """62 prompts of 6-80 words, mean 32.3, with the histogram quoted in the docs."""
    summary = length_summary(load_prompts())
    assert summary["prompts"] == 62
    assert (summary["min_words"], summary["max_words"]) == (6, 80)
    assert summary["mean_words"] == 32.3 and summary["median_words"] == 30
    assert summary["with_digits"] == 51
    assert list(summary["histogram_words"].values()) == [7, 10, 12, 14, 9, 4, 2, 3, 1]


def test_prompts_are_unique_and_punctuated() -> None:
    """No duplicates; every prompt ends with sentence punctuation."""
    prompts = load_prompts()
    assert len(set(prompts)) == len(prompts)
    assert all(p[-1] in ".?!\"" for p in prompts)


def test_load_skips_comments_and_blank_lines(tmp_path) -> None:
    """A custom file: comments and blank lines are not prompts; an empty file is an error."""
    f = tmp_path / "p.txt"
    f.write_text("# header\n\nHello there.\n  Second one here.  \n")
    assert load_prompts(f) == ["Hello there.", "Second one here."]
    f.write_text("# only a comment\n")
    with pytest.raises(ValueError):
        load_prompts(f)


def test_filter_by_word_band() -> None:
    """Filtering keeps the band inclusive and refuses an empty result."""
    prompts = load_prompts()
    band = filter_prompts(prompts, min_words=30, max_words=50)
    assert band and all(30 <= word_count(p) <= 50 for p in band)
    with pytest.raises(ValueError, match="no prompt"):
        filter_prompts(prompts, min_words=81)
