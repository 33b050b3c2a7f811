"""The benchmark's outputs: a terminal table, a JSON file with every figure, PNG plots."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmark.bench.loop_lag import LAG_WARN_MS
from benchmark.bench.metrics import simulate_player

if TYPE_CHECKING:
    from benchmark.bench.runner import BenchResult, LevelRun

__all__ = ["format_summary", "to_json", "write_json", "write_plots"]


def _f(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_summary(result: BenchResult) -> str:
    cfg = result.config
    head = (f"{'load':>8} {'streams':>7} {'failed':>6} {'refused':>7} {'queued':>6} {'TTFA p50':>8} "
            f"{'p90':>6} {'p99':>6} {'end-in p50':>10} {'gap p99':>7} {'RTF p50':>7} {'on time':>7} "
            f"{'underruns':>9} {'stall s':>7} {'audio s/s':>9} {'goodput':>7} {'pass':>4}")
    lines = [f"voxgate bench: target {cfg.target} {cfg.url}  model "
             f"{result.target_info.get('model', '?')}  mode {cfg.mode}  "
             f"text {'at ' + format(cfg.token_rate, 'g') + ' words/s' if cfg.token_rate else 'at once'}"
             f"  start buffer {cfg.start_buffer_ms:g} ms  seed {cfg.seed}",
             "times in ms; TTFA from the first text, end-in from the end of input; failed "
             "excludes refused; goodput: on-time audio s/s", head,
             "-" * len(head)]
    if result.target_info.get("device"):
        lines.insert(1, f"server device: {result.target_info['device']}")
    if result.target_info.get("bench_note"):
        lines.insert(1, f"note: {result.target_info['bench_note']}")
    for run in result.levels:
        s = run.summary
        lines.append(
            f"{s.level:>8g} {s.num_streams:>7} {s.num_failed_not_refused:>6} {s.num_refused:>7} "
            f"{s.num_queued:>6} {_f(s.ttfa_ms['p50']):>8} "
            f"{_f(s.ttfa_ms['p90']):>6} {_f(s.ttfa_ms['p99']):>6} "
            f"{_f(s.ttfa_end_input_ms['p50']):>10} {_f(s.gap_ms['p99']):>7} "
            f"{_f(s.rtf['p50'], 3):>7} {100 * s.on_time_fraction:>6.1f}% "
            f"{s.underruns_total:>9} {s.stalled_s_total:>7.2f} "
            f"{s.throughput_audio_s_per_s:>9.2f} {s.goodput_audio_s_per_s:>7.2f} "
            f"{'yes' if run.passed else 'no':>4}")
    for run in result.levels:
        s = run.summary
        if s.num_refused or s.num_queued:
            lines.append(
                f"admission at {s.level:g}: {s.num_refused} refused (after p90 {_f(s.refused_ms.get('p90'))} ms, "
                f"max {_f(s.refused_ms.get('max'))} ms), {s.num_queued} queued (waited p90 "
                f"{_f(s.queue_wait_ms.get('p90'))} ms; their TTFA p90 {_f(s.ttfa_queued_ms.get('p90'))} ms); "
                f"{100 * s.on_time_fraction_admitted:.1f}% of the admitted on time")
    for run in result.levels:
        onset = run.summary.first_underrun_audio_s
        if onset.get("count"):
            lines.append(f"underran at {run.summary.level:g}: {onset['count']} streams, the first time after "
                         f"{_f(onset['p50'], 2)} s of audio (p50; p90 {_f(onset['p90'], 2)} s)")
    for run in result.levels:
        srv = run.summary.extra.get("server")
        if srv and "ms_per_step" in srv:
            rows = (f", {srv['decode_rows_per_step']:.0f} decode rows and "
                    f"{srv.get('prefill_tokens_per_step', 0.0):.0f} prompt tokens per LM step"
                    if "decode_rows_per_step" in srv else "")
            if srv.get("light_steps_fraction"):  # (docs/scheduling.md, "Light steps")
                rows += f", {100 * srv['light_steps_fraction']:.0f}% of them light steps"
                if "light_ms_per_step" in srv and "loaded_ms_per_step" in srv:
                    rows += (f" ({srv['light_ms_per_step']:.1f} ms; the others {srv['loaded_ms_per_step']:.1f} ms "
                             f"with {srv['loaded_rows_per_step']:.0f} rows)")
            slow = _slowest_interval(run.summary.extra.get("server_timeline") or [])
            lines.append(f"server at {run.summary.level:g}: {srv['ms_per_step']:.1f} ms per engine step, "
                         f"busy {100 * srv['busy_fraction']:.0f}%{rows}{slow}")
    for run in result.levels:
        pauses = run.summary.extra.get("server_pauses") or {}
        if pauses.get("count"):
            every = pauses.get("median_interval_s")
            period = f", every {every:.2f} s (median)" if every is not None and pauses["count"] >= 3 else ""
            length = pauses["length_ms"]
            cadence = pauses.get("delivery_interval_ms")
            why = (f" (twice the server's median interval between deliveries, {cadence:g} ms)"
                   if cadence is not None and pauses["min_gap_ms"] > 50.0 else "")
            lines.append(f"pauses at {run.summary.level:g}: {pauses['count']} times no stream received audio for "
                         f">= {pauses['min_gap_ms']:.0f} ms{why} while >= {pauses['min_active']} were mid-stream "
                         f"(p50 {_f(length['p50'])} ms, longest {_f(length['max'])} ms{period}): "
                         "the server stopped for all of them at once")
    for run in result.levels:
        lag = run.summary.extra.get("client_loop_lag_ms") or {}
        if lag.get("p99") is not None and lag["p99"] > LAG_WARN_MS:
            lines.append(f"client at {run.summary.level:g}: its event loop ran late by {_f(lag['p99'])} ms at p99 "
                         f"(max {_f(lag['max'])} ms): chunk times, TTFA and underruns may be late by as much, "
                         "so this level measures the client as well as the server")
    for run in result.levels:
        if run.summary.errors_by_code:
            errs = ", ".join(f"{k}: {v}" for k, v in run.summary.errors_by_code.items())
            lines.append(f"errors at {run.summary.level:g}: {errs}")
    crit = f"TTFA p90 <= {cfg.ttfa_p90_max_ms:g} ms and >= {100 * cfg.min_on_time:g}% on time"
    unit = "concurrent streams" if cfg.mode == "concurrency" else "streams/s"
    cap = "none of the levels" if result.capacity is None else f"{result.capacity:g} {unit}"
    if _capacity_is_lower_bound(result):
        cap = f">= {cap} (every level tested passed: try higher)"
    lines.append(f"capacity ({crit}): {cap}")
    if result.overload is not None:
        lines.extend(_overload_lines(result.overload))
    if result.asr is not None:
        lines.append(f"ASR: {result.asr['streams']} streams, word error rate mean "
                     f"{_f(result.asr['wer_mean'], 3)}, word-weighted "
                     f"{_f(result.asr['wer_word_weighted'], 3)}")
    return "\n".join(lines)


def _overload_lines(overload: dict[str, Any]) -> list[str]:
    if overload.get("base") is None:
        return [f"overload: {overload.get('note', 'no capacity to multiply')}"]
    out = []
    for row in overload["levels"]:
        ratio = row["goodput_vs_base"]
        share = "-" if ratio is None else f"{100 * ratio:.0f}%"
        out.append(f"overload {row['factor']:.2g}x ({row['level']:g}): goodput {row['goodput_audio_s_per_s']:.2f} "
                   f"audio s/s, {share} of that at {overload['base']:g}; {row['num_refused']} of "
                   f"{row['num_streams']} refused, {100 * row['on_time_fraction_admitted']:.1f}% of the "
                   f"admitted on time")
    return out


def _capacity_is_lower_bound(result: BenchResult) -> bool:
    """The highest level tested passed, so the real capacity may be higher."""
    return bool(result.levels) and result.capacity is not None and result.capacity == max(
        r.summary.level for r in result.levels)


def _git_commit() -> str | None:
    """``VOXGATE_COMMIT`` if set (a copied working tree whose .git is not its own), else HEAD."""
    if os.environ.get("VOXGATE_COMMIT"):
        return os.environ["VOXGATE_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _level_json(run: LevelRun) -> dict[str, Any]:
    streams = []
    for m, tr in zip(run.metrics, run.traces):
        row = dataclasses.asdict(m)
        row.update(text_words=len(tr.text.split()), error_message=tr.error_message,
                   retry_after_s=tr.retry_after_s, sample_rate=tr.sample_rate,
                   done_reason=tr.done_reason, server_timings=tr.server_timings,
                   t_start=tr.t_start, t_first_text=tr.t_first_text, t_end_input=tr.t_end_input,
                   t_done=tr.t_done, chunk_t=tr.chunk_t, chunk_samples=tr.chunk_samples,
                   chunk_engine_t=tr.chunk_engine_t or None)
        streams.append(row)
    return {**run.summary.to_dict(), "passed": run.passed, "streams": streams}


def to_json(result: BenchResult) -> dict[str, Any]:
    cfg = dataclasses.asdict(result.config)
    return {
        "tool": "voxgate bench",
        "commit": _git_commit(),
        "machine": {"node": platform.node(), "platform": platform.platform(),
                    "python": platform.python_version(), "cpus": os.cpu_count()},
        "started_unix_s": result.started_unix_s,
        "elapsed_s": result.elapsed_s,
        "config": cfg,
        "target": result.target_info,
        "prompts": result.prompts,
        "capacity": result.capacity,
        "capacity_is_lower_bound": _capacity_is_lower_bound(result),
        "capacity_criterion": {"ttfa_p90_max_ms": result.config.ttfa_p90_max_ms,
                               "min_on_time": result.config.min_on_time},
        "search_tried": result.search_tried,
        "overload": result.overload,
        "asr": result.asr,
        "levels": [_level_json(r) for r in result.levels],
    }


def write_json(result: BenchResult, path: str | os.PathLike[str]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(to_json(result), f, indent=1, default=str)


def write_plots(result: BenchResult, out_dir: str | os.PathLike[str]) -> list[Path]:
    """ttfa.png (percentiles vs load), viability.png (on time and throughput vs load),
    timeline.png (a few streams of the highest load level)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = result.config
    xlabel = "concurrent streams" if cfg.mode == "concurrency" else "arrival rate (streams/s)"
    levels = [r.summary.level for r in result.levels]
    written: list[Path] = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, style in (("p50", "o-"), ("p90", "s-"), ("p99", "^-")):
        ax.plot(levels, [r.summary.ttfa_ms[key] for r in result.levels], style, label=f"TTFA {key}")
    ax.plot(levels, [r.summary.ttfa_end_input_ms["p50"] for r in result.levels], "x--",
            label="from end of input, p50")
    ax.axhline(cfg.ttfa_p90_max_ms, color="grey", ls=":", label=f"{cfg.ttfa_p90_max_ms:g} ms bound")
    ax.set(xlabel=xlabel, ylabel="time to first audio (ms)", title="Time to first audio vs load")
    _log_x(ax, levels)
    ax.grid(alpha=0.3)
    ax.legend()
    written.append(_save(fig, out / "ttfa.png"))

    written.append(_save(viability_figure(plt, result), out / "viability.png"))

    if result.levels and cfg.timeline_streams:
        written.append(_timeline(plt, result.levels[-1], cfg, out / "timeline.png"))
    return written


def viability_figure(plt: Any, result: BenchResult) -> Any:
    """Share of streams on time (left axis) and throughput (right axis, from zero) per level."""
    cfg = result.config
    xlabel = "concurrent streams" if cfg.mode == "concurrency" else "arrival rate (streams/s)"
    levels = [r.summary.level for r in result.levels]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    # The bound goes under the data (zorder 1), thin and dashed, so that levels at 100% stay
    # visible just above a 99% bound; and the host axis comes in front of its twin (drawn over
    # it by default), so that the throughput line does not cover the on-time line either.
    ax.axhline(100 * cfg.min_on_time, color="grey", ls=(0, (2, 3)), lw=0.8, zorder=1,
               label=f"{100 * cfg.min_on_time:g}% bound")
    ax.plot(levels, [100 * r.summary.on_time_fraction for r in result.levels], "o-",
            color="tab:green", lw=2, zorder=3, label="streams on time (%)")
    ax.set(xlabel=xlabel, ylabel="on time (%)", ylim=(0, 105),
           title=f"Streaming viability (start buffer {cfg.start_buffer_ms:g} ms)")
    _log_x(ax, levels)
    ax2 = ax.twinx()
    throughput = [r.summary.throughput_audio_s_per_s for r in result.levels]
    ax2.plot(levels, throughput, "s--", color="tab:blue", label="throughput (audio s / s)")
    ax2.set_ylabel("audio seconds per wall second")
    ax2.set_ylim(0, 1.1 * max(throughput, default=0) or 1)  # from zero: no exaggerated slope
    ax.set_zorder(ax2.get_zorder() + 1)
    ax.patch.set_visible(False)  # the host in front, transparent: both lines show
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    # Below the axes: inside, it covered the low levels' throughput.
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper center",
              bbox_to_anchor=(0.5, -0.13), ncol=3, frameon=False)
    ax.grid(alpha=0.3)
    return fig


def _log_x(ax: Any, levels: list[float]) -> None:
    if len(levels) > 1 and min(levels) > 0 and max(levels) / min(levels) >= 8:
        ax.set_xscale("log", base=2)


def _timeline(plt: Any, run: LevelRun, cfg: Any, path: Path) -> Path:
    """Per stream: input being sent (grey), chunk arrivals (ticks), playback (green) and
    stalls (red) of the simulated player; times relative to the stream's first text."""
    traces = [t for t in run.traces if t.t_first_text is not None][: cfg.timeline_streams]
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(traces) + 1.5))
    for y, tr in enumerate(traces):
        t0 = tr.t_first_text
        ax.broken_barh([(0, (tr.t_end_input or t0) - t0 or 0.005)], (y - 0.4, 0.15),
                       color="grey")
        ticks = [t - t0 for t in tr.chunk_t]
        ax.vlines(ticks, y - 0.2, y + 0.2, color="tab:blue", lw=0.8)
        if tr.sample_rate and tr.chunk_t:
            spans, stalls = _playback(tr, cfg.start_buffer_ms / 1e3)
            ax.broken_barh([(a - t0, b - a) for a, b in spans], (y + 0.25, 0.15), color="tab:green")
            ax.broken_barh([(a - t0, b - a) for a, b in stalls], (y + 0.25, 0.15), color="tab:red")
        if tr.error_code:
            ax.text((tr.t_done or t0) - t0, y, f" {tr.error_code}", color="tab:red", va="center")
    ax.set_yticks(range(len(traces)), [t.stream_id for t in traces])
    ax.set(xlabel="seconds since first text",
           title=f"{len(traces)} streams at {run.summary.level:g} ({run.summary.mode}): input "
                 f"(grey), chunks (blue), playback (green), stalls (red)")
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def _playback(tr: Any, start_buffer_s: float) -> tuple[list[tuple[float, float]],
                                                        list[tuple[float, float]]]:
    """Playing and stalled intervals of the simulated player (replayed chunk by chunk)."""
    spans: list[tuple[float, float]] = []
    stalls: list[tuple[float, float]] = []
    durations = [n / tr.sample_rate for n in tr.chunk_samples]
    prev = simulate_player([], [], start_buffer_s=start_buffer_s, is_complete=False)
    for k in range(1, len(tr.chunk_t) + 1):
        cur = simulate_player(tr.chunk_t[:k], durations[:k], start_buffer_s=start_buffer_s,
                              is_complete=tr.is_ok and k == len(tr.chunk_t))
        if cur.stalled_s > prev.stalled_s:
            stalls.append((tr.chunk_t[k - 1] - (cur.stalled_s - prev.stalled_s), tr.chunk_t[k - 1]))
        prev = cur
    if prev.t_play_start is not None:
        end = prev.t_play_start + sum(durations) + prev.stalled_s
        spans.append((prev.t_play_start, end))
    return spans, stalls


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def _slowest_interval(timeline: list[dict]) -> str:
    """", slowest second: X ms per step at T s" from a level's server timeline ("" without one);
    the engine's garbage-collection pauses in it, where reported (``benchmark.timeline``
    prints every second)."""
    timed = [p for p in timeline if "ms_per_step" in p]
    if not timed:
        return ""
    worst = max(timed, key=lambda p: p["ms_per_step"])
    gc = worst.get("gc_pause_ms_per_s")
    gc_part = f", {gc:.0f} ms of GC pauses" if gc else ""
    return f"; slowest second {worst['ms_per_step']:.1f} ms per step at {worst['t_s']:.1f} s{gc_part}"
