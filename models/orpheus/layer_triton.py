"""Two pointwise parts of the fused decoder layer as Triton kernels (docs/orpheus.md, "Fused
forward"): the rotary embedding of the queries and keys with the values' copy out of the QKV
projection (``rope_qkv``, ``orpheus_rope=triton``) and the gate's SiLU times the up projection
(``silu_mul``, ``orpheus_silu_mul=triton``).

``fused_forward._rope`` slices the projection [T, (hq + 2 hkv) d] into q, k and v, rotates q and
k (``x cos + rotate_half(x) sin``) and makes all three contiguous. ``torch.compile`` (dynamic
shapes) made it three kernels a layer: on an H100 at 448 rows 22.0 µs for the queries, 5.3 for
the keys and 4.4 for the values' copy, some 32 µs for about 9 MB moved (engine_profile's kernel
table, 2026-12-05). Here a program is four heads of one token's row: it reads them once, rotates
those of q and k in float32 (rounding once, as the compiled form does) and writes them to q, k or
v: 10.9 µs at 448 rows alone in a CUDA graph, the graph's launch included (28.7 compiled); in the
28-layer forward about 15 µs a layer less.

``torch.compile``'s SiLU-mul took 15.4 µs a layer at 448 rows on the same H100 for about 22 MB
(1.4 TB/s). ``silu_mul`` reads a block of a row's gate and up halves, multiplies in float32 and
rounds once, as the compiled form (not yet timed on a GPU: off by default).
"""

from __future__ import annotations

import torch
from torch import Tensor

try:  # Triton serves these kernels on CUDA (it comes with CUDA torch); a CPU install need not have it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

__all__ = ["rope_qkv", "silu_mul"]


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
    heads = hq + 2 * hkv
    block_h = 4  # heads a program: 10 programs a token for Orpheus-3B's 40 (one program a token
    # measured the same on an H100: 10.4-10.8 µs alone in a graph from 1 to 448 rows)
    rope_qkv_kernel[(t, triton.cdiv(heads, block_h))](
        qkv, cos, sin, q, k, v, qkv.stride(0), cos.stride(0), sin.stride(0),
        HQ=hq, HKV=hkv, HALF=d // 2, BLOCK_H=block_h, BLOCK_HALF=triton.next_power_of_2(d // 2), num_warps=1)
    return q, k, v


def silu_mul(gu: Tensor) -> Tensor:
    """gu [T, 2I] (rows contiguous: the gate then the up projection) -> silu(gate) * up [T, I]
    in ``gu``'s dtype; the same function as ``fused_forward._silu_mul``."""
    if gu.dim() != 2 or gu.shape[1] % 2 or gu.stride(1) != 1:
        raise ValueError(f"silu_mul: gu {tuple(gu.shape)} is not [T, 2I] with contiguous rows")
    if triton is None:
        raise RuntimeError("orpheus_silu_mul=triton needs Triton (it comes with CUDA torch)")
    t, width = gu.shape[0], gu.shape[1] // 2
    out = torch.empty(t, width, dtype=gu.dtype, device=gu.device)
    if t == 0:
        return out
    block = min(2048, triton.next_power_of_2(width))
    silu_mul_kernel[(t, triton.cdiv(width, block))](gu, out, gu.stride(0), width, BLOCK=block, num_warps=4)
    return out


if triton is not None:  # (else the kernel is not made: the caller says Triton is needed)
    @triton.jit
    def rope_qkv_kernel(qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, row_stride, cos_stride, sin_stride,
                        HQ: tl.constexpr, HKV: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                        BLOCK_HALF: tl.constexpr):
        tok = tl.program_id(0).to(tl.int64)
        D: tl.constexpr = 2 * HALF
        # this program's heads of the projection: q's hq, k's hkv (rotated), then v's hkv (copied)
        h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)[:, None]
        j = tl.arange(0, BLOCK_HALF)[None, :]  # a position in the first half of a head
        inside = (h < HQ + 2 * HKV) & (j < HALF)
        row = qkv_ptr + tok * row_stride
        x1 = tl.load(row + h * D + j, mask=inside, other=0.0).to(tl.float32)
        x2 = tl.load(row + h * D + HALF + j, mask=inside, other=0.0).to(tl.float32)
        c1 = tl.load(cos_ptr + tok * cos_stride + j, mask=j < HALF, other=0.0).to(tl.float32)
        c2 = tl.load(cos_ptr + tok * cos_stride + HALF + j, mask=j < HALF, other=0.0).to(tl.float32)
        s1 = tl.load(sin_ptr + tok * sin_stride + j, mask=j < HALF, other=0.0).to(tl.float32)
        s2 = tl.load(sin_ptr + tok * sin_stride + HALF + j, mask=j < HALF, other=0.0).to(tl.float32)
        rotated = h < HQ + HKV
        y1 = tl.where(rotated, x1 * c1 - x2 * s1, x1).to(q_ptr.dtype.element_ty)  # rotate_half's first half: -x2
        y2 = tl.where(rotated, x2 * c2 + x1 * s2, x2).to(q_ptr.dtype.element_ty)
        is_q = inside & (h < HQ)
        q_at = q_ptr + tok * (HQ * D) + h * D + j
        tl.store(q_at, y1, mask=is_q)
        tl.store(q_at + HALF, y2, mask=is_q)
        is_k = inside & (h >= HQ) & rotated
        k_at = k_ptr + tok * (HKV * D) + (h - HQ) * D + j
        tl.store(k_at, y1, mask=is_k)
        tl.store(k_at + HALF, y2, mask=is_k)
        is_v = inside & (h >= HQ + HKV)
        v_at = v_ptr + tok * (HKV * D) + (h - HQ - HKV) * D + j
        tl.store(v_at, y1, mask=is_v)
        tl.store(v_at + HALF, y2, mask=is_v)

    @triton.jit
    def silu_mul_kernel(gu_ptr, out_ptr, row_stride, WIDTH, BLOCK: tl.constexpr):
        tok = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = c < WIDTH
        g = tl.load(gu_ptr + tok * row_stride + c, mask=inside, other=0.0).to(tl.float32)
        u = tl.load(gu_ptr + tok * row_stride + WIDTH + c, mask=inside, other=0.0).to(tl.float32)
        y = g / (1.0 + tl.exp(-g)) * u
        tl.store(out_ptr + tok * WIDTH + c, y.to(out_ptr.dtype.element_ty), mask=inside)
