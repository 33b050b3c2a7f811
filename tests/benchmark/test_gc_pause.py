"""``benchmark.gc_pause`` on the synthetic engine: both lines, and the heap frozen between them."""

from __future__ import annotations

import gc

import pytest

from benchmark.gc_pause import main


def test_gc_pause_times_collections_before_and_after_the_freeze(capsys) -> None:
    try:
        assert main(["--model", "synthetic", "--runs", "2"]) == 0
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[1].startswith("as loaded") and "(2 runs)" in lines[1]
    assert lines[2].startswith("start-up heap frozen") and "frozen" in lines[2]


def test_gc_pause_refuses_zero_runs() -> None:
    with pytest.raises(SystemExit):
        main(["--runs", "0"])
