"""The pointwise parts of the fused decoder layer as Triton kernels (docs/orpheus.md, "Fused
forward"): the rotary embedding of the queries and keys with the values' copy out of the QKV
projection (``rope_qkv``, ``orpheus_rope=triton``), the gate's SiLU times the up projection
(``silu_mul``, ``orpheus_silu_mul=triton``), the residual add and RMSNorm (``add_rmsnorm``,
``orpheus_norm=triton``) and, with fp8 weights, the row-wise fp8 quantisation of what feeds a
GEMM fused into each of these (``quantise``) and alone for the attention's output
(``quantise_rows``).

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
rounds once, as the compiled form (the default with CUDA graphs since session 48, with the norms'
kernels below, the runtime's Triton decode attention and KV write: docs/performance.md).

With fp8 weights the compiled forward quantises four activations a layer (the two RMSNorms'
outputs, SiLU-mul's and the attention's), 0.93 ms of a 512-row fp8 step on an H200 (at
``4c3cad4``): about 8 µs each for 3-16 MB. Here the quantisation is fused into the kernel that
makes the activation: a program holds a whole row, so its largest magnitude, the scale and the
fp8 values come from one read (``add_rmsnorm``, ``silu_mul`` with ``quantise``; ``quantise_rows``
for the attention's output). Numerics as ``engine.llm.fp8.quantise_rowwise`` applied to the
bf16 activation the eager form makes (its roundings kept: the residual sum, the normalised row,
its product with the weight). ``orpheus_norm=triton`` is the default with CUDA graphs (as above).
"""

from __future__ import annotations

import torch
from torch import Tensor

try:  # Triton serves these kernels on CUDA (it comes with CUDA torch); a CPU install need not have it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

__all__ = ["add_rmsnorm", "quantise_rows", "rope_qkv", "silu_mul"]

_FP8_MAX = 448.0  # engine.llm.fp8.FP8_MAX (float8_e4m3fn)
_MIN_AMAX = 1e-12  # engine.llm.fp8's: an all-zero row gets a tiny scale, not a division by zero
Quantised = tuple[Tensor, Tensor]  # (x8 [T, K] fp8, scale [T, 1] float32): engine.llm.fp8.quantise_rowwise's


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


def silu_mul(gu: Tensor, *, quantise: torch.dtype | None = None) -> Tensor | Quantised:
    """gu [T, 2I] (rows contiguous: the gate then the up projection) -> silu(gate) * up [T, I]
    in ``gu``'s dtype; the same function as ``fused_forward._silu_mul``. ``quantise`` (fp8
    weights: ``torch.float8_e4m3fn``) -> that product quantised row-wise instead, (x8, scale) as
    ``fused_forward._silu_mul_q`` (module docstring); ``torch.float32`` gives x8 before its
    cast, for tests."""
    if gu.dim() != 2 or gu.shape[1] % 2 or gu.stride(1) != 1:
        raise ValueError(f"silu_mul: gu {tuple(gu.shape)} is not [T, 2I] with contiguous rows")
    if triton is None:
        raise RuntimeError("orpheus_silu_mul=triton needs Triton (it comes with CUDA torch)")
    t, width = gu.shape[0], gu.shape[1] // 2
    if quantise is not None:
        x8, scale = _quantised(t, width, quantise, gu.device)
        if t:
            block = triton.next_power_of_2(width)  # the whole row in one program: its scale
            silu_mul_quant_kernel[(t,)](gu, x8, scale, gu.stride(0), width, FP8_MAX=_FP8_MAX, MIN_AMAX=_MIN_AMAX,
                                        ROUND_TY=_tl_dtype(gu.dtype), BLOCK=block, num_warps=_warps(block))
        return x8, scale
    out = torch.empty(t, width, dtype=gu.dtype, device=gu.device)
    if t == 0:
        return out
    block = min(2048, triton.next_power_of_2(width))
    silu_mul_kernel[(t, triton.cdiv(width, block))](gu, out, gu.stride(0), width, BLOCK=block, num_warps=4)
    return out


def add_rmsnorm(x: Tensor, residual: Tensor | None, w: Tensor, eps: float, *,
                quantise: torch.dtype | None = None) -> tuple[Tensor | Quantised, Tensor | None]:
    """x [T, D] (rows contiguous), the residual [T, D] or None (the first layer: no add), the
    norm's weight [D] -> (y, r): r = x + residual in x's dtype (None without a residual), y
    ``fused_forward._rmsnorm`` of r (of x without a residual), or with ``quantise`` (fp8 weights:
    ``torch.float8_e4m3fn``) y quantised row-wise, (x8, scale), as ``_add_rmsnorm_q`` /
    ``_rmsnorm_q``; ``torch.float32`` gives x8 before its cast, for tests."""
    if x.dim() != 2 or x.stride(1) != 1 or w.shape != (x.shape[1],) or w.stride(0) != 1:
        raise ValueError(f"add_rmsnorm: x {tuple(x.shape)} / weight {tuple(w.shape)} are not [T, D] with "
                         f"contiguous rows and [D]")
    if residual is not None and (residual.shape != x.shape or residual.stride(1) != 1):
        raise ValueError(f"add_rmsnorm: the residual {tuple(residual.shape)} is not x's {tuple(x.shape)} "
                         f"with contiguous rows")
    if triton is None:
        raise RuntimeError("orpheus_norm=triton needs Triton (it comes with CUDA torch)")
    t, width = x.shape
    r = None if residual is None else torch.empty(t, width, dtype=x.dtype, device=x.device)
    if quantise is not None:
        y, scale = _quantised(t, width, quantise, x.device)
    else:
        y = scale = torch.empty(t, width, dtype=x.dtype, device=x.device)  # (scale: unused)
    if t:
        block = triton.next_power_of_2(width)
        add_rmsnorm_kernel[(t,)](
            x, residual if residual is not None else x, w, r if r is not None else x, y, scale,
            x.stride(0), residual.stride(0) if residual is not None else 0, width, eps,
            HAS_RESIDUAL=residual is not None, QUANTISE=quantise is not None, FP8_MAX=_FP8_MAX,
            MIN_AMAX=_MIN_AMAX, ROUND_TY=_tl_dtype(x.dtype), BLOCK=block, num_warps=_warps(block))
    return ((y, scale) if quantise is not None else y), r


def quantise_rows(x: Tensor, quantise: torch.dtype) -> Quantised:
    """``engine.llm.fp8.quantise_rowwise(x)`` as one kernel: x [T, K] (rows contiguous) ->
    (x8 [T, K] ``quantise``, scale [T, 1] float32)."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"quantise_rows: x {tuple(x.shape)} is not [T, K] with contiguous rows")
    if triton is None:
        raise RuntimeError("orpheus_norm=triton needs Triton (it comes with CUDA torch)")
    t, width = x.shape
    x8, scale = _quantised(t, width, quantise, x.device)
    if t:
        block = triton.next_power_of_2(width)
        quantise_rows_kernel[(t,)](x, x8, scale, x.stride(0), width, FP8_MAX=_FP8_MAX, MIN_AMAX=_MIN_AMAX,
                                   BLOCK=block, num_warps=_warps(block))
    return x8, scale


def _quantised(t: int, width: int, dtype: torch.dtype, device: torch.device) -> Quantised:
    if dtype not in (torch.float8_e4m3fn, torch.float32):
        raise ValueError(f"quantise to {dtype}: float8_e4m3fn (or float32, the values before the cast)")
    return (torch.empty(t, width, dtype=dtype, device=device),
            torch.empty(t, 1, dtype=torch.float32, device=device))


def _warps(block: int) -> int:
    return max(1, min(16, block // 512))  # a whole row a program: 16 elements a thread at 4,096 to 8,192


def _tl_dtype(dtype: torch.dtype):  # the activations' dtype, where a kernel rounds as the eager form does
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[dtype]


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

    @triton.jit
    def silu_mul_quant_kernel(gu_ptr, x8_ptr, scale_ptr, row_stride, WIDTH, FP8_MAX: tl.constexpr,
                              MIN_AMAX: tl.constexpr, ROUND_TY: tl.constexpr, BLOCK: tl.constexpr):
        tok = tl.program_id(0).to(tl.int64)
        c = tl.arange(0, BLOCK)
        inside = c < WIDTH
        g = tl.load(gu_ptr + tok * row_stride + c, mask=inside, other=0.0).to(tl.float32)
        u = tl.load(gu_ptr + tok * row_stride + WIDTH + c, mask=inside, other=0.0).to(tl.float32)
        y = (g / (1.0 + tl.exp(-g)) * u).to(ROUND_TY).to(tl.float32)  # the activation, rounded once
        _store_quantised(y, x8_ptr + tok * WIDTH + c, scale_ptr + tok, inside, FP8_MAX, MIN_AMAX)

    @triton.jit
    def add_rmsnorm_kernel(x_ptr, res_ptr, w_ptr, r_ptr, y_ptr, scale_ptr, x_stride, res_stride, WIDTH, eps,
                           HAS_RESIDUAL: tl.constexpr, QUANTISE: tl.constexpr, FP8_MAX: tl.constexpr,
                           MIN_AMAX: tl.constexpr, ROUND_TY: tl.constexpr, BLOCK: tl.constexpr):
        tok = tl.program_id(0).to(tl.int64)
        c = tl.arange(0, BLOCK)
        inside = c < WIDTH
        h = tl.load(x_ptr + tok * x_stride + c, mask=inside, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:  # the residual sum in the activations' dtype, as the reference's add
            h = (h + tl.load(res_ptr + tok * res_stride + c, mask=inside, other=0.0).to(tl.float32)).to(ROUND_TY)
            tl.store(r_ptr + tok * WIDTH + c, h, mask=inside)
            h = h.to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / WIDTH + eps)
        w = tl.load(w_ptr + c, mask=inside, other=0.0).to(tl.float32)
        y = (w * (h * inv).to(ROUND_TY).to(tl.float32)).to(ROUND_TY)  # _rmsnorm's two roundings
        if QUANTISE:
            _store_quantised(y.to(tl.float32), y_ptr + tok * WIDTH + c, scale_ptr + tok, inside, FP8_MAX, MIN_AMAX)
        else:
            tl.store(y_ptr + tok * WIDTH + c, y, mask=inside)

    @triton.jit
    def quantise_rows_kernel(x_ptr, x8_ptr, scale_ptr, x_stride, WIDTH, FP8_MAX: tl.constexpr,
                             MIN_AMAX: tl.constexpr, BLOCK: tl.constexpr):
        tok = tl.program_id(0).to(tl.int64)
        c = tl.arange(0, BLOCK)
        inside = c < WIDTH
        x = tl.load(x_ptr + tok * x_stride + c, mask=inside, other=0.0).to(tl.float32)
        _store_quantised(x, x8_ptr + tok * WIDTH + c, scale_ptr + tok, inside, FP8_MAX, MIN_AMAX)

    @triton.jit
    def _store_quantised(x, x8_at, scale_at, inside, FP8_MAX: tl.constexpr, MIN_AMAX: tl.constexpr):
        # engine.llm.fp8.quantise_rowwise of one row (float32 x, zeros outside): the largest
        # magnitude maps to FP8_MAX; the values divided by the scale, clamped, cast once
        scale = tl.maximum(tl.max(tl.abs(x), axis=0), MIN_AMAX) / FP8_MAX
        q = tl.minimum(tl.maximum(x / scale, -FP8_MAX), FP8_MAX)
        tl.store(x8_at, q.to(x8_at.dtype.element_ty), mask=inside)
        tl.store(scale_at, scale)
