"""Run by tests/models/kyutai_tts/test_draw_select.py in the Triton venv with TRITON_INTERPRET=1:
the top-k draw by bisection (``kyutai_sampling=triton-select``) against ``sampling.top_k_draw``
and the sorting kernel, on logits with and without ties, greedy rows, rows with and without
top-p side by side, Kyutai's audio and text widths. Prints one JSON object."""

from __future__ import annotations

import json
import os

import torch

assert os.environ.get("TRITON_INTERPRET") == "1"
from models.kyutai_tts.draw_triton import top_k_draw_triton, top_k_select_triton  # noqa: E402
from models.kyutai_tts.sampling import top_k_draw  # noqa: E402

g = torch.Generator().manual_seed(0)
cases = {}
# (rows, width, k, logit scale, rounded to bfloat16: many equal values, ties at the k-th; whether
# rows with top-p go beside those without, and whether the sorting kernel runs too: its sort is
# slow in the interpreter)
for b, v, k, scale, bf16, mixed, by_sort in ((4, 2048, 250, 3.0, False, False, True), (4, 2048, 250, 3.0, True, True, False),
                                             (3, 2048, 25, 0.5, True, False, False), (2, 8001, 25, 4.0, True, False, False),
                                             (3, 100, 25, 1.0, False, True, True), (2, 37, 64, 1.0, False, True, True),
                                             (3, 300, 300, 2.0, True, False, True)):
    logits = torch.randn(b, v, generator=g) * scale
    if bf16:
        logits = logits.to(torch.bfloat16)
    div = torch.rand(b, 1, generator=g) + 0.5
    noise = -torch.log(-torch.log(torch.rand(b, v, generator=g)))
    noise[0], div[0] = 0.0, 1.0  # a greedy row: its largest logit, the lowest column among equals
    top_ps = {"off": torch.full((b, 1), float("inf"))}
    if mixed:
        top_ps["mixed"] = torch.tensor([[float("inf")], [0.8], [float("inf")], [0.3]])[:b]
    for name, top_p in top_ps.items():
        want = top_k_draw(logits, k, div, noise, top_p)
        sorted_ids = top_k_draw_triton(logits, k, div, noise, top_p) if by_sort else want
        got = top_k_select_triton(logits, k, div, noise, top_p)
        cases[f"{b}x{v} k={k} bf16={bf16} top_p={name}"] = [want.tolist(), sorted_ids.tolist(), got.tolist()]
# ties at the k-th value on purpose: 40 columns of one value around the cut, the draw greedy
logits = torch.zeros(2, 512)
logits[:, :100] = 5.0
logits[:, 200:240] = 1.0  # k = 120: 100 above, 20 of the 40 equal ones kept (the lowest columns)
noise = torch.zeros(2, 512)
noise[1, 230], noise[1, 205] = 10.0, 9.0  # row 1: column 205 (kept) wins, 230 (not kept) may not
div, top_p = torch.ones(2, 1), torch.full((2, 1), float("inf"))
cases["ties at the k-th"] = [top_k_draw(logits, 120, div, noise, top_p).tolist(),
                             top_k_draw_triton(logits, 120, div, noise, top_p).tolist(),
                             top_k_select_triton(logits, 120, div, noise, top_p).tolist()]
print(json.dumps({"cases": cases}))
