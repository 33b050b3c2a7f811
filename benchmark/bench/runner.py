"""Runs a ``BenchConfig``: warm-up, the levels (a sweep or a capacity search, then an overload
sweep), scoring, ASR and the report; only an unreachable target or a bad prompt file ends a run
early (exit status 1)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from benchmark.bench.config import BenchConfig
from benchmark.bench.load import CapacitySearch, LevelPlan, Target, run_level
from benchmark.bench.loop_lag import loop_lag
from benchmark.bench.metrics import (
    LevelSummary,
    StreamMetrics,
    capacity,
    distribution,
    meets_target,
    pause_summary,
    pause_threshold,
    server_pauses,
    stream_metrics,
    summarize_level,
)
from benchmark.bench.prompts import filter_prompts, length_summary, load_prompts
from benchmark.bench.server_stats import fetch_totals, level_figures, poll_timeline, timeline
from benchmark.bench.targets import make_target
from benchmark.bench.trace import StreamTrace

__all__ = ["LevelRun", "BenchResult", "overload_summary", "run", "run_async"]


@dataclass
class LevelRun:
    summary: LevelSummary
    passed: bool
    metrics: list[StreamMetrics]
    traces: list[StreamTrace]


@dataclass
class BenchResult:
    config: BenchConfig
    target_info: dict[str, Any]
    prompts: dict[str, Any]
    levels: list[LevelRun] = field(default_factory=list)
    capacity: float | None = None
    search_tried: list[tuple[int, bool]] = field(default_factory=list)
    asr: dict[str, Any] | None = None
    overload: dict[str, Any] | None = None  # the overload sweep (``overload_summary``)
    started_unix_s: float = 0.0
    elapsed_s: float = 0.0


def _make_target(config: BenchConfig) -> Target:
    return make_target(config.target, config.url, voice=config.voice, fmt=config.format,
                       native_sample_rate=config.sample_rate,
                       options=config.options, streams_per_connection=config.streams_per_connection,
                       keep_pcm=config.asr, model=config.http_model,
                       response_format=config.http_response_format,
                       sample_rate=config.http_sample_rate, extra=config.http_extra)


def _plan(config: BenchConfig, prompts: list[str], level: float, **overrides: Any) -> LevelPlan:
    kwargs: dict[str, Any] = dict(
        mode=config.mode, level=level, seed=config.seed, prompts=tuple(prompts),
        num_requests=config.requests_for(level), duration_s=config.duration_s,
        token_rate=config.token_rate, timeout_s=config.timeout_s, ramp_s=config.ramp_s,
        arrival_shape=config.arrival_shape, stream_prefix=f"L{level:g}-")
    kwargs.update(overrides)
    return LevelPlan(**kwargs)


async def _run_one_level(target: Target, config: BenchConfig, plan: LevelPlan) -> LevelRun:
    bar = None
    if config.progress:
        from tqdm import tqdm

        bar = tqdm(total=plan.num_requests, desc=f"{plan.mode} {plan.level:g}", unit="stream",
                   file=sys.stderr, leave=False)
    failed = 0

    def on_done(trace: StreamTrace) -> None:
        nonlocal failed
        failed += not trace.is_ok
        if bar is not None:
            bar.update(1)
            if failed:
                bar.set_postfix(failed=failed, refresh=False)

    is_native = config.target == "native" and config.url is not None
    before = await fetch_totals(config.url) if is_native else None  # type: ignore[arg-type]
    samples: list = []
    t0 = time.monotonic()
    poller = asyncio.create_task(poll_timeline(config.url, samples)) if before is not None else None  # type: ignore[arg-type]
    lag: list[tuple[float, float]] = []
    stop_lag = asyncio.Event()
    lag_task = asyncio.create_task(loop_lag(lag, stop_lag))
    try:
        traces, wall_s = await run_level(target, plan, on_done)
    finally:
        stop_lag.set()
        await lag_task
        if poller is not None:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
        if bar is not None:
            bar.close()
    after = await fetch_totals(config.url) if before is not None else None  # type: ignore[arg-type]
    start_buffer_s = config.start_buffer_ms / 1e3
    metrics = [stream_metrics(t, start_buffer_s=start_buffer_s) for t in traces]
    summary = summarize_level(metrics, level=plan.level, mode=plan.mode, wall_s=wall_s)
    server = level_figures(before, after)
    if server is not None:
        summary.extra["server"] = server
    summary.extra["client_loop_lag_ms"] = distribution([x for _, x in lag], scale=1e3)
    gap_s, cadence_s = pause_threshold(traces)  # a gap of a batched step or two is no pause
    summary.extra["server_pauses"] = pause_summary(server_pauses(traces, min_gap_s=gap_s), t0,  # timeline's clock
                                                   min_gap_s=gap_s, cadence_s=cadence_s)
    if samples:
        summary.extra["server_timeline"] = timeline(samples, t0)
        summary.extra["server_timeline_t0"] = t0  # the streams' clock (t_start, chunk_t)
    offsets = sum(t.offset_mismatches for t in traces)
    if offsets:
        summary.extra["offset_mismatches"] = offsets
    passed = meets_target(summary, ttfa_p90_max_ms=config.ttfa_p90_max_ms,
                          min_on_time=config.min_on_time)
    return LevelRun(summary=summary, passed=passed, metrics=metrics, traces=traces)


async def run_async(config: BenchConfig) -> BenchResult:
    """Run the benchmark; raises ``ConnectionError`` if the target cannot be reached."""
    prompts = filter_prompts(load_prompts(config.prompts_path), min_words=config.min_words,
                             max_words=config.max_words)
    target = _make_target(config)
    result = BenchResult(config=config, target_info={}, prompts=length_summary(prompts),
                         started_unix_s=time.time())
    t0 = time.monotonic()
    try:
        await target.open()
    except Exception as exc:
        raise ConnectionError(f"cannot reach {config.target} target at {config.url}: "
                              f"{type(exc).__name__}: {exc}") from exc
    try:
        result.target_info = dict(target.info)
        if config.warmup:
            await run_level(target, _plan(config, prompts, 1, mode="concurrency",
                                          num_requests=config.warmup, duration_s=None,
                                          stream_prefix="warmup-"))
        if config.search:
            search = CapacitySearch(start=config.search_start, max_level=config.search_max)
            while (level := search.next_level()) is not None:
                run = await _run_one_level(target, config, _plan(config, prompts, level))
                search.record(level, run.passed)
                result.levels.append(run)
            result.search_tried = list(search.tried)
            result.levels.sort(key=lambda r: r.summary.level)
        else:
            for level in (config.concurrency or config.rate):
                result.levels.append(
                    await _run_one_level(target, config, _plan(config, prompts, level)))
        if config.overload:
            base = search.result if config.search else (config.concurrency or config.rate)[0]
            if base is not None:
                tried = {r.summary.level for r in result.levels}
                for level in config.overload_levels(base):
                    if level not in tried:
                        result.levels.append(
                            await _run_one_level(target, config, _plan(config, prompts, level)))
                result.levels.sort(key=lambda r: r.summary.level)
            result.overload = overload_summary(result.levels, base, config.overload_levels(base or 1))
    finally:
        await target.close()
    result.capacity = capacity((r.summary.level, r.passed) for r in result.levels)
    if config.asr:
        result.asr = await asyncio.get_running_loop().run_in_executor(
            None, _score_asr, result.levels, config.asr_max_streams)
    result.elapsed_s = time.monotonic() - t0
    return result


def overload_summary(levels: list[LevelRun], base: float | None,
                     sweep: list[float]) -> dict[str, Any]:
    """The overload sweep: per level over ``base`` (the capacity), its multiple of it, goodput
    as a share of the goodput at ``base``, refusals (how soon), queued streams (their TTFA
    p90) and the share of admitted streams on time. ``base`` None: no capacity was found."""
    if base is None:
        return {"base": None, "levels": [], "note": "no capacity found: nothing to multiply"}
    by_level = {r.summary.level: r.summary for r in levels}
    ref = by_level.get(base)
    rows = []
    for level in sweep:
        s = by_level.get(level)
        if s is None:
            continue
        ratio = (s.goodput_audio_s_per_s / ref.goodput_audio_s_per_s
                 if ref is not None and ref.goodput_audio_s_per_s > 0 else None)
        rows.append({"level": level, "factor": level / base, "goodput_audio_s_per_s": s.goodput_audio_s_per_s,
                     "goodput_vs_base": ratio, "num_streams": s.num_streams, "num_refused": s.num_refused,
                     "refused_ms_p90": s.refused_ms.get("p90"), "num_queued": s.num_queued,
                     "ttfa_queued_ms_p90": s.ttfa_queued_ms.get("p90"), "ttfa_ms_p90": s.ttfa_ms.get("p90"),
                     "on_time_fraction_admitted": s.on_time_fraction_admitted,
                     "num_failed_not_refused": s.num_failed_not_refused})
    return {"base": base, "levels": rows}


def _score_asr(levels: list[LevelRun], max_streams: int) -> dict[str, Any]:
    """Word error rate of up to ``max_streams`` finished streams, spread over the levels."""
    from benchmark import asr  # lazily: pocketsphinx loads a model
    from benchmark.bench.pcm import pcm_to_float

    per_level = max(1, math.ceil(max_streams / max(1, len(levels))))
    rows: list[dict[str, Any]] = []
    for run in levels:
        picked = [t for t in run.traces if t.is_ok and t.pcm and t.sample_rate][:per_level]
        for tr in picked[: max_streams - len(rows)]:
            fmt = "pcm_f32le" if tr.bytes_per_sample == 4 else "pcm_s16le"
            hyp = asr.transcribe(pcm_to_float(bytes(tr.pcm or b""), fmt), tr.sample_rate)
            wer = asr.word_error_rate(tr.text, hyp)
            rows.append({"level": run.summary.level, "stream": tr.stream_id, "wer": wer,
                         "ref_words": len(tr.text.split()), "hypothesis": hyp})
    words = sum(r["ref_words"] for r in rows)
    return {"streams": len(rows),
            "wer_mean": sum(r["wer"] for r in rows) / len(rows) if rows else None,
            "wer_word_weighted": (sum(r["wer"] * r["ref_words"] for r in rows) / words
                                  if words else None),
            "per_stream": rows}


def run(config: BenchConfig) -> int:
    """Run and report. Exit status: 0 ran (whatever the server did), 1 target unreachable."""
    from benchmark.bench import report

    try:
        try:
            import uvloop

            result = uvloop.run(run_async(config))
        except ImportError:
            result = asyncio.run(run_async(config))
    except ConnectionError as exc:
        print(f"voxgate bench: {exc}", file=sys.stderr)
        return 1
    print(report.format_summary(result))
    if config.json_path:
        report.write_json(result, config.json_path)
        print(f"wrote {config.json_path}")
    if config.plots_dir:
        for path in report.write_plots(result, config.plots_dir):
            print(f"wrote {path}")
    return 0
