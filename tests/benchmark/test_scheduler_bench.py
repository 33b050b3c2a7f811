"""benchmark.scheduler_bench: times schedule() per running count and validates its arguments."""

from __future__ import annotations

import pytest

from benchmark import scheduler_bench


def test_scheduler_bench_reports_each_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert scheduler_bench.main(["--running", "4,16", "--calls", "5"]) == 0
    out = capsys.readouterr().out
    assert "4 running:" in out and "16 running:" in out


def test_scheduler_bench_rejects_bad_arguments() -> None:
    for argv in (["--running", "x"], ["--running", "0"], ["--calls", "0"]):
        with pytest.raises(SystemExit):
            scheduler_bench.main(argv)
