"""Paged decode attention as one Triton kernel (``--decode-attention triton``), in place of
FlashInfer's decode in the decode CUDA graphs; ``GraphTritonDecodeAttention`` has
``GraphDecodeAttention``'s interface.

Why: FlashInfer's CUDA-core decode took 91 µs a layer at 448 rows of about 105 cached tokens on
an H100 (engine_profile's kernel table, 2026-12-05): 24% of an Orpheus step's device time,
reading its 193 MB at about 2.1 of the GPU's 3.35 TB/s; and each replay needs its plan, made on
the host. Here a program is one decode row and one KV head: it loads the row's queries of that
head's group once, walks the row's pages a block of tokens at a time (scores and the weighted
values by ``tl.dot``, an online softmax in float32), and writes the group's outputs. No plan:
``begin_step`` only stages the page table (``kv_indptr``, ``kv_indices``) and the last pages'
lengths into fixed buffers the graph reads, from pinned memory without waiting. Numerics: the
scores in float32 from the queries and keys in the queries' dtype, the probabilities rounded to
the values' dtype for their product (as FlashInfer's tensor-core decode and FlashAttention do);
fp8 pages are read as their values (scale 1.0, the engine's). Float32 queries (and Triton's
CPU interpreter, whose bfloat16 ``tl.dot`` is wrong) take every product in float32. One program per (row, KV head)
and no split of long contexts: meant for many rows of short contexts. The default for a program
that names it (``ServingDefaults.decode_attention``; Orpheus, with its other Triton kernels:
served on an H200, docs/performance.md); ``cuda-cores`` for the others.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor

from engine.llm.attention import write_kv
from engine.llm.flashinfer_attention import slot_to_page_offset  # (FlashInfer itself is imported lazily there)
from engine.llm.fp8 import is_fp8

try:  # Triton serves this kernel on CUDA (it comes with CUDA torch); a CPU install need not have it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

__all__ = ["GraphTritonDecodeAttention", "paged_decode_attention"]

_BLOCK_N = 64  # tokens a loop iteration (four pages of 16)


def paged_decode_attention(q: Tensor, cache: Tensor, kv_indptr: Tensor, kv_indices: Tensor,
                           kv_last_page_len: Tensor, *, out: Tensor | None = None) -> Tensor:
    """q [B, Hq, D] (each head's D contiguous), cache [N, 2, P, Hkv, D] (contiguous; K at index 0 of
    dim 1, V at 1), the page table as FlashInfer takes it (int32 on q's device: ``kv_indptr``
    [B + 1], ``kv_indices``, ``kv_last_page_len`` [B]) -> softmax(q k^T / sqrt(D)) v over each
    row's cached tokens, [B, Hq, D] in q's dtype (into ``out`` when given)."""
    if triton is None:
        raise RuntimeError("--decode-attention triton needs Triton (it comes with CUDA torch)")
    b, hq, d = q.shape
    if cache.dim() != 5 or cache.shape[1] != 2 or not cache.is_contiguous() or cache.shape[4] != d:
        raise ValueError(f"paged_decode_attention: cache {tuple(cache.shape)} is not a contiguous [N, 2, P, Hkv, {d}]")
    hkv, page = cache.shape[3], cache.shape[2]
    if hq % hkv or d & (d - 1) or q.stride(2) != 1:
        raise ValueError(f"paged_decode_attention: {hq} query heads of {d} over {hkv} KV heads (a power-of-two "
                         f"head size, whole groups, contiguous heads)")
    if kv_indptr.shape != (b + 1,) or kv_last_page_len.shape != (b,):
        raise ValueError(f"paged_decode_attention: kv_indptr {tuple(kv_indptr.shape)} / kv_last_page_len "
                         f"{tuple(kv_last_page_len.shape)} do not fit {b} rows")
    if out is None:
        out = torch.empty(b, hq, d, dtype=q.dtype, device=q.device)
    if b == 0:
        return out
    group = hq // hkv
    decode_attention_kernel[(b, hkv)](
        q, cache, kv_indptr, kv_indices, kv_last_page_len, out,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        cache.stride(0), cache.stride(1), cache.stride(2), cache.stride(3), d ** -0.5,
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), D=d, PAGE=page, BLOCK_N=_BLOCK_N,
        DOT_F32=q.dtype == torch.float32 or _interpreting(), num_warps=4)
    return out


class GraphTritonDecodeAttention:
    """Decode-only attention at a fixed batch size for CUDA-graph capture and replay, as
    ``flashinfer_attention.GraphDecodeAttention`` (same constructor and calls), through
    ``paged_decode_attention``. ``async_plan`` is accepted and changes nothing: there is no plan,
    and the page table always goes to the device without waiting."""

    tensor_cores = False

    def __init__(self, kv_caches: list[Tensor], *, num_q_heads: int, batch_size: int, max_num_pages: int,
                 workspace: Tensor | None = None, q_dtype: torch.dtype | None = None, async_plan: bool = False,
                 tensor_cores: bool = False) -> None:
        if tensor_cores:
            raise ValueError("the Triton decode attention has no tensor-core variant to choose")
        self.kv_caches = kv_caches
        cache = kv_caches[0]
        self.batch_size = batch_size
        self.num_q_heads = num_q_heads
        self.page_size = int(cache.shape[2])
        self.q_dtype = q_dtype or (torch.bfloat16 if is_fp8(cache.dtype) else cache.dtype)
        self.async_plan = async_plan
        dev = cache.device
        self._page = torch.zeros(batch_size, dtype=torch.int64, device=dev)
        self._offset = torch.zeros(batch_size, dtype=torch.int64, device=dev)
        self._indptr = torch.zeros(batch_size + 1, dtype=torch.int32, device=dev)
        self._indices = torch.zeros(max(1, max_num_pages), dtype=torch.int32, device=dev)
        self._last = torch.ones(batch_size, dtype=torch.int32, device=dev)

    def begin_step(self, meta: Any) -> None:
        """Stage this replay's K/V slots and page table in the fixed buffers (outside the graph)."""
        n = int(meta.kv_last_page_len.numel())
        if n != self.batch_size or int(meta.num_decode_seqs) != self.batch_size:
            raise ValueError(f"graph for batch {self.batch_size} got {n} rows")
        num_pages = int(meta.kv_indices.numel())
        if num_pages > self._indices.numel():
            raise ValueError(f"{num_pages} pages for a graph of at most {self._indices.numel()}")
        dev = self._page.device
        slots = meta.slot_mapping.to(dev, dtype=torch.int64, non_blocking=True)
        page, offset = slot_to_page_offset(slots, self.page_size)
        self._page.copy_(page)
        self._offset.copy_(offset)
        self._indptr.copy_(_staged(meta.kv_indptr, dev))
        self._indices[:num_pages].copy_(_staged(meta.kv_indices, dev))
        self._last.copy_(_staged(meta.kv_last_page_len, dev))

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """q [B, Hq, D], this step's k / v [B, Hkv, D] (stored first) -> [B, Hq, D]."""
        cache = self.kv_caches[layer]
        write_kv(cache, self._page, self._offset, k, v)
        return paged_decode_attention(q.to(self.q_dtype).contiguous(), cache, self._indptr, self._indices, self._last)


def _interpreting() -> bool:
    """Triton's CPU interpreter (TRITON_INTERPRET=1) is on: its ``tl.dot`` of bfloat16 operands
    is wrong (the tests' kernels run their products in float32 there)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _staged(t: Tensor, dev: torch.device) -> Tensor:
    """``t`` as int32 on ``dev``: from the host through pinned memory without waiting for the device."""
    t = t.to(torch.int32)
    if t.device.type == "cpu" and dev.type == "cuda":
        t = t.pin_memory()
    return t.to(dev, non_blocking=True)


if triton is not None:  # (else the kernel is not made: the caller says Triton is needed)
    @triton.jit
    def decode_attention_kernel(q_ptr, cache_ptr, indptr_ptr, indices_ptr, last_ptr, out_ptr,
                                q_row, q_head, o_row, o_head, c_page, c_kv, c_tok, c_head, scale,
                                GROUP: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                                BLOCK_N: tl.constexpr, DOT_F32: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        kvh = tl.program_id(1)
        first = tl.load(indptr_ptr + row)
        num_pages = tl.load(indptr_ptr + row + 1) - first
        length = (num_pages - 1) * PAGE + tl.load(last_ptr + row)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, D)
        in_group = g < GROUP
        heads = kvh * GROUP + g
        q = tl.load(q_ptr + row * q_row + heads[:, None] * q_head + d[None, :], mask=in_group[:, None], other=0.0)
        m = tl.full([BLOCK_G], float("-inf"), tl.float32)
        s_sum = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, D], tl.float32)
        head_at = cache_ptr + kvh.to(tl.int64) * c_head
        for start in range(0, length, BLOCK_N):
            t = start + tl.arange(0, BLOCK_N)
            inside = t < length
            page = tl.load(indices_ptr + first + t // PAGE, mask=inside, other=0).to(tl.int64)
            at = head_at + page * c_page + (t % PAGE) * c_tok
            k = tl.load(at[:, None] + d[None, :], mask=inside[:, None], other=0.0)
            v = tl.load(at[:, None] + c_kv + d[None, :], mask=inside[:, None], other=0.0)
            if DOT_F32:  # float32 products throughout (float32 queries; Triton's CPU interpreter)
                s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee") * scale
            else:
                s = tl.dot(q, tl.trans(k.to(q.dtype))) * scale  # [BLOCK_G, BLOCK_N], float32
            s = tl.where(inside[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m - m_new)
            s_sum = s_sum * alpha + tl.sum(p, axis=1)
            if DOT_F32:
                pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
            else:
                pv = tl.dot(p.to(q.dtype), v.to(q.dtype))
            acc = acc * alpha[:, None] + pv
            m = m_new
        o = acc / s_sum[:, None]
        tl.store(out_ptr + row * o_row + heads[:, None] * o_head + d[None, :], o.to(out_ptr.dtype.element_ty),
                 mask=in_group[:, None])
