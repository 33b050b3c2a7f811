"""Run by tests/engine/llm/test_kv_write_triton.py in the Triton venv with TRITON_INTERPRET=1:
``kv_write_triton.write_kv_triton`` against ``attention.write_kv``'s index_put on the same
caches: Orpheus-3B's 8 KV heads of 128 and small layouts, bfloat16 and float32, pages in any
order, a row of K and V that is a view of a wider tensor. Prints one JSON object."""

from __future__ import annotations

import json
import os

import torch

assert os.environ.get("TRITON_INTERPRET") == "1"
from engine.llm.attention import write_kv  # noqa: E402
from engine.llm.kv_write_triton import write_kv_triton  # noqa: E402

g = torch.Generator().manual_seed(0)
cases = {}
# (tokens, pages, page size, kv heads, head dim, cache dtype, k/v as views of a wider tensor)
for t, n, p, h, d, dtype, strided in ((5, 6, 16, 8, 128, torch.bfloat16, False), (9, 4, 4, 2, 16, torch.float32, True),
                                      (1, 3, 16, 8, 128, torch.bfloat16, True), (7, 5, 8, 3, 24, torch.bfloat16, False)):
    cache = torch.randn(n, 2, p, h, d, generator=g).to(dtype)
    slots = torch.randperm(n * p, generator=g)[:t]  # distinct places, in any order
    page, offset = slots // p, slots % p
    if strided:  # K and V as the halves of one [T, 2, H, D] tensor: rows not contiguous
        kv = torch.randn(t, 2, h, d, generator=g).to(dtype)
        k, v = kv[:, 0], kv[:, 1]
    else:
        k, v = torch.randn(t, h, d, generator=g).to(dtype), torch.randn(t, h, d, generator=g).to(dtype)
    want = cache.clone()
    write_kv(want, page, offset, k, v)
    got = cache.clone()
    write_kv_triton(got, page, offset, k, v)
    cases[f"{t}x{h}x{d} pages {n}x{p} {str(dtype).removeprefix('torch.')} strided={strided}"] = {
        "equal": bool(torch.equal(got, want)),
        "changed": int((want != cache).any(dim=(3, 4)).sum()),  # (page, K/V, offset) places written
        "rows": t,
    }
try:
    write_kv_triton(torch.zeros(2, 2, 4, 2, 8), torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64),
                    torch.zeros(3, 2, 4), torch.zeros(3, 2, 4))
    cases["refused"] = False
except ValueError as e:
    cases["refused"] = str(e)
print(json.dumps({"cases": cases}))
