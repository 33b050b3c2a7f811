"""Gateway overhead: latency the gateway (and the queues) add per audio chunk, and its CPU per
stream, at 100, 500 and 1,000 concurrent streams, against ``voxgate serve --model synthetic``.

    python -m benchmark.gateway_overhead --streams 100,500,1000 --json overhead.json

Method: docs/benchmark.md, "Gateway overhead"; the client processes: benchmark/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmark.bench.load import LevelPlan, run_level
from benchmark.bench.loop_lag import loop_lag
from benchmark.bench.metrics import distribution
from benchmark.bench.prompts import load_prompts
from benchmark.bench.targets import NativeTarget
from benchmark.bench.trace import StreamTrace
from benchmark.serve_process import ServeProcess

__all__ = ["OverheadConfig", "process_cpu_s", "descendants", "run_level_overhead",
           "run_level_overhead_multiproc", "main"]

_CLK_TCK = os.sysconf("SC_CLK_TCK")
MS_PER_CHAR = 60.0  # the synthetic engine's default: audio seconds per text character / 1000
CHUNK_MS = 40.0


@dataclass(frozen=True)
class OverheadConfig:
    streams: tuple[int, ...] = (100, 500, 1000)
    ramp_s: float = 10.0
    settle_s: float = 3.0
    measure_s: float = 10.0
    streams_per_connection: int = 1
    sample_rate: int | None = None  # each stream asks for this output rate (the gateway resamples)
    client_procs: int = 0  # 0: one per 250 streams, at most a quarter of the CPUs
    server_args: tuple[str, ...] = ("--lookahead-jobs", "0")
    start_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if not self.streams or min(self.streams) < 1:
            raise ValueError(f"--streams must be levels >= 1, got {self.streams}")
        for name in ("ramp_s", "settle_s", "measure_s"):
            if getattr(self, name) < 0 or (name == "measure_s" and self.measure_s <= 0):
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0 (measure > 0)")
        if self.streams_per_connection < 1:
            raise ValueError("--streams-per-connection must be >= 1")
        if self.client_procs < 0:
            raise ValueError("--client-procs must be >= 0 (0: automatic)")

    def num_client_procs(self, num_streams: int) -> int:
        """Client processes for a level: as configured, else one per 250 streams, at most a
        quarter of the CPUs (the gateway and the engine need theirs), never more than streams."""
        if self.client_procs:
            return min(self.client_procs, num_streams)
        return max(1, min(math.ceil(num_streams / 250), (os.cpu_count() or 1) // 4, num_streams))


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process, from /proc/PID/stat (0 if it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "; fields[0] is the state
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def descendants(pid: int) -> list[int]:
    """All processes below ``pid`` (the engine, multiprocessing's helpers)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


async def run_level_overhead(url: str, server_pid: int, num_streams: int,
                             cfg: OverheadConfig) -> dict[str, Any]:
    stream_s = cfg.ramp_s + cfg.settle_s + cfg.measure_s + 3.0
    text = _long_text(stream_s)
    target = NativeTarget(url, streams_per_connection=cfg.streams_per_connection,
                          open_timeout_s=60.0, native_sample_rate=cfg.sample_rate)
    await target.open()
    plan = LevelPlan(mode="concurrency", level=num_streams, seed=0, prompts=(text,),
                     num_requests=num_streams, timeout_s=stream_s * 3 + 60,
                     ramp_s=cfg.ramp_s, stream_prefix="o")
    lag: list[tuple[float, float]] = []
    stop = asyncio.Event()
    lag_task = asyncio.create_task(loop_lag(lag, stop))
    level_task = asyncio.create_task(run_level(target, plan))
    t0 = time.monotonic()

    def snapshot() -> dict[str, float]:
        return {**_server_snapshot(server_pid), "client": time.process_time()}

    await asyncio.sleep(max(0.0, t0 + cfg.ramp_s + cfg.settle_s - time.monotonic()))
    a = snapshot()
    await asyncio.sleep(cfg.measure_s)
    b = snapshot()
    traces, _ = await level_task
    stop.set()
    await lag_task
    await target.close()
    return _summarize(traces, a, b, lag, num_streams)


def run_level_overhead_multiproc(url: str, server_pid: int, num_streams: int,
                                 cfg: OverheadConfig, num_procs: int) -> dict[str, Any]:
    """``run_level_overhead`` with the streams split over ``num_procs`` client processes."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(num_procs + 1)
    t0 = ctx.Value("d", 0.0)
    results = ctx.Queue()
    shares = [num_streams // num_procs + (i < num_streams % num_procs) for i in range(num_procs)]
    procs = [ctx.Process(target=_client_proc, daemon=True,
                         args=(url, share, cfg, f"o{i}-", barrier, t0, results))
             for i, share in enumerate(shares)]
    for proc in procs:
        proc.start()
    try:
        barrier.wait(timeout=cfg.start_timeout_s)  # every client is connected
        t0.value = time.monotonic() + 0.2
        barrier.wait(timeout=10)  # every client has read t0
        a_t = t0.value + cfg.ramp_s + cfg.settle_s
        time.sleep(max(0.0, a_t - time.monotonic()))
        a = _server_snapshot(server_pid)
        time.sleep(max(0.0, a_t + cfg.measure_s - time.monotonic()))
        b = _server_snapshot(server_pid)
        stream_s = cfg.ramp_s + cfg.settle_s + cfg.measure_s + 3.0
        parts = [results.get(timeout=stream_s * 3 + 120) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    errors = [x for x in parts if isinstance(x, str)]
    if errors:
        raise RuntimeError("a client process failed:\n" + errors[0])
    traces = [tr for part in parts for tr in part["traces"]]
    lag = [x for part in parts for x in part["lag"]]
    a["client"] = sum(part["cpu_a"] for part in parts)
    b["client"] = sum(part["cpu_b"] for part in parts)
    row = _summarize(traces, a, b, lag, num_streams)
    row["client_procs"] = num_procs
    return row


def _server_snapshot(server_pid: int) -> dict[str, float]:
    kids = descendants(server_pid)
    return {"t": time.monotonic(), "load1": os.getloadavg()[0],
            "gateway": process_cpu_s(server_pid),
            "engine": sum(process_cpu_s(p) for p in kids)}


def _client_proc(url: str, num_streams: int, cfg: OverheadConfig, prefix: str, barrier: Any,
                 t0: Any, results: Any) -> None:
    """One client process: connect, wait for the others, run its streams from the common t0."""
    try:
        results.put(_run(_client_part(url, num_streams, cfg, prefix, barrier, t0)))
    except BaseException:  # the parent reports it
        import traceback

        results.put(traceback.format_exc())


async def _client_part(url: str, num_streams: int, cfg: OverheadConfig, prefix: str,
                       barrier: Any, t0: Any) -> dict[str, Any]:
    stream_s = cfg.ramp_s + cfg.settle_s + cfg.measure_s + 3.0
    text = _long_text(stream_s)
    target = NativeTarget(url, streams_per_connection=cfg.streams_per_connection,
                          open_timeout_s=60.0, native_sample_rate=cfg.sample_rate)
    await target.open()
    # Blocking the loop here is harmless: no stream runs yet.
    barrier.wait(timeout=cfg.start_timeout_s)
    barrier.wait(timeout=10)
    start = t0.value
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    plan = LevelPlan(mode="concurrency", level=num_streams, seed=0, prompts=(text,),
                     num_requests=num_streams, timeout_s=stream_s * 3 + 60,
                     ramp_s=cfg.ramp_s, stream_prefix=prefix)
    lag: list[tuple[float, float]] = []
    stop = asyncio.Event()
    lag_task = asyncio.create_task(loop_lag(lag, stop))
    level_task = asyncio.create_task(run_level(target, plan))
    a_t = start + cfg.ramp_s + cfg.settle_s
    await asyncio.sleep(max(0.0, a_t - time.monotonic()))
    cpu_a = time.process_time()
    await asyncio.sleep(max(0.0, a_t + cfg.measure_s - time.monotonic()))
    cpu_b = time.process_time()
    traces, _ = await level_task
    stop.set()
    await lag_task
    await target.close()
    for tr in traces:
        tr.pcm = None
    return {"traces": traces, "lag": lag, "cpu_a": cpu_a, "cpu_b": cpu_b}


def _long_text(audio_s: float) -> str:
    """Prompts joined until the synthetic engine would speak them for ``audio_s`` seconds."""
    prompts = load_prompts()
    chars = audio_s * 1000 / MS_PER_CHAR
    out: list[str] = []
    i = 0
    while sum(len(p) + 1 for p in out) < chars:
        out.append(prompts[i % len(prompts)])
        i += 1
    return " ".join(out)


def _summarize(traces: list[StreamTrace], a: dict[str, float], b: dict[str, float],
               lag: list[tuple[float, float]], num_streams: int) -> dict[str, Any]:
    window_s = b["t"] - a["t"]
    added = [r - e for tr in traces if len(tr.chunk_engine_t) == len(tr.chunk_t)
             for r, e in zip(tr.chunk_t, tr.chunk_engine_t) if a["t"] <= r <= b["t"]]
    active = sum(1 for tr in traces if tr.chunk_t and tr.chunk_t[0] <= a["t"]
                 and (tr.t_done or 0) >= b["t"])
    errors: dict[str, int] = {}
    examples: dict[str, str] = {}
    for tr in traces:
        if not tr.is_ok:
            code = tr.error_code or "no_audio"
            errors[code] = errors.get(code, 0) + 1
            examples.setdefault(code, tr.error_message or "")
    cpu = {k: b[k] - a[k] for k in ("gateway", "engine", "client")}
    chunks = len(added)
    return {
        "streams": num_streams,
        "streams_active_whole_window": active,
        "window_s": window_s,
        "chunks_in_window": chunks,
        "chunks_per_s": chunks / window_s,
        "expected_chunks_per_s": num_streams * 1000 / CHUNK_MS,
        "added_latency_ms": distribution(added, scale=1e3),
        "client_loop_lag_ms": distribution([x for t, x in lag if a["t"] <= t <= b["t"]],
                                           scale=1e3),
        "cpu_cores": {k: v / window_s for k, v in cpu.items()},
        "gateway_cpu_per_stream_pct_core": 100 * cpu["gateway"] / window_s / num_streams,
        "gateway_cpu_us_per_chunk": 1e6 * cpu["gateway"] / chunks if chunks else None,
        # What one stream costs the gateway when it keeps real time (25 chunks/s): robust to
        # streams falling behind on an overloaded machine, unlike the per-stream figure above.
        "gateway_cpu_pct_core_per_realtime_stream":
            100 * cpu["gateway"] / chunks * 1000 / CHUNK_MS if chunks else None,
        "errors_by_code": errors,
        "error_examples": examples,
        # Other work on the machine inflates every figure here: say how busy it was.
        "loadavg_1min": [a["load1"], b["load1"]],
    }


def _print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'streams':>7} {'active':>6} {'chunks/s':>9} {'added p50 ms':>12} {'p99 ms':>8} "
          f"{'max ms':>8} {'client lag p99':>14} {'gw CPU %core/stream':>19} "
          f"{'(at real time)':>14} "
          f"{'gw us/chunk':>11} {'gw cores':>8} {'engine':>6} {'client':>6} {'load':>5} errors")
    for r in rows:
        lat = r["added_latency_ms"]
        f = lambda v, d=2: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
        print(f"{r['streams']:>7} {r['streams_active_whole_window']:>6} "
              f"{r['chunks_per_s']:>9.0f} {f(lat['p50']):>12} {f(lat['p99']):>8} "
              f"{f(lat['max']):>8} {f(r['client_loop_lag_ms']['p99']):>14} "
              f"{r['gateway_cpu_per_stream_pct_core']:>19.3f} "
              f"{f(r['gateway_cpu_pct_core_per_realtime_stream'], 3):>14} "
              f"{f(r['gateway_cpu_us_per_chunk'], 1):>11} {r['cpu_cores']['gateway']:>8.2f} "
              f"{r['cpu_cores']['engine']:>6.2f} {r['cpu_cores']['client']:>6.2f} "
              f"{r['loadavg_1min'][1]:>5.1f} {r['errors_by_code'] or ''}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmark.gateway_overhead",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", default="100,500,1000", help="levels, comma-separated")
    p.add_argument("--ramp-s", type=float, default=OverheadConfig.ramp_s)
    p.add_argument("--settle-s", type=float, default=OverheadConfig.settle_s)
    p.add_argument("--measure-s", type=float, default=OverheadConfig.measure_s)
    p.add_argument("--streams-per-connection", type=int, default=1)
    p.add_argument("--sample-rate", type=int, default=None, metavar="HZ",
                   help="each stream asks for this output rate (the gateway resamples; default: the model's)")
    p.add_argument("--client-procs", type=int, default=0,
                   help="client processes (default 0: one per 250 streams, at most CPUs/4)")
    p.add_argument("--server-arg", action="append", default=None,
                   help="extra voxgate serve argument (repeatable; default --lookahead-jobs 0)")
    p.add_argument("--json", dest="json_path")
    args = p.parse_args(argv)
    try:
        levels = tuple(int(x) for x in args.streams.split(",") if x.strip())
        cfg = OverheadConfig(streams=levels, ramp_s=args.ramp_s, settle_s=args.settle_s,
                             measure_s=args.measure_s,
                             streams_per_connection=args.streams_per_connection,
                             sample_rate=args.sample_rate,
                             client_procs=args.client_procs,
                             server_args=tuple(args.server_arg) if args.server_arg is not None
                             else OverheadConfig.server_args)
    except ValueError as exc:
        p.error(str(exc))
    _raise_fd_limit()
    rows: list[dict[str, Any]] = []
    for n in cfg.streams:
        server = ServeProcess(["--model", "synthetic", "--debug-timestamps", "--max-connections", str(n + 16),
                               *cfg.server_args], cfg.start_timeout_s, stop_timeout_s=20.0)
        try:
            num_procs = cfg.num_client_procs(n)
            print(f"level {n}: server {server.url} (pid {server.proc.pid}), "
                  f"{num_procs} client process(es)", file=sys.stderr)
            if num_procs == 1:
                row = _run(run_level_overhead(server.url, server.proc.pid, n, cfg))
                row["client_procs"] = 1
            else:
                row = run_level_overhead_multiproc(server.url, server.proc.pid, n, cfg, num_procs)
        finally:
            server.stop()
        rows.append(row)
        _print_table([row])
        if args.json_path:  # after every level: a run cut short keeps the levels it finished
            _write_json(Path(args.json_path), cfg, rows)
    print()
    _print_table(rows)
    if args.json_path:
        print(f"wrote {args.json_path}")
    return 0


def _write_json(path: Path, cfg: OverheadConfig, rows: list[dict[str, Any]]) -> None:
    from benchmark.bench.report import _git_commit

    out = {"tool": "benchmark.gateway_overhead", "commit": _git_commit(), "machine": {
        "platform": platform.platform(), "cpus": os.cpu_count(),
        "python": platform.python_version()},
        "config": {**cfg.__dict__}, "levels": rows}
    path.write_text(json.dumps(out, indent=1, default=str))


def _run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _raise_fd_limit() -> None:
    """A thousand connections need more descriptors than a default soft limit of 1024."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


if __name__ == "__main__":
    raise SystemExit(main())
