"""The benchmark's metrics on synthetic traces with answers worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from benchmark.bench.metrics import (
    added_latencies,
    capacity,
    distribution,
    meets_target,
    delivery_interval,
    pause_summary,
    pause_threshold,
    percentile,
    server_pauses,
    simulate_player,
    stream_metrics,
    summarize_level,
)
from benchmark.bench.trace import StreamTrace

SR = 1000  # 1 sample = 1 ms keeps the arithmetic readable


def make_trace(chunk_t: list[float], chunk_ms: list[int] | int = 100, *, t_first_text: float = 0.0,
               t_end_input: float | None = None, ok: bool = True, sid: str = "s") -> StreamTrace:
    if isinstance(chunk_ms, int):
        chunk_ms = [chunk_ms] * len(chunk_t)
    tr = StreamTrace(stream_id=sid, prompt_index=0, text="hello world", sample_rate=SR,
                     t_first_text=t_first_text,
                     t_end_input=t_first_text if t_end_input is None else t_end_input)
    for t, n in zip(chunk_t, chunk_ms):
        tr.add_chunk(t, n)
    if ok:
        tr.done_reason = "end"
        tr.t_done = chunk_t[-1] if chunk_t else t_first_text
    else:
        tr.fail("engine_restarted", "boom", chunk_t[-1] if chunk_t else t_first_text)
    return tr


def test_percentile_matches_numpy_linear_interpolation() -> None:
    """percentile() agrees with numpy's default (linear) method, including the ends."""
    rng = np.random.default_rng(3)
    xs = rng.exponential(size=101).tolist()
    for q in (0, 1, 50, 90, 99, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_percentile_known_values_and_empty() -> None:
    """p50 of 1..4 is 2.5, p90 of 1..11 is 10; no values gives None; q out of range raises."""
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile(list(range(1, 12)), 90) == 10
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_distribution_scales_to_ms() -> None:
    """distribution() reports count/mean/p50/max in the scaled unit."""
    d = distribution([0.1, 0.2, 0.3], scale=1e3)
    assert d["count"] == 3
    assert d["mean"] == pytest.approx(200)
    assert d["p50"] == pytest.approx(200)
    assert d["max"] == pytest.approx(300)


def test_player_on_time_when_chunks_arrive_ahead_of_playback() -> None:
    """Chunks of 100 ms every 50 ms never starve the player."""
    r = simulate_player([0.05 * i for i in range(10)], [0.1] * 10, start_buffer_s=0.1,
                        is_complete=True)
    assert (r.underruns, r.stalled_s, r.t_play_start) == (0, 0.0, 0.0)


def test_player_exactly_real_time_is_not_an_underrun() -> None:
    """100 ms chunks arriving every 100 ms exactly keep a 100 ms buffer just fed."""
    r = simulate_player([0.1 * i for i in range(20)], [0.1] * 20, start_buffer_s=0.1,
                        is_complete=True)
    assert r.underruns == 0


def test_player_counts_one_underrun_and_its_stall() -> None:
    """A 300 ms hole after 200 ms of audio: one underrun, stalled until the buffer refills."""
    # Chunks at 0, 0.1 (100 ms each): plays 0..0.2. Next chunk at 0.5: dry from 0.2 to 0.5.
    r = simulate_player([0.0, 0.1, 0.5, 0.6], [0.1] * 4, start_buffer_s=0.1, is_complete=True)
    assert r.underruns == 1
    assert r.stalled_s == pytest.approx(0.3)
    assert r.first_underrun_audio_s == pytest.approx(0.2)  # the late chunk came after 200 ms of audio
    on_time = simulate_player([0.1 * i for i in range(5)], [0.1] * 5, start_buffer_s=0.1, is_complete=True)
    assert on_time.first_underrun_audio_s is None


def test_player_waits_for_start_buffer_before_playing() -> None:
    """With a 250 ms buffer and 100 ms chunks, playback starts at the third chunk."""
    r = simulate_player([0.0, 0.1, 0.2, 0.3], [0.1] * 4, start_buffer_s=0.25, is_complete=True)
    assert r.t_play_start == pytest.approx(0.2)
    assert r.underruns == 0


def test_player_starts_short_complete_stream_at_its_last_chunk() -> None:
    """A finished stream shorter than the buffer still plays (from its last chunk)."""
    r = simulate_player([0.0, 0.01], [0.02, 0.02], start_buffer_s=0.1, is_complete=True)
    assert r.t_play_start == pytest.approx(0.01)
    incomplete = simulate_player([0.0, 0.01], [0.02, 0.02], start_buffer_s=0.1,
                                 is_complete=False)
    assert incomplete.t_play_start is None


def test_player_rebuffers_after_underrun() -> None:
    """After an underrun the player waits for a full start buffer again, counting the wait."""
    # 100 ms at 0 (play 0..0.1); dry at 0.1; 50 ms chunks at 0.3 and 0.4 -> resumes at 0.4.
    r = simulate_player([0.0, 0.3, 0.4], [0.1, 0.05, 0.05], start_buffer_s=0.1, is_complete=True)
    assert r.underruns == 1
    assert r.stalled_s == pytest.approx(0.3)


def test_stream_metrics_ttfa_gaps_rtf() -> None:
    """TTFA from first text and end of input, gaps and RTF of a hand-made trace."""
    tr = make_trace([0.25, 0.35, 0.45, 0.55], t_first_text=0.05, t_end_input=0.15)
    m = stream_metrics(tr, start_buffer_s=0.1)
    assert m.ttfa_s == pytest.approx(0.2)
    assert m.ttfa_end_input_s == pytest.approx(0.1)
    assert m.gaps_s == pytest.approx((0.1, 0.1, 0.1))
    assert m.audio_s == pytest.approx(0.4)
    assert m.rtf == pytest.approx((0.55 - 0.05) / 0.4)
    assert m.startup_s == pytest.approx(0.2)
    assert m.is_ok and m.is_on_time


def test_failed_stream_is_never_on_time() -> None:
    """A stream that ends in an error counts as failed even though it never underran."""
    m = stream_metrics(make_trace([0.1, 0.15], ok=False), start_buffer_s=0.1)
    assert not m.is_ok and not m.is_on_time
    assert m.error_code == "engine_restarted"


def test_stream_without_audio_is_failed_no_audio() -> None:
    """A stream that finished without a single chunk is reported as no_audio."""
    m = stream_metrics(make_trace([]), start_buffer_s=0.1)
    assert not m.is_ok and m.error_code == "no_audio" and m.ttfa_s is None


def test_summarize_level_aggregates() -> None:
    """On-time fraction, errors by code, throughput and pooled gaps over a level."""
    good = [make_trace([0.1 + 0.1 * i for i in range(10)], sid=f"g{i}") for i in range(3)]
    late = make_trace([0.1, 0.2, 0.9, 1.0], sid="late")  # underruns once
    bad = make_trace([0.1], ok=False, sid="bad")
    ms = [stream_metrics(t, start_buffer_s=0.1) for t in [*good, late, bad]]
    s = summarize_level(ms, level=4, mode="concurrency", wall_s=2.0)
    assert s.num_streams == 5 and s.num_ok == 4 and s.num_failed == 1
    assert s.errors_by_code == {"engine_restarted": 1}
    assert s.on_time_fraction == pytest.approx(3 / 5)
    assert s.num_with_underruns == 1 and s.underruns_total == 1
    assert s.stalled_s_total == pytest.approx(0.6)  # dry from 0.3 until 0.9
    assert s.audio_s_total == pytest.approx(3 * 1.0 + 0.4 + 0.1)
    assert s.throughput_audio_s_per_s == pytest.approx(3.5 / 2.0)
    assert s.ttfa_ms["p50"] == pytest.approx(100)
    assert s.gap_ms["max"] == pytest.approx(700)
    assert s.first_underrun_audio_s["count"] == 1  # only the late stream
    assert s.first_underrun_audio_s["p50"] == pytest.approx(0.2)


def test_meets_target_thresholds() -> None:
    """A level passes only with TTFA p90 within the bound and >= 99% of streams on time."""
    fast = [make_trace([0.05 + 0.1 * i for i in range(5)], sid=str(i)) for i in range(100)]
    ms = [stream_metrics(t) for t in fast]
    s = summarize_level(ms, level=1, mode="concurrency", wall_s=1.0)
    assert meets_target(s)
    assert not meets_target(s, ttfa_p90_max_ms=40)
    one_late = [*ms[:99], stream_metrics(make_trace([0.05, 0.9], sid="x"))]
    s2 = summarize_level(one_late, level=1, mode="concurrency", wall_s=1.0)
    assert s2.on_time_fraction == pytest.approx(0.99)
    assert meets_target(s2)
    two_late = [*ms[:98], *[stream_metrics(make_trace([0.05, 0.9], sid=f"y{i}"))
                            for i in range(2)]]
    assert not meets_target(summarize_level(two_late, level=1, mode="concurrency", wall_s=1.0))


def test_capacity_is_highest_level_below_first_failure() -> None:
    """Capacity ignores a pass above a failure and is None when the lowest level fails."""
    assert capacity([(1, True), (8, True), (32, True), (64, False)]) == 32
    assert capacity([(64, False), (1, True), (32, True)]) == 32
    assert capacity([(1, True), (8, False), (16, True)]) == 1
    assert capacity([(1, False), (2, True)]) is None
    assert capacity([]) is None


def test_added_latencies_use_engine_timestamps() -> None:
    """Per-chunk added latency is receipt minus engine emit time; unstamped traces are skipped."""
    tr = make_trace([1.0, 1.1])
    tr.chunk_engine_t = [0.999, 1.098]
    assert added_latencies([tr, make_trace([2.0])]) == pytest.approx([0.001, 0.002])


def test_summary_says_where_streams_first_underran() -> None:
    """The terminal summary has a line per level with underruns: how many streams and after how
    much audio (p50, p90) the first one came; a level without underruns has no such line."""
    from benchmark.bench.config import BenchConfig
    from benchmark.bench.report import format_summary
    from benchmark.bench.runner import BenchResult, LevelRun

    def level(n: int, traces: list) -> LevelRun:
        ms = [stream_metrics(t, start_buffer_s=0.1) for t in traces]
        return LevelRun(summary=summarize_level(ms, level=n, mode="concurrency", wall_s=2.0), passed=False,
                        metrics=ms, traces=traces)

    late = [make_trace([0.1, 0.2, 0.9, 1.0], sid="a"), make_trace([0.1, 0.2, 0.3, 0.4, 1.5], sid="b")]
    smooth = [make_trace([0.1 + 0.1 * i for i in range(5)], sid="c")]
    result = BenchResult(config=BenchConfig(concurrency=[1, 2]), target_info={}, prompts={},
                         levels=[level(1, smooth), level(2, late)])
    text = format_summary(result)
    assert "underran at 2: 2 streams, the first time after 0.30 s of audio (p50; p90 0.38 s)" in text
    assert "underran at 1" not in text
    result.levels[1].summary.extra["server"] = {"ms_per_step": 9.84, "busy_fraction": 0.93,
                                                "decode_rows_per_step": 181.2, "prefill_tokens_per_step": 12.6}
    assert ("server at 2: 9.8 ms per engine step, busy 93%, 181 decode rows and 13 prompt tokens per LM step"
            in format_summary(result))
    result.levels[1].summary.extra["server_timeline"] = [  # the server second by second
        {"t_s": 1.0, "ms_per_step": 8.0}, {"t_s": 2.1, "ms_per_step": 18.3, "gc_pause_ms_per_s": 240.0},
        {"t_s": 3.0, "ms_per_step": 9.0}, {"t_s": 3.5}]
    assert ("13 prompt tokens per LM step; slowest second 18.3 ms per step at 2.1 s, 240 ms of GC pauses"
            in format_summary(result))
    result.levels[1].summary.extra["server"]["light_steps_fraction"] = 0.4  # (light steps on)
    assert "13 prompt tokens per LM step, 40% of them light steps; slowest second" in format_summary(result)
    result.levels[1].summary.extra["server"].update(light_ms_per_step=3.04, loaded_ms_per_step=29.6,
                                                     loaded_rows_per_step=212.4)  # (each kind's time)
    assert ("40% of them light steps (3.0 ms; the others 29.6 ms with 212 rows); slowest second"
            in format_summary(result))
    result.levels[0].summary.extra["client_loop_lag_ms"] = {"p50": 0.2, "p99": 3.0, "max": 9.0}
    result.levels[1].summary.extra["client_loop_lag_ms"] = {"p50": 4.0, "p99": 120.0, "max": 800.0}
    text = format_summary(result)
    assert "client at 2: its event loop ran late by 120 ms at p99 (max 800 ms)" in text
    assert "client at 1" not in text  # a client that kept up is not mentioned


def _staggered(n: int, *, hole: tuple[float, float] | None = None, holes_for: int | None = None,
               end: float = 3.0) -> list[StreamTrace]:
    """``n`` streams receiving a chunk every 20 ms, offset from one another by 20/n ms, from
    0.1 s to ``end``; the first ``holes_for`` streams (all by default) receive nothing inside
    ``hole``."""
    out = []
    for i in range(n):
        ts = [0.1 + 0.02 * k + 0.02 * i / n for k in range(int((end - 0.1) / 0.02))]
        if hole is not None and (holes_for is None or i < holes_for):
            ts = [t for t in ts if not hole[0] < t < hole[1]]
        out.append(make_trace(ts, 20, sid=str(i)))
    return out


def test_a_silence_for_every_stream_at_once_is_a_server_pause() -> None:
    traces = _staggered(8, hole=(1.0, 1.09))
    pauses = server_pauses(traces)
    assert len(pauses) == 1
    start, length = pauses[0]
    assert 0.99 < start <= 1.0 and 0.09 <= length < 0.11
    # one stream's own gap is scheduling, not a pause: the others kept receiving
    assert server_pauses(_staggered(8, hole=(1.0, 1.09), holes_for=1)) == []
    # nor is a silence with too few streams in progress, or one shorter than the threshold
    assert server_pauses(_staggered(3, hole=(1.0, 1.09))) == []
    assert server_pauses(_staggered(8, hole=(1.0, 1.04))) == []
    assert len(server_pauses(_staggered(8, hole=(1.0, 1.04)), min_gap_s=0.03)) == 1
    # the time before the first stream starts and after the last ends is no pause
    late = [make_trace([2.0 + 0.02 * k for k in range(20)], 20, sid=f"l{i}") for i in range(8)]
    assert server_pauses(_staggered(8, end=1.0) + late) == []
    with pytest.raises(ValueError):
        server_pauses(traces, min_gap_s=0.0)


def _batched(n: int, *, step_s: float, stop: tuple[float, float] | None = None) -> list[StreamTrace]:
    """``n`` streams whose audio all comes at once each ``step_s`` (a batched engine step: a
    chunk model's step of 45-60 ms delivers every stream's chunk together), none inside ``stop``."""
    ts = [0.1 + step_s * k for k in range(int(2.9 / step_s))]
    if stop is not None:
        ts = [t for t in ts if not stop[0] < t < stop[1]]
    return [make_trace([t + 0.0001 * i for t in ts], 20, sid=str(i)) for i in range(n)]


def test_the_pause_threshold_follows_the_servers_delivery_interval() -> None:
    """Steps of 60 ms that deliver every stream's audio together are normal running, not 47
    pauses: the threshold is twice the median delivery interval (120 ms), never under 50 ms;
    a stop of several steps still counts."""
    steady = _batched(8, step_s=0.06)
    assert delivery_interval(steady) == pytest.approx(0.06, abs=1e-3)
    gap_s, cadence = pause_threshold(steady)
    assert gap_s == pytest.approx(0.12, abs=2e-3) and cadence == pytest.approx(0.06, abs=1e-3)
    assert len(server_pauses(steady)) > 40 and server_pauses(steady, min_gap_s=gap_s) == []
    stopped = _batched(8, step_s=0.06, stop=(1.0, 1.3))
    assert len(server_pauses(stopped, min_gap_s=pause_threshold(stopped)[0])) == 1
    fast = _staggered(8)  # deliveries every 2.5 ms: the 50 ms floor holds
    assert pause_threshold(fast)[0] == 0.05
    assert delivery_interval([]) is None and pause_threshold([]) == (0.05, None)


def test_pause_summary_finds_a_period() -> None:
    traces = _staggered(8, end=5.2)
    for tr in traces:  # a 80 ms stop of everyone once a second, as a per-second report once caused
        keep = [(t, n) for t, n in zip(tr.chunk_t, tr.chunk_samples) if not any(s < t < s + 0.08 for s in (1.0, 2.0, 3.0, 4.0))]
        tr.chunk_t, tr.chunk_samples = [t for t, _ in keep], [n for _, n in keep]
    pauses = server_pauses(traces)
    summary = pause_summary(pauses, 0.0)
    assert summary["count"] == 4 and summary["median_interval_s"] == pytest.approx(1.0, abs=0.01)
    assert 80 <= summary["length_ms"]["max"] < 100
    assert summary["at_s"] == pytest.approx([1.0, 2.0, 3.0, 4.0], abs=0.01)
    assert pause_summary([], 0.0)["count"] == 0


def test_summary_reports_server_pauses() -> None:
    from benchmark.bench.config import BenchConfig
    from benchmark.bench.report import format_summary
    from benchmark.bench.runner import BenchResult, LevelRun

    traces = _staggered(8, end=1.0)
    ms = [stream_metrics(t, start_buffer_s=0.1) for t in traces]
    run = LevelRun(summary=summarize_level(ms, level=8, mode="concurrency", wall_s=1.0), passed=True,
                   metrics=ms, traces=traces)
    result = BenchResult(config=BenchConfig(concurrency=[8]), target_info={}, prompts={}, levels=[run])
    run.summary.extra["server_pauses"] = pause_summary([], 0.0)
    assert "pauses at" not in format_summary(result)
    run.summary.extra["server_pauses"] = pause_summary([(1.0, 0.08), (2.0, 0.09), (3.01, 0.07)], 0.0)
    assert ("pauses at 8: 3 times no stream received audio for >= 50 ms while >= 4 were mid-stream "
            "(p50 80 ms, longest 90 ms, every 1.00 s (median))") in format_summary(result)
    run.summary.extra["server_pauses"] = pause_summary([(1.0, 0.3)], 0.0, min_gap_s=0.09, cadence_s=0.045)
    assert ("pauses at 8: 1 times no stream received audio for >= 90 ms (twice the server's median "
            "interval between deliveries, 45 ms) while >= 4 were mid-stream") in format_summary(result)


def test_summary_names_the_server_device() -> None:
    """The hello's ``device`` (the server's GPU or CPU) heads the summary; without it, no line."""
    from benchmark.bench.config import BenchConfig
    from benchmark.bench.report import format_summary
    from benchmark.bench.runner import BenchResult

    result = BenchResult(config=BenchConfig(concurrency=[8]), target_info={}, prompts={}, levels=[])
    assert "server device" not in format_summary(result)
    result.target_info["device"] = "NVIDIA H200, 140 GiB, GPU-58a1, torch 2.11.0, CUDA 13.0"
    assert format_summary(result).splitlines()[1] == "server device: NVIDIA H200, 140 GiB, GPU-58a1, torch 2.11.0, CUDA 13.0"


def test_refused_and_queued_streams_are_counted_apart_and_goodput_is_on_time_audio() -> None:
    """Two on-time streams (one of them queued 250 ms by the server), one refused after 20 ms,
    one late: refused and queued counted apart from the failures, the admitted's on-time share
    over the three admitted, goodput only the on-time audio."""
    good = make_trace([0.1, 0.2], sid="g")
    queued = make_trace([0.3, 0.4], sid="q")
    queued.server_timings["queue_wait_ms"] = 250.0
    refused = make_trace([], ok=False, sid="r")
    refused.error_code, refused.t_done = "capacity", 0.02
    late = make_trace([0.05, 0.9], sid="l")  # underruns
    ms = [stream_metrics(t, start_buffer_s=0.1) for t in (good, queued, refused, late)]
    assert ms[2].is_refused and ms[2].refused_after_s == pytest.approx(0.02)
    assert ms[1].queue_wait_s == pytest.approx(0.25)
    s = summarize_level(ms, level=4, mode="concurrency", wall_s=2.0)
    assert (s.num_failed, s.num_refused, s.num_queued, s.num_failed_not_refused) == (1, 1, 1, 0)
    assert s.on_time_fraction == 0.5 and s.on_time_fraction_admitted == pytest.approx(2 / 3)
    assert s.goodput_audio_s_per_s == pytest.approx(0.4 / 2.0)
    assert s.throughput_audio_s_per_s == pytest.approx(0.6 / 2.0)
    assert s.refused_ms["max"] == pytest.approx(20.0) and s.queue_wait_ms["p50"] == pytest.approx(250.0)
    assert s.ttfa_queued_ms["count"] == 1 and s.ttfa_queued_ms["p50"] == pytest.approx(300.0)
    assert not meets_target(s)  # a level with refusals does not count as served
