"""``benchmark.step_fit``: step costs fitted to a bench file's server timeline."""

from __future__ import annotations

import gzip
import json
import random

import pytest

from benchmark.step_fit import fit_step_costs, main


def _timeline(n: int, *, base: float, row: float, token: float, noise: float, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    pts = []
    for i in range(n):
        rows, tokens, busy = rng.uniform(60, 320), rng.uniform(0, 120), rng.uniform(0.92, 1.0)
        ms = (base + row * rows + token * tokens + rng.gauss(0, noise)) / busy
        pts.append({"t_s": i + 1.0, "steps_per_s": 1e3 / ms, "busy_fraction": busy, "ms_per_step": ms,
                    "decode_rows_per_step": rows, "prefill_tokens_per_step": tokens})
    return pts


def test_the_fit_recovers_the_costs_that_made_the_timeline() -> None:
    r = fit_step_costs(_timeline(200, base=4.0, row=0.012, token=0.025, noise=0.05))
    assert r["intervals"] == 200
    assert r["base_ms"] == pytest.approx(4.0, abs=0.1)
    assert r["per_row_ms"] == pytest.approx(0.012, abs=0.001)
    assert r["per_token_ms"] == pytest.approx(0.025, abs=0.002)
    assert r["rms_ms"] < 0.1
    with pytest.raises(ValueError, match="at least 3"):
        fit_step_costs(_timeline(2, base=4.0, row=0.01, token=0.02, noise=0.0))


def test_main_fits_busy_intervals_of_several_files_and_refuses_bad_input(tmp_path, capsys) -> None:
    idle = [dict(p, busy_fraction=0.5, ms_per_step=99.0) for p in _timeline(30, base=1, row=1, token=1, noise=0)]
    paths = []
    for k in range(2):
        path = tmp_path / f"b{k}.json.gz"
        levels = [{"level": 64, "extra": {"server_timeline": _timeline(40, base=4.0, row=0.01, token=0.03,
                                                                       noise=0.0, seed=k) + idle}}]
        with gzip.open(path, "wt") as f:
            json.dump({"levels": levels}, f)
        paths.append(str(path))
    assert main(paths) == 0
    out = capsys.readouterr().out
    assert out.startswith("80 intervals at least 90% busy") and "0.0300 × prompt tokens" in out  # idle ones left out
    with pytest.raises(SystemExit):
        main([str(tmp_path / "missing.json")])
    with pytest.raises(SystemExit):
        main(paths + ["--min-busy", "2"])
