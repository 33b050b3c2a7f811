"""``benchmark.prompt_tokens``: Orpheus prompt lengths of the benchmark's segments."""

from __future__ import annotations

import pytest

from benchmark.prompt_tokens import main, segment_prompt_lengths


def test_lengths_per_segment_with_pieces_and_with_bytes() -> None:
    """The engine cuts "Hello there, this is a test." after the comma; each segment's prompt is
    the layout (6 ids with BOS) plus one id per piece of "tara: Hello there," (5) and "tara: this
    is a test." (7), or one per byte (18 and 21)."""
    r = segment_prompt_lengths(["Hello there, this is a test."])
    assert r["segments"] == 2 and r["pieces"] == [6 + 5, 6 + 7] and r["bytes"] == [6 + 18, 6 + 21]


def test_main_prints_both_tokenizers_for_the_prompt_set(capsys) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    piece = next(line for line in out.splitlines() if line.startswith("PieceTokenizer")).split()
    byte = next(line for line in out.splitlines() if line.startswith("bytes")).split()
    assert 2.5 * float(piece[1]) < float(byte[-4])  # mean ids: bytes about three times longer
    with pytest.raises(SystemExit):
        main(["--min-words", "400"])
