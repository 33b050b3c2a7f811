"""benchmark.host_parts: times schedule() and the decode inputs per running count; validates its arguments."""

from __future__ import annotations

import pytest

from benchmark import host_parts


def test_host_parts_reports_each_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert host_parts.main(["--running", "4,16", "--calls", "5"]) == 0
    out = capsys.readouterr().out
    lines = [line.split() for line in out.splitlines()[2:]]
    assert [row[0] for row in lines] == ["4", "16"] and all(float(x) > 0 for row in lines for x in row[1:])


def test_host_parts_rejects_bad_arguments() -> None:
    for argv in (["--running", "x"], ["--running", "0"], ["--calls", "0"]):
        with pytest.raises(SystemExit):
            host_parts.main(argv)
