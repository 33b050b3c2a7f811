"""Where the GPU's time went in a torch.profiler Chrome trace (the served engine's
``engine_trace.json.gz``): busy and idle time, streams, gaps, top kernels, per step.

    python -m benchmark.gpu.trace_summary engine_trace.json.gz --steps 40"""

from __future__ import annotations

import argparse
import collections
import sys
from typing import Any

from benchmark.args import number_type
from benchmark.timeline import load_bench_json

__all__ = ["summarise", "main"]


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def summarise(trace: dict[str, Any], *, steps: int, top: int = 20, gap_us: float = 20.0) -> dict[str, Any]:
    """The figures of a trace: span, busy and idle time, per stream, gaps of at least
    ``gap_us``, the ``top`` kernels by device time (all times in µs over the window)."""
    kernels = [e for e in trace.get("traceEvents", [])
               if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not kernels:
        raise ValueError("the trace holds no GPU kernels (was it recorded with CUDA activity?)")
    spans = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))) for e in kernels]
    merged = _union(spans)
    start, end = merged[0][0], merged[-1][1]
    busy = sum(b - a for a, b in merged)
    gaps = [b[0] - a[1] for a, b in zip(merged, merged[1:]) if b[0] - a[1] >= gap_us]
    per_stream: dict[str, float] = collections.defaultdict(float)
    by_name: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for e in kernels:
        stream = str(e.get("args", {}).get("stream", e.get("tid", "?")))
        dur = float(e.get("dur", 0.0))
        per_stream[stream] += dur
        row = by_name[e.get("name", "?")]
        row[0] += dur
        row[1] += 1
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "steps": steps, "span_us": end - start, "busy_us": busy, "idle_us": end - start - busy,
        "gaps": {"min_us": gap_us, "count": len(gaps), "total_us": sum(gaps), "longest_us": max(gaps, default=0.0)},
        "streams": dict(sorted(per_stream.items(), key=lambda kv: -kv[1])),
        "kernels": [{"name": n, "us": us, "calls": int(c)} for n, (us, c) in ranked],
        "kernel_us_total": sum(v[0] for v in by_name.values()),
    }


def format_summary(s: dict[str, Any]) -> str:
    per = 1e-3 / s["steps"]  # µs over the window -> ms per step
    g = s["gaps"]
    lines = [
        f"window {s['span_us'] / 1e3:.1f} ms over {s['steps']} steps: {s['span_us'] * per:.2f} ms per step, "
        f"GPU busy {s['busy_us'] * per:.2f} ms ({100 * s['busy_us'] / s['span_us']:.1f}%), "
        f"idle {s['idle_us'] * per:.2f} ms",
        f"gaps of {g['min_us']:.0f} us or more: {g['count'] / s['steps']:.1f} per step, "
        f"{g['total_us'] * per:.2f} ms per step, longest {g['longest_us'] / 1e3:.2f} ms",
        f"kernel time, all streams: {s['kernel_us_total'] * per:.2f} ms per step; by stream: "
        + ", ".join(f"{k} {v * per:.2f}" for k, v in s["streams"].items()),
        f"{'ms/step':>8} {'calls/step':>10}  kernel",
    ]
    for k in s["kernels"]:
        lines.append(f"{k['us'] * per:>8.3f} {k['calls'] / s['steps']:>10.1f}  {k['name'][:110]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", help="a Chrome trace (.json or .json.gz) from torch.profiler")
    p.add_argument("--steps", type=number_type(int, 1), default=50, help="engine steps the trace covers")
    p.add_argument("--top", type=number_type(int, 1), default=20, help="kernels listed")
    p.add_argument("--gap-us", type=number_type(float, 0.0), default=20.0, help="shortest idle gap counted")
    args = p.parse_args(argv)
    try:
        s = summarise(load_bench_json(args.trace), steps=args.steps, top=args.top, gap_us=args.gap_us)
    except (OSError, ValueError) as exc:
        print(f"trace_summary: {exc}", file=sys.stderr)
        return 2
    print(format_summary(s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
