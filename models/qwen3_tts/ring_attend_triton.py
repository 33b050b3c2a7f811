"""The codec transformer's attention of one new frame over each slot's sliding window, in one
Triton kernel (``--model-setting codec_attention=triton``; docs/models/qwen3_tts.md, "Codec").

``CodecStream._transformer`` keeps each slot's last ``W`` keys and values in a ring
[S, W, Hkv, D] and, a layer a frame, writes the new key and value at ``pos % W``, gathers the
step's slots' rings, repeats the key heads for grouped queries and attends in float32 through two
einsums: at 1,024 rows about a quarter of the codec step on an H200 is those copies and casts
(docs/performance.md, the codec profile). Here one program per row and key head writes the new
key and value into its slot's ring and attends its query heads over the entries written so far,
in float32, reading each entry once where it lies.
"""

from __future__ import annotations

import torch
from torch import Tensor

try:  # Triton serves this kernel on CUDA (it comes with CUDA torch); a CPU install need not have it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

__all__ = ["ring_attend"]


def ring_attend(q: Tensor, k: Tensor, v: Tensor, k_ring: Tensor, v_ring: Tensor, slots: Tensor,
                pos: Tensor) -> Tensor:
    """q [N, 1, H, D], k and v [N, 1, Hkv, D] (each row's heads contiguous; rows strided), the
    rings [S, W, Hkv, D] (contiguous), ``slots`` and ``pos`` int64 [N] (each row's slot and the
    number of frames its slot has decoded) -> [N, 1, H * D]. The key and value are written at
    ``pos % W`` of the row's slot; each query attends over the ring's entries that hold a
    position (all once ``pos >= W - 1``, else entries ``0..pos``), unmasked otherwise: what
    ``CodecStream._transformer``'s writes and ``_attend`` compute."""
    n, one, h, d = q.shape
    s, w, hkv = k_ring.shape[0], k_ring.shape[1], k_ring.shape[2]
    if one != 1 or k.shape != (n, 1, hkv, d) or v.shape != k.shape or k_ring.shape != (s, w, hkv, d) \
            or v_ring.shape != k_ring.shape or slots.shape != (n,) or pos.shape != (n,):
        raise ValueError(f"ring_attend: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, the rings "
                         f"{tuple(k_ring.shape)}, slots {tuple(slots.shape)} and pos {tuple(pos.shape)} do not match")
    if h % hkv or d & (d - 1) or not (k_ring.is_contiguous() and v_ring.is_contiguous()):
        raise ValueError("ring_attend needs contiguous rings, whole query groups and a power-of-two head size")
    for t in (q, k, v):
        if t.stride(3) != 1 or t.stride(2) != d:
            raise ValueError("ring_attend: each row's heads must be contiguous")
    if triton is None:
        raise RuntimeError("codec_attention=triton needs Triton (it comes with CUDA torch)")
    out = torch.empty(n, 1, h * d, dtype=q.dtype, device=q.device)
    if n:
        ring_attend_kernel[(n * hkv,)](q, k, v, k_ring, v_ring, slots, pos, out, q.stride(0), k.stride(0),
                                       v.stride(0), hkv, w, d ** -0.5, REP=h // hkv, D=d,
                                       BLOCK_W=max(16, 1 << (w - 1).bit_length()), num_warps=4)
    return out


if triton is not None:  # (else the kernel is not made: the callers say Triton is needed)
    @triton.jit
    def ring_attend_kernel(q_ptr, k_ptr, v_ptr, kr_ptr, vr_ptr, slots_ptr, pos_ptr, out_ptr, q_row, k_row, v_row,
                           HKV, W, scale, REP: tl.constexpr, D: tl.constexpr, BLOCK_W: tl.constexpr):
        pid = tl.program_id(0)  # row * HKV + key head
        row = (pid // HKV).to(tl.int64)
        g = pid % HKV
        d = tl.arange(0, D)
        slot = tl.load(slots_ptr + row).to(tl.int64)
        p = tl.load(pos_ptr + row).to(tl.int64)
        at = p % W  # this frame's entry
        k_new = tl.load(k_ptr + row * k_row + g * D + d)
        v_new = tl.load(v_ptr + row * v_row + g * D + d)
        ring = slot * W * HKV * D + g * D  # entry j of this slot and key head: ring + j * HKV * D
        tl.store(kr_ptr + ring + at * HKV * D + d, k_new)
        tl.store(vr_ptr + ring + at * HKV * D + d, v_new)
        j = tl.arange(0, BLOCK_W)
        # entries that hold a position, the new one included: 0..p, all of them once p >= W - 1
        held = (j < W) & (j <= p)
        # written before this frame (entry ``at`` is in registers), as the [BLOCK_W, D] tile it masks
        old = (held & (j != at))[:, None] & (d < D)[None, :]
        where = ring + j[:, None] * (HKV * D) + d[None, :]
        keys = tl.load(kr_ptr + where, mask=old, other=0.0).to(tl.float32)
        values = tl.load(vr_ptr + where, mask=old, other=0.0).to(tl.float32)
        is_new = (j == at)[:, None]
        keys = tl.where(is_new, k_new.to(tl.float32)[None, :], keys)
        values = tl.where(is_new, v_new.to(tl.float32)[None, :], values)
        for r in tl.static_range(REP):
            head = g * REP + r
            qh = tl.load(q_ptr + row * q_row + head * D + d).to(tl.float32)
            scores = tl.where(held, tl.sum(keys * qh[None, :], axis=1) * scale, float("-inf"))
            e = tl.exp(scores - tl.max(scores, axis=0))
            o = tl.sum(e[:, None] * values, axis=0) / tl.sum(e, axis=0)
            tl.store(out_ptr + (row * (HKV * REP) + head) * D + d, o.to(out_ptr.dtype.element_ty))
