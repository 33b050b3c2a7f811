"""The voice cross-attention of the temporal transformer in one Triton kernel that reads only the
voices a step's rows use (``kyutai_cross_attention=triton``; docs/models/kyutai_tts.md, "Voices").

``VoiceBank.attend`` scores every token against every bank voice's keys and masks the other
voices (one fused SDPA call over 8 voices x 625 keys): on an H200 it took about 135 µs a layer
from 64 to 256 rows, the same at every batch (a flash kernel over 5,000 keys with one query
sequence: few thread blocks, each streaming every key). Here a program is one (block of rows,
head, voice): it returns at once when none of its rows speaks that voice, and otherwise attends
those rows over that voice's 625 keys only (tensor-core dots, online softmax in float32); each
row is written by the one program of its voice. Unmasked within a voice, as moshi's
cross-attention and ``VoiceBank.attend``.
"""

from __future__ import annotations

import torch
from torch import Tensor

try:  # Triton serves this kernel on CUDA (it comes with CUDA torch); a CPU install need not have it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

__all__ = ["attend_voices"]


def attend_voices(q: Tensor, k: Tensor, v: Tensor, rows: Tensor) -> Tensor:
    """q [T, H, D] (contiguous), one layer's bank keys and values k, v [V, L, H, D] (contiguous),
    rows [T] (each token's bank row, int) -> [T, H * D] in ``q``'s dtype."""
    t, h, d = q.shape
    voices, length = k.shape[0], k.shape[1]
    if k.shape != v.shape or k.shape[2:] != (h, d) or rows.shape != (t,):
        raise ValueError(f"attend_voices: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} and rows "
                         f"{tuple(rows.shape)} do not match")
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()) or d & (d - 1) or d < 16:
        raise ValueError("attend_voices needs contiguous inputs and a power-of-two head size of 16 or more")
    if triton is None:
        raise RuntimeError("kyutai_cross_attention=triton needs Triton (it comes with CUDA torch)")
    out = torch.empty(t, h * d, dtype=q.dtype, device=q.device)
    block_m = 16 if t <= 16 else 32
    grid = (triton.cdiv(t, block_m), h, voices)
    attend_voices_kernel[grid](q, k, v, rows, out, t, h, length, d ** -0.5, IEEE=q.dtype == torch.float32,
                               D=d, BLOCK_M=block_m, BLOCK_N=64, num_warps=4, num_stages=2)
    return out


if triton is not None:  # (else the kernel is not made: the callers say Triton is needed)
    @triton.jit
    def attend_voices_kernel(q_ptr, k_ptr, v_ptr, rows_ptr, out_ptr, T, H, L, scale, IEEE: tl.constexpr,
                             D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # tokens
        head = tl.program_id(1)
        voice = tl.program_id(2)
        mine = tl.load(rows_ptr + rm, mask=rm < T, other=-1) == voice
        if tl.sum(mine.to(tl.int32), axis=0) > 0:  # (else no row of this block speaks this voice)
            d = tl.arange(0, D)
            at = rm.to(tl.int64)[:, None] * (H * D) + head * D + d[None, :]  # [BLOCK_M, D] in q and out
            q = tl.load(q_ptr + at, mask=mine[:, None], other=0.0)
            base = voice.to(tl.int64) * L * H * D + head * D  # key 0 of this voice and head
            m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
            l_i = tl.zeros((BLOCK_M,), tl.float32)
            acc = tl.zeros((BLOCK_M, D), tl.float32)
            for n0 in range(0, L, BLOCK_N):
                rn = n0 + tl.arange(0, BLOCK_N)
                kv_at = base + rn.to(tl.int64)[:, None] * (H * D) + d[None, :]  # [BLOCK_N, D]
                keys = tl.load(k_ptr + kv_at, mask=(rn < L)[:, None], other=0.0)
                if IEEE:
                    s = tl.dot(q, tl.trans(keys), input_precision="ieee")
                else:
                    s = tl.dot(q, tl.trans(keys))
                s = tl.where((rn < L)[None, :], s * scale, float("-inf"))  # [BLOCK_M, BLOCK_N]
                m_new = tl.maximum(m_i, tl.max(s, axis=1))
                p = tl.exp(s - m_new[:, None])
                alpha = tl.exp(m_i - m_new)
                values = tl.load(v_ptr + kv_at, mask=(rn < L)[:, None], other=0.0)
                if IEEE:
                    pv = tl.dot(p, values, input_precision="ieee")
                else:
                    pv = tl.dot(p.to(values.dtype), values)
                acc = acc * alpha[:, None] + pv
                l_i = l_i * alpha + tl.sum(p, axis=1)
                m_i = m_new
            o = acc / l_i[:, None]
            tl.store(out_ptr + at, o.to(out_ptr.dtype.element_ty), mask=mine[:, None])
