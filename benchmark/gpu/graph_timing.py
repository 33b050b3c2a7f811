"""Timing a piece of GPU work the way the engine runs it: captured once in a CUDA graph, replayed
(``graph_median_ms``); ``eager_median_ms`` times the same call eagerly, for a tool's CPU smoke run;
``kernel_table`` counts the kernels one eager call launches and lists its ops by device time."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

__all__ = ["eager_median_ms", "graph_median_ms", "kernel_table"]


def eager_median_ms(fn: Callable[[], object], iters: int) -> float:
    """Median milliseconds of ``iters`` eager calls of ``fn`` (wall clock: on the CPU, the work)."""
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def graph_median_ms(fn: Callable[[], object], iters: int) -> float:
    """Median milliseconds of ``iters`` replays of a CUDA graph of ``fn`` (one eager call first)."""
    import torch

    torch.cuda.synchronize()
    with torch.inference_mode():
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def kernel_table(fn: Callable[[], object], top: int) -> tuple[int, str]:
    """(kernels one eager call launches, the profiler's table of its ops by device time)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
    count = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=top, max_name_column_width=70) if top else ""
    return count, table
