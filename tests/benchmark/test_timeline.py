"""``benchmark.timeline``: the server's figures per interval beside the clients' underruns."""

from __future__ import annotations

import gzip
import json

import pytest

from benchmark.timeline import level_rows, main


def _level() -> dict:
    t0 = 50.0
    # stream a: chunks of 0.1 s every 0.1 s (never dry); stream b: a 0.1 s chunk at 51.0, the
    # next at 51.5 (playback started at 51.0 with 0.1 s buffered: dry at 51.1)
    a = {"t_start": 50.2, "chunk_t": [50.3 + 0.1 * i for i in range(10)], "chunk_samples": [2400] * 10,
         "done_reason": "end"}
    b = {"t_start": 50.9, "chunk_t": [51.0, 51.5, 51.6], "chunk_samples": [2400, 2400, 2400], "done_reason": "end"}
    server = [{"t_s": 1.0, "steps_per_s": 100.0, "ms_per_step": 8.0, "decode_rows_per_step": 64.0,
               "queued_jobs": 0.0},
              {"t_s": 2.0, "steps_per_s": 90.0, "ms_per_step": 11.0, "decode_rows_per_step": 200.0,
               "queued_jobs": 4.0}]
    return {"level": 2, "streams": [a, b], "extra": {"server_timeline": server, "server_timeline_t0": t0}}


def test_level_rows_put_each_underrun_and_start_in_its_interval() -> None:
    rows = level_rows(_level(), sample_rate=24000, start_buffer_s=0.1)
    assert [r["t_s"] for r in rows] == [1.0, 2.0]
    assert [r["started"] for r in rows] == [2, 0]
    assert [r["underruns"] for r in rows] == [0, 1]  # b ran dry at 51.1 s = 1.1 s into the level
    assert rows[1]["ms_per_step"] == 11.0


def test_a_level_without_a_server_timeline_has_no_rows() -> None:
    level = _level()
    del level["extra"]["server_timeline_t0"]
    assert level_rows(level, sample_rate=24000, start_buffer_s=0.1) == []


def test_main_prints_a_level_and_refuses_a_missing_one(tmp_path, capsys) -> None:
    path = tmp_path / "bench.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"target": {"sample_rate": 24000}, "config": {"start_buffer_ms": 100}, "levels": [_level()]}, f)
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "== level 2: 2 streams" in out and "underruns" in out
    assert len(out.strip().splitlines()) == 4
    with pytest.raises(SystemExit):
        main([str(path), "--level", "7"])
    with pytest.raises(SystemExit):
        main([str(tmp_path / "missing.json")])
