"""Host cost of two per-step parts of the LM engine with many running sequences (CPU only):
``Scheduler.schedule()`` and ``DecodeInputBuilder.build`` (a graphed decode step's inputs).

With asynchronous steps they run while the device works on the previous step, but they are
still host time every step, with 256-512 running sequences under load:

    python -m benchmark.host_parts --running 256,512
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

from benchmark.args import list_type, number_type

__all__ = ["main"]


def measure(running: int, calls: int) -> float:
    """Median ms of ``schedule()`` with ``running`` decoding sequences (deadlines spread over 2 s,
    the CUDA defaults: decode cap 256, horizon 1 s, fill 64)."""
    from engine.llm.page_allocator import PageAllocator
    from engine.llm.scheduler import Scheduler, SchedulerConfig
    from engine.llm.sequence import SamplingParams, Sequence

    sched = Scheduler(SchedulerConfig(max_num_seqs=running, max_num_batched_tokens=running + 512, max_model_len=2048,
                                      max_waiting=running, max_num_decode_seqs=256, decode_horizon_s=1.0,
                                      decode_fill_seqs=64),
                      PageAllocator(max(running, 8) * 30, 16), clock=lambda: 100.0)
    for i in range(running):
        sched.add(Sequence(i, list(range(1, 60)), SamplingParams(max_tokens=400)))
    for seq in sched.running:  # each one decoding: 10 tokens out, the last one not yet computed
        seq.output_ids = [5] * 10
        seq.num_computed_tokens = 68
        sched.set_deadline(seq.seq_id, 100.0 + (seq.seq_id % 20) * 0.1)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        sched.schedule()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def measure_decode_inputs(rows: int, calls: int) -> float:
    """Median ms of ``DecodeInputBuilder.build`` for ``rows`` decode rows of 158-token contexts."""
    from engine.llm.decode_inputs import DecodeInputBuilder
    from engine.llm.sequence import SamplingParams, Sequence

    builder = DecodeInputBuilder(max_num_seqs=rows, max_pages_per_seq=128, page_size=16, scratch_page=rows * 30)
    seqs = []
    for i in range(rows):
        seq = Sequence(i, list(range(1, 60)), SamplingParams(seed=i), slot=i, pages=list(range(i * 30, i * 30 + 30)))
        seq.output_ids = [5] * 100
        seq.num_computed_tokens = 158
        seqs.append(seq)
    sampled = [True] * rows
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        builder.build(seqs, rows, sampled)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--running", type=list_type(number_type(int, 1)), default=[256, 512])
    parser.add_argument("--calls", type=number_type(int, 1), default=2000)
    args = parser.parse_args(argv)
    print(f"host parts of an LM step on {platform.machine()}, Python {platform.python_version()}; "
          f"median of {args.calls} calls, ms")
    print(f"{'running':>8} {'schedule':>9} {'decode inputs':>14}")
    for n in args.running:
        print(f"{n:>8} {measure(n, args.calls):>9.3f} {measure_decode_inputs(n, args.calls):>14.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
