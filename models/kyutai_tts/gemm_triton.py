"""The depth transformer's matmuls with their neighbours fused in, in Triton
(``kyutai_depth_gemm=triton``; docs/models/kyutai_tts.md, "Depth transformer").

A codebook step of one depth-transformer layer is, as torch ops, eight kernels: the input
projection, the attention, the output projection, a residual sum with the next norm, the gating's
input projection, its silu-mul, its output projection and another residual sum with a norm. On
the GPU the frame (24 codebooks, 4 layers) is bound by its kernel count, not by arithmetic, so
here each matmul takes what sits beside it: the norm before it (each program computes its rows'
RMS from the activations it reads anyway and normalises them, rounded to the weights' dtype, as
``rms_norm`` does, before they meet the weights), the gating's silu-mul after the gating's input
projection (both halves of a column pair in one program) and the residual sum after an output
projection. A layer is five kernels: ``linear_rms`` (queries, keys, values), the attention,
``linear_residual``, ``linear_rms_glu``, ``linear_residual``. Each rounds where the torch ops
round (the projection's output before the silu-mul and before the residual sum), so the two
differ by the matmuls' order of summation.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

try:  # Triton serves these kernels on CUDA (it comes with CUDA torch); a CPU install need not have it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

__all__ = ["DEPTH_GEMMS", "DEPTH_GEMMS_ATTEND", "Blocks", "DepthGemms", "blocks_for", "linear_residual", "linear_rms",
           "linear_rms_attend", "linear_rms_glu"]

def _check(x: Tensor, w: Tensor, what: str) -> tuple[int, int, int]:
    if triton is None:
        raise RuntimeError("kyutai_depth_gemm=triton needs Triton (it comes with CUDA torch)")
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1] or x.dtype != w.dtype:
        raise ValueError(f"{what}: x {tuple(x.shape)} {x.dtype} and weight {tuple(w.shape)} {w.dtype} do not match")
    if x.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError(f"{what}: x and the weight need contiguous rows")
    return x.shape[0], w.shape[0], x.shape[1]


class Blocks(NamedTuple):
    """A launch's shape: rows and columns a program takes, the K slice a loop step reads, and
    Triton's warps and pipeline stages (``benchmark.gpu.depth_gemm`` compares them)."""

    m: int
    n: int
    k: int = 128
    warps: int = 4
    stages: int = 3


def blocks_for(m: int, n: int) -> Blocks:
    """The default launch: 16 rows, 32 columns and 256 of K a step up to 64 rows (the fastest of
    ten shapes at 1-64 rows for each of the four matmuls on an H200, 45c1f5da,
    ``benchmark.gpu.depth_gemm``; docs/performance.md), wider blocks beyond."""
    if m <= 64:
        return Blocks(16, 32, 256)
    return Blocks(64, 32 if n <= 1024 else 64)


def _launch(x: Tensor, weight: Tensor, alpha: Tensor, residual: Tensor, out: Tensor, n: int, half: int, eps: float,
            blocks: Blocks | None, **flags: bool) -> Tensor:
    m, k = x.shape
    b = blocks or blocks_for(m, n)
    _linear_kernel[(triton.cdiv(m, b.m), triton.cdiv(n, b.n))](
        x, weight, alpha, residual, out, m, n, k, x.stride(0), weight.stride(0), residual.stride(0), out.stride(0),
        half, eps, **flags, BLOCK_M=b.m, BLOCK_N=b.n, BLOCK_K=b.k, num_warps=b.warps, num_stages=b.stages)
    return out


def linear_rms(x: Tensor, weight: Tensor, alpha: Tensor, eps: float, blocks: Blocks | None = None) -> Tensor:
    """``F.linear(rms_norm(x, alpha, eps), weight)`` in one kernel: x [M, K], weight [N, K],
    alpha [K] -> [M, N]."""
    m, n, _ = _check(x, weight, "linear_rms")
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    return _launch(x, weight, alpha, x, out, n, 0, eps, blocks, RMS=True, GLU=False, RESIDUAL=False)


def linear_rms_glu(x: Tensor, weight: Tensor, alpha: Tensor, eps: float, blocks: Blocks | None = None) -> Tensor:
    """The gating's first half in one kernel: h = ``F.linear(rms_norm(x, alpha, eps), weight)``
    (weight [2 F, K]: the gate's rows, then the value's), rounded, then ``silu(h[:, :F]) *
    h[:, F:]`` -> [M, F]."""
    m, n2, k = _check(x, weight, "linear_rms_glu")
    if n2 % 2:
        raise ValueError(f"linear_rms_glu: the weight's {n2} rows are not two halves")
    n = n2 // 2
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    return _launch(x, weight, alpha, x, out, n, n, eps, blocks, RMS=True, GLU=True, RESIDUAL=False)


def linear_residual(x: Tensor, weight: Tensor, residual: Tensor, blocks: Blocks | None = None) -> Tensor:
    """``residual + F.linear(x, weight)`` in one kernel (the product rounded before the sum, as
    the two ops round): x [M, K], weight [N, K], residual [M, N] -> a new [M, N]."""
    m, n, _ = _check(x, weight, "linear_residual")
    if residual.shape != (m, n) or residual.stride(1) != 1 or residual.dtype != x.dtype:
        raise ValueError(f"linear_residual: residual {tuple(residual.shape)} is not [{m}, {n}] of x's dtype")
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    return _launch(x, weight, weight, residual, out, n, 0, 0.0, blocks, RMS=False, GLU=False, RESIDUAL=True)


def linear_rms_attend(x: Tensor, weight: Tensor, alpha: Tensor, eps: float, cache: Tensor, k: int,
                      blocks: Blocks | None = None) -> Tensor:
    """``linear_rms``'s queries, keys and values (weight [3 H D, K]: the queries' rows, the
    keys', the values') and codebook ``k``'s attention over them (``attend_codebook``: the key
    and value written at ``k`` of cache [B, 2, H, n, D], the query against the keys so far) in
    one kernel, a program per block of rows and head -> [B, H D]."""
    m, n3, _ = _check(x, weight, "linear_rms_attend")
    b_, two, h, n, d = cache.shape
    if two != 2 or b_ != m or n3 != 3 * h * d or not cache.is_contiguous() or cache.dtype != x.dtype:
        raise ValueError(f"linear_rms_attend: cache {tuple(cache.shape)} does not hold [{m}, 2, H, n, D] for "
                         f"weight {tuple(weight.shape)}")
    if not 0 <= k < n or d & (d - 1):
        raise ValueError("linear_rms_attend needs a power-of-two head size and 0 <= k < n")
    out = torch.empty(m, h * d, dtype=x.dtype, device=x.device)
    bl = blocks or Blocks(16 if m <= 16 else 32, d)
    _qkv_attend_kernel[(triton.cdiv(m, bl.m), h)](
        x, weight, alpha, cache, out, m, x.shape[1], h, n, k, x.stride(0), weight.stride(0), eps, d ** -0.5,
        D=d, BLOCK_M=bl.m, BLOCK_K=bl.k, num_warps=bl.warps, num_stages=bl.stages)
    return out


class DepthGemms(NamedTuple):
    """The fused matmuls ``decode_frame`` runs a layer with (``FrameFns.gemms``); with
    ``rms_attend`` the queries, keys and values and the attention are one kernel too."""

    rms: object
    rms_glu: object
    residual: object
    rms_attend: object = None


DEPTH_GEMMS = DepthGemms(linear_rms, linear_rms_glu, linear_residual)
DEPTH_GEMMS_ATTEND = DEPTH_GEMMS._replace(rms_attend=linear_rms_attend)


if triton is not None:  # (else the kernel is not made: the callers say Triton is needed)
    @triton.jit
    def _rms_scale(xs, row_in, K, eps, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
        """The rows' norm scale, moshi's rms_norm_f32: rsqrt(eps + mean(x ** 2)) in float32."""
        ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(xs + ks[None, :], mask=row_in[:, None] & (ks < K)[None, :], other=0.0).to(tl.float32)
            ss += tl.sum(a * a, axis=1)
        return 1.0 / tl.sqrt(eps + ss / K)

    @triton.jit
    def _linear_kernel(x_ptr, w_ptr, alpha_ptr, res_ptr, out_ptr, M, N, K, stride_x, stride_w, stride_r, stride_o,
                       half, eps, RMS: tl.constexpr, GLU: tl.constexpr, RESIDUAL: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_in, col_in = rows < M, cols < N
        xs = x_ptr + rows.to(tl.int64)[:, None] * stride_x
        ws = w_ptr + cols.to(tl.int64)[None, :] * stride_w  # [1, BLOCK_N]: the weight read as [K, N]
        dt = w_ptr.dtype.element_ty
        if RMS:  # the rows' scale first
            scale = _rms_scale(xs, row_in, K, eps, BLOCK_M, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if GLU:
            acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_in = ks < K
            a = tl.load(xs + ks[None, :], mask=row_in[:, None] & k_in[None, :], other=0.0)
            if RMS:  # normalised and rounded as rms_norm's output is, then the matmul
                al = tl.load(alpha_ptr + ks, mask=k_in, other=0.0).to(tl.float32)
                a = (a.to(tl.float32) * scale[:, None] * al[None, :]).to(dt)
            w = tl.load(ws + ks[:, None], mask=k_in[:, None] & col_in[None, :], other=0.0)
            acc = tl.dot(a, w, acc, input_precision="ieee")
            if GLU:
                w2 = tl.load(ws + half * stride_w + ks[:, None], mask=k_in[:, None] & col_in[None, :], other=0.0)
                acc2 = tl.dot(a, w2, acc2, input_precision="ieee")
        y = acc.to(dt).to(tl.float32)  # the projection's output, rounded as F.linear's
        if GLU:
            u = acc2.to(dt).to(tl.float32)
            y = y / (1.0 + tl.exp(-y)) * u
        if RESIDUAL:
            y += tl.load(res_ptr + rows.to(tl.int64)[:, None] * stride_r + cols[None, :],
                         mask=row_in[:, None] & col_in[None, :], other=0.0).to(tl.float32)
        tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_o + cols[None, :], y.to(dt),
                 mask=row_in[:, None] & col_in[None, :])

    @triton.jit
    def _qkv_attend_kernel(x_ptr, w_ptr, alpha_ptr, cache_ptr, out_ptr, M, K, H, NPOS, kpos, stride_x, stride_w, eps,
                           scale, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        head = tl.program_id(1)
        row_in = rows < M
        rows64 = rows.to(tl.int64)
        xs = x_ptr + rows64[:, None] * stride_x
        d = tl.arange(0, D)
        wq = w_ptr + (head * D + d).to(tl.int64)[None, :] * stride_w  # [1, D]: this head's query rows
        wk = wq + H * D * stride_w
        wv = wk + H * D * stride_w
        dt = w_ptr.dtype.element_ty
        rscale = _rms_scale(xs, row_in, K, eps, BLOCK_M, BLOCK_K)
        acc_q = tl.zeros((BLOCK_M, D), dtype=tl.float32)
        acc_k = tl.zeros((BLOCK_M, D), dtype=tl.float32)
        acc_v = tl.zeros((BLOCK_M, D), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_in = ks < K
            a = tl.load(xs + ks[None, :], mask=row_in[:, None] & k_in[None, :], other=0.0)
            al = tl.load(alpha_ptr + ks, mask=k_in, other=0.0).to(tl.float32)
            a = (a.to(tl.float32) * rscale[:, None] * al[None, :]).to(dt)
            acc_q = tl.dot(a, tl.load(wq + ks[:, None], mask=k_in[:, None], other=0.0), acc_q, input_precision="ieee")
            acc_k = tl.dot(a, tl.load(wk + ks[:, None], mask=k_in[:, None], other=0.0), acc_k, input_precision="ieee")
            acc_v = tl.dot(a, tl.load(wv + ks[:, None], mask=k_in[:, None], other=0.0), acc_v, input_precision="ieee")
        q = acc_q.to(dt).to(tl.float32)  # each rounded as F.linear's output, as the cache holds them
        k_new = acc_k.to(dt)
        v_new = acc_v.to(dt)
        keys = cache_ptr + rows64[:, None] * (2 * H * NPOS * D) + head * NPOS * D + d[None, :]  # [BLOCK_M, D] at 0
        values = keys + H * NPOS * D
        tl.store(keys + kpos * D, k_new, mask=row_in[:, None])
        tl.store(values + kpos * D, v_new, mask=row_in[:, None])
        # attention over the keys before and the new one, in float32 (a running softmax)
        m_i = tl.sum(q * k_new.to(tl.float32), axis=1) * scale
        l_i = tl.full((BLOCK_M,), 1.0, dtype=tl.float32)
        o = v_new.to(tl.float32)
        for j in range(0, kpos):
            kj = tl.load(keys + j * D, mask=row_in[:, None], other=0.0).to(tl.float32)
            vj = tl.load(values + j * D, mask=row_in[:, None], other=0.0).to(tl.float32)
            s = tl.sum(q * kj, axis=1) * scale
            m_new = tl.maximum(m_i, s)
            c = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new)
            l_i = l_i * c + p
            o = o * c[:, None] + p[:, None] * vj
            m_i = m_new
        o = o / l_i[:, None]
        tl.store(out_ptr + rows64[:, None] * (H * D) + head * D + d[None, :], o.to(dt), mask=row_in[:, None])
