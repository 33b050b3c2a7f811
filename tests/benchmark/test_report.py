"""Tests for benchmark.bench.report's viability plot: throughput from zero, nothing hides the data."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmark.bench.config import BenchConfig
from benchmark.bench.report import viability_figure


def _result(on_time: list[float], throughput: list[float]) -> SimpleNamespace:
    levels = [SimpleNamespace(summary=SimpleNamespace(level=2 ** i, on_time_fraction=f,
                                                      throughput_audio_s_per_s=t))
              for i, (f, t) in enumerate(zip(on_time, throughput))]
    return SimpleNamespace(config=BenchConfig(concurrency=[1]), levels=levels)


@pytest.fixture
def plt():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    yield plt
    plt.close("all")


def test_throughput_axis_starts_at_zero(plt) -> None:
    """The right axis runs from 0 to above the largest throughput, not from the smallest."""
    fig = viability_figure(plt, _result([1.0, 1.0, 0.5], [50.0, 90.0, 100.0]))
    lo, hi = fig.axes[1].get_ylim()
    assert lo == 0 and hi >= 100


def test_bound_line_is_drawn_under_the_on_time_line(plt) -> None:
    """The 99% bound sits below the data in drawing order, and the on-time axis is in front of
    the throughput axis, so a 100% line is never covered."""
    fig = viability_figure(plt, _result([1.0, 1.0], [10.0, 20.0]))
    host, twin = fig.axes
    bound, data = host.get_lines()
    assert list(bound.get_ydata()) == [99.0, 99.0] and list(data.get_ydata()) == [100.0, 100.0]
    assert bound.get_zorder() < data.get_zorder()
    assert host.get_zorder() > twin.get_zorder() and not host.patch.get_visible()


def test_all_zero_throughput_still_plots(plt) -> None:
    """A level with no audio at all gives a valid axis (0 to 1), not an empty range."""
    fig = viability_figure(plt, _result([0.0], [0.0]))
    assert fig.axes[1].get_ylim() == (0.0, 1.0)
