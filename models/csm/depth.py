"""The depth decoder's layers as few kernels as a step of one frame allows (31 run per frame).

Built from the checkpoint's modules once the weights are in place (``CsmModel.setup``): each
layer's q, k and v projections in one matrix and its gate and up projections in another
(copies, not parameters), and RoPE applied to q, k and v in one pass (a multiply, a roll and
one fused multiply-add) over tables in which v's heads turn by 0 (cos 1, sin 0: v exact).
``rotate_half(x) * sin`` is ``roll(x, D / 2) * sin'`` with sin's first half negated; the
multiply-add rounds once where ``models.orpheus.llama``'s layers round twice.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["FusedDepth"]


class FusedDepth:
    """``layers`` (``DecoderLayer``s) and ``rope`` [P, 2, D] -> ``__call__(h, offset, n, attn)``;
    ``attn(layer, q, kv)`` takes the queries and the keys then values side by side."""

    def __init__(self, layers: nn.ModuleList, rope: Tensor, num_heads: int, num_kv_heads: int, eps: float) -> None:
        self.nh, self.nkv, self.eps = num_heads, num_kv_heads, eps
        self.qkv, self.gate_up, self.o, self.down, self.ln1, self.ln2 = [], [], [], [], [], []
        with torch.no_grad():
            for layer in layers:
                a, m = layer.self_attn, layer.mlp
                self.qkv.append(torch.cat((a.q_proj.weight, a.k_proj.weight, a.v_proj.weight)))
                self.gate_up.append(torch.cat((m.gate_proj.weight, m.up_proj.weight)))
                self.o.append(a.o_proj.weight)
                self.down.append(m.down_proj.weight)
                self.ln1.append(layer.input_layernorm.weight)
                self.ln2.append(layer.post_attention_layernorm.weight)
            dtype = self.qkv[0].dtype if self.qkv else rope.dtype
            heads = num_heads + 2 * num_kv_heads
            cos = rope[:, 0:1].expand(-1, heads, -1).clone()  # [P, heads, D]
            sin = rope[:, 1:2].expand(-1, heads, -1).clone()
            sin[..., : sin.shape[-1] // 2] *= -1  # for roll, not rotate_half
            cos[:, num_heads + num_kv_heads:] = 1.0  # v's heads: not turned
            sin[:, num_heads + num_kv_heads:] = 0.0
            self.cos, self.sin = cos.to(dtype), sin.to(dtype)

    def __call__(self, h: Tensor, offset: int, n: int, attn) -> Tensor:  # noqa: ANN001
        """h [B * n, Hd] (rows batch-major) at positions offset.. -> the layers' output [B * n, Hd]."""
        t, b = h.shape[0], h.shape[0] // n
        cos, sin = self.cos[offset:offset + n], self.sin[offset:offset + n]  # [n, heads, D]
        if cos.dtype != h.dtype:
            cos, sin = cos.to(h.dtype), sin.to(h.dtype)
        if n > 1:  # one position broadcasts over the rows as it is
            cos, sin = cos.repeat(b, 1, 1), sin.repeat(b, 1, 1)  # [B * n, heads, D]
        nh, nkv = self.nh, self.nkv
        for i in range(len(self.qkv)):
            x = F.rms_norm(h, (h.shape[-1],), self.ln1[i], self.eps)
            qkv = F.linear(x, self.qkv[i]).view(t, nh + 2 * nkv, -1)  # [T, heads, D]
            qkv = torch.addcmul(qkv * cos, qkv.roll(qkv.shape[-1] // 2, dims=-1), sin)
            o = attn(i, qkv[:, :nh], qkv[:, nh:])  # q [T, H, D], keys and values [T, 2 Hkv, D]
            h = h + F.linear(o.reshape(t, -1), self.o[i])
            gate, up = F.linear(F.rms_norm(h, (h.shape[-1],), self.ln2[i], self.eps), self.gate_up[i]).chunk(2, dim=-1)
            h = h + F.linear(F.silu(gate) * up, self.down[i])
        return h
