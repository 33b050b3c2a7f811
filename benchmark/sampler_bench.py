"""Cost of the engine's sampler on the GPU at Orpheus' head width, with and without top-p.

Times ``engine.llm.sampler.Sampler`` on random logits [B, 28,673] (the audio ids + stop) with the
position mask and repetition penalty, replayed as a CUDA graph (as in a decode step):

    python -m benchmark.sampler_bench --batch 64,256,512
"""

from __future__ import annotations

import argparse
import statistics

from benchmark.args import list_type, number_type

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=list_type(number_type(int, 1)), default=[64, 256, 512])
    parser.add_argument("--cols", type=int, default=28673)
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args(argv)
    import torch

    from engine.llm.sampler import Sampler

    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    dev = torch.device("cuda")
    print(f"sampler on {torch.cuda.get_device_name()}, {args.cols} columns; CUDA graph replay, median of {args.iters}")
    print(f"{'batch':>6} {'top_p=1 ms':>11} {'top_p=0.95 ms':>14}")
    for b in args.batch:
        logits = torch.randn(b, args.cols, device=dev) * 3
        allowed = torch.rand(b, args.cols, device=dev) < 0.15
        seen = torch.rand(b, args.cols, device=dev) < 0.01
        row = dict(temperature=torch.full((b,), 0.6, device=dev), repetition_penalty=torch.full((b,), 1.1, device=dev),
                   seeds=torch.arange(b, device=dev), steps=torch.zeros(b, dtype=torch.int64, device=dev),
                   seen=seen, allowed=allowed)
        times = []
        for top_p in (1.0, 0.95):
            sampler = Sampler()
            kw = dict(row, top_p=torch.full((b,), top_p, device=dev), any_top_p=top_p < 1)
            sampler(logits, **kw)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                sampler(logits, **kw)
            ts = []
            for _ in range(args.iters):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                g.replay()
                end.record()
                end.synchronize()
                ts.append(start.elapsed_time(end))
            times.append(statistics.median(ts))
        print(f"{b:>6} {times[0]:>11.3f} {times[1]:>14.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
