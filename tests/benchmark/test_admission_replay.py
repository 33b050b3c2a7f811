"""``benchmark.admission_replay``: a run's per-second server figures through the estimate."""

from __future__ import annotations

import gzip
import json

import pytest

from benchmark.admission_replay import main, replay


def _run() -> dict:
    """A VoxCPM2-like level: demand rising to 60 streams, two jobs each, every job decoding
    (rows = 2 x demand), steps of 34.5 ms + 0.58 ms a row."""
    timeline = []
    for i in range(1, 31):
        demand = min(60, 2 * i)
        rows = 2 * demand
        timeline.append({"t_s": float(i), "steps_per_s": 1.0 / (0.0345 + 0.00058 * rows),
                         "decode_rows_per_step": float(rows), "prefill_tokens_per_step": 0.0,
                         "demand_streams": float(demand), "running_jobs": float(rows), "queued_jobs": 0.0,
                         "capacity_streams": 150.0, "step_per_row_us": 580.0, "prefill_share": 0.0})
    server = {"prefill_steps": 0, "lm_steps": 300}
    return {"levels": [{"level": 64, "extra": {"server": server, "server_timeline": timeline}}]}


def test_the_replay_counts_the_jobs_a_stream_holds() -> None:
    """Two jobs a stream, no fill: the replayed capacity is the N with 6.25 x t(2N) <= 0.9."""
    [rows] = replay(_run(), 6.25, fill_rows=0, single=(1, 0.035, 200)).values()
    last = rows[-1]
    assert last["jobs_per_stream"] == pytest.approx(2.0, rel=0.02)
    assert last["capacity_replayed"] == pytest.approx((0.9 / 6.25 - 0.0345) / 0.00058 / 2, rel=0.05)
    assert last["capacity_reported"] == 150.0
    # the estimate's terms: the server's beside the replay's (a slope of 0.58 ms a row, no prompts)
    assert last["reported"]["step_per_row_us"] == 580.0 and last["reported"]["step_scale"] is None
    assert last["replayed"]["step_per_row_us"] == pytest.approx(580.0, rel=0.05)
    assert last["replayed"]["prefill_share"] == 0.0


def test_main_prints_each_level(tmp_path, capsys) -> None:
    path = tmp_path / "bench.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(_run(), f)
    assert main([str(path), "--tokens-per-s", "6.25", "--fill-rows", "0"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "== level 64" and "replayed" in out[1] and len(out) == 32
    assert out[-1].split("|")[1].split()[1].startswith("580/")  # us a row, reported/replayed
