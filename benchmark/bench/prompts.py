"""The benchmark's prompt set: loading, filtering by length, and its length distribution
(``python -m benchmark.bench.prompts`` prints the one in docs/benchmark.md)."""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

__all__ = ["DEFAULT_PROMPTS", "load_prompts", "filter_prompts", "word_count", "length_summary"]

DEFAULT_PROMPTS = "prompts.txt"


def load_prompts(path: str | Path | None = None) -> list[str]:
    """Prompts from a text file (one per line; blank lines and '#' comments skipped).

    ``None`` loads the project's prompt set shipped with this package.
    """
    if path is None:
        text = resources.files(__package__).joinpath(DEFAULT_PROMPTS).read_text(encoding="utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    prompts = [line.strip() for line in text.splitlines()]
    prompts = [p for p in prompts if p and not p.startswith("#")]
    if not prompts:
        raise ValueError(f"no prompts in {path or DEFAULT_PROMPTS}")
    return prompts


def word_count(text: str) -> int:
    return len(text.split())


def filter_prompts(prompts: list[str], *, min_words: int = 0,
                   max_words: int | None = None) -> list[str]:
    """Prompts whose word count lies in ``[min_words, max_words]``; ValueError if none do."""
    kept = [p for p in prompts
            if word_count(p) >= min_words and (max_words is None or word_count(p) <= max_words)]
    if not kept:
        raise ValueError(
            f"no prompt has between {min_words} and {max_words if max_words is not None else 'any'}"
            f" words (the set has {min(map(word_count, prompts))}-"
            f"{max(map(word_count, prompts))})")
    return kept


def length_summary(prompts: list[str]) -> dict[str, object]:
    """Count, word-count range, mean, median and a histogram in 10-word bins."""
    counts = sorted(word_count(p) for p in prompts)
    n = len(counts)
    median = counts[n // 2] if n % 2 else (counts[n // 2 - 1] + counts[n // 2]) / 2
    bins: dict[str, int] = {}
    for lo in range(0, max(counts) + 1, 10):
        label = f"{max(lo, 1)}-{lo + 9}"
        bins[label] = sum(lo <= c <= lo + 9 for c in counts)
    return {"prompts": n, "min_words": counts[0], "max_words": counts[-1],
            "mean_words": round(sum(counts) / n, 1), "median_words": median,
            "chars_mean": round(sum(len(p) for p in prompts) / n, 1),
            "with_digits": sum(any(ch.isdigit() for ch in p) for p in prompts),
            "histogram_words": bins}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    summary = length_summary(load_prompts(args[0] if args else None))
    for key, value in summary.items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
