"""benchmark.fuzz_protocol: the long fuzz run's command line and its verdicts."""

from __future__ import annotations

import pytest

from benchmark import fuzz_protocol


def test_a_short_run_reports_no_failure(capsys: pytest.CaptureFixture[str]) -> None:
    """One round of a few examples passes and says how many it ran."""
    assert fuzz_protocol.main(["--seconds", "0", "--round-examples", "20"]) == 0
    assert "1 rounds of 20 examples" in capsys.readouterr().out


def test_a_property_violation_is_reported_as_a_failure(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A session that raises makes the run exit 1 with the error named."""
    def broken(frames: list[bytes | str]) -> None:
        if frames:
            raise RecursionError("boom")

    monkeypatch.setattr(fuzz_protocol, "check_frames", broken)
    assert fuzz_protocol.main(["--seconds", "0", "--round-examples", "50"]) == 1
    assert "FAILED" in capsys.readouterr().out
