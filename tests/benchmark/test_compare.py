"""``benchmark.compare``: bench runs side by side per level, with ratios to the first run."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from benchmark.compare import compare_lines, main


def _run(capacity: int | None, levels: dict[int, float], *, lower_bound: bool = False) -> dict:
    return {"commit": "abc", "capacity": capacity, "capacity_is_lower_bound": lower_bound,
            "levels": [{"level": level, "num_streams": level, "on_time_fraction": 1.0,
                        "ttfa_ms": {"p50": 120.0, "p90": 180.0},
                        "goodput_audio_s_per_s": goodput, "num_refused": 0}
                       for level, goodput in levels.items()]}


def test_levels_in_every_run_are_compared_with_the_first() -> None:
    """Each shared level has a row per run with its goodput over the baseline's; a level only
    one run tried is named, not compared; capacities carry their ratio."""
    lines = compare_lines([("one", _run(448, {256: 200.0, 448: 350.0})),
                           ("two", _run(896, {256: 201.0, 448: 352.0, 896: 700.0},
                                        lower_bound=True))])
    rows = [line.split() for line in lines[1:5]]
    assert [(r[0], r[1]) for r in rows] == [("256", "one"), ("256", "two"), ("448", "one"),
                                            ("448", "two")]
    assert rows[1][7] == "1.00" and rows[3][7] == "1.01"  # 201/200 and 352/350, rounded
    assert lines[5] == "levels not in every run (left out): 896"
    assert lines[6].startswith("capacity one: 448, x base 1.00")
    assert lines[7].startswith("capacity two: 896 (the highest level tried: a lower bound), x base 2.00")


def test_main_reads_gzipped_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """NAME=PATH arguments, .gz or not, print the table; a run without a capacity says so."""
    a, b = tmp_path / "a.json.gz", tmp_path / "b.json"
    with gzip.open(a, "wt") as f:
        json.dump(_run(None, {1: 1.0}), f)
    b.write_text(json.dumps(_run(1, {1: 1.0})))
    assert main([f"default={a}", f"gpus0={b}"]) == 0
    out = capsys.readouterr().out
    assert "capacity default: none met the target" in out and "capacity gpus0: 1" in out


def test_an_argument_without_a_name_is_a_usage_error() -> None:
    """A bare path (no NAME=) is refused by argparse (exit 2)."""
    with pytest.raises(SystemExit) as exc:
        main(["bench.json"])
    assert exc.value.code == 2
