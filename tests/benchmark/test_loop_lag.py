"""``benchmark.bench.loop_lag``: the client's event-loop lateness."""

from __future__ import annotations

import asyncio
import time

from benchmark.bench.loop_lag import loop_lag


def test_a_blocked_loop_shows_as_lag_and_the_ticker_stops_when_asked() -> None:
    """While a callback holds the loop for 150 ms, the ticker wakes that much late; otherwise
    it wakes about on time; it returns once ``stop`` is set."""

    async def scenario() -> list[tuple[float, float]]:
        samples: list[tuple[float, float]] = []
        stop = asyncio.Event()
        task = asyncio.create_task(loop_lag(samples, stop, period_s=0.005))
        while len(samples) < 3:  # let it tick
            await asyncio.sleep(0)
        time.sleep(0.15)  # a client busy for 150 ms without yielding (the lag under test)
        n = len(samples)
        while len(samples) == n:
            await asyncio.sleep(0)
        stop.set()
        await asyncio.wait_for(task, 1.0)
        return samples

    samples = asyncio.run(scenario())
    lateness = [x for _, x in samples]
    assert max(lateness) >= 0.1 and min(lateness) >= 0.0
    assert [t for t, _ in samples] == sorted(t for t, _ in samples)
