"""``benchmark.gpu.layer_kernels`` on the CPU with the tiny preset: the compiled forms' and the
index_put KV write's timings, each part alone and in the forward, for each row count asked, in
the JSON."""

from __future__ import annotations

import json

import pytest

from benchmark.gpu.layer_kernels import main


def test_it_times_each_row_count_alone_and_in_the_forward(tmp_path, capsys) -> None:
    out = tmp_path / "layer.json"
    assert main(["--device", "cpu", "--preset", "tiny", "--rows", "1,8", "--iters", "2", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["rows"] for r in data["results"]] == [1, 8]
    for r in data["results"]:
        assert r["rope_compiled_ms"] > 0 and r["silu_compiled_ms"] > 0 and r["norm_compiled_ms"] > 0
        assert r["kv_index_ms"] > 0
        assert r["forward_compiled_compiled_compiled_ms"] > r["rope_compiled_ms"]
        assert "rope_triton_ms" not in r and "kv_triton_ms" not in r  # no Triton on the CPU
        assert "forward_triton_triton_triton_ms" not in r and "normq_compiled_ms" not in r
    assert "preset tiny" in capsys.readouterr().out


def test_fp8_is_refused_off_cuda(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--device", "cpu", "--preset", "tiny", "--fp8"])
    assert "--fp8: CUDA only" in capsys.readouterr().err
