"""``benchmark.light_steps_sim``: the engine's scheduler on a modelled GPU. With light steps a
stream's first audio comes sooner at load and no stream underruns; without, none is light."""

from __future__ import annotations

from benchmark.light_steps_sim import main, simulate


def test_light_steps_bring_first_audio_sooner_on_the_modelled_gpu_and_keep_every_stream() -> None:
    off, on = simulate(128, 0, duration_s=8.0, ramp_s=5.0), simulate(128, 4, duration_s=8.0, ramp_s=5.0)
    assert off.light == 0 and on.light > on.steps // 4
    assert min(len(on.ttfa_ms), len(off.ttfa_ms)) >= 128  # every stream started spoke
    assert on.pct(0.9) < 0.85 * off.pct(0.9)
    assert off.underrun_streams == on.underrun_streams == 0


def test_main_prints_a_row_per_setting(capsys) -> None:
    assert main(["--streams", "16", "--light", "0,4"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("16")]
    assert len(rows) == 2


def test_main_takes_fills_and_the_parts_of_a_commit(capsys) -> None:
    """A row per (fill, light steps), and the step model of the parts measured at `e307713`
    (the Triton kernels): its steps are shorter than the default model's at every batch."""
    from benchmark.light_steps_sim import PARTS

    assert main(["--streams", "16", "--light", "0,4", "--fill", "16,32", "--parts", "e307713"]) == 0
    out = capsys.readouterr().out
    assert "`e307713`" in out
    assert len([line for line in out.splitlines() if line.strip().startswith("16 ")]) == 4
    for rows in (1, 64, 128, 256):
        assert PARTS["e307713"].full_ms(rows) < PARTS["45808a2"].full_ms(rows)


def test_main_takes_slacks_and_light_rows(capsys) -> None:
    """A row per (slack, light rows); a cap of one light row a step keeps a burst of new turns
    in whole steps longer than a cap of 16 does."""
    assert main(["--streams", "16", "--light", "4", "--light-slack-s", "0.05,0.1", "--light-rows", "1,16"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("16 ")]
    assert [(r[3], r[4]) for r in rows] == [("0.05", "1"), ("0.05", "16"), ("0.10", "1"), ("0.10", "16")]
    one, many = (simulate(64, 4, duration_s=4.0, ramp_s=1.0, light_rows=n) for n in (1, 16))
    assert many.pct(0.9) < one.pct(0.9)


def test_asynchronous_steps_deliver_audio_a_step_later_and_keep_every_stream() -> None:
    """With steps asynchronous (a step's audio leaves one call later) the first audio comes
    later than without, every stream still speaks and none underruns at a light load."""
    sync, pipelined = (simulate(64, 4, duration_s=6.0, ramp_s=3.0, async_steps=a) for a in (False, True))
    assert min(len(sync.ttfa_ms), len(pipelined.ttfa_ms)) >= 64
    assert pipelined.pct(0.5) > sync.pct(0.5)
    assert sync.underrun_streams == pipelined.underrun_streams == 0
    assert pipelined.light > 0
