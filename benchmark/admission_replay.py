"""A ``voxgate bench --json`` run's server timeline replayed through ``engine.admission``: the
capacity the estimate gives from the run's own per-second figures, beside the one the server
reported (docs/scheduling.md, "What the first H200 runs showed").

    python -m benchmark.admission_replay bench.json[.gz] --tokens-per-s 6.25 [--max-rows 1024]

The server reports about once a second, so each second becomes that many steps of its mean
rows, prompt tokens (on the share of steps that had prompts) and step interval (1 / steps per
second, what the engine loop times), +-5% of jitter; the levels run through one estimate, as
they ran on one server, after ``--single`` steps of a lightly loaded engine (the single-stream
requests the GPU script runs first). The fit sees no step's own variation, so the figures are
an approximation of the estimate, not a measurement of the engine.
"""

from __future__ import annotations

import argparse
import random
from typing import Any

from benchmark.timeline import load_bench_json
from engine.admission import Admission, AdmissionConfig

__all__ = ["main", "replay"]


# the capacity estimate's terms in a server's timeline (benchmark.bench.server_stats.parse_gauges)
_TERMS = ("step_base_ms", "step_per_row_us", "step_per_prompt_token_us", "prefill_share", "jobs_per_stream",
          "step_scale")


def replay(run: dict[str, Any], tokens_per_audio_second: float, *, max_rows: int = 1024,
           fill_rows: int = 256, single: tuple[int, float, int] = (1, 0.02, 1000), seed: int = 0,
           jitter: float = 0.05) -> dict[float, list[dict[str, Any]]]:
    """Per level, per server report: its time, rows a step, interval (ms), demand, the
    capacity the server reported and the one replayed."""
    rng = random.Random(seed)
    adm = Admission(AdmissionConfig(policy="off"), tokens_per_audio_second=tokens_per_audio_second)
    rows1, step1_s, steps1 = single
    adm.request(-1)
    for _ in range(steps1):
        adm.observe_step(rows1, 0, step1_s * (1 + jitter * rng.uniform(-1, 1)), max_rows=max_rows,
                         fill_rows=fill_rows, jobs=1)
    adm.release(-1)
    out: dict[float, list[dict[str, Any]]] = {}
    key = 0
    for level in run["levels"]:
        server = level["extra"]["server"]
        prompt_steps = server["prefill_steps"] / max(server["lm_steps"], 1)
        speaking: list[int] = []
        t_prev = 0.0
        rows_out = []
        for p in level["extra"].get("server_timeline") or []:
            dt, t_prev = p["t_s"] - t_prev, p["t_s"]
            demand = int(p["demand_streams"])
            while len(speaking) < demand:
                key += 1
                speaking.append(key)
                adm.request(key)
            while len(speaking) > demand:
                adm.release(speaking.pop())
            if p["steps_per_s"] > 0:
                interval = 1.0 / p["steps_per_s"]
                jobs = round(p["running_jobs"] + p.get("queued_jobs", 0))
                for _ in range(max(1, round(p["steps_per_s"] * dt))):
                    mean = p["decode_rows_per_step"]
                    rows = int(mean) + (rng.random() < mean - int(mean))
                    prompt = 0
                    if p["prefill_tokens_per_step"] > 0 and rng.random() < prompt_steps:
                        prompt = round(p["prefill_tokens_per_step"] / prompt_steps)
                    adm.observe_step(rows, prompt, interval * (1 + jitter * rng.uniform(-1, 1)),
                                     max_rows=max_rows, fill_rows=fill_rows, jobs=jobs)
            coef = adm.model.coefficients
            rows_out.append({"t_s": p["t_s"], "rows": p["decode_rows_per_step"],
                             "interval_ms": 1e3 / p["steps_per_s"] if p["steps_per_s"] else None,
                             "demand": demand, "capacity_reported": p.get("capacity_streams"),
                             "capacity_replayed": adm.capacity(), "jobs_per_stream": adm.jobs_per_stream(),
                             # the estimate's terms, as the server reported them (servers from
                             # 98a1d84 on; None before) and as replayed
                             "reported": {k: p.get(k) for k in _TERMS},
                             "replayed": dict(zip(_TERMS, (
                                 None if coef is None else 1e3 * coef[0], None if coef is None else 1e6 * coef[1],
                                 None if coef is None else 1e6 * coef[2], adm.prefill_share(),
                                 adm.jobs_per_stream(), adm.model.scale)))})
        for k in speaking:
            adm.release(k)
        out[level["level"]] = rows_out
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmark.admission_replay", description=__doc__.split("\n\n")[0])
    ap.add_argument("path", help="a voxgate bench --json file (.gz too)")
    ap.add_argument("--tokens-per-s", type=float, required=True,
                    help="the model's tokens_per_audio_second (Orpheus 82.03, VoxCPM2 6.25, CSM and Kyutai 12.5)")
    ap.add_argument("--max-rows", type=int, default=1024, help="the decode cap, else --max-num-seqs (default 1024)")
    ap.add_argument("--fill-rows", type=int, default=256, help="the scheduler's decode fill (default 256; 0: none)")
    ap.add_argument("--single", default="1,0.02,1000",
                    help="rows,seconds,steps of the lightly loaded steps first (default 1,0.02,1000)")
    args = ap.parse_args(argv)
    r, s, n = args.single.split(",")
    levels = replay(load_bench_json(args.path), args.tokens_per_s, max_rows=args.max_rows,
                    fill_rows=args.fill_rows, single=(int(r), float(s), int(n)))
    def pair(x: dict[str, Any], term: str, fmt: str) -> str:  # "reported/replayed"
        got = [x[k][term] for k in ("reported", "replayed")]
        return "/".join("-" if v is None else format(v, fmt) for v in got)

    for level, rows in levels.items():
        print(f"== level {level:g}")
        print("   t s   rows  ms/step  demand  reported  replayed  jobs/stream | the estimate's terms, "
              "reported/replayed: base ms, us a row, us a prompt token, prefill share, step scale")
        for x in rows:
            ms = "-" if x["interval_ms"] is None else f"{x['interval_ms']:.1f}"
            rep = "-" if x["capacity_reported"] is None else f"{x['capacity_reported']:.0f}"
            cap = "-" if x["capacity_replayed"] is None else str(x["capacity_replayed"])
            terms = "  ".join((pair(x, "step_base_ms", ".1f"), pair(x, "step_per_row_us", ".0f"),
                               pair(x, "step_per_prompt_token_us", ".1f"), pair(x, "prefill_share", ".4f"),
                               pair(x, "step_scale", ".2f")))
            print(f"  {x['t_s']:5.1f} {x['rows']:6.0f} {ms:>8} {x['demand']:7d} {rep:>9} {cap:>9} "
                  f"{x['jobs_per_stream']:12.2f} | {terms}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
