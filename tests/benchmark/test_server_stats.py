"""Server figures per level from the gateway's /metrics: URL, parsing, deltas and rates."""

from __future__ import annotations

import pytest

from benchmark.bench.server_stats import level_figures, metrics_url, parse_gauges, parse_totals, timeline
from gateway.metrics import GatewayMetrics


def test_metrics_url_from_the_stream_url() -> None:
    assert metrics_url("ws://127.0.0.1:8765/v1/stream") == "http://127.0.0.1:8765/metrics"
    assert metrics_url("wss://tts.example:443/v1/stream?x=1") == "https://tts.example:443/metrics"


def test_parse_totals_reads_the_engine_counters_of_a_real_exposition() -> None:
    """The gateway's own rendering parses back to the counters it was given; other metrics are
    ignored, and an exposition without them gives nothing."""
    m = GatewayMetrics()
    assert parse_totals(m.render().decode()) == {}
    for name, value in {"steps": 120, "busy_s": 1.25, "decode_rows": 9600}.items():
        m.engine_totals.labels(name=name).set(value)
    m.running_jobs.set(7)
    assert parse_totals(m.render().decode()) == {"steps": 120.0, "busy_s": 1.25, "decode_rows": 9600.0}


def test_level_figures_are_deltas_and_rates_over_the_window() -> None:
    """Rows per LM step, ms per step and the busy fraction come from the increases between the
    two readings; a missing reading or a counter that went down (engine restart) gives None."""
    before = (10.0, {"steps": 100, "busy_s": 1.0, "lm_steps": 90, "decode_rows": 1000, "prefill_tokens": 50})
    after = (12.0, {"steps": 300, "busy_s": 3.0, "lm_steps": 290, "decode_rows": 21000, "prefill_tokens": 450})
    f = level_figures(before, after)
    assert f["window_s"] == pytest.approx(2.0) and f["steps"] == 200
    assert f["ms_per_step"] == pytest.approx(10.0)
    assert f["busy_fraction"] == pytest.approx(1.0)
    assert f["steps_per_s"] == pytest.approx(100.0)
    assert f["decode_rows_per_step"] == pytest.approx(100.0)
    assert f["prefill_tokens_per_step"] == pytest.approx(2.0)
    assert level_figures(None, after) is None and level_figures(before, None) is None
    restarted = (13.0, {"steps": 5, "busy_s": 0.1})
    assert level_figures(after, restarted) is None
    plain = level_figures((0.0, {"steps": 0, "busy_s": 0.0}), (1.0, {"steps": 0, "busy_s": 0.0}))
    assert "ms_per_step" not in plain and "decode_rows_per_step" not in plain
    light = level_figures((0.0, {"steps": 0, "busy_s": 0.0, "lm_steps": 0, "light_steps": 0}),
                          (1.0, {"steps": 80, "busy_s": 0.8, "lm_steps": 80, "light_steps": 20}))
    assert light["light_steps_fraction"] == pytest.approx(0.25)  # a quarter of the LM steps light
    assert "light_ms_per_step" not in light and "loaded_ms_per_step" not in light  # (an older server)
    split = level_figures((0.0, {"steps": 0, "busy_s": 0.0, "lm_steps": 0, "light_steps": 0, "decode_rows": 0,
                                 "light_rows": 0, "light_busy_s": 0.0, "loaded_busy_s": 0.0}),
                          (1.0, {"steps": 80, "busy_s": 0.8, "lm_steps": 80, "light_steps": 60, "decode_rows": 4300,
                                 "light_rows": 300, "light_busy_s": 0.18, "loaded_busy_s": 0.6}))
    assert split["light_ms_per_step"] == pytest.approx(3.0)  # 0.18 s over 60 light steps
    assert split["loaded_ms_per_step"] == pytest.approx(30.0)  # 0.6 s over the 20 others
    assert split["loaded_rows_per_step"] == pytest.approx(200.0)  # (4,300 - 300) rows over them
    assert "light_steps_fraction" not in f


def test_fetch_from_no_server_gives_no_figures() -> None:
    """A server that is not there (or not voxgate) gives None, not an error."""
    import asyncio

    from benchmark.bench.server_stats import fetch_totals

    assert asyncio.run(fetch_totals("ws://127.0.0.1:9/v1/stream", timeout_s=2.0)) is None


def test_json_commit_is_head_or_the_override(monkeypatch):
    """The JSON's commit is the checkout's HEAD, or VOXGATE_COMMIT where a copied tree's .git
    is not its own (the GPU machine's copy)."""
    import subprocess
    from pathlib import Path

    from benchmark.bench.report import _git_commit

    monkeypatch.delenv("VOXGATE_COMMIT", raising=False)
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent).stdout.strip()
    assert _git_commit() == (head or None)
    monkeypatch.setenv("VOXGATE_COMMIT", "abc1234")
    assert _git_commit() == "abc1234"


def test_parse_gauges_reads_streams_and_jobs() -> None:
    """The engine's gauges by short name; the admission's capacity only once it is known."""
    m = GatewayMetrics()
    m.engine_streams.set(5)
    m.queued_jobs.set(2)
    m.running_jobs.set(9)
    m.engine_totals.labels(name="steps").set(3)
    assert parse_gauges(m.render().decode()) == {"streams": 5.0, "queued_jobs": 2.0, "running_jobs": 9.0,
                                                 "demand_streams": 0.0, "queued_streams": 0.0}
    m.observe_admission({"capacity": 480, "demand": 12, "queued": 1})
    gauges = parse_gauges(m.render().decode())
    assert (gauges["capacity_streams"], gauges["demand_streams"], gauges["queued_streams"]) == (480.0, 12.0, 1.0)
    # the estimate's terms, once the engine reports them
    m.admission_step.labels(term="per_row_us").set(20.5)
    m.admission_estimate.labels(term="prefill_share").set(0.002)
    m.admission_estimate.labels(term="step_scale").set(1.25)
    gauges = parse_gauges(m.render().decode())
    assert (gauges["step_per_row_us"], gauges["prefill_share"], gauges["step_scale"]) == (20.5, 0.002, 1.25)


def test_timeline_gives_each_interval_its_rates_and_the_gauges_at_its_end() -> None:
    """Consecutive reports give per-interval figures dated from the level's start; a counter
    that went down (an engine restart) drops that interval only."""
    samples = [
        (100.0, {"steps": 0, "busy_s": 0.0, "lm_steps": 0, "decode_rows": 0}, {"queued_jobs": 0}),
        (101.0, {"steps": 100, "busy_s": 0.8, "lm_steps": 100, "decode_rows": 6400, "gc_pause_s": 0.25},
         {"queued_jobs": 3}),
        (102.0, {"steps": 150, "busy_s": 1.8, "lm_steps": 150, "decode_rows": 19200}, {"queued_jobs": 1}),
        (103.0, {"steps": 10, "busy_s": 0.1, "lm_steps": 10, "decode_rows": 100}, {"queued_jobs": 0}),
    ]
    rows = timeline(samples, t0=99.5)
    assert [r["t_s"] for r in rows] == [1.5, 2.5]
    assert rows[0]["steps_per_s"] == 100 and rows[0]["ms_per_step"] == pytest.approx(8.0)
    assert rows[0]["decode_rows_per_step"] == 64 and rows[0]["queued_jobs"] == 3
    assert rows[0]["gc_pause_ms_per_s"] == pytest.approx(250.0)  # 0.25 s of pauses in that second
    assert rows[1]["ms_per_step"] == pytest.approx(20.0) and rows[1]["decode_rows_per_step"] == 256
    assert rows[1]["busy_fraction"] == pytest.approx(1.0)
