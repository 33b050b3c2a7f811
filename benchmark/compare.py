"""``voxgate bench --json`` runs side by side, level by level (on time, TTFA, goodput, refused,
capacity, ratios to the first run): whether two server layouts serve alike (docs/deploy.md).

    python -m benchmark.compare NAME=bench.json[.gz] NAME=bench.json[.gz] ...
"""

from __future__ import annotations

import argparse
from typing import Any, Sequence

from benchmark.timeline import load_bench_json

__all__ = ["compare_lines", "main"]


def _levels(run: dict[str, Any]) -> dict[float, dict[str, Any]]:
    return {float(level["level"]): level for level in run.get("levels", [])}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return "-"
    return f"{value / base:.2f}"


def compare_lines(runs: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """The comparison table of ``runs`` (name, bench JSON), the first being the baseline."""
    if not runs:
        return []
    width = max(8, *(len(name) for name, _ in runs))
    header = (f"{'level':>6}  {'run':<{width}}  {'streams':>7}  {'on time':>7}  {'ttfa p50':>8}  "
              f"{'ttfa p90':>8}  {'goodput':>7}  {'x base':>6}  {'refused':>7}")
    lines = [header]
    base_levels = _levels(runs[0][1])
    shared = sorted(set.intersection(*(set(_levels(run)) for _, run in runs)))
    for level in shared:
        base_goodput = base_levels[level].get("goodput_audio_s_per_s")
        for name, run in runs:
            s = _levels(run)[level]
            ttfa = s.get("ttfa_ms") or {}
            goodput = s.get("goodput_audio_s_per_s")
            lines.append(
                f"{level:>6g}  {name:<{width}}  {s.get('num_streams', 0):>7}  "
                f"{100 * s.get('on_time_fraction', 0.0):>6.1f}%  {_ms(ttfa.get('p50')):>8}  "
                f"{_ms(ttfa.get('p90')):>8}  {goodput or 0.0:>7.1f}  "
                f"{_ratio(goodput, base_goodput):>6}  {s.get('num_refused', 0):>7}")
    missing = sorted(set().union(*(set(_levels(run)) for _, run in runs)) - set(shared))
    if missing:
        lines.append(f"levels not in every run (left out): {', '.join(f'{x:g}' for x in missing)}")
    base_capacity = runs[0][1].get("capacity")
    for name, run in runs:
        capacity = run.get("capacity")
        bound = " (the highest level tried: a lower bound)" if run.get("capacity_is_lower_bound") else ""
        lines.append(f"capacity {name}: {capacity if capacity is not None else 'none met the target'}"
                     f"{bound}, x base {_ratio(capacity, base_capacity)}; commit {run.get('commit')}")
    return lines


def _named(value: str) -> tuple[str, str]:
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {value!r}")
    return name, path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmark.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=_named, metavar="NAME=PATH",
                        help="a voxgate bench --json file (.gz or not), the first the baseline")
    args = parser.parse_args(argv)
    runs = [(name, load_bench_json(path)) for name, path in args.runs]
    print("\n".join(compare_lines(runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
