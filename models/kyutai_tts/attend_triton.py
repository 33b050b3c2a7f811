"""The depth transformer's attention of one codebook in one Triton kernel
(``kyutai_depth_attention=triton``; docs/models/kyutai_tts.md, "Depth transformer").

At codebook ``k`` each row's one query attends to the ``k + 1`` keys of its frame so far. As
torch ops that is a copy of the new key and value into the cache and an attention kernel
(cuDNN's, 13 µs a call at 128 rows on an H200, 92 calls a frame) for a few dozen keys. Here one
program per (row, head) writes the new key and value into the cache, scores the query against
the cached keys and the new one, and sums the values, in float32, rounding once.
"""

from __future__ import annotations

import torch
from torch import Tensor

try:  # Triton serves this kernel on CUDA (it comes with CUDA torch); a CPU install need not have it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

__all__ = ["attend_codebook"]


def attend_codebook(qkv: Tensor, cache: Tensor, k: int) -> Tensor:
    """qkv [B, 3, H, D] (contiguous: query, key, value), cache [B, 2, H, n, D] (contiguous;
    keys, values; positions below ``k`` written) -> the attention output [B, H, D]; the key and
    value are written at position ``k``."""
    b, three, h, d = qkv.shape
    if three != 3 or cache.shape[0] != b or cache.shape[1] != 2 or cache.shape[2] != h or cache.shape[4] != d:
        raise ValueError(f"attend_codebook: qkv {tuple(qkv.shape)} and cache {tuple(cache.shape)} do not match")
    n = cache.shape[3]
    if not 0 <= k < n or not qkv.is_contiguous() or not cache.is_contiguous() or d & (d - 1):
        raise ValueError("attend_codebook needs contiguous inputs, a power-of-two head size and 0 <= k < n")
    if triton is None:
        raise RuntimeError("kyutai_depth_attention=triton needs Triton (it comes with CUDA torch)")
    out = torch.empty(b, h, d, dtype=qkv.dtype, device=qkv.device)
    block_n = max(16, 1 << (n - 1).bit_length())
    attend_codebook_kernel[(b * h,)](qkv, cache, out, k, h, n, d ** -0.5, D=d, BLOCK_N=block_n, num_warps=1)
    return out


if triton is not None:  # (else the kernel is not made: the callers say Triton is needed)
    @triton.jit
    def attend_codebook_kernel(qkv_ptr, cache_ptr, out_ptr, k, H, N, scale, D: tl.constexpr, BLOCK_N: tl.constexpr):
        pid = tl.program_id(0)  # row * H + head
        row = (pid // H).to(tl.int64)
        head = pid % H
        d = tl.arange(0, D)
        src = qkv_ptr + row * 3 * H * D + head * D
        q = tl.load(src + d).to(tl.float32)
        k_new = tl.load(src + H * D + d)
        v_new = tl.load(src + 2 * H * D + d)
        keys = cache_ptr + row * 2 * H * N * D + head * N * D  # [N, D] of this row and head
        values = keys + H * N * D
        tl.store(keys + k * D + d, k_new)
        tl.store(values + k * D + d, v_new)
        pos = tl.arange(0, BLOCK_N)
        before = pos < k  # written by earlier codebooks; position k is the new key, in registers
        kk = tl.load(keys + pos[:, None] * D + d[None, :], mask=before[:, None], other=0.0).to(tl.float32)
        vv = tl.load(values + pos[:, None] * D + d[None, :], mask=before[:, None], other=0.0).to(tl.float32)
        is_new = (pos == k)[:, None]
        kk = tl.where(is_new, k_new.to(tl.float32)[None, :], kk)
        vv = tl.where(is_new, v_new.to(tl.float32)[None, :], vv)
        scores = tl.where(pos <= k, tl.sum(kk * q[None, :], axis=1) * scale, float("-inf"))
        p = tl.exp(scores - tl.max(scores, axis=0))
        o = tl.sum(p[:, None] * vv, axis=0) / tl.sum(p, axis=0)
        tl.store(out_ptr + (row * H + head) * D + d, o.to(out_ptr.dtype.element_ty))
