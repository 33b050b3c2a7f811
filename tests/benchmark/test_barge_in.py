"""benchmark.barge_in against the real server: streams cancelled while they speak end as
cancelled, and the figures say how long that took and what still arrived."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmark import barge_in


@pytest.mark.slow
def test_streams_cut_while_they_speak_end_cancelled_and_are_timed(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The synthetic model speaks at real time, so every cancel 50-200 ms after the first audio
    lands mid-stream: each such stream ends ``cancelled``, cancel -> done is timed, and the audio
    the engine held for them shows in its counters."""
    out = tmp_path / "b.json"
    assert barge_in.main(["--streams", "4", "--rounds", "2", "--after-ms", "50,200",
                          "--serve-args", "--model synthetic", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["reasons"] == {"cancelled": 8} and r["cut_sent"] == 8 and r["failed"] == 0
    assert 0 < r["cancel_to_done_ms"]["p50"] <= r["cancel_to_done_ms"]["p100"] < 5000
    assert all(c["spoke_s"] > 0 for c in r["cuts"])
    assert r["engine_dropped_cancelled_s"] + r["gateway_dropped_cancelled_s"] > 0
    assert r["model"] == "synthetic" and r["sample_rate"] > 0
    report = capsys.readouterr().out
    assert "cancel -> done: p50" in report and "OK: every stream sent a cancel ended as cancelled, the others had ended" in report


@pytest.mark.parametrize("after", ["x", "300,100", "-5"])
def test_a_bad_window_is_refused(after: str) -> None:
    with pytest.raises(SystemExit) as info:
        barge_in.main(["--after-ms", after, "--url", "ws://127.0.0.1:9/v1/stream"])
    assert info.value.code == 2


def test_a_stream_is_ok_when_cut_or_ended_before_its_cancel() -> None:
    """A cancel sent must end in ``cancelled``; without one, the stream must have ended; a
    timeout or an error is a failure either way."""
    cut = barge_in.Cut
    assert cut("cancelled", 1.0, 0.5, 0.0, True).is_ok and cut("end", 1.0, None, 0.0, False).is_ok
    assert not cut("timeout", 1.0, None, 0.0, True).is_ok and not cut("end", 1.0, 3.0, 0.0, True).is_ok
    assert not cut("error:capacity", 0.0, None, 0.0, False).is_ok
