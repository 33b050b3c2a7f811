"""``benchmark.qwen3_sim``: the engine's scheduler, steps asynchronous, on a modelled GPU. A light
load keeps every stream on time with its first audio a few steps after its start; past the
modelled throughput streams underrun, and cheaper rows bring them back."""

from __future__ import annotations

from benchmark.qwen3_sim import FrameSteps, main, simulate


def test_a_light_load_starts_every_stream_within_a_few_steps_and_keeps_it() -> None:
    r = simulate(32, duration_s=3.0, ramp_s=1.0)
    assert len(r.ttfa_ms) >= 32 and r.underrun_streams == 0
    # a queued step, its own and the next before its audio leaves: 3 steps of ~10 ms and more
    assert 20 < r.pct(0.5) < 80


def test_past_the_throughput_streams_underrun_and_cheaper_rows_bring_them_back() -> None:
    full = simulate(1024, duration_s=25.0)
    cheap = simulate(1024, duration_s=25.0, model=FrameSteps(row_cost=0.75))
    assert full.underrun_streams > 100 and full.max_step_ms > 85
    assert cheap.underrun_streams == 0 and cheap.pct(0.9) < full.pct(0.9)


def test_main_prints_a_row_per_setting(capsys) -> None:
    assert main(["--streams", "16", "--fill", "128,256", "--row-cost", "1,0.9", "--duration-s", "2", "--ramp-s", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("16 ")]
    assert len(rows) == 4
