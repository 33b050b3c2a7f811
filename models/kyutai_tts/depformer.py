"""The depth transformer and ``decode_frame``: all the codebooks of one frame inside one step,
with static shapes so it is captured in a CUDA graph (docs/models/kyutai_tts.md,
"Depth transformer").

A frame runs up to 32 codebook steps in sequence, each a few small kernels: on the GPU the step
is bound by the number of kernels, not by FLOPs, so each codebook step launches as few as it
can: one cache write for both keys and values (a cache [B, 2, H, K, D], left unfilled past the
codebooks written: they are never read), attention without a mask (the one query sees every
key written so far; none at all for the first codebook, whose one key has weight 1), fused
RMSNorm, the embedding of a sampled code without the handling of a zero (-1) input (a sample is
never one), and the input projection of every weight set in one matmul a frame
(``KyutaiLM.join_depformer_in``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.kyutai_tts.config import LMConfig
from models.kyutai_tts.layers import Gating, RMSNorm, ScaledEmbedding

__all__ = ["DepformerLayers", "SampleFn", "decode_frame"]

SampleFn = Callable[[Tensor, int], Tensor]  # logits [B, V] (the model's dtype), salt -> ids [B] int64 in [0, V)


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

    def forward(self, x: Tensor, k_index: int, w: int, cache: Tensor) -> Tensor:
        """x [B, d] at codebook position ``k_index`` with weight set ``w``; cache [B, 2, H, K, D]
        (keys, values), written at ``k_index``."""
        b, h, d = x.shape[0], self.heads, self.head_dim
        qkv = self.self_attn.in_projs[w](self.norm1(x)).view(b, 3, h, d)
        cache[:, :, :, k_index] = qkv[:, 1:]  # keys and values in one copy
        keys, vals = cache[:, 0, :, : k_index + 1], cache[:, 1, :, : k_index + 1]  # [B, H, k+1, D]
        if k_index == 0:  # one key: its softmax weight is exactly 1
            o = qkv[:, 2]
        else:
            o = F.scaled_dot_product_attention(qkv[:, 0, :, None], keys, vals)  # [B, H, 1, D], no mask
        # (Not addmm: on an H200 at one row cuBLAS's kernel with the sum took 9.6 us, the product
        # alone about 3 and the sum 1-2; the temporal transformer's addmm kernels are not slower.)
        x = x + self.self_attn.out_projs[w](o.reshape(b, h * d))
        return x + self.gating[w](self.norm2(x))


class DepformerLayers(nn.Module):
    """``depformer.layers.<i>.*`` (moshi's ``depformer`` StreamingTransformer)."""

    def __init__(self, c: LMConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_DepLayer(c) for _ in range(c.depformer_num_layers))


def _embed_code(emb: ScaledEmbedding, code: Tensor) -> Tensor:
    """``emb(code)`` for a sampled code (never -1, the zero input): no clamp and no zeroing."""
    y = F.embedding(code, emb.weight)
    return emb.low_rank(y) if emb.low_rank is not None else y


def decode_frame(lm: nn.Module, hidden: Tensor, text_in: Tensor, sample: SampleFn, num_codebooks: int) -> Tensor:
    """One frame's codebooks: temporal hidden [B, dim] and the machine's text output [B] ->
    codes [B, num_codebooks] (each sampled with salt ``k + 1``)."""
    c: LMConfig = lm.config.lm
    layers = lm.depformer.layers
    b = hidden.shape[0]
    first = layers[0]
    shape = (b, 2, first.heads, num_codebooks, first.head_dim)
    caches = [hidden.new_empty(shape) for _ in layers]  # only positions already written are read
    joint = lm.depformer_in_joint
    if joint is not None:
        # Every weight set the whole frame uses (``lm.num_active`` codebooks), even when fewer are
        # decoded: a shorter decode (step variant 2) computes codebook 0's input by the same matmul.
        sets = max(c.schedule(k) for k in range(max(lm.num_active, num_codebooks))) + 1
        d = c.depformer_dim
        proj = F.linear(hidden, joint[: sets * d]).view(b, sets, d)  # [B, sets, d]
    codes = []
    for k in range(num_codebooks):
        w = c.schedule(k)
        x = proj[:, w] if joint is not None else lm.depformer_in[w](hidden)
        x = x + (lm.depformer_text_emb(text_in) if k == 0 else _embed_code(lm.depformer_emb[k - 1], codes[-1]))
        for layer, cache in zip(layers, caches):
            x = layer(x, k, w, cache)
        codes.append(sample(lm.linears[k](x), k + 1))  # [B] (the sampler scales the logits in float32)
    return torch.stack(codes, dim=1)
