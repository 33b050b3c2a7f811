"""Load generation: arrival statistics, the seeded prompt schedule, text pacing, the capacity
search, and the level driver against an in-process fake target."""

from __future__ import annotations

import asyncio
import math
from collections import Counter

import numpy as np
import pytest

from benchmark.bench.load import (
    CapacitySearch,
    LevelPlan,
    gamma_arrivals,
    prompt_index,
    run_level,
    text_pieces,
)
from benchmark.bench.pcm import PcmDecoder, WavStreamDecoder
from benchmark.bench.trace import StreamTrace


@pytest.mark.parametrize("shape", [1.0, 4.0, 0.5])
def test_gamma_arrivals_mean_rate_and_cv(shape: float) -> None:
    """Gaps have mean 1/rate and coefficient of variation 1/sqrt(shape)."""
    offsets = np.array(gamma_arrivals(8.0, seed=1, shape=shape, count=20_000))
    gaps = np.diff(np.concatenate([[0.0], offsets]))
    assert gaps.mean() == pytest.approx(1 / 8.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(shape), rel=0.05)


def test_poisson_counts_per_window_have_variance_equal_to_mean() -> None:
    """Shape 1 is a Poisson process: arrivals per second are Poisson (variance = mean)."""
    offsets = np.array(gamma_arrivals(5.0, seed=7, duration_s=4000.0))
    counts = np.bincount(offsets.astype(int), minlength=4000)
    assert counts.mean() == pytest.approx(5.0, rel=0.03)
    assert counts.var() / counts.mean() == pytest.approx(1.0, rel=0.1)


def test_arrivals_are_seeded_and_bounded() -> None:
    """The same seed gives the same offsets; duration bounds them; bad arguments raise."""
    assert gamma_arrivals(3.0, seed=5, count=50) == gamma_arrivals(3.0, seed=5, count=50)
    assert gamma_arrivals(3.0, seed=5, count=50) != gamma_arrivals(3.0, seed=6, count=50)
    within = gamma_arrivals(3.0, seed=5, duration_s=10.0)
    assert within and max(within) < 10.0
    assert within == sorted(within)
    with pytest.raises(ValueError):
        gamma_arrivals(0.0, seed=0, count=3)
    with pytest.raises(ValueError):
        gamma_arrivals(1.0, seed=0, count=3, duration_s=1.0)


def test_prompt_schedule_is_seeded_and_balanced() -> None:
    """Each cycle is a permutation of the set; seeds change the order, not the balance."""
    n = 7
    first = [prompt_index(i, n, seed=3) for i in range(3 * n)]
    assert first == [prompt_index(i, n, seed=3) for i in range(3 * n)]
    assert Counter(first) == {k: 3 for k in range(n)}
    assert sorted(first[:n]) == list(range(n))
    assert first != [prompt_index(i, n, seed=4) for i in range(3 * n)]


def test_text_pieces_whole_or_word_by_word() -> None:
    """Streamed pieces are words with their trailing space and join back to the text."""
    text = "Hello, world! It's 9:30. "
    assert text_pieces(text, streamed=False) == ["Hello, world! It's 9:30."]
    pieces = text_pieces(text, streamed=True)
    assert pieces == ["Hello, ", "world! ", "It's ", "9:30."]
    assert "".join(pieces) == text.strip()


def _drive(search: CapacitySearch, true_capacity: int) -> list[int]:
    tried = []
    while (level := search.next_level()) is not None:
        tried.append(level)
        search.record(level, level <= true_capacity)
    return tried


def test_capacity_search_doubles_then_bisects_to_the_capacity() -> None:
    """With resolution 0 the search lands exactly on the true capacity."""
    search = CapacitySearch(start=1, max_level=1024, resolution=0.0)
    tried = _drive(search, 300)
    assert tried[:10] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert search.result == 300
    assert len(tried) <= 10 + 9


def test_capacity_search_resolution_and_limits() -> None:
    """Coarser resolution stops early within bounds; all passing stops at max; a failing start
    bisects down; nothing passing gives None."""
    s = CapacitySearch(start=1, max_level=1024, resolution=0.05)
    _drive(s, 300)
    assert s.result is not None and 300 * 0.95 <= s.result <= 300
    s = CapacitySearch(start=4, max_level=100)
    _drive(s, 10_000)
    assert s.result == 100
    s = CapacitySearch(start=64, max_level=1024, resolution=0.0)
    _drive(s, 5)
    assert s.result == 5
    s = CapacitySearch(start=1)
    assert _drive(s, 0) == [1] and s.result is None
    with pytest.raises(ValueError):
        CapacitySearch(start=0)


class FakeTarget:
    """Answers each stream with 100 ms chunks after a delay; stream ids containing a listed
    index fail, raise, or hang. Tracks the maximum number of streams in flight."""

    name = "fake"
    info: dict = {}

    def __init__(self, *, fail: set[int] = frozenset(), crash: set[int] = frozenset(),
                 hang: set[int] = frozenset(), refuse: set[int] = frozenset()) -> None:
        self.fail, self.crash, self.hang, self.refuse = fail, crash, hang, refuse
        self.in_flight = 0
        self.max_in_flight = 0

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def run_stream(self, trace: StreamTrace, pieces: list[str],
                         token_rate: float | None) -> None:
        i = int(trace.stream_id.rsplit("-", 1)[-1])
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            loop = asyncio.get_running_loop()
            trace.sample_rate = 1000
            trace.t_first_text = trace.t_end_input = loop.time()
            if i in self.hang:
                await asyncio.Event().wait()
            if i in self.crash:
                raise RuntimeError("client bug")
            if i in self.refuse:
                trace.fail("capacity", "server at capacity", loop.time())
                trace.retry_after_s = 0.05
                return
            await asyncio.sleep(0)
            trace.add_chunk(loop.time(), 100)
            if i in self.fail:
                trace.fail("engine_restarted", "engine died", loop.time())
                return
            trace.done_reason = "end"
            trace.t_done = loop.time()
        finally:
            self.in_flight -= 1


def _plan(**kw: object) -> LevelPlan:
    base = dict(mode="concurrency", level=3, seed=0, prompts=("a b", "c d e"), num_requests=10,
                stream_prefix="t-")
    base.update(kw)
    return LevelPlan(**base)  # type: ignore[arg-type]


def test_run_level_fixed_concurrency_runs_count_with_bounded_concurrency() -> None:
    """Ten streams at concurrency 3: all run, never more than 3 at once, in start order."""
    target = FakeTarget()
    traces, wall_s = asyncio.run(run_level(target, _plan()))
    assert [t.stream_id for t in traces] == [f"t-{i}" for i in range(10)]
    assert target.max_in_flight == 3
    assert all(t.is_ok for t in traces) and wall_s >= 0


def test_run_level_records_failures_crashes_and_timeouts_per_stream() -> None:
    """Server errors, client exceptions and hung streams become per-stream errors; the run
    finishes."""
    target = FakeTarget(fail={1}, crash={2}, hang={3})
    done: list[str] = []
    traces, _ = asyncio.run(run_level(target, _plan(num_requests=6, timeout_s=0.2),
                                      on_stream_done=lambda t: done.append(t.stream_id)))
    codes = {t.stream_id: t.error_code for t in traces}
    assert codes == {"t-0": None, "t-1": "engine_restarted", "t-2": "client_error",
                     "t-3": "timeout", "t-4": None, "t-5": None}
    assert sorted(done) == sorted(codes)


def test_a_refused_worker_waits_the_retry_hint_before_its_next_stream() -> None:
    """Concurrency mode: after a `capacity` refusal the worker waits the server's
    retry_after_s before it starts another stream (no storm of retries)."""
    target = FakeTarget(refuse={0})
    traces, _ = asyncio.run(run_level(target, _plan(level=1, num_requests=3)))
    assert traces[0].is_refused and traces[0].retry_after_s == 0.05
    assert traces[1].t_start - traces[0].t_done >= 0.05  # type: ignore[operator]
    assert traces[1].is_ok and traces[2].is_ok


def test_run_level_rate_mode_starts_every_arrival() -> None:
    """Open-loop arrivals at a high rate start the requested number of streams."""
    target = FakeTarget()
    traces, _ = asyncio.run(run_level(target, _plan(mode="rate", level=500.0, num_requests=12)))
    assert len(traces) == 12 and all(t.is_ok for t in traces)


def test_run_level_duration_bound_stops_starting_streams() -> None:
    """A duration-bounded level stops starting streams once the duration has passed."""
    target = FakeTarget()
    traces, _ = asyncio.run(run_level(
        target, _plan(mode="rate", level=200.0, num_requests=None, duration_s=0.05)))
    expected = len(gamma_arrivals(200.0, seed=0, duration_s=0.05))
    assert len(traces) == expected


def test_pcm_decoder_counts_whole_frames_across_reads() -> None:
    """Raw s16 PCM split mid-sample still counts each sample once."""
    dec = PcmDecoder(sample_rate=24000)
    counts = [dec.feed(b"\x00" * n)[0] for n in (3, 1, 5, 7)]
    assert counts == [1, 1, 2, 4]


def test_wav_stream_decoder_parses_split_header_and_placeholder_size() -> None:
    """A streamed WAV (data size 0xFFFFFFFF, extra LIST chunk) fed byte by byte."""
    import struct

    fmt = struct.pack("<HHIIHH", 1, 1, 22050, 22050 * 2, 2, 16)
    body = (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE" + b"fmt " + struct.pack("<I", 16)
            + fmt + b"LIST" + struct.pack("<I", 3) + b"abc\x00" + b"data"
            + struct.pack("<I", 0xFFFFFFFF) + b"\x01\x00" * 10)
    dec = WavStreamDecoder()
    total = sum(dec.feed(body[i:i + 1])[0] for i in range(len(body)))
    assert total == 10
    assert (dec.sample_rate, dec.format) == (22050, "pcm_s16le")
    with pytest.raises(ValueError):
        WavStreamDecoder().feed(b"<html>not a wav</html>")
