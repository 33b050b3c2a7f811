"""Host-side cost of one LM engine step, without the GPU: how much Python work the engine does
per step around the model, at several batch sizes (issue 5: at 64 streams the H200 was 17% busy).

The real ``LMBackend`` (scheduler, Orpheus program with its streaming decoders, output chunking)
runs with the model's forward and sampler replaced by a stub that returns valid audio tokens at
once, and the codec replaced by a stub that returns silence of the right length. What remains is
the host work of a step. Run on the CPU:

    python -m benchmark.engine_host --batch 1,64,256 --steps 200 [--profile 64]
"""

from __future__ import annotations

import argparse
import cProfile
import platform
import pstats
import statistics
import time

import numpy as np
import torch

from benchmark.args import list_type, number_type
from engine.llm.backend import LMBackend
from engine.llm.model_runner import ModelRunner
from engine.llm.page_allocator import PageAllocator
from models.orpheus.program import OrpheusProgram
from engine.llm.scheduler import Scheduler, SchedulerConfig
from models.orpheus.loader import load_orpheus

__all__ = ["main"]


class _StubRunner(ModelRunner):
    """The real runner's host path (metadata, inputs) with no forward and a cheap sampler."""

    def _forward(self, input_ids: torch.Tensor, meta: object) -> torch.Tensor:
        return torch.empty(0)

    def _sample(self, logits: torch.Tensor, batch: object) -> torch.Tensor:
        if not hasattr(self, "_col_of_row"):  # an allowed column per row of the allowed table
            self._col_of_row = [int(np.flatnonzero(row.numpy())[7]) for row in self.allowed_table]
        cols = [self._col_of_row[s.allowed_row] for s in batch.seqs]  # type: ignore[attr-defined]
        return torch.tensor(cols, dtype=torch.int64)


def _silence(requests: list) -> list[np.ndarray]:
    return [np.zeros(r.emit_to - r.emit_from, dtype=np.float32) for r in requests]


def build(batch: int) -> LMBackend:
    model, tokenizer, config = load_orpheus("tiny", device="cpu", dtype=torch.float32,
                                            load_format="dummy", max_seq_len=1280)
    program = OrpheusProgram(tokenizer, codec=None, decode_fn=_silence)
    pages = batch * 80 + 1
    runner = _StubRunner(model, config, device="cpu", dtype=torch.float32, num_pages=pages,
                         page_size=16, max_num_seqs=batch, vocab_ids=program.vocab_ids,
                         allowed_table=program.allowed_table)
    sched = Scheduler(SchedulerConfig(max_num_seqs=batch, max_num_batched_tokens=max(512, batch),
                                      max_model_len=1280, max_waiting=4 * batch),
                      PageAllocator(pages, 16))
    return LMBackend(program, runner, sched)


def measure(batch: int, steps: int, profile: bool) -> dict[str, float]:
    backend = build(batch)
    voice, options = backend.validate(None, {"max_tokens": 1100, "seed": 1})
    for job in range(batch):
        backend.add_job(job, "Hello there, this is a test of the engine host path.", voice, options)
    for _ in range(20):  # prefill, then into steady decode
        backend.step()
    prof = cProfile.Profile() if profile else None
    times = []
    for _ in range(steps):
        if prof:
            prof.enable()
        t0 = time.perf_counter()
        backend.step()
        times.append(time.perf_counter() - t0)
        if prof:
            prof.disable()
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    times.sort()
    return {"batch": batch, "p50_ms": statistics.median(times) * 1e3,
            "p90_ms": times[int(0.9 * len(times))] * 1e3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=list_type(number_type(int, 1)), default=[1, 64, 256])
    parser.add_argument("--steps", type=number_type(int, 10), default=200)
    parser.add_argument("--profile", type=int, default=0, help="cProfile this batch size")
    args = parser.parse_args(argv)
    batches = args.batch
    print(f"host path of one LM engine step (stub model and codec); {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}, torch {torch.__version__}")
    print(f"{'batch':>6} {'p50 ms':>8} {'p90 ms':>8} {'us/seq':>8}")
    for b in batches:
        r = measure(b, args.steps, profile=(b == args.profile))
        print(f"{b:>6} {r['p50_ms']:>8.2f} {r['p90_ms']:>8.2f} {1e3 * r['p50_ms'] / b:>8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
