"""Kyutai's top-k draw of one codebook in one Triton kernel (``kyutai_sampling=triton``;
docs/models/kyutai_tts.md, "Depth transformer").

``sampling.top_k_draw`` is ``torch.topk`` (a radix sort of every row's 2,048 logits) and a fused
tail (softmax over the k kept, top-p, the noise gathered, argmax, the id gathered back): about
42 µs a sample at 128 rows on an H200 and several kernels, 24 samples a frame. Here one program
per row sorts its logits in registers (value and column packed into one 64-bit key: a bitonic
sort, descending, ties by the lower column first), keeps the first ``k``, applies top-p over
them renormalised as ``top_k_draw`` does, and takes the argmax of the scaled logits plus the
row's Gumbel noise among what is kept: the same draw, in one launch.

``top_k_select_triton`` (``kyutai_sampling=triton-select``) is the same draw without the sort
for the rows without top-p (Kyutai's default): the k-th largest value is found by bisection on
its order-preserving bits (32 counts over the row in registers), ties at it kept lowest column
first as the sort keeps them, and the argmax taken among those; a row with top-p, which needs
the kept values in order, is sorted as above.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.llm import sample_triton

triton = sample_triton.triton  # (None where Triton is missing: the kernel is not made)
if triton is not None:
    import triton.language as tl

    sorted_columns = sample_triton.sorted_columns  # the runtime sampler's sort of a row

__all__ = ["top_k_draw_triton", "top_k_select_triton"]


def top_k_draw_triton(logits: Tensor, k: int, divisor: Tensor, noise: Tensor | None, top_p: Tensor,
                      select: bool = False) -> Tensor:
    """``sampling.top_k_draw``'s contract: logits [B, V] (any float dtype), ``divisor`` [B, 1]
    float32, ``noise`` [B, V] float32 (zero on greedy rows; None: every row greedy), ``top_p``
    [B, 1] (inf for none) -> ids [B] int64. ``select``: ``top_k_select_triton``."""
    if noise is None:
        return logits.argmax(dim=-1)
    b, v = logits.shape
    if noise.shape != (b, v) or divisor.shape != (b, 1) or top_p.shape != (b, 1):
        raise ValueError(f"top_k_draw_triton: logits {tuple(logits.shape)}, noise {tuple(noise.shape)}, divisor "
                         f"{tuple(divisor.shape)} and top_p {tuple(top_p.shape)} do not match")
    if triton is None:
        raise RuntimeError("kyutai_sampling=triton needs Triton (it comes with CUDA torch)")
    logits, noise = logits.contiguous(), noise.contiguous()
    out = torch.empty(b, dtype=torch.int64, device=logits.device)
    block = max(16, 1 << (v - 1).bit_length())
    kernel = top_k_select_kernel if select else top_k_draw_kernel
    kernel[(b,)](logits, divisor.contiguous(), noise, top_p.contiguous(), out, v, min(k, v),
                 BLOCK_V=block, num_warps=4 if block <= 2048 else 8)
    return out


def top_k_select_triton(logits: Tensor, k: int, divisor: Tensor, noise: Tensor | None, top_p: Tensor) -> Tensor:
    """``top_k_draw_triton`` with the k kept found by bisection rather than a sort on the rows
    without top-p (``top_p`` inf): the same ids."""
    return top_k_draw_triton(logits, k, divisor, noise, top_p, select=True)


if triton is not None:  # (else the kernel is not made: the callers say Triton is needed)
    @triton.jit
    def top_k_draw_kernel(logits_ptr, div_ptr, noise_ptr, top_p_ptr, out_ptr, V, K, BLOCK_V: tl.constexpr):
        _sorted_draw(logits_ptr, div_ptr, noise_ptr, top_p_ptr, out_ptr, V, K, BLOCK_V)

    @triton.jit
    def top_k_select_kernel(logits_ptr, div_ptr, noise_ptr, top_p_ptr, out_ptr, V, K, BLOCK_V: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        if tl.load(top_p_ptr + row) == float("inf"):
            _selected_draw(logits_ptr, div_ptr, noise_ptr, out_ptr, V, K, BLOCK_V)
        else:  # top-p needs the kept values in order
            _sorted_draw(logits_ptr, div_ptr, noise_ptr, top_p_ptr, out_ptr, V, K, BLOCK_V)

    @triton.jit
    def _selected_draw(logits_ptr, div_ptr, noise_ptr, out_ptr, V, K, BLOCK_V: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        col = tl.arange(0, BLOCK_V)
        real = col < V
        x = tl.load(logits_ptr + row * V + col, mask=real, other=float("-inf")).to(tl.float32)
        x = x / tl.load(div_ptr + row)
        bits = x.to(tl.int32, bitcast=True)
        key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # order-preserving, as ``sorted_columns``'
        u = tl.where(real, key.to(tl.int64) + 2147483648, -1)  # unsigned order in [0, 2 ** 32); padding below
        kth = tl.zeros((), dtype=tl.int64)  # the k-th largest u, bit by bit from the top
        for bit in tl.static_range(31, -1, -1):
            cand = kth | (1 << bit)
            kth = tl.where(tl.sum((u >= cand).to(tl.int32), axis=0) >= K, cand, kth)
        above = u > kth
        tie = u == kth  # equal values at the k-th: the lowest columns first, as the sort keeps them
        kept = above | (tie & (tl.cumsum(tie.to(tl.int32), 0) <= K - tl.sum(above.to(tl.int32), axis=0)))
        score = tl.where(kept, x + tl.load(noise_ptr + row * V + col, mask=kept, other=0.0), float("-inf"))
        best = kept & (score == tl.max(score, axis=0))
        # the first of equal scores in the sort's order: the larger value, then the lower column
        top = tl.max(tl.where(best, u, -1), axis=0)
        tl.store(out_ptr + row, tl.min(tl.where(best & (u == top), col, BLOCK_V), axis=0).to(tl.int64))

    @triton.jit
    def _sorted_draw(logits_ptr, div_ptr, noise_ptr, top_p_ptr, out_ptr, V, K, BLOCK_V: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        col = tl.arange(0, BLOCK_V)
        real = col < V
        x = tl.load(logits_ptr + row * V + col, mask=real, other=float("-inf")).to(tl.float32)
        x = x / tl.load(div_ptr + row)
        cols = sorted_columns(x, BLOCK_V)  # columns, largest value first (the runtime sampler's sort)
        rank = tl.arange(0, BLOCK_V)
        kept = (rank < K) & (cols < V)
        vals = tl.load(logits_ptr + row * V + cols, mask=kept, other=float("-inf")).to(tl.float32)
        vals = vals / tl.load(div_ptr + row)
        top = tl.max(vals, axis=0)
        e = tl.where(kept, tl.exp(vals - top), 0.0)
        probs = e / tl.sum(e, axis=0)
        before = tl.cumsum(probs, 0) - probs  # the kept mass above each one (the top one: 0)
        kept = kept & (before < tl.load(top_p_ptr + row))
        noisy = vals + tl.load(noise_ptr + row * V + cols, mask=kept, other=0.0)
        score = tl.where(kept, noisy, float("-inf"))
        best = tl.max(score, axis=0)
        pos = tl.min(tl.where(score == best, rank, BLOCK_V), axis=0)  # the first of equal scores
        tl.store(out_ptr + row, tl.sum(tl.where(rank == pos, cols, 0), axis=0).to(tl.int64))
