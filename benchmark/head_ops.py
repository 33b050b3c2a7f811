"""How many kernels a program's token head launches per step, counted on the CPU.

    python -m benchmark.head_ops csm-tiny kyutai-tts-tiny qwen3-tts-tiny voxcpm2-tiny

A frame model's head (a depth decoder or code predictor stepping through a frame's codebooks,
a flow-matching solver) runs inside a CUDA graph, where a small kernel costs about the same
whatever it computes: its step time follows the number of kernels more than their work
(docs/performance.md, "Frame heads alone"). This counts the operators one ``head.sample`` call
dispatches (torch.profiler, top-level operators that are not views), sampled as the decode
graphs sample (top-k and top-p set, no host hints), on random weights. On the GPU each is one
kernel or a few; a cast to the same dtype, counted here, launches none.
"""

from __future__ import annotations

import argparse
import collections
import sys
from dataclasses import dataclass

__all__ = ["HeadOps", "count_head_ops", "main"]

# Operators that only make views (or nothing) and launch no kernel.
_VIEWS = frozenset(
    f"aten::{n}" for n in (
        "view", "slice", "select", "unsqueeze", "squeeze", "transpose", "permute", "reshape", "alias",
        "expand", "t", "as_strided", "lift_fresh", "detach", "_unsafe_view", "empty", "empty_like",
        "chunk", "split", "unbind", "narrow",
    )
)


@dataclass
class HeadOps:
    model: str
    hidden: int  # the width of the hidden state the head takes
    ops: int  # operators one head.sample call dispatched
    kinds: list[tuple[str, int]]  # the most frequent, with their counts


def _row_inputs(b: int):  # noqa: ANN202
    import torch

    from engine.llm.token_head import RowInputs

    i64 = torch.int64
    return RowInputs(temperature=torch.full((b,), 0.9), top_p=torch.full((b,), 0.95),
                     repetition_penalty=torch.ones(b), seeds=torch.arange(b, dtype=i64),
                     steps=torch.full((b,), 100, dtype=i64), rows=torch.arange(b, dtype=i64),
                     allowed_rows=torch.zeros(b, dtype=i64), keep=torch.ones(b, dtype=torch.bool),
                     top_k=torch.full((b,), 50, dtype=i64))


def count_head_ops(model: str, *, rows: int = 1) -> HeadOps:
    """Build ``model`` (a --model name) on the CPU with random weights and count one
    ``head.sample`` call over ``rows`` rows (after one call to warm up)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from engine.llm.build import build_lm_backend
    from models.registry import load_factory, resolve

    res = resolve(model)
    backend = build_lm_backend(load_factory(res.entry), res.model_id, device="cpu", load_format="dummy",
                               warmup=False, max_num_seqs=max(rows, 4), num_pages=1024, max_model_len=512)
    head, r = backend.runner.head, _row_inputs(rows)
    hidden = _hidden_width(head, r, rows)
    x = torch.randn(rows, hidden)
    with torch.inference_mode():
        head.sample(x, r)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            head.sample(x, r)
    top = [e.name for e in prof.events() if e.cpu_parent is None and e.name not in _VIEWS]
    return HeadOps(model, hidden, len(top), collections.Counter(top).most_common(8))


def _hidden_width(head, r, rows: int) -> int:  # noqa: ANN001
    """The hidden width the head accepts: the program does not say, so try the usual ones."""
    import torch

    last: Exception | None = None
    for width in (16, 32, 48, 64, 96, 128, 192, 256, 512, 1024, 2048, 4096):
        try:
            with torch.inference_mode():
                head.sample(torch.randn(rows, width), r)
            return width
        except RuntimeError as e:  # a shape mismatch
            last = e
    raise ValueError(f"no hidden width fits this head: {last}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmark.head_ops", description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", help="--model names (tiny ones build in seconds)")
    p.add_argument("--rows", type=int, default=1)
    args = p.parse_args(argv)
    for m in args.models:
        c = count_head_ops(m, rows=args.rows)
        kinds = ", ".join(f"{k.removeprefix('aten::')} {n}" for k, n in c.kinds)
        print(f"{c.model}: {c.ops} operators per head.sample at {args.rows} row(s) (hidden {c.hidden}); {kinds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
