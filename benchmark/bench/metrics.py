"""Pure functions from stream traces to the benchmark's figures: TTFA, gaps, real-time factor, the
simulated player's underruns, throughput and goodput, refusals and queueing, server pauses
(defined in docs/benchmark.md)."""

from __future__ import annotations

import bisect
import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

from benchmark.bench.trace import StreamTrace

__all__ = [
    "PlayerResult",
    "StreamMetrics",
    "LevelSummary",
    "percentile",
    "distribution",
    "simulate_player",
    "stream_metrics",
    "summarize_level",
    "meets_target",
    "capacity",
    "added_latencies",
    "server_pauses",
    "delivery_interval",
    "pause_threshold",
    "pause_summary",
]

# A chunk arriving this much after the buffer ran dry is not an underrun: float noise only.
_EPS_S = 1e-6


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation between order statistics
    (numpy's default method). ``None`` for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def distribution(values: Sequence[float], *, scale: float = 1.0) -> dict[str, float | None]:
    """count, mean, p50, p90, p99 and max of ``values`` times ``scale`` (e.g. 1e3 for ms)."""
    vals = [v * scale for v in values]
    return {
        "count": len(vals),
        "mean": sum(vals) / len(vals) if vals else None,
        "p50": percentile(vals, 50),
        "p90": percentile(vals, 90),
        "p99": percentile(vals, 99),
        "max": max(vals) if vals else None,
    }


@dataclass(frozen=True)
class PlayerResult:
    underruns: int
    stalled_s: float  # time spent stalled after playback first started
    t_play_start: float | None  # when playback first started (None: it never did)
    # Seconds of audio received before the first underrun (None: none): small values point at a
    # stream's start (a server's fast-start ramp), larger ones at a later slowdown.
    first_underrun_audio_s: float | None = None
    underrun_t: tuple[float, ...] = ()  # when playback ran dry, each time (chunk_t's clock)


def simulate_player(chunk_t: Sequence[float], chunk_s: Sequence[float], *, start_buffer_s: float,
                    is_complete: bool) -> PlayerResult:
    """Play chunks (receipt times ``chunk_t``, durations ``chunk_s``) through a jitter buffer.

    ``is_complete``: the last chunk is the stream's last, so playback may start (or resume)
    with less than ``start_buffer_s`` buffered once it arrives.
    """
    if start_buffer_s < 0:
        raise ValueError(f"start_buffer_s must be >= 0, got {start_buffer_s}")
    if len(chunk_t) != len(chunk_s):
        raise ValueError("chunk_t and chunk_s differ in length")
    buffered = 0.0  # seconds of audio received and not yet played
    is_playing = False
    clock = 0.0  # time up to which playback has been accounted for
    underruns = 0
    stalled_s = 0.0
    stall_since: float | None = None
    t_play_start: float | None = None
    first_underrun_audio_s: float | None = None
    underrun_t: list[float] = []
    received = 0.0
    last = len(chunk_t) - 1
    for i, (t, dur) in enumerate(zip(chunk_t, chunk_s)):
        if is_playing:
            elapsed = t - clock
            if elapsed > buffered + _EPS_S:
                if first_underrun_audio_s is None:
                    first_underrun_audio_s = received
                underruns += 1
                stall_since = clock + buffered
                underrun_t.append(stall_since)
                buffered = 0.0
                is_playing = False
            else:
                buffered = max(0.0, buffered - elapsed)
            clock = t
        buffered += dur
        received += dur
        if not is_playing and (buffered >= start_buffer_s - _EPS_S or (is_complete and i == last)):
            is_playing = True
            clock = t
            if t_play_start is None:
                t_play_start = t
            if stall_since is not None:
                stalled_s += t - stall_since
                stall_since = None
    return PlayerResult(underruns=underruns, stalled_s=stalled_s, t_play_start=t_play_start,
                        first_underrun_audio_s=first_underrun_audio_s, underrun_t=tuple(underrun_t))


@dataclass(frozen=True)
class StreamMetrics:
    stream_id: str
    prompt_index: int
    is_ok: bool
    is_on_time: bool
    error_code: str | None
    ttfa_s: float | None
    ttfa_end_input_s: float | None
    audio_s: float
    num_chunks: int
    gaps_s: tuple[float, ...]
    rtf: float | None
    underruns: int
    stalled_s: float
    startup_s: float | None  # first text -> playback start (TTFA plus the start-up buffer)
    first_underrun_audio_s: float | None = None  # see PlayerResult
    is_refused: bool = False  # turned away because the server was full (trace.REFUSAL_CODES)
    refused_after_s: float | None = None  # first text (or issue) -> the refusal
    queue_wait_s: float | None = None  # the server's admission wait (`done`'s queue_wait_ms)


def stream_metrics(trace: StreamTrace, *, start_buffer_s: float = 0.1) -> StreamMetrics:
    sr = trace.sample_rate
    if trace.chunk_t and not sr:
        raise ValueError(f"stream {trace.stream_id}: audio chunks but no sample_rate")
    chunk_s = [n / sr for n in trace.chunk_samples] if sr else []
    audio_s = sum(chunk_s)
    first = trace.chunk_t[0] if trace.chunk_t else None
    ttfa = first - trace.t_first_text if first is not None and trace.t_first_text is not None else None
    ttfa_end = first - trace.t_end_input if first is not None and trace.t_end_input is not None else None
    gaps = tuple(b - a for a, b in zip(trace.chunk_t, trace.chunk_t[1:]))
    rtf = None
    if audio_s > 0 and trace.t_first_text is not None:
        rtf = (trace.chunk_t[-1] - trace.t_first_text) / audio_s
    player = simulate_player(trace.chunk_t, chunk_s, start_buffer_s=start_buffer_s,
                             is_complete=trace.is_ok)
    startup = None
    if player.t_play_start is not None and trace.t_first_text is not None:
        startup = player.t_play_start - trace.t_first_text
    is_ok = trace.is_ok and bool(trace.chunk_t)
    refused_after = None
    t_asked = trace.t_first_text if trace.t_first_text is not None else trace.t_start
    if trace.is_refused and trace.t_done is not None and t_asked is not None:
        refused_after = trace.t_done - t_asked
    wait_ms = trace.server_timings.get("queue_wait_ms")
    return StreamMetrics(
        stream_id=trace.stream_id, prompt_index=trace.prompt_index, is_ok=is_ok,
        is_on_time=is_ok and player.underruns == 0,
        error_code=trace.error_code or (None if is_ok else "no_audio"),
        ttfa_s=ttfa, ttfa_end_input_s=ttfa_end, audio_s=audio_s, num_chunks=len(trace.chunk_t),
        gaps_s=gaps, rtf=rtf, underruns=player.underruns, stalled_s=player.stalled_s,
        startup_s=startup, first_underrun_audio_s=player.first_underrun_audio_s,
        is_refused=trace.is_refused, refused_after_s=refused_after,
        queue_wait_s=float(wait_ms) / 1e3 if isinstance(wait_ms, (int, float)) else None)


@dataclass
class LevelSummary:
    """Aggregated figures of one load level. Times in ms unless the name says otherwise."""

    level: float
    mode: str  # "concurrency" or "rate"
    num_streams: int
    num_ok: int
    num_failed: int
    errors_by_code: dict[str, int]
    ttfa_ms: dict[str, float | None]
    ttfa_end_input_ms: dict[str, float | None]
    startup_ms: dict[str, float | None]
    gap_ms: dict[str, float | None]
    rtf: dict[str, float | None]
    on_time_fraction: float
    num_with_underruns: int
    underruns_total: int
    stalled_s_total: float
    audio_s_total: float
    wall_s: float
    throughput_audio_s_per_s: float
    extra: dict[str, Any] = field(default_factory=dict)
    # Over the streams that underran: seconds of audio each had received before its first
    # underrun (where in a stream the trouble starts).
    first_underrun_audio_s: dict[str, float | None] = field(default_factory=dict)
    # Overload: streams refused (counted in num_failed too, which keeps its meaning: every
    # stream that did not finish normally), those admitted after waiting in the server's queue,
    # the failures other than refusals, the share on time of the streams not refused, and
    # goodput: seconds of audio of on-time streams per wall second.
    num_refused: int = 0
    num_queued: int = 0
    num_failed_not_refused: int = 0
    on_time_fraction_admitted: float = 0.0
    goodput_audio_s_per_s: float = 0.0
    refused_ms: dict[str, float | None] = field(default_factory=dict)  # first text -> refusal
    queue_wait_ms: dict[str, float | None] = field(default_factory=dict)  # over queued streams
    ttfa_queued_ms: dict[str, float | None] = field(default_factory=dict)  # TTFA of queued streams

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize_level(metrics: Sequence[StreamMetrics], *, level: float, mode: str,
                    wall_s: float) -> LevelSummary:
    """Aggregate a level's per-stream metrics. Failed streams count as not on time."""
    n = len(metrics)
    errors = Counter(m.error_code for m in metrics if not m.is_ok)
    audio_s = sum(m.audio_s for m in metrics)
    gaps = [g for m in metrics for g in m.gaps_s]
    admitted = [m for m in metrics if not m.is_refused]
    queued = [m for m in admitted if m.queue_wait_s]
    on_time_s = sum(m.audio_s for m in metrics if m.is_on_time)
    return LevelSummary(
        level=level, mode=mode, num_streams=n, num_ok=sum(m.is_ok for m in metrics),
        num_failed=sum(not m.is_ok for m in metrics),
        errors_by_code=dict(sorted(errors.items(), key=lambda kv: str(kv[0]))),
        ttfa_ms=distribution(_present(m.ttfa_s for m in metrics), scale=1e3),
        ttfa_end_input_ms=distribution(_present(m.ttfa_end_input_s for m in metrics), scale=1e3),
        startup_ms=distribution(_present(m.startup_s for m in metrics), scale=1e3),
        gap_ms=distribution(gaps, scale=1e3),
        rtf=distribution(_present(m.rtf for m in metrics)),
        on_time_fraction=sum(m.is_on_time for m in metrics) / n if n else 0.0,
        num_with_underruns=sum(m.underruns > 0 for m in metrics),
        underruns_total=sum(m.underruns for m in metrics),
        stalled_s_total=sum(m.stalled_s for m in metrics),
        audio_s_total=audio_s, wall_s=wall_s,
        throughput_audio_s_per_s=audio_s / wall_s if wall_s > 0 else 0.0,
        first_underrun_audio_s=distribution(_present(m.first_underrun_audio_s for m in metrics)),
        num_refused=n - len(admitted), num_queued=len(queued),
        num_failed_not_refused=sum(not m.is_ok for m in admitted),
        on_time_fraction_admitted=(sum(m.is_on_time for m in admitted) / len(admitted)
                                   if admitted else 0.0),
        goodput_audio_s_per_s=on_time_s / wall_s if wall_s > 0 else 0.0,
        refused_ms=distribution(_present(m.refused_after_s for m in metrics), scale=1e3),
        queue_wait_ms=distribution([m.queue_wait_s for m in queued], scale=1e3),  # type: ignore[misc]
        ttfa_queued_ms=distribution(_present(m.ttfa_s for m in queued), scale=1e3),
    )


def _present(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None]


def meets_target(summary: LevelSummary, *, ttfa_p90_max_ms: float = 300.0,
                 min_on_time: float = 0.99) -> bool:
    """TTFA p90 within the bound and enough streams on time (a level with no audio fails)."""
    p90 = summary.ttfa_ms.get("p90")
    return (summary.num_streams > 0 and p90 is not None and p90 <= ttfa_p90_max_ms
            and summary.on_time_fraction >= min_on_time)


def capacity(results: Iterable[tuple[float, bool]]) -> float | None:
    """The highest level such that it and every lower level tested passed; ``None`` if the
    lowest failed. A pass above a failure is noise, not capacity, so it does not count."""
    best = None
    for level, passed in sorted(results):
        if not passed:
            break
        best = level
    return best


def added_latencies(traces: Iterable[StreamTrace]) -> list[float]:
    """Per chunk: client receipt minus the engine's emit time (seconds), where stamped."""
    out: list[float] = []
    for tr in traces:
        if len(tr.chunk_engine_t) == len(tr.chunk_t):
            out.extend(r - e for r, e in zip(tr.chunk_t, tr.chunk_engine_t))
    return out


def server_pauses(traces: Iterable[StreamTrace], *, min_gap_s: float = 0.05,
                  min_active: int = 4) -> list[tuple[float, float]]:
    """(start, length) in seconds of every interval of at least ``min_gap_s`` in which no
    stream received audio while at least ``min_active`` streams were mid-stream, in time order
    (the streams' clock)."""
    if min_gap_s <= 0 or min_active < 1:
        raise ValueError("min_gap_s must be > 0 and min_active >= 1")
    spans = [(tr.chunk_t[0], tr.chunk_t[-1]) for tr in traces if len(tr.chunk_t) >= 2]
    firsts = sorted(a for a, _ in spans)
    lasts = sorted(b for _, b in spans)
    arrivals = sorted(t for tr in traces for t in tr.chunk_t)
    out: list[tuple[float, float]] = []
    for a, b in zip(arrivals, arrivals[1:]):
        if b - a < min_gap_s:
            continue
        # mid-stream throughout (a, b): started by a, and its last chunk is after a (no chunk
        # falls inside the gap, so after a means at b or later)
        active = bisect.bisect_right(firsts, a) - bisect.bisect_right(lasts, a)
        if active >= min_active:
            out.append((a, b - a))
    return out


def delivery_interval(traces: Iterable[StreamTrace], *, burst_s: float = 0.002) -> float | None:
    """The median interval (seconds) between the server's deliveries: audio arrivals closer than
    ``burst_s`` are one delivery (a batched engine step sends every stream's audio at once).
    None with fewer than two deliveries."""
    arrivals = sorted(t for tr in traces for t in tr.chunk_t)
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:]) if b - a >= burst_s]
    return percentile(gaps, 50) if gaps else None


def pause_threshold(traces: Sequence[StreamTrace], *, min_gap_s: float = 0.05,
                    cadence_factor: float = 2.0) -> tuple[float, float | None]:
    """(the gap that counts as a server pause, the delivery interval it came from): at least
    ``min_gap_s`` and at least ``cadence_factor`` delivery intervals. A server whose batched
    steps take 50 ms delivers every 50 ms in normal running; only a gap of several steps is a
    stop for everyone."""
    cadence = delivery_interval(traces)
    return max(min_gap_s, cadence_factor * cadence if cadence is not None else 0.0), cadence


def pause_summary(pauses: Sequence[tuple[float, float]], t0: float, *, min_gap_s: float = 0.05,
                  min_active: int = 4, cadence_s: float | None = None) -> dict[str, Any]:
    """``server_pauses`` for a report: how many, their lengths (ms), when (seconds after
    ``t0``, the first 50) and the median interval between consecutive ones (a period, if any);
    ``cadence_s``: the delivery interval the threshold ``min_gap_s`` was set from."""
    starts = [a for a, _ in pauses]
    between = [y - x for x, y in zip(starts, starts[1:])]
    return {"min_gap_ms": 1e3 * min_gap_s, "min_active": min_active, "count": len(pauses),
            "delivery_interval_ms": None if cadence_s is None else round(1e3 * cadence_s, 1),
            "length_ms": distribution([g for _, g in pauses], scale=1e3),
            "median_interval_s": percentile(between, 50),
            "at_s": [round(a - t0, 3) for a in starts[:50]]}
