"""Tests for benchmark.gpu.trace_summary: where the GPU's time went in a Chrome trace."""

from __future__ import annotations

import gzip
import json

import pytest

from benchmark.gpu.trace_summary import format_summary, main, summarise


def _kernel(name: str, ts: float, dur: float, stream: int) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}


TRACE = {"traceEvents": [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 500.0},  # host: not counted
    _kernel("gemm", 0.0, 100.0, 7),
    _kernel("attn", 100.0, 50.0, 7),
    _kernel("codec", 120.0, 60.0, 9),   # overlaps attn on another stream: busy 0-180
    _kernel("gemm", 230.0, 100.0, 7),   # a 50 us gap before it
    _kernel("attn", 335.0, 65.0, 7),    # a 5 us gap: under the threshold
]}


def test_busy_idle_gaps_streams_and_kernels_per_step() -> None:
    s = summarise(TRACE, steps=2, gap_us=20.0)
    assert s["span_us"] == 400.0
    assert s["busy_us"] == 180.0 + 100.0 + 65.0
    assert s["idle_us"] == 55.0
    assert s["gaps"] == {"min_us": 20.0, "count": 1, "total_us": 50.0, "longest_us": 50.0}
    assert s["streams"] == {"7": 315.0, "9": 60.0}
    assert [(k["name"], k["us"], k["calls"]) for k in s["kernels"]] == [("gemm", 200.0, 2), ("attn", 115.0, 2),
                                                                         ("codec", 60.0, 1)]
    text = format_summary(s)
    assert "0.20 ms per step" in text and "GPU busy 0.17 ms (86.2%)" in text
    assert "   0.100        1.0  gemm" in text


def test_a_trace_without_kernels_is_a_clear_error(tmp_path, capsys) -> None:
    with pytest.raises(ValueError, match="no GPU kernels"):
        summarise({"traceEvents": []}, steps=1)
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": TRACE["traceEvents"][:1]}, f)
    assert main([str(path)]) == 2
    assert "no GPU kernels" in capsys.readouterr().err
    path2 = tmp_path / "t.json"
    path2.write_text(json.dumps(TRACE))
    assert main([str(path2), "--steps", "2"]) == 0
    assert "window 0.4 ms over 2 steps" in capsys.readouterr().out
