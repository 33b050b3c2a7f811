"""A ``voxgate bench --json`` level second by second: the server's ``/metrics`` beside the streams
that started and underran (native voxgate targets only).

    python -m benchmark.timeline bench.json[.gz] [--level 256] [--every 1.0]"""

from __future__ import annotations

import argparse
import gzip
import json
from typing import Any

from benchmark.bench.metrics import simulate_player

__all__ = ["level_rows", "load_bench_json", "main"]


def load_bench_json(path: str) -> dict[str, Any]:
    """A ``voxgate bench --json`` file (or any JSON file: ``trace_summary`` reads Chrome traces
    with it), gzipped (``.gz``) or not."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def level_rows(level: dict[str, Any], *, sample_rate: int, start_buffer_s: float, every_s: float = 1.0
               ) -> list[dict[str, Any]]:
    """The server timeline merged into intervals of ``every_s`` (the engine reports about once
    a second), each with the client events in it."""
    extra = level.get("extra", {})
    server = extra.get("server_timeline") or []
    t0 = extra.get("server_timeline_t0")
    if t0 is None:
        return []
    starts: list[float] = []
    dry: list[float] = []
    for s in level.get("streams", []):
        starts.append(s["t_start"] - t0)
        chunk_t, chunk_n = s.get("chunk_t") or [], s.get("chunk_samples") or []
        if chunk_t:
            res = simulate_player(chunk_t, [n / sample_rate for n in chunk_n], start_buffer_s=start_buffer_s,
                                  is_complete=s.get("done_reason") == "end")
            dry.extend(t - t0 for t in res.underrun_t)
    rows: list[dict[str, Any]] = []
    lo = 0.0
    for point in server:
        hi = point["t_s"]
        if hi - lo < every_s * 0.5 and rows:
            continue
        row = dict(point)
        row["started"] = sum(lo < t <= hi for t in starts)
        row["underruns"] = sum(lo < t <= hi for t in dry)
        rows.append(row)
        lo = hi
    return rows


_COLUMNS = [("t_s", "t s", "{:6.1f}"), ("steps_per_s", "steps/s", "{:7.0f}"), ("ms_per_step", "ms/step", "{:7.2f}"),
            ("decode_rows_per_step", "decode", "{:6.0f}"), ("deferred_decodes_per_step", "defer", "{:5.0f}"),
            ("prefill_rows_per_step", "prompts", "{:7.2f}"), ("light_steps_fraction", "light", "{:5.2f}"),
            ("light_ms_per_step", "light ms", "{:8.2f}"), ("loaded_ms_per_step", "loaded ms", "{:9.2f}"),
            ("loaded_rows_per_step", "loaded rows", "{:11.0f}"),
            ("streams", "streams", "{:7.0f}"),
            ("queued_jobs", "queued", "{:6.0f}"), ("running_jobs", "running", "{:7.0f}"),
            ("gc_pause_ms_per_s", "gc ms/s", "{:7.1f}"),
            ("started", "started", "{:7d}"), ("underruns", "underruns", "{:9d}")]


def _fmt(row: dict[str, Any]) -> str:
    cells = []
    for key, head, fmt in _COLUMNS:
        v = row.get(key)
        cells.append(fmt.format(v) if v is not None else "-".rjust(len(head)))
    return " ".join(cells)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmark.timeline", description=__doc__.split("\n\n")[0])
    ap.add_argument("path", help="a voxgate bench --json file (.gz too)")
    ap.add_argument("--level", type=float, default=None, help="only this level (default: every level)")
    ap.add_argument("--every", type=float, default=1.0, help="interval in seconds (default 1)")
    args = ap.parse_args(argv)
    if args.every <= 0:
        ap.error("--every must be > 0")
    try:
        data = load_bench_json(args.path)
    except (OSError, ValueError) as e:
        ap.error(f"cannot read {args.path}: {e}")
    rate = int(data.get("target", {}).get("sample_rate") or 24000)
    start_buffer_s = float(data.get("config", {}).get("start_buffer_ms", 100.0)) / 1e3
    shown = 0
    for level in data.get("levels", []):
        if args.level is not None and level.get("level") != args.level:
            continue
        rows = level_rows(level, sample_rate=rate, start_buffer_s=start_buffer_s, every_s=args.every)
        print(f"== level {level.get('level'):g}: {len(level.get('streams', []))} streams"
              + ("" if rows else " (no server timeline in this file)"))
        if rows:
            print(" ".join(head.rjust(len(fmt.format(0))) for _, head, fmt in _COLUMNS))
            for row in rows:
                print(_fmt(row))
        shown += 1
    if not shown:
        ap.error("no such level in the file")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
