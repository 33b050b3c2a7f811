"""``benchmark.sched_sim``: the engine's scheduling on a modelled GPU (virtual clock)."""

from __future__ import annotations

import pytest

from benchmark.sched_sim import StepModel, main, simulate


def test_a_light_load_on_a_fast_model_is_on_time_and_a_slow_model_is_not() -> None:
    """8 streams: with the fitted step model every stream is on time and first audio comes in
    tens of ms (a frame of 7 steps plus the prompt); with steps of 40 ms per row (far below
    real time) streams underrun and first audio is late."""
    fast = simulate(8, ramp_s=0.5, duration_s=1.0, model=StepModel(), max_tokens=70)
    assert fast["streams"] >= 8 and fast["on_time"] == 1.0
    assert 20 < fast["ttfa_p50_ms"] < 200
    assert fast["timeline"] and all(p["ms_per_step"] > 0 for p in fast["timeline"])
    slow = simulate(8, ramp_s=0.5, duration_s=1.0, model=StepModel(decode_row_ms=40.0), max_tokens=70)
    assert slow["on_time"] < 0.5 and slow["ttfa_p50_ms"] > fast["ttfa_p50_ms"]


def test_mixed_graphs_take_the_prefill_pass_out_of_a_step_with_decode_rows() -> None:
    m = StepModel(decode_ms=3.0, decode_row_ms=0.01, prefill_pass_ms=5.0, prompt_token_ms=0.01, prompt_ms=1.0)
    assert m.step_ms(100, 0, mixed=False) == pytest.approx(4.0)
    assert m.step_ms(100, 100, mixed=False, prompts=2) == pytest.approx(4.0 + 1.0 + 2.0 + 5.0)
    assert m.step_ms(100, 100, mixed=True, prompts=2) == pytest.approx(4.0 + 1.0 + 2.0)
    assert m.step_ms(0, 100, mixed=True, prompts=2) == pytest.approx(1.0 + 2.0 + 5.0)  # prompts alone: a pass


def test_main_prints_a_row_per_level_and_refuses_bad_arguments(capsys) -> None:
    assert main(["-c", "4", "--ramp", "0.2", "--duration", "0.5", "--max-tokens", "70"]) == 0
    out = capsys.readouterr().out
    assert "an estimate, not a measurement" in out and len(out.strip().splitlines()) == 3
    with pytest.raises(SystemExit):
        main(["-c", "0"])
    assert main(["-c", "4", "--ramp", "0.2", "--duration", "0.5", "--max-tokens", "70", "--decode-ms", "4.26",
                 "--decode-row-ms", "0.0141", "--prompt-token-ms", "0.0274", "--prompt-ms", "0"]) == 0
    assert ("StepModel(decode_ms=4.26, decode_row_ms=0.0141, prefill_pass_ms=2.0, prompt_token_ms=0.0274, "
            "prompt_ms=0.0)") in capsys.readouterr().out  # a model fitted elsewhere (benchmark.step_fit)
    with pytest.raises(SystemExit):
        main(["--decode-row-ms", "-1"])


def test_the_fill_and_the_horizon_reach_the_scheduler() -> None:
    """16 streams (about 32 jobs, each stream's head and its segment ahead): with a fill of 64
    every job decodes every step; with a fill of 1 only the due ones, fewer rows a step; with the
    horizon off (0) every job decodes again. Holding undue prompts runs and keeps a light load on
    time (its steps rarely reach the fill)."""
    kw = dict(ramp_s=0.2, duration_s=1.0, model=StepModel(), max_tokens=140)
    full = simulate(16, fill=64, **kw)
    lean = simulate(16, fill=1, **kw)
    no_horizon = simulate(16, fill=1, horizon_s=0.0, **kw)
    assert lean["decode_rows_per_step"] < 0.8 * full["decode_rows_per_step"]
    assert no_horizon["decode_rows_per_step"] > 1.2 * lean["decode_rows_per_step"]
    held = simulate(16, hold_undue_prompts=True, **kw)
    assert held["on_time"] == 1.0
