"""The runtime sampler's draw in one Triton kernel for vocabularies up to 8,192 columns
(``--sampler-kernel triton``; docs/architecture.md, "The LM runtime").

``Sampler._sample`` in a CUDA graph always takes its top-p path: a softmax, a stable sort of
every row's columns, a cumulative sum, the top-k's k-th value, a scatter of the decision back to
column order and the argmax with the noise, some 27 kernels a sample; frame models draw 16 to 32
samples a frame. Here one program per row sorts its scaled logits in registers (value and column
packed into one 64-bit key, descending, the lower column first among equals, as the stable sort
orders them) and decides as ``_sample`` does: top-k keeps the values at or above the k-th
(ties kept), top-p the sorted columns whose mass before them is below ``top_p`` times the
top-k's mass, then the argmax of scaled logit plus noise among the kept (the lowest column among
equal scores, as ``argmax`` over columns), or the largest logit on greedy rows.
"""

from __future__ import annotations

import torch

try:  # Triton serves this kernel on CUDA (it comes with CUDA torch); a CPU install need not have it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

__all__ = ["MAX_COLUMNS", "draw_rows", "sorted_columns", "triton"]

MAX_COLUMNS = 8192  # a row's columns sorted in one program's registers


def draw_rows(logits: torch.Tensor, divisor: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor | None,
              is_greedy: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """logits float32 [B, V] (after the penalty and the allowed mask: -inf columns never drawn),
    ``divisor`` [B, 1] (the temperature, 1 on greedy rows), ``top_p`` [B, 1], ``top_k`` int64 [B]
    (0: off; None: no row), ``is_greedy`` bool [B], ``noise`` float32 [B, V] -> ids int64 [B]."""
    b, v = logits.shape
    if v > MAX_COLUMNS:
        raise ValueError(f"draw_rows: {v} columns, more than the kernel's {MAX_COLUMNS}")
    if triton is None:
        raise RuntimeError("--sampler-kernel triton needs Triton (it comes with CUDA torch)")
    out = torch.empty(b, dtype=torch.int64, device=logits.device)
    block = max(16, 1 << (v - 1).bit_length())
    k = top_k if top_k is not None else out  # (unread without HAS_TOP_K)
    draw_rows_kernel[(b,)](logits.contiguous(), divisor.contiguous(), top_p.contiguous(), k.contiguous(),
                           is_greedy.contiguous(), noise.contiguous(), out, v, HAS_TOP_K=top_k is not None,
                           BLOCK_V=block, num_warps=4 if block <= 2048 else 8)
    return out


if triton is not None:  # (else the kernels are not made: the callers say Triton is needed)
    @triton.jit
    def sorted_columns(x, BLOCK_V: tl.constexpr):
        """float32 [BLOCK_V] -> its columns (int32) by value, largest first, the lower column
        first among equals: each float as an order-preserving integer (negatives' magnitude bits
        flipped) with its column below it in one 64-bit key, one descending bitonic sort."""
        col = tl.arange(0, BLOCK_V)
        bits = x.to(tl.int32, bitcast=True)
        key = bits ^ ((bits >> 31) & 0x7FFFFFFF)
        packed = tl.sort((key.to(tl.int64) << 32) + (BLOCK_V - 1 - col).to(tl.int64), 0, descending=True)
        return (BLOCK_V - 1 - (packed - ((packed >> 32) << 32))).to(tl.int32)

    @triton.jit
    def draw_rows_kernel(logits_ptr, div_ptr, top_p_ptr, top_k_ptr, greedy_ptr, noise_ptr, out_ptr, V,
                         HAS_TOP_K: tl.constexpr, BLOCK_V: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        col = tl.arange(0, BLOCK_V)
        x = tl.load(logits_ptr + row * V + col, mask=col < V, other=float("-inf"))
        x = x / tl.load(div_ptr + row)
        cols = sorted_columns(x, BLOCK_V)  # largest first
        real = cols < V
        vals = tl.load(logits_ptr + row * V + cols, mask=real, other=float("-inf")) / tl.load(div_ptr + row)
        rank = tl.arange(0, BLOCK_V)
        top = tl.max(vals, axis=0)
        e = tl.where(vals == float("-inf"), 0.0, tl.exp(vals - top))
        probs = e / tl.sum(e, axis=0)  # in sorted order
        mass = tl.load(top_p_ptr + row)
        if HAS_TOP_K:  # top-p over what top-k kept, renormalised (as ``_sample``)
            k = tl.load(top_k_ptr + row)
            kth = tl.sum(tl.where(rank == tl.minimum(tl.maximum(k, 1), V) - 1, probs, 0.0), axis=0)
            in_top_k = (k <= 0) | (probs >= kth)
            mass = mass * tl.sum(tl.where(in_top_k, probs, 0.0), axis=0)
        else:
            in_top_k = rank >= 0
        kept = in_top_k & (tl.cumsum(probs, 0) - probs < mass) & (vals != float("-inf")) & real
        score = tl.where(kept, vals + tl.load(noise_ptr + row * V + cols, mask=real, other=0.0), float("-inf"))
        best = tl.max(score, axis=0)
        pick = tl.min(tl.where(kept & (score == best), cols, BLOCK_V), axis=0)
        greedy = tl.load(greedy_ptr + row) != 0
        pick = tl.where(greedy, tl.min(tl.where(rank == 0, cols, BLOCK_V), axis=0), pick)
        tl.store(out_ptr + row, pick.to(tl.int64))
