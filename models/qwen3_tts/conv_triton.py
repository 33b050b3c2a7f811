"""A causal dense convolution of ``k`` taps on channels-last activations as one implicit GEMM in
Triton (``codec_conv=triton``; docs/models/qwen3_tts.md, "Codec").

The channels-last step (``codec_nwc._Dense``) makes a dense convolution one GEMM of its
gathered taps: a [N, n, k * C_in] copy of the inputs, written and read again, seven times the
inputs' size for the decoder's seven-tap convolutions, whose high-rate stages run hundreds of
samples a frame per row. This kernel reads each tap where it lies, in the [N, ctx + n, C_in]
tensor of the state's context followed by the new inputs: row ``(i, t)``'s column ``j * C_in +
c`` is ``full[i, t + j * dilation, c]``, so a block of columns within one tap is a contiguous run
of channels. Float32 accumulation; the bias added before the one rounding to the output dtype.

With ``residual`` the residual sum after the convolution is added in the epilogue, and with
``snake_out`` the SnakeBeta that the next convolution takes is applied to the output there (per
output channel, after the one rounding, as the separate kernel would), so neither is written and
read again (``codec_conv=fused``). SnakeBeta in the epilogue is computed once per output; in the
loads (session 36's form, measured twice as slow on an H200) it was computed again for every
tap and every block of output channels that read an input. With ``state`` the kernel reads a
row's first ``ctx`` inputs from its slot's state and the rest from the new inputs, so the
[state, inputs] concatenation (a copy of every input) is not made either
(``codec_conv=fused-state``).
"""

from __future__ import annotations

import torch
from torch import Tensor

try:  # Triton serves this kernel on CUDA (it comes with CUDA torch); a CPU install need not have it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

__all__ = ["conv_taps", "taps_weight"]


def taps_weight(weight: Tensor) -> Tensor:
    """A conv weight [C_out, C_in, k] -> the kernel's [k * C_in, C_out] (tap-major rows)."""
    c_out, c_in, k = weight.shape
    return weight.permute(2, 1, 0).reshape(k * c_in, c_out).contiguous()


def conv_taps(full: Tensor, weight: Tensor, bias: Tensor | None, n: int, dilation: int,
              residual: Tensor | None = None, state: tuple[Tensor, Tensor] | None = None,
              snake_out: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """full [N, L, C_in] (contiguous; L = (k - 1) * dilation + n), weight [k * C_in, C_out]
    (``taps_weight``), bias [C_out] or None -> [N, n, C_out] in ``full``'s dtype. ``residual``:
    [N, n, C_out] (contiguous) added to the output. ``state``: (states [S, ctx, C_in], slots
    int64 [N]), contiguous, ctx = (k - 1) * dilation: then ``full`` is the new inputs [N, n,
    C_in] alone and the inputs before them are ``states[slots]`` (the caller updates the states
    after). ``snake_out``: (alpha, inv_beta) [C_out] each, SnakeBeta (``codec_nwc.snake``)
    applied to the output last."""
    if triton is None:
        raise RuntimeError("codec_conv=triton needs Triton (it comes with CUDA torch)")
    batch, length, c_in = full.shape
    k_total, c_out = weight.shape
    if not full.is_contiguous() or not weight.is_contiguous():
        raise ValueError("conv_taps needs contiguous inputs")
    ctx = (k_total // c_in - 1) * dilation
    states, slots = state if state is not None else (full, full)  # (unread without FROM_STATE)
    if state is not None:
        if states.shape[1:] != (ctx, c_in) or not states.is_contiguous() or slots.shape != (batch,):
            raise ValueError(f"conv_taps: states {tuple(states.shape)} and slots {tuple(slots.shape)} do not "
                             f"fit [S, {ctx}, {c_in}] and [{batch}]")
        length += ctx  # (the inputs the taps read: the states' and the new)
    if k_total % c_in or ctx + n != length:
        raise ValueError(f"conv_taps: {k_total // c_in} taps of dilation {dilation} and {n} outputs "
                         f"do not fit {length} inputs")
    if residual is not None and (residual.shape != (batch, n, c_out) or not residual.is_contiguous()):
        raise ValueError(f"conv_taps: residual {tuple(residual.shape)} is not a contiguous [{batch}, {n}, {c_out}]")
    if snake_out is not None and (snake_out[0].shape != (c_out,) or snake_out[1].shape != (c_out,)):
        raise ValueError(f"conv_taps: the output SnakeBeta's parameters must be [{c_out}]")
    out = torch.empty(batch, n, c_out, dtype=full.dtype, device=full.device)
    alpha, inv_beta = snake_out if snake_out is not None else (weight, weight)  # (unread without SNAKE_OUT)
    m = batch * n
    block_m, block_n = 64, (32 if c_out <= 32 else 64 if c_out <= 64 else 128)
    block_k = 64 if c_in % 64 == 0 else 32 if c_in % 32 == 0 else 16
    grid = (triton.cdiv(m, block_m), triton.cdiv(c_out, block_n))
    conv_taps_kernel[grid](full, weight, bias if bias is not None else weight, out, m, n, length, c_in, c_out, k_total,
                 dilation, alpha, inv_beta, residual if residual is not None else out, states, slots, ctx,
                 HAS_BIAS=bias is not None, SNAKE_OUT=snake_out is not None, RESIDUAL=residual is not None,
                 FROM_STATE=state is not None,
                 IEEE=full.dtype == torch.float32,  # (float32 as torch computes it: no TF32)
                 BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4 if block_n < 128 else 8, num_stages=3)
    return out


if triton is not None:  # (else the kernel is not made: the callers say Triton is needed)
    @triton.jit
    def conv_taps_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, n, L, C_in, C_out, K, dil, alpha_ptr, inv_beta_ptr, r_ptr,
                         s_ptr, slots_ptr, CTX,
                         HAS_BIAS: tl.constexpr, SNAKE_OUT: tl.constexpr, RESIDUAL: tl.constexpr,
                         FROM_STATE: tl.constexpr, IEEE: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # output rows (i, t)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # output channels
        row = rm.to(tl.int64)
        base = (row // n) * L * C_in + (row % n) * C_in  # offset of full[i, t, 0]
        if FROM_STATE:  # full[i] is states[slots[i]] (CTX inputs) then x[i] (n inputs)
            t = row % n
            x_row = (row // n) * n * C_in  # offset of x[i, 0, 0]
            s_row = tl.load(slots_ptr + row // n, mask=rm < M, other=0).to(tl.int64) * CTX * C_in
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)  # columns: tap rk // C_in, channel rk % C_in
            valid = (rm[:, None] < M) & (rk[None, :] < K)
            if FROM_STATE:
                pos = t[:, None] + ((rk // C_in) * dil)[None, :]  # the input's place in full[i]
                ch = (rk % C_in)[None, :]
                early = pos < CTX
                a_s = tl.load(s_ptr + s_row[:, None] + pos * C_in + ch, mask=valid & early, other=0.0)
                a_x = tl.load(x_ptr + x_row[:, None] + (pos - CTX) * C_in + ch, mask=valid & (pos >= CTX), other=0.0)
                a = tl.where(early, a_s, a_x)
            else:
                col = (rk // C_in) * dil * C_in + rk % C_in
                a = tl.load(x_ptr + base[:, None] + col[None, :], mask=valid, other=0.0)
            w = tl.load(w_ptr + rk[:, None] * C_out + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < C_out),
                        other=0.0)
            if IEEE:
                acc += tl.dot(a, w, input_precision="ieee")
            else:
                acc += tl.dot(a, w)
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=rn < C_out, other=0.0).to(tl.float32)[None, :]
        at = rm.to(tl.int64)[:, None] * C_out + rn[None, :]
        keep = (rm[:, None] < M) & (rn[None, :] < C_out)
        if RESIDUAL:  # (the output rounded once, after the sum)
            acc += tl.load(r_ptr + at, mask=keep, other=0.0).to(tl.float32)
        y = acc.to(y_ptr.dtype.element_ty)
        if SNAKE_OUT:  # y + sin(alpha y)^2 / beta per output channel, on the rounded y, as the separate kernel
            al = tl.load(alpha_ptr + rn, mask=rn < C_out, other=0.0).to(tl.float32)
            ib = tl.load(inv_beta_ptr + rn, mask=rn < C_out, other=0.0).to(tl.float32)
            yf = y.to(tl.float32)
            sn = tl.sin(yf * al[None, :])
            y = (yf + ib[None, :] * sn * sn).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + at, y, mask=keep)
