"""Rotary embedding of the queries and keys and the values' copy out of the fused QKV projection,
in one Triton kernel (``orpheus_rope=triton``; docs/orpheus.md, "Fused forward").

``fused_forward._rope`` slices the projection [T, (hq + 2 hkv) d] into q, k and v, rotates q and
k (``x cos + rotate_half(x) sin``) and makes all three contiguous. ``torch.compile`` (dynamic
shapes) made it three kernels a layer: on an H100 at 448 rows 22.0 µs for the queries, 5.3 for
the keys and 4.4 for the values' copy, some 32 µs for about 9 MB moved (engine_profile's kernel
table, 2026-12-05). Here one program is one token: it reads the token's row once, rotates its
hq + hkv heads in float32 and writes q, k and v, rounding once as the compiled form does.
"""

from __future__ import annotations

import torch
from torch import Tensor

try:  # Triton serves this kernel on CUDA (it comes with CUDA torch); a CPU install need not have it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

__all__ = ["rope_qkv"]


def rope_qkv(qkv: Tensor, cos: Tensor, sin: Tensor, hq: int, hkv: int, d: int) -> tuple[Tensor, Tensor, Tensor]:
    """qkv [T, (hq + 2 hkv) d] (rows contiguous), cos / sin [T, 1, d] (or [T, d]; each row's last
    dimension contiguous) -> q [T, hq, d], k [T, hkv, d] rotated, v [T, hkv, d]; all contiguous,
    in ``qkv``'s dtype. The same function as ``fused_forward._rope``."""
    t = qkv.shape[0]
    width = (hq + 2 * hkv) * d
    if qkv.dim() != 2 or qkv.shape[1] != width or qkv.stride(1) != 1:
        raise ValueError(f"rope_qkv: qkv {tuple(qkv.shape)} is not [T, {width}] with contiguous rows")
    if d % 2 or cos.shape[0] != t or sin.shape[0] != t or cos.shape[-1] != d or sin.shape[-1] != d \
            or cos.stride(-1) != 1 or sin.stride(-1) != 1:
        raise ValueError(f"rope_qkv: cos {tuple(cos.shape)} / sin {tuple(sin.shape)} do not fit {t} tokens of "
                         f"head size {d} (even, last dimension contiguous)")
    if triton is None:
        raise RuntimeError("orpheus_rope=triton needs Triton (it comes with CUDA torch)")
    q = torch.empty(t, hq, d, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(t, hkv, d, dtype=qkv.dtype, device=qkv.device)
    v = torch.empty(t, hkv, d, dtype=qkv.dtype, device=qkv.device)
    if t == 0:
        return q, k, v
    half = d // 2
    rope_qkv_kernel[(t,)](qkv, cos, sin, q, k, v, qkv.stride(0), cos.stride(0), sin.stride(0),
                          HQ=hq, HKV=hkv, HALF=half, BLOCK_H=triton.next_power_of_2(hq + hkv),
                          BLOCK_HALF=triton.next_power_of_2(half), BLOCK_V=triton.next_power_of_2(hkv * d),
                          num_warps=4)
    return q, k, v


if triton is not None:  # (else the kernel is not made: the caller says Triton is needed)
    @triton.jit
    def rope_qkv_kernel(qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, row_stride, cos_stride, sin_stride,
                        HQ: tl.constexpr, HKV: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                        BLOCK_HALF: tl.constexpr, BLOCK_V: tl.constexpr):
        tok = tl.program_id(0).to(tl.int64)
        D: tl.constexpr = 2 * HALF
        h = tl.arange(0, BLOCK_H)[:, None]  # the rotated heads: q's hq, then k's hkv
        j = tl.arange(0, BLOCK_HALF)[None, :]  # a position in the first half of a head
        inside = (h < HQ + HKV) & (j < HALF)
        row = qkv_ptr + tok * row_stride
        x1 = tl.load(row + h * D + j, mask=inside, other=0.0).to(tl.float32)
        x2 = tl.load(row + h * D + HALF + j, mask=inside, other=0.0).to(tl.float32)
        c1 = tl.load(cos_ptr + tok * cos_stride + j, mask=j < HALF, other=0.0).to(tl.float32)
        c2 = tl.load(cos_ptr + tok * cos_stride + HALF + j, mask=j < HALF, other=0.0).to(tl.float32)
        s1 = tl.load(sin_ptr + tok * sin_stride + j, mask=j < HALF, other=0.0).to(tl.float32)
        s2 = tl.load(sin_ptr + tok * sin_stride + HALF + j, mask=j < HALF, other=0.0).to(tl.float32)
        y1 = (x1 * c1 - x2 * s1).to(q_ptr.dtype.element_ty)  # rotate_half's first half is -x2
        y2 = (x2 * c2 + x1 * s2).to(q_ptr.dtype.element_ty)
        is_q = inside & (h < HQ)
        q_at = q_ptr + tok * (HQ * D) + h * D + j
        tl.store(q_at, y1, mask=is_q)
        tl.store(q_at + HALF, y2, mask=is_q)
        is_k = inside & (h >= HQ)
        k_at = k_ptr + tok * (HKV * D) + (h - HQ) * D + j
        tl.store(k_at, y1, mask=is_k)
        tl.store(k_at + HALF, y2, mask=is_k)
        c = tl.arange(0, BLOCK_V)  # the values, copied
        vmask = c < HKV * D
        vals = tl.load(row + (HQ + HKV) * D + c, mask=vmask, other=0.0)
        tl.store(v_ptr + tok * (HKV * D) + c, vals, mask=vmask)
