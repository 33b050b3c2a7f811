"""Mimi's decoder transformer attention over each slot's ring of keys and values in one Triton
kernel a layer (``--model-setting mimi_attention=triton``; docs/models/kyutai_tts.md, "The Mimi
codec").

``MimiDecodeStream._transformer`` keeps each slot's last ``W`` (250) keys and values in a ring
[S, W, H, D]; a layer's step writes the frame's ``n`` new keys and values, gathers the step's
slots' rings (``index_select``: a copy of every slot's whole window, written and read again) and
attends through a masked SDPA. Here one program per row and head writes its ``n`` new keys and
values into the slot's ring and attends each of the row's ``n`` queries over the entries it may
see, reading each entry once where it lies, in blocks of the window with an online softmax in
float32.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

try:  # Triton serves this kernel on CUDA (it comes with CUDA torch); a CPU install need not have it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

__all__ = ["ATTENTIONS", "attention_setting", "ring_attend_steps"]

ATTENTIONS = ("sdpa", "triton")


def attention_setting(ctx: Any) -> str:
    """``mimi_attention`` of a program's load context (Kyutai TTS and CSM share Mimi): "sdpa"
    (the default: the ring writes, a gather of the step's slots' rings and a masked SDPA) or
    "triton" (``ring_attend_steps``; CUDA, or Triton's CPU interpreter, and Triton installed)."""
    from models.triton_setting import triton_asked

    return "triton" if triton_asked(ctx, "mimi_attention", "sdpa", "sdpa", triton) else "sdpa"


def ring_attend_steps(q: Tensor, k: Tensor, v: Tensor, k_ring: Tensor, v_ring: Tensor, slots: Tensor,
                      pos: Tensor) -> Tensor:
    """q, k and v [N, n, H, D] (each step's heads contiguous; rows and steps strided), the rings
    [S, W, H, D] (contiguous), ``slots`` and ``pos`` int64 [N] (each row's slot and the steps its
    slot has decoded) -> [N, n, H * D]. Step ``t``'s key and value are written at ``(pos + t) %
    W`` of the row's slot; query ``t`` (position ``pos + t``) sees the entries whose position,
    after the writes, is at most its own and fewer than ``W`` before it: what the ring writes,
    ``attend_mask`` and ``attend`` compute in ``MimiDecodeStream._transformer`` (with ``n`` > 1 the
    later steps' writes replace entries the first query would still see, there as here)."""
    n, steps, h, d = q.shape
    s, w = k_ring.shape[0], k_ring.shape[1]
    if k.shape != q.shape or v.shape != q.shape or k_ring.shape != (s, w, h, d) or v_ring.shape != k_ring.shape \
            or slots.shape != (n,) or pos.shape != (n,):
        raise ValueError(f"ring_attend_steps: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, the rings "
                         f"{tuple(k_ring.shape)}, slots {tuple(slots.shape)} and pos {tuple(pos.shape)} do not match")
    if d & (d - 1) or not (k_ring.is_contiguous() and v_ring.is_contiguous()) or not 1 <= steps <= w:
        raise ValueError("ring_attend_steps needs contiguous rings, a power-of-two head size and 1..W steps")
    for t in (q, k, v):
        if t.stride(3) != 1 or t.stride(2) != d:
            raise ValueError("ring_attend_steps: each step's heads must be contiguous")
    if triton is None:
        raise RuntimeError("mimi_attention=triton needs Triton (it comes with CUDA torch)")
    out = torch.empty(n, steps, h * d, dtype=q.dtype, device=q.device)
    if n:
        ring_steps_kernel[(n * h,)](q, k, v, k_ring, v_ring, slots, pos, out, q.stride(0), q.stride(1),
                                    k.stride(0), k.stride(1), v.stride(0), v.stride(1), h, w, d ** -0.5,
                                    STEPS=steps, STEPS_P2=max(2, 1 << (steps - 1).bit_length()), D=d,
                                    BLOCK_W=64, num_warps=4)
    return out


if triton is not None:  # (else the kernel is not made: the callers say Triton is needed)
    @triton.jit
    def ring_steps_kernel(q_ptr, k_ptr, v_ptr, kr_ptr, vr_ptr, slots_ptr, pos_ptr, out_ptr, q_row, q_step, k_row,
                          k_step, v_row, v_step, H, W, scale, STEPS: tl.constexpr, STEPS_P2: tl.constexpr,
                          D: tl.constexpr, BLOCK_W: tl.constexpr):
        pid = tl.program_id(0)  # row * H + head
        row = (pid // H).to(tl.int64)
        head = pid % H
        d = tl.arange(0, D)
        t = tl.arange(0, STEPS_P2)
        live = t < STEPS  # (query slots past the row's steps are padding)
        slot = tl.load(slots_ptr + row).to(tl.int64)
        p0 = tl.load(pos_ptr + row).to(tl.int64)
        last = p0 + STEPS - 1  # the newest position once this step's writes are done
        q_pos = p0 + t  # [STEPS_P2]
        tile = live[:, None] & (d < D)[None, :]
        qs = tl.load(q_ptr + row * q_row + t[:, None] * q_step + head * D + d[None, :], mask=tile,
                     other=0.0).to(tl.float32)  # [STEPS_P2, D]
        ring = slot * W * H * D + head * D  # entry j of this slot and head: ring + j * H * D
        # the new keys and values: written to the ring now, read from registers below (a sibling
        # program's reads never touch this row and head's entries)
        for i in tl.static_range(STEPS):
            at = (p0 + i) % W
            tl.store(kr_ptr + ring + at * H * D + d, tl.load(k_ptr + row * k_row + i * k_step + head * D + d))
            tl.store(vr_ptr + ring + at * H * D + d, tl.load(v_ptr + row * v_row + i * v_step + head * D + d))
        m = tl.full([STEPS_P2], -1.0e30, tl.float32)
        l = tl.zeros([STEPS_P2], tl.float32)
        acc = tl.zeros([STEPS_P2, D], tl.float32)
        for start in range(0, W, BLOCK_W):
            j = start + tl.arange(0, BLOCK_W)
            inside = j < W
            k_pos = last - (last - j + W) % W  # the position entry j holds (< 0: never written)
            # entries written by this step hold positions p0..last: take them from the inputs
            fresh = k_pos >= p0
            old = (inside & ~fresh)[:, None] & (d < D)[None, :]
            where = ring + j[:, None] * (H * D) + d[None, :]
            keys = tl.load(kr_ptr + where, mask=old, other=0.0).to(tl.float32)
            values = tl.load(vr_ptr + where, mask=old, other=0.0).to(tl.float32)
            for i in tl.static_range(STEPS):
                is_i = (inside & (k_pos == p0 + i))[:, None]
                k_i = tl.load(k_ptr + row * k_row + i * k_step + head * D + d).to(tl.float32)
                v_i = tl.load(v_ptr + row * v_row + i * v_step + head * D + d).to(tl.float32)
                keys = tl.where(is_i, k_i[None, :], keys)
                values = tl.where(is_i, v_i[None, :], values)
            delta = q_pos[:, None] - k_pos[None, :]  # [STEPS_P2, BLOCK_W]
            seen = live[:, None] & (inside & (k_pos >= 0))[None, :] & (delta >= 0) & (delta < W)
            scores = tl.sum(qs[:, None, :] * keys[None, :, :], axis=2) * scale
            scores = tl.where(seen, scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            e = tl.exp(scores - m_new[:, None])
            alpha = tl.exp(m - m_new)
            l = l * alpha + tl.sum(e, axis=1)
            acc = acc * alpha[:, None] + tl.sum(e[:, :, None] * values[None, :, :], axis=1)
            m = m_new
        o = acc / tl.where(l > 0, l, 1.0)[:, None]
        tl.store(out_ptr + (row * STEPS + t[:, None]) * (H * D) + head * D + d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=tile)
