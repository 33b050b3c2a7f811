"""How late the client's own event loop wakes (a 10 ms ticker): a lagging load client makes every
chunk look late, so the benchmark reports it beside its figures (docs/benchmark.md, "Output")."""

from __future__ import annotations

import asyncio
import time

__all__ = ["LAG_WARN_MS", "loop_lag"]

LAG_WARN_MS = 50.0  # a report flags a level whose client lag p99 is above this


async def loop_lag(samples: list[tuple[float, float]], stop: asyncio.Event, *, period_s: float = 0.01) -> None:
    """Append (monotonic time, lateness in s) every ``period_s`` until ``stop`` is set."""
    while not stop.is_set():
        t = time.monotonic()
        await asyncio.sleep(period_s)
        now = time.monotonic()
        samples.append((now, max(0.0, now - t - period_s)))
