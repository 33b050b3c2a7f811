"""Host cost of one ``Scheduler.schedule()`` call with many running sequences (CPU only).

With asynchronous steps the scheduler runs while the device works on the previous step, but it
is still host time every step, with 256-512 running sequences under load:

    python -m benchmark.scheduler_bench --running 256,512
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--running", default="256,512")
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)
    try:
        sizes = [int(x) for x in args.running.split(",")]
    except ValueError:
        parser.error(f"--running must be comma-separated integers, got {args.running!r}")
    if any(n < 1 for n in sizes) or args.calls < 1:
        parser.error("--running sizes and --calls must be >= 1")
    print(f"Scheduler.schedule() on {platform.machine()}, Python {platform.python_version()}; "
          f"median of {args.calls} calls")
    for n in sizes:
        print(f"{n:>6} running: {measure(n, args.calls):.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
