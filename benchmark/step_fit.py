"""What a decode row and a prompt token cost of an engine step, fitted to served seconds.

    python -m benchmark.step_fit bench.json.gz [bench2.json.gz ...] [--min-busy 0.9]

``voxgate bench`` polls the server's ``/metrics`` during each level (``extra.server_timeline``
in its JSON). Each polled interval gives the engine's ms per step, its busy share, and the decode
rows and prompt tokens per LM step. Over the intervals in which the engine was at least
``--min-busy`` busy, a least-squares fit of busy time per step (ms per step × busy share)

    busy_ms ≈ base + per_row × decode_rows + per_token × prompt_tokens

says what each costs under the load that was served, codec and host work included. The fit is
only as good as its residual (printed): seconds differ in what they carry beyond these two
counts (codec frames, prompts' count against their length, GC).
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from benchmark.timeline import load_bench_json

__all__ = ["fit_step_costs", "main"]


def _intervals(data: dict[str, Any], min_busy: float) -> list[dict[str, float]]:
    out = []
    for level in data.get("levels", []):
        for p in level.get("extra", {}).get("server_timeline") or []:
            if p.get("busy_fraction", 0.0) >= min_busy and p.get("steps_per_s", 0.0) > 0 and "ms_per_step" in p:
                out.append(p)
    return out


def fit_step_costs(points: list[dict[str, float]]) -> dict[str, float]:
    """Least squares of busy ms per step on decode rows and prompt tokens per step."""
    if len(points) < 3:
        raise ValueError(f"need at least 3 busy intervals to fit 3 costs, got {len(points)}")
    x = np.array([[1.0, p["decode_rows_per_step"], p.get("prefill_tokens_per_step", 0.0)] for p in points])
    y = np.array([p["ms_per_step"] * p.get("busy_fraction", 1.0) for p in points])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    rms = float(np.sqrt(np.mean((x @ coef - y) ** 2)))
    return {"base_ms": float(coef[0]), "per_row_ms": float(coef[1]), "per_token_ms": float(coef[2]),
            "rms_ms": rms, "intervals": len(points)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmark.step_fit", description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", help="voxgate bench --json files (.gz too), fitted together")
    ap.add_argument("--min-busy", type=float, default=0.9, help="intervals at least this busy (default 0.9)")
    args = ap.parse_args(argv)
    if not 0.0 <= args.min_busy <= 1.0:
        ap.error("--min-busy must be within [0, 1]")
    points: list[dict[str, float]] = []
    for path in args.paths:
        try:
            points += _intervals(load_bench_json(path), args.min_busy)
        except (OSError, ValueError) as e:
            ap.error(f"cannot read {path}: {e}")
    try:
        r = fit_step_costs(points)
    except ValueError as e:
        ap.error(str(e))
    print(f"{r['intervals']} intervals at least {args.min_busy:.0%} busy: busy ms per step ≈ "
          f"{r['base_ms']:.2f} + {r['per_row_ms']:.4f} × decode rows + {r['per_token_ms']:.4f} × prompt tokens "
          f"(residual {r['rms_ms']:.2f} ms RMS)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
