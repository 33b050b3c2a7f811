"""Load generation: fixed-concurrency and open-loop arrivals, the prompt schedule, text pacing and
the level driver; everything random comes from the seed (docs/benchmark.md, "Load")."""

from __future__ import annotations

import asyncio
import math
import random
import re
import time
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from benchmark.bench.trace import StreamTrace

__all__ = [
    "REFUSAL_BACKOFF_S",
    "Target",
    "LevelPlan",
    "gamma_arrivals",
    "prompt_index",
    "text_pieces",
    "CapacitySearch",
    "run_level",
]


# Concurrency mode: a worker whose stream was refused (the server is full) waits the server's
# retry hint, within these bounds (the default: without a hint), before its next stream, as a
# well-behaved client would; without a wait it would retry at once, a storm of refusals.
REFUSAL_BACKOFF_S = {"default": 1.0, "min": 0.05, "max": 5.0}


class Target(Protocol):
    """A server under test. ``run_stream`` fills ``trace`` in and must not raise for server
    misbehaviour (it records it with ``trace.fail``)."""

    name: str
    info: dict

    async def open(self) -> None: ...

    async def run_stream(self, trace: StreamTrace, pieces: list[str],
                         token_rate: float | None) -> None: ...

    async def close(self) -> None: ...


def gamma_arrivals(rate: float, *, seed: int, shape: float = 1.0, count: int | None = None,
                   duration_s: float | None = None) -> list[float]:
    """Arrival offsets (seconds from the level's start): ``count`` of them, or all before
    ``duration_s``. Gaps are gamma(shape, 1/(shape*rate)): mean 1/rate, CV 1/sqrt(shape)."""
    if rate <= 0 or shape <= 0:
        raise ValueError(f"rate and shape must be > 0, got rate={rate}, shape={shape}")
    if (count is None) == (duration_s is None):
        raise ValueError("give exactly one of count and duration_s")
    rng = np.random.default_rng(seed)
    scale = 1.0 / (shape * rate)
    if count is not None:
        return np.cumsum(rng.gamma(shape, scale, size=count)).tolist()
    out: list[float] = []
    t = 0.0
    while True:
        t += float(rng.gamma(shape, scale))
        if t >= duration_s:
            return out
        out.append(t)


def prompt_index(i: int, num_prompts: int, seed: int) -> int:
    """The prompt of the i-th stream: a fresh seeded shuffle of the set every ``num_prompts``
    streams, so each prompt is used equally often and the order does not depend on timing."""
    cycle, pos = divmod(i, num_prompts)
    order = list(range(num_prompts))
    random.Random(f"voxgate-bench:{seed}:{cycle}").shuffle(order)
    return order[pos]


def text_pieces(text: str, *, streamed: bool) -> list[str]:
    """The text as sent: whole, or word by word (each word with its trailing space), as an LLM
    would emit tokens. Joining the pieces gives the text back (less trailing whitespace)."""
    text = text.strip()
    if not streamed:
        return [text]
    return re.findall(r"\S+\s*", text)


class CapacitySearch:
    """Which concurrency to try next when searching for capacity (pure: no I/O).

    Doubles from ``start`` while levels pass (up to ``max_level``), then bisects between the
    highest pass and the lowest failure until they are within ``max(1, resolution * pass)``.
    Assumes that passing is monotone in load.
    """

    def __init__(self, *, start: int = 1, max_level: int = 1024, growth: float = 2.0,
                 resolution: float = 0.05) -> None:
        if start < 1 or max_level < start:
            raise ValueError(f"need 1 <= start <= max_level, got {start}, {max_level}")
        if growth <= 1 or not 0 <= resolution < 1:
            raise ValueError("growth must be > 1 and resolution in [0, 1)")
        self.start, self.max_level = start, max_level
        self.growth, self.resolution = growth, resolution
        self.highest_pass = 0  # 0: nothing passed yet
        self.lowest_fail: int | None = None
        self.tried: list[tuple[int, bool]] = []

    def record(self, level: int, passed: bool) -> None:
        self.tried.append((level, passed))
        if passed:
            self.highest_pass = max(self.highest_pass, level)
        else:
            self.lowest_fail = level if self.lowest_fail is None else min(self.lowest_fail, level)

    def next_level(self) -> int | None:
        """The next concurrency to run, or ``None`` when the search is over."""
        if self.lowest_fail is None:
            if not self.tried:
                return self.start
            if self.highest_pass >= self.max_level:
                return None
            return min(self.max_level, max(self.highest_pass + 1,
                                           math.ceil(self.highest_pass * self.growth)))
        lo, hi = self.highest_pass, self.lowest_fail
        if hi - lo <= max(1, int(self.resolution * lo)):
            return None
        return (lo + hi) // 2

    @property
    def result(self) -> int | None:
        return self.highest_pass or None


@dataclass(frozen=True)
class LevelPlan:
    mode: str  # "concurrency" or "rate"
    level: float
    seed: int
    prompts: tuple[str, ...]
    num_requests: int | None = None
    duration_s: float | None = None
    token_rate: float | None = None  # None: all text at once
    timeout_s: float = 120.0
    ramp_s: float = 0.0  # concurrency mode: spread the workers' first starts over this long
    arrival_shape: float = 1.0
    stream_prefix: str = "s"


async def run_level(target: Target, plan: LevelPlan,
                    on_stream_done: Callable[[StreamTrace], None] | None = None,
                    ) -> tuple[list[StreamTrace], float]:
    """Run one load level; returns the traces (in start order) and the level's wall seconds
    (first start to last finish)."""
    if (plan.num_requests is None) == (plan.duration_s is None):
        raise ValueError("a level is bounded by exactly one of num_requests and duration_s")
    traces: list[StreamTrace] = []
    t0 = time.monotonic()
    deadline = t0 + plan.duration_s if plan.duration_s is not None else None

    async def one(i: int) -> StreamTrace:
        idx = prompt_index(i, len(plan.prompts), plan.seed)
        trace = StreamTrace(stream_id=f"{plan.stream_prefix}{i}", prompt_index=idx,
                            text=plan.prompts[idx], level=plan.level)
        traces.append(trace)
        trace.t_start = time.monotonic()
        pieces = text_pieces(trace.text, streamed=plan.token_rate is not None)
        try:
            await asyncio.wait_for(target.run_stream(trace, pieces, plan.token_rate),
                                   plan.timeout_s)
        except TimeoutError:
            trace.fail("timeout", f"no `done` within {plan.timeout_s} s", time.monotonic())
        except Exception as exc:  # a client bug must not end the run; it is reported per stream
            trace.fail("client_error", f"{type(exc).__name__}: {exc}", time.monotonic())
        if on_stream_done is not None:
            on_stream_done(trace)
        return trace

    if plan.mode == "concurrency":
        counter = iter(range(10**12))
        workers = int(plan.level)

        async def worker(w: int) -> None:
            if plan.ramp_s > 0:
                await asyncio.sleep(plan.ramp_s * w / workers)
            while True:
                i = next(counter)
                if plan.num_requests is not None and i >= plan.num_requests:
                    return
                if deadline is not None and time.monotonic() >= deadline:
                    return
                trace = await one(i)
                if trace.is_refused:
                    b = REFUSAL_BACKOFF_S
                    wait = min(max(trace.retry_after_s or b["default"], b["min"]), b["max"])
                    if deadline is not None:
                        wait = min(wait, max(0.0, deadline - time.monotonic()))
                    await asyncio.sleep(wait)

        await asyncio.gather(*(worker(w) for w in range(workers)))
    elif plan.mode == "rate":
        offsets = gamma_arrivals(plan.level, seed=plan.seed, shape=plan.arrival_shape,
                                 count=plan.num_requests, duration_s=plan.duration_s)
        tasks = []
        for i, off in enumerate(offsets):
            delay = t0 + off - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
    else:
        raise ValueError(f"unknown load mode {plan.mode!r}")
    t_end = max((t.t_done for t in traces if t.t_done is not None), default=time.monotonic())
    return traces, max(0.0, t_end - t0)
