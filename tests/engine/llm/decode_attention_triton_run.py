"""Run by tests/engine/llm/test_decode_attention_triton.py in the Triton venv with TRITON_INTERPRET=1:
``decode_attention_triton.paged_decode_attention`` against attention over each row's gathered
pages in float32 (Orpheus-3B's 24 query heads over 8 KV heads of 128 and other groupings; lengths
within a page, on page and block edges and across several blocks; pages scattered; bf16, float32
and fp8 pages), and ``GraphTritonDecodeAttention`` over ``build_attention_metadata``'s metadata of
a scheduled step, its new keys stored first. Prints one JSON object."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import torch

assert os.environ.get("TRITON_INTERPRET") == "1"
from engine.llm.attention import build_attention_metadata  # noqa: E402
from engine.llm.decode_attention_triton import GraphTritonDecodeAttention, paged_decode_attention  # noqa: E402

g = torch.Generator().manual_seed(0)
PAGE = 16


def reference(q, cache, indptr, indices, last):
    """float32 attention of each row over its pages' tokens (the cache's values as stored)."""
    b, hq, d = q.shape
    hkv = cache.shape[3]
    out = torch.empty(b, hq, d)
    for r in range(b):
        pages = indices[indptr[r]:indptr[r + 1]].long()
        length = (len(pages) - 1) * PAGE + int(last[r])
        kv = cache[pages].float()  # [n, 2, P, Hkv, D]
        k = kv[:, 0].reshape(-1, hkv, d)[:length].repeat_interleave(hq // hkv, dim=1)  # [L, Hq, D]
        v = kv[:, 1].reshape(-1, hkv, d)[:length].repeat_interleave(hq // hkv, dim=1)
        s = torch.einsum("hd,lhd->hl", q[r].float(), k) * d ** -0.5
        out[r] = torch.einsum("hl,lhd->hd", s.softmax(-1), v)
    return out


def table(lengths, num_pages):
    """A page table of scattered pages for rows of these lengths."""
    perm = torch.randperm(num_pages, generator=g)
    indptr, indices, last, used = [0], [], [], 0
    for n in lengths:
        k = -(-n // PAGE)
        indices += perm[used:used + k].tolist()
        used += k
        indptr.append(indptr[-1] + k)
        last.append(n - (k - 1) * PAGE)
    i32 = torch.int32
    return torch.tensor(indptr, dtype=i32), torch.tensor(indices, dtype=i32), torch.tensor(last, dtype=i32)


cases = {}
# (query heads, KV heads, head size, dtype of the pages, lengths)
for hq, hkv, d, kv_dtype, lengths in (
        (24, 8, 128, torch.bfloat16, [1, 15, 16, 17, 64, 65, 105, 200]),
        (24, 8, 128, torch.float32, [3, 64, 130]),
        (4, 4, 64, torch.float32, [1, 33, 129]),
        (8, 2, 32, torch.bfloat16, [16, 48, 250]),
        (24, 8, 128, torch.float8_e4m3fn, [20, 100])):
    num_pages = sum(-(-n // PAGE) for n in lengths) + 5
    cache = (torch.randn(num_pages, 2, PAGE, hkv, d, generator=g) * 2).to(kv_dtype)
    q_dtype = torch.bfloat16 if kv_dtype == torch.float8_e4m3fn else kv_dtype
    q = (torch.randn(len(lengths), hq, d, generator=g) * 2).to(q_dtype)
    indptr, indices, last = table(lengths, num_pages)
    got = paged_decode_attention(q, cache, indptr, indices, last)
    want = reference(q, cache, indptr, indices, last)
    name = f"{hq}/{hkv}x{d} {str(kv_dtype).removeprefix('torch.')} lengths={lengths}"
    cases[name] = {
        "shape": list(got.shape) == list(q.shape), "dtype": got.dtype == q_dtype,
        "max_err": float((got.float() - want).abs().max()), "max_abs": float(want.abs().max()),
        "spread": float(want.std()),  # (outputs that differ from row to row: the comparison bites)
    }
try:
    paged_decode_attention(torch.zeros(2, 6, 24), torch.zeros(4, 2, PAGE, 2, 24), torch.zeros(3, dtype=torch.int32),
                           torch.zeros(2, dtype=torch.int32), torch.ones(2, dtype=torch.int32))
    cases["refused"] = False
except ValueError as e:
    cases["refused"] = str(e)

# The graph's attention over a step's metadata: three rows decoding one token each, pages held
# out of order; the new keys and values written at their slots before the attention reads them.
hq, hkv, d, num_pages = 6, 2, 32, 12
caches = [(torch.randn(num_pages + 1, 2, PAGE, hkv, d, generator=g)).to(torch.bfloat16) for _ in range(2)]
seqs = [SimpleNamespace(num_computed_tokens=n - 1, pages=p) for n, p in ((5, [7]), (17, [2, 9]), (40, [11, 0, 4]))]
batch = SimpleNamespace(seqs=seqs, num_new_tokens=[1, 1, 1], num_decode_seqs=3)
meta = build_attention_metadata(batch, PAGE)
attn = GraphTritonDecodeAttention(caches, num_q_heads=hq, batch_size=3, max_num_pages=3 * 4)
attn.begin_step(meta)
q = torch.randn(3, hq, d, generator=g).to(torch.bfloat16)
k = torch.randn(3, hkv, d, generator=g).to(torch.bfloat16)
v = torch.randn(3, hkv, d, generator=g).to(torch.bfloat16)
got = attn(1, q, k, v)
slots = meta.slot_mapping
stored = all(bool(torch.equal(caches[1][int(s) // PAGE, 0, int(s) % PAGE], k[i])) and
             bool(torch.equal(caches[1][int(s) // PAGE, 1, int(s) % PAGE], v[i])) for i, s in enumerate(slots))
want = reference(q, caches[1], meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len)
graph = {"stored": stored, "max_err": float((got.float() - want).abs().max()), "max_abs": float(want.abs().max())}
try:
    attn.begin_step(build_attention_metadata(SimpleNamespace(seqs=seqs[:2], num_new_tokens=[1, 1], num_decode_seqs=2),
                                             PAGE))
    graph["refused_batch"] = False
except ValueError as e:
    graph["refused_batch"] = str(e)
print(json.dumps({"cases": cases, "graph": graph}))
