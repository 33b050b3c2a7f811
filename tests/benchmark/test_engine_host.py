"""benchmark.engine_host: the host-path harness runs the real LMBackend and reports a row per batch."""

from __future__ import annotations

import pytest

from benchmark import engine_host


def test_engine_host_reports_each_batch(capsys: pytest.CaptureFixture[str]) -> None:
    """Two batch sizes give two table rows with positive times."""
    assert engine_host.main(["--batch", "1,3", "--steps", "10"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()
            if line.split() and line.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == [1, 3]
    assert all(float(r[1]) > 0 for r in rows)


def test_engine_host_rejects_bad_arguments() -> None:
    """A batch size of 0 is refused with a usage error."""
    with pytest.raises(SystemExit):
        engine_host.main(["--batch", "0"])
