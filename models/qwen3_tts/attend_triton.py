"""The code predictor's attention of one new position in one Triton kernel
(``--model-setting code_predictor_attention=triton``; docs/models/qwen3_tts.md, "Code predictor").

Each of a frame's 14 passes after the first adds one position per row: ``_DenseCache`` writes its
key and value into the per-call cache (two strided copies) and runs SDPA over the positions so
far, 5 layers a pass. Here one program per row and key/value head writes the new key and value
and attends its query heads (grouped-query: ``H / Hkv`` queries share a key head) over the
positions written so far, in float32: one launch for the three.
"""

from __future__ import annotations

import torch
from torch import Tensor

try:  # Triton serves this kernel on CUDA (it comes with CUDA torch); a CPU install need not have it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

__all__ = ["attend_position"]


def attend_position(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, p: int) -> Tensor:
    """q [B, 1, H, D], k and v [B, 1, Hkv, D] (each row's heads contiguous; rows strided), the
    caches [B, Hkv, S, D] (contiguous; positions below ``p`` written) -> [B, 1, H, D]; the key and
    value are written at ``p``. Softmax attention over positions 0..p, unmasked."""
    b, one, h, d = q.shape
    hkv, s = k_cache.shape[1], k_cache.shape[2]
    if one != 1 or k.shape != (b, 1, hkv, d) or v.shape != k.shape or k_cache.shape != (b, hkv, s, d):
        raise ValueError(f"attend_position: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} and the "
                         f"cache {tuple(k_cache.shape)} do not match")
    if h % hkv or not 0 <= p < s or d & (d - 1) or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("attend_position needs contiguous caches, whole query groups, 0 <= p < S and a "
                         "power-of-two head size")
    for t in (q, k, v):
        if t.stride(3) != 1 or t.stride(2) != d:
            raise ValueError("attend_position: each row's heads must be contiguous")
    if triton is None:
        raise RuntimeError("code_predictor_attention=triton needs Triton (it comes with CUDA torch)")
    out = torch.empty(b, 1, h, d, dtype=q.dtype, device=q.device)
    attend_position_kernel[(b * hkv,)](q, k, v, k_cache, v_cache, out, q.stride(0), k.stride(0), v.stride(0),
                                       p, hkv, s, d ** -0.5, REP=h // hkv, D=d,
                                       BLOCK_S=max(16, 1 << (s - 1).bit_length()), num_warps=2)
    return out


if triton is not None:  # (else the kernel is not made: the callers say Triton is needed)
    @triton.jit
    def attend_position_kernel(q_ptr, k_ptr, v_ptr, kc_ptr, vc_ptr, out_ptr, q_row, k_row, v_row, p, HKV, S, scale,
                               REP: tl.constexpr, D: tl.constexpr, BLOCK_S: tl.constexpr):
        pid = tl.program_id(0)  # row * HKV + key head
        row = (pid // HKV).to(tl.int64)
        g = pid % HKV
        d = tl.arange(0, D)
        k_new = tl.load(k_ptr + row * k_row + g * D + d)
        v_new = tl.load(v_ptr + row * v_row + g * D + d)
        cache = (row * HKV + g) * S * D  # [S, D] of this row and key head
        tl.store(kc_ptr + cache + p * D + d, k_new)
        tl.store(vc_ptr + cache + p * D + d, v_new)
        pos = tl.arange(0, BLOCK_S)
        before = (pos < p)[:, None]  # written earlier; position p is the new one, in registers
        keys = tl.load(kc_ptr + cache + pos[:, None] * D + d[None, :], mask=before, other=0.0).to(tl.float32)
        values = tl.load(vc_ptr + cache + pos[:, None] * D + d[None, :], mask=before, other=0.0).to(tl.float32)
        is_new = (pos == p)[:, None]
        keys = tl.where(is_new, k_new.to(tl.float32)[None, :], keys)
        values = tl.where(is_new, v_new.to(tl.float32)[None, :], values)
        for r in tl.static_range(REP):
            head = g * REP + r
            q = tl.load(q_ptr + row * q_row + head * D + d).to(tl.float32)
            scores = tl.where(pos <= p, tl.sum(keys * q[None, :], axis=1) * scale, float("-inf"))
            w = tl.exp(scores - tl.max(scores, axis=0))
            o = tl.sum(w[:, None] * values, axis=0) / tl.sum(w, axis=0)
            tl.store(out_ptr + (row * (HKV * REP) + head) * D + d, o.to(out_ptr.dtype.element_ty))
