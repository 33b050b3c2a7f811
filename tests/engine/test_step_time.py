"""engine.step_time: the online step-time fit and the pairing of steps with their times."""

from __future__ import annotations

import random

import pytest

from engine.step_time import StepSampler, StepTimeModel


def _gpu(rows: int, prompt_tokens: int = 0, *, scale: float = 1.0) -> float:
    """A simulated H200-like step: 3.2 ms, 20.6 us a row, 4 us a prompt token."""
    return scale * (0.0032 + 20.6e-6 * rows + 4e-6 * prompt_tokens)


def _feed(model: StepTimeModel, n: int, *, rng: random.Random, rows: tuple[int, int] = (1, 450),
          noise: float = 0.03, scale: float = 1.0, stall_every: int = 0) -> None:
    for i in range(n):
        r = rng.randint(*rows)
        p = rng.choice((0, 0, 0, 0, 120, 240))
        t = _gpu(r, p, scale=scale) * (1 + rng.gauss(0, noise))
        if stall_every and i % stall_every == 0:
            t *= 50  # a compile or a garbage collection
        model.observe(r, p, t)


def test_the_fit_finds_the_step_time_and_leaves_out_stalls() -> None:
    """Noisy steps over a range of rows and prompts: the fitted base, per-row and per-token
    costs are within a few percent of the simulated ones; stalls are counted, not used."""
    model = StepTimeModel()
    _feed(model, 3000, rng=random.Random(1), stall_every=200)
    a, b, c = model.coefficients  # type: ignore[misc]
    assert a == pytest.approx(0.0032, rel=0.05)
    assert b == pytest.approx(20.6e-6, rel=0.05)
    assert c == pytest.approx(4e-6, rel=0.15)
    assert model.num_outliers >= 14  # the stalls after the filter armed
    assert model.predict(384) == pytest.approx(_gpu(384), rel=0.02)


def test_the_estimate_converges_when_step_times_change() -> None:
    """The device gets 40% slower (a slower GPU, longer contexts): within a few thousand steps
    the fit predicts the new step times, not the old ones."""
    model = StepTimeModel()
    rng = random.Random(2)
    _feed(model, 2000, rng=rng)
    assert model.predict(300) == pytest.approx(_gpu(300), rel=0.02)
    _feed(model, 4000, rng=rng, scale=1.4)
    assert model.predict(300) == pytest.approx(_gpu(300, scale=1.4), rel=0.03)
    assert model.predict(100) == pytest.approx(_gpu(100, scale=1.4), rel=0.03)


def test_a_steady_load_moves_the_fit_where_the_engine_runs() -> None:
    """After a ramp over many row counts, steps at 200-260 rows get slower: the prediction there
    follows within seconds of steps, while the other bands keep the slope measurable."""
    model = StepTimeModel()
    rng = random.Random(3)
    _feed(model, 2000, rng=rng)
    _feed(model, 1500, rng=rng, rows=(200, 260), scale=1.25)
    assert model.predict(230) == pytest.approx(_gpu(230, scale=1.25), rel=0.04)
    assert model.coefficients[1] > 0  # type: ignore[index]


def test_a_new_regime_is_not_taken_for_stalls() -> None:
    """Every step suddenly 8x slower (beyond the stall factor): after a run of them the
    filter gives way and the fit follows."""
    model = StepTimeModel()
    rng = random.Random(4)
    _feed(model, 500, rng=rng)
    _feed(model, 3000, rng=rng, scale=8.0)
    assert model.predict(200) == pytest.approx(_gpu(200, scale=8.0), rel=0.1)


def test_without_spread_of_rows_the_slope_is_left_out_and_the_low_edge_is_flat() -> None:
    """All steps at one row count: no slope can be told (0), and the optimistic time for more
    rows is the measured time's low edge, never less."""
    model = StepTimeModel()
    for _ in range(300):
        model.observe(256, 0, _gpu(256))
    a, b, c = model.coefficients  # type: ignore[misc]
    assert (b, c) == (0.0, 0.0) and a == pytest.approx(_gpu(256))
    assert model.optimistic(1000) == pytest.approx(_gpu(256), rel=1e-6)


def test_a_narrow_range_of_rows_is_optimistic_beyond_it() -> None:
    """Steps of 1-8 rows only: far beyond them the low edge is below the true step time (it
    errs towards admitting), and at the rows measured it is close to it."""
    model = StepTimeModel()
    rng = random.Random(5)
    _feed(model, 2000, rng=rng, rows=(1, 8))
    assert model.optimistic(400) < _gpu(400)
    assert model.optimistic(5) == pytest.approx(_gpu(5), rel=0.03)


def test_steps_without_work_or_time_are_ignored() -> None:
    """No rows and no prompt tokens, or a non-positive or infinite time: not a sample."""
    model = StepTimeModel()
    assert not model.observe(0, 0, 0.01)
    assert not model.observe(5, 0, 0.0)
    assert not model.observe(5, 0, float("inf"))
    assert model.num_samples == 0 and model.coefficients is None


def test_the_first_steps_only_arm_the_stall_filter() -> None:
    """A first step that is a compile stall is never part of the fit."""
    model = StepTimeModel()
    model.observe(4, 30, 30.0)  # the first step compiles for 30 s
    for _ in range(100):
        model.observe(4, 0, 0.004)
    assert model.predict(4) == pytest.approx(0.004, rel=1e-6)


def test_bad_settings_are_refused() -> None:
    """Zero-sized bands or a stall factor of 1 are configuration errors."""
    with pytest.raises(ValueError):
        StepTimeModel(bucket_rows=0)
    with pytest.raises(ValueError):
        StepTimeModel(stall_factor=1.0)


def test_sampler_pairs_a_call_with_the_next_interval() -> None:
    """Synchronous steps: the rows launched by call i took from its start to call i+1's."""
    s = StepSampler(lag=0)
    assert s.on_step(10.0, 5, 0) is None
    assert s.on_step(10.012, 6, 30) == (5, 0, pytest.approx(0.012))
    assert s.on_step(10.030, 7, 0) == (6, 30, pytest.approx(0.018))


def test_sampler_with_async_steps_pairs_one_call_later() -> None:
    """Asynchronous steps: call i's rows are timed by the interval between calls i+1 and i+2
    (call i+1 waits for them); a reset (the loop slept) starts over."""
    s = StepSampler(lag=1)
    assert s.on_step(0.000, 5, 0) is None
    assert s.on_step(0.001, 6, 0) is None  # launched without waiting: not a step's time
    assert s.on_step(0.013, 7, 0) == (5, 0, pytest.approx(0.012))
    s.reset()
    assert s.on_step(5.0, 8, 0) is None
    assert s.on_step(5.001, 9, 0) is None
    with pytest.raises(ValueError):
        StepSampler(lag=2)
