"""``benchmark.gpu.cross_attention`` on the CPU: the three forms of the voice cross-attention
agree with float32 and are timed at each row count."""

from __future__ import annotations

import json

from benchmark.gpu.cross_attention import main


def test_the_three_forms_agree_and_are_timed(tmp_path) -> None:
    out = tmp_path / "x.json"
    assert main(["--device", "cpu", "--rows", "1,3", "--heads", "2", "--head-dim", "8", "--voices", "3",
                 "--positions", "5", "--iters", "2", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["rows"] for r in rows] == [1, 3]
    for r in rows:
        for way in ("explicit", "sdpa3", "sdpa4"):
            assert r[f"{way}_us"] > 0 and r[f"{way}_err"] < 1e-5
