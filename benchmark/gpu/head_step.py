"""A program's token head alone on a GPU: ``head.sample`` for B rows, replayed in a CUDA graph.

    python -m benchmark.gpu.head_step --model csm --batch 1,64,256 [--sampler-kernel triton] [--json OUT]

The head is what a frame model runs after its backbone every step (CSM's 31-codebook depth
decoder, Qwen3-TTS's code predictor, Kyutai's depformer, VoxCPM2's flow-matching steps, each
with its sampling), sampled as the decode graphs sample it (top-k and top-p set, no host
hints). The hidden state is random and the head's per-slot state is what the build left: a
timing, not a generation. Run it from two checkouts on one machine to compare two versions of
a head (benchmark/gpu/README.md). GPU only.
"""

from __future__ import annotations

import argparse
import json
import sys

from benchmark.gpu.graph_timing import graph_median_ms, kernel_table

__all__ = ["main"]

# The width of what each model's forward hands its head, at its default checkpoint (VoxCPM2's
# forward hands over the LM's and the residual LM's states side by side).
HIDDEN = {"csm": 2048, "qwen3-tts": 2048, "kyutai-tts": 2048, "voxcpm2": 4096}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, choices=sorted(HIDDEN), help="a --model name")
    p.add_argument("--batch", default="1,64,256", help="rows, comma-separated")
    p.add_argument("--steps", type=int, default=100, help="frames each row has generated (past any delay)")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--label", default="", help="a name for this checkout in the output")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--kernels", type=int, default=0, help="at this batch size, the head's top ops")
    p.add_argument("--top", type=int, default=15, help="ops listed with --kernels")
    p.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                   help="a model setting (voxgate serve --model-setting), repeatable")
    p.add_argument("--sampler-kernel", default="auto", choices=("auto", "torch", "triton"),
                   help="the runtime sampler's draw (voxgate serve --sampler-kernel; auto: the model's default)")
    args = p.parse_args(argv)
    import torch

    from engine.llm.build import build_lm_backend
    from engine.llm.token_head import RowInputs
    from models.registry import load_factory, resolve

    if not torch.cuda.is_available():
        print("head_step needs a CUDA GPU", file=sys.stderr)
        return 2
    batches = [int(x) for x in args.batch.split(",")]
    resolved = resolve(args.model)
    backend = build_lm_backend(load_factory(resolved.entry), resolved.model_id, device="cuda", load_format="dummy",
                               warmup=False, max_num_seqs=max(batches), num_pages=1024,
                               sampler_kernel=args.sampler_kernel,
                               **dict(kv.split("=", 1) for kv in args.setting))
    head = backend.runner.head
    from engine.llm.sampler import Sampler

    args.sampler_kernel = Sampler.kernel  # (what "auto" became: the label says what ran)
    dev, dtype = torch.device("cuda"), torch.bfloat16
    rows = {}
    for b in batches:
        i64 = torch.int64
        r = RowInputs(temperature=torch.full((b,), 0.9, device=dev), top_p=torch.full((b,), 0.95, device=dev),
                      repetition_penalty=torch.ones(b, device=dev),
                      seeds=torch.arange(b, dtype=i64, device=dev), steps=torch.full((b,), args.steps, dtype=i64, device=dev),
                      rows=torch.arange(b, dtype=i64, device=dev), allowed_rows=torch.zeros(b, dtype=i64, device=dev),
                      keep=torch.ones(b, dtype=torch.bool, device=dev),
                      top_k=torch.full((b,), 50, dtype=i64, device=dev))
        hidden = torch.randn(b, HIDDEN[args.model], dtype=dtype, device=dev)
        rows[b] = graph_median_ms(lambda: head.sample(hidden, r), args.iters)  # noqa: B023
        print(f"{args.label or args.model} (sampler {args.sampler_kernel}{''.join(' ' + kv for kv in args.setting)}): {b} rows: head.sample {rows[b]:.2f} ms (median of {args.iters} replays)",
              flush=True)
        if b == args.kernels:
            count, table = kernel_table(lambda: head.sample(hidden, r), args.top)  # noqa: B023
            print(f"{b} rows, one eager call: {count} kernels\n{table}", flush=True)
    name = torch.cuda.get_device_name()
    uuid = str(getattr(torch.cuda.get_device_properties(0), "uuid", ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "label": args.label, "gpu": name, "uuid": uuid,
                       "head_ms": {str(k): v for k, v in rows.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
