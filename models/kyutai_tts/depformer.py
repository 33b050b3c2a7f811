"""The depth transformer and ``decode_frame``: all the codebooks of one frame inside one step,
with static shapes so it is captured in a CUDA graph (docs/models/kyutai_tts.md,
"Depth transformer").
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.kyutai_tts.config import LMConfig
from models.kyutai_tts.layers import Gating, RMSNorm

__all__ = ["DepformerLayers", "SampleFn", "decode_frame"]

SampleFn = Callable[[Tensor, int], Tensor]  # logits [B, V] float32, salt -> ids [B] int64


class _StepAttention(nn.Module):
    def __init__(self, dim: int, mult: int) -> None:
        super().__init__()
        self.in_projs = nn.ModuleList(nn.Linear(dim, 3 * dim, bias=False) for _ in range(mult))
        self.out_projs = nn.ModuleList(nn.Linear(dim, dim, bias=False) for _ in range(mult))


class _DepLayer(nn.Module):
    def __init__(self, c: LMConfig) -> None:
        super().__init__()
        d, mult = c.depformer_dim, c.num_depformer_weights
        self.heads, self.head_dim = c.depformer_num_heads, d // c.depformer_num_heads
        self.norm1 = RMSNorm(d)
        self.self_attn = _StepAttention(d, mult)
        self.norm2 = RMSNorm(d)
        self.gating = nn.ModuleList(Gating(d, c.depformer_dim_feedforward) for _ in range(mult))

    def forward(self, x: Tensor, k_index: int, w: int, kc: Tensor, vc: Tensor) -> Tensor:
        """x [B, d] at codebook position ``k_index`` with weight set ``w``; kc/vc [B, K, H, D]."""
        b, h, d = x.shape[0], self.heads, self.head_dim
        q, k, v = self.self_attn.in_projs[w](self.norm1(x)).view(b, 3, h, d).unbind(1)
        kc[:, k_index] = k
        vc[:, k_index] = v
        keys, vals = kc[:, : k_index + 1], vc[:, : k_index + 1]  # [B, k+1, H, D]
        o = F.scaled_dot_product_attention(q[:, :, None], keys.transpose(1, 2), vals.transpose(1, 2))  # [B, H, 1, D]
        x = x + self.self_attn.out_projs[w](o[:, :, 0].reshape(b, h * d))
        return x + self.gating[w](self.norm2(x))


class DepformerLayers(nn.Module):
    """``depformer.layers.<i>.*`` (moshi's ``depformer`` StreamingTransformer)."""

    def __init__(self, c: LMConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_DepLayer(c) for _ in range(c.depformer_num_layers))


def decode_frame(lm: nn.Module, hidden: Tensor, text_in: Tensor, sample: SampleFn, num_codebooks: int) -> Tensor:
    """One frame's codebooks: temporal hidden [B, dim] and the machine's text output [B] ->
    codes [B, num_codebooks] (each sampled with salt ``k + 1``)."""
    c: LMConfig = lm.config.lm
    layers = lm.depformer.layers
    b = hidden.shape[0]
    first = layers[0]
    shape = (b, num_codebooks, first.heads, first.head_dim)
    caches = [(hidden.new_zeros(shape), hidden.new_zeros(shape)) for _ in layers]
    prev = text_in
    codes = []
    for k in range(num_codebooks):
        w = c.schedule(k)
        x = lm.depformer_in[w](hidden)
        x = x + (lm.depformer_text_emb(prev) if k == 0 else lm.depformer_emb[k - 1](prev))
        for layer, (kc, vc) in zip(layers, caches):
            x = layer(x, k, w, kc, vc)
        tok = sample(lm.linears[k](x).float(), k + 1)  # [B]
        codes.append(tok)
        prev = tok
    return torch.stack(codes, dim=1)
