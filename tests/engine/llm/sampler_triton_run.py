"""Run by tests/engine/llm/test_sample_triton.py in the Triton venv with TRITON_INTERPRET=1: the
runtime sampler with ``kernel = "triton"`` against itself with ``"torch"`` on the same rows.
Prints one JSON object."""

from __future__ import annotations

import json
import os

import torch

assert os.environ.get("TRITON_INTERPRET") == "1"
from engine.llm.sampler import Sampler  # noqa: E402

g = torch.Generator().manual_seed(0)
out: dict = {"cases": {}}
# rows: greedy, temperature 0.7 / 1.3, top-k 0 (off) / 5 / 50 / over the width, top-p 1 / 0.8 / 0.3;
# a width not a power of two; a column masked off; bf16-rounded logits (ties at the k-th value)
b = 8
temperature = torch.tensor([0.0, 0.7, 1.3, 0.7, 1.0, 0.9, 0.7, 1.1])
top_p = torch.tensor([1.0, 1.0, 0.8, 0.3, 1.0, 0.95, 0.5, 1.0])
top_k = torch.tensor([0, 0, 5, 50, 3000, 1, 50, 20])
for v, rounded, with_k, steps in ((2048, False, True, 1), (300, True, True, 2), (300, False, False, 2),
                                  (97, True, True, 2)):  # (2,048-wide sorts take seconds here)
    for step in range(steps):
        logits = torch.randn(b, v, generator=g) * 2
        if rounded:
            logits = logits.to(torch.bfloat16).float()
        allowed = torch.ones(b, v, dtype=torch.bool)
        allowed[:, 7] = False
        kw = dict(temperature=temperature, top_p=top_p, top_k=top_k if with_k else None,
                  repetition_penalty=torch.full((b,), 1.1), seeds=torch.arange(b) + 11,
                  steps=torch.full((b,), step), seen=torch.rand(b, v, generator=g) < 0.1, allowed=allowed, salt=3)
        ids = {}
        for kernel in ("torch", "triton"):
            s = Sampler()
            s.kernel = kernel
            ids[kernel] = s(logits, **kw).tolist()
        out["cases"][f"{v}{' bf16' if rounded else ''}{' top-k' if with_k else ''} step {step}"] = [ids["torch"], ids["triton"]]
print(json.dumps(out))
