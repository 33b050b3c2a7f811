"""The depth transformer and ``decode_frame``: all the codebooks of one frame inside one step,
with static shapes so it is captured in a CUDA graph (docs/models/kyutai_tts.md,
"Depth transformer").

A frame runs up to 32 codebook steps in sequence, each a few small kernels: on the GPU the step
is bound by the number of kernels, not by FLOPs, so each codebook step launches as few as it
can: one cache write for both keys and values (a cache [B, 2, H, K, D], left unfilled past the
codebooks written: they are never read), attention without a mask (the one query sees every
key written so far; none at all for the first codebook, whose one key has weight 1; or both in
one Triton kernel, ``attend_triton``), the
embedding of a sampled code without the handling of a zero (-1) input (a sample is never one),
the input projection of every weight set in one matmul a frame (``KyutaiLM.join_depformer_in``),
and the fused pieces (``FrameFns``: a residual sum with the next norm, the same with the
codebook's input embedding looked up inside it in the tables ``KyutaiLM.fold_depformer_emb``
made, the gating's silu-mul, the top-k draw), compiled by ``torch.compile`` when the head is
(``kyutai_compile``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.kyutai_tts.config import LMConfig
from models.kyutai_tts.layers import Gating, RMSNorm, demux_rows, rms_norm
from models.kyutai_tts.sampling import top_k_draw

__all__ = ["GREEDY", "PLAIN", "AudioSampling", "DepformerLayers", "FrameFns", "add_norm", "attend_sdpa", "decode_frame",
           "embed_add_norm", "silu_mul", "text_add_norm"]


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


class DepformerLayers(nn.Module):
    """``depformer.layers.<i>.*`` (moshi's ``depformer`` StreamingTransformer)."""

    def __init__(self, c: LMConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_DepLayer(c) for _ in range(c.depformer_num_layers))


class AudioSampling(NamedTuple):
    """How ``decode_frame`` samples each codebook (``top_k_draw``'s inputs): ``noise`` [n, B, V]
    holds codebook ``k``'s Gumbel noise at ``k`` (zero on greedy rows), None for argmax."""

    top_k: int
    divisor: Tensor | None  # [B, 1] float32
    noise: Tensor | None
    top_p: Tensor | None  # [B, 1], inf for none


GREEDY = AudioSampling(0, None, None, None)


class FrameFns(NamedTuple):
    """The fused pieces of a codebook step: plain PyTorch, or each through ``torch.compile``
    (``FrameFns.compiled``). Between them the step is eager code captured in the CUDA graph:
    matmuls, the cache write and the attention over the codebooks written so far."""

    add_norm: Callable[..., tuple[Tensor, Tensor]]
    silu_mul: Callable[[Tensor], Tensor]
    draw: Callable[..., Tensor]
    attend: Callable[[Tensor, Tensor, int], Tensor]  # (qkv, cache, k) -> [B, H, D]: ``attend_sdpa``'s contract
    embed_add_norm: Callable[..., tuple[Tensor, Tensor]]  # a code's folded embedding added, then the norm
    text_add_norm: Callable[..., tuple[Tensor, Tensor]]  # the same for the machine's (multiplexed) text output
    # A layer's matmuls with the norms, the silu-mul and the residual sums fused in (Triton's
    # ``gemm_triton.DEPTH_GEMMS``: five kernels a layer, not eight); None: torch's matmuls
    gemms: Any = None

    @classmethod
    def compiled(cls, backend: str | Callable = "inductor",
                 attend: Callable[[Tensor, Tensor, int], Tensor] | None = None,
                 draw: Callable[..., Tensor] | None = None, gemms: Any = None) -> FrameFns:
        """The pieces compiled; ``attend``, ``draw`` and ``gemms`` given (Triton kernels) are
        used as they are."""
        # (inductor's pattern passes off: they would make a residual sum and its matmul one
        # addmm, whose cuBLAS kernel took 9.1 us at one row on an H200, the matmul alone 4.6)
        options = {"pattern_matcher": False} if backend == "inductor" else None

        def wrap(f: Callable) -> Callable:
            return torch.compile(f, dynamic=True, fullgraph=True, backend=backend, options=options)

        return cls(wrap(add_norm), wrap(silu_mul), draw or wrap(top_k_draw), attend or attend_sdpa,
                   wrap(embed_add_norm), wrap(text_add_norm), gemms)


def add_norm(x: Tensor, delta: Tensor, alpha: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(x + delta, its ``rms_norm``): a residual sum and the next norm, one kernel compiled."""
    y = x + delta
    return y, rms_norm(y, alpha, eps)


def embed_add_norm(x: Tensor, table: Tensor, code: Tensor, alpha: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """``add_norm`` of x and row ``code`` [B] of a folded embedding ``table`` [card + 1, D] (a
    sampled code, never -1): compiled, the look-up is read inside the sum's kernel."""
    return add_norm(x, F.embedding(code, table), alpha, eps)


def text_add_norm(x: Tensor, table: Tensor, ids: Tensor, n: int, alpha: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """``add_norm`` of x and the demultiplexed text embedding of ``ids`` [B] (``(second + 1) * n
    + first``, -1 for none: zero) from ``KyutaiLM.depformer_text_folded`` [2 n + 1, D] (the
    first token's half, the second's, a zero row): ``DemuxEmbedding`` with its projections
    folded, one kernel compiled."""
    first_row, second_row = demux_rows(ids, n, table.shape[0] - 1)
    return add_norm(x, F.embedding(first_row, table) + F.embedding(second_row, table), alpha, eps)


def silu_mul(h: Tensor) -> Tensor:
    """The gating's hidden [B, 2, F] -> silu(h[:, 0]) * h[:, 1]."""
    return F.silu(h[:, 0]) * h[:, 1]


def attend_sdpa(qkv: Tensor, cache: Tensor, k: int) -> Tensor:
    """Codebook ``k``'s attention: qkv [B, 3, H, D] (query, key, value), cache [B, 2, H, n, D]
    (keys and values of the codebooks before) -> [B, H, D]; the key and value are written at
    ``k``. The one query sees every key written so far, so no mask; codebook 0's one key has
    weight 1. (``attend_triton.attend_codebook`` is the same in one kernel.)"""
    cache[:, :, :, k] = qkv[:, 1:]  # keys and values in one copy
    if k == 0:
        return qkv[:, 2]
    return F.scaled_dot_product_attention(qkv[:, 0, :, None], cache[:, 0, :, : k + 1], cache[:, 1, :, : k + 1])[:, :, 0]


PLAIN = FrameFns(add_norm, silu_mul, top_k_draw, attend_sdpa, embed_add_norm, text_add_norm)


def decode_frame(lm: nn.Module, hidden: Tensor, text_in: Tensor, sampling: AudioSampling, num_codebooks: int,
                 fns: FrameFns = PLAIN) -> Tensor:
    """One frame's codebooks: temporal hidden [B, dim] and the machine's text output [B] ->
    codes [B, num_codebooks] (codebook k drawn with ``sampling.noise[k]``); ``fns``: the fused
    pieces, plain or compiled."""
    c: LMConfig = lm.config.lm
    layers = lm.depformer.layers
    b = hidden.shape[0]
    first = layers[0]
    h, dh, eps = first.heads, first.head_dim, first.norm1.eps
    caches = [hidden.new_empty((b, 2, h, num_codebooks, dh)) for _ in layers]  # only positions written are read
    # Every weight set the whole frame uses (``lm.num_active`` codebooks), even when fewer are
    # decoded: a shorter decode (step variant 2) computes codebook 0's input by the same matmul.
    sets = max(c.schedule(k) for k in range(max(lm.num_active, num_codebooks))) + 1
    d = c.depformer_dim
    joint = lm.depformer_in_joint
    if joint is not None:
        proj = F.linear(hidden, joint[: sets * d]).view(b, sets, d)  # [B, sets, d]
    else:
        proj = torch.stack([lm.depformer_in[w](hidden) for w in range(sets)], dim=1)
    codes: list[Tensor] = []
    folded, text_folded = lm.depformer_emb_folded, lm.depformer_text_folded  # (None: not folded)
    alpha0 = first.norm1.alpha.reshape(-1)
    for k in range(num_codebooks):
        w = c.schedule(k)
        if k == 0 and text_folded is not None:
            x, normed = fns.text_add_norm(proj[:, w], text_folded, text_in, c.text_card + 1, alpha0, eps)
        elif k > 0 and folded is not None:
            x, normed = fns.embed_add_norm(proj[:, w], folded[k - 1], codes[-1], alpha0, eps)
        else:
            y = lm.depformer_text_emb(text_in) if k == 0 else _embed_code(lm.depformer_emb[k - 1], codes[-1])
            x, normed = fns.add_norm(proj[:, w], y, alpha0, eps)
        if fns.gemms is not None:
            x = _layers_fused(fns, layers, caches, x, w, k)
        else:
            x = _layers(fns, layers, caches, x, normed, w, k)
        noise = None if sampling.noise is None else sampling.noise[k]
        codes.append(fns.draw(lm.linears[k](x), sampling.top_k, sampling.divisor, noise, sampling.top_p))
    return torch.stack(codes, dim=1)


def _layers(fns: FrameFns, layers: nn.ModuleList, caches: list[Tensor], x: Tensor, normed: Tensor, w: int,
            k: int) -> Tensor:
    """Codebook ``k``'s pass through the layers (weight set ``w``) as torch's matmuls between
    ``fns``' fused pieces: x [B, D] and its first norm -> the last layer's output."""
    b = x.shape[0]
    for i, (layer, cache) in enumerate(zip(layers, caches)):
        a, g, eps = layer.self_attn, layer.gating[w], layer.norm1.eps
        o = fns.attend(F.linear(normed, a.in_projs[w].weight).view(b, 3, layer.heads, layer.head_dim), cache, k)
        x, normed = fns.add_norm(x, F.linear(o.reshape(b, -1), a.out_projs[w].weight), layer.norm2.alpha.reshape(-1), eps)
        delta = F.linear(fns.silu_mul(F.linear(normed, g.linear_in.weight).view(b, 2, -1)), g.linear_out.weight)
        if i + 1 < len(layers):  # the residual sum and the next layer's norm in one
            x, normed = fns.add_norm(x, delta, layers[i + 1].norm1.alpha.reshape(-1), eps)
        else:
            x = x + delta
    return x


def _layers_fused(fns: FrameFns, layers: nn.ModuleList, caches: list[Tensor], x: Tensor, w: int, k: int) -> Tensor:
    """Codebook ``k``'s pass through the layers (weight set ``w``) with ``fns.gemms``: each layer
    its queries, keys and values with the norm before them, the attention, the output
    projection with the residual sum, the gating's input projection with the norm and the
    silu-mul, its output projection with the residual sum -> the last layer's output [B, D]."""
    gm = fns.gemms
    b = x.shape[0]
    for layer, cache in zip(layers, caches):
        a, g, eps = layer.self_attn, layer.gating[w], layer.norm1.eps
        if gm.rms_attend is not None:  # (the attention in the same kernel)
            o = gm.rms_attend(x, a.in_projs[w].weight, layer.norm1.alpha.reshape(-1), eps, cache, k)
        else:
            qkv = gm.rms(x, a.in_projs[w].weight, layer.norm1.alpha.reshape(-1), eps)
            o = fns.attend(qkv.view(b, 3, layer.heads, layer.head_dim), cache, k).reshape(b, -1)  # [B, H D]
        x = gm.residual(o, a.out_projs[w].weight, x)
        x = gm.residual(gm.rms_glu(x, g.linear_in.weight, layer.norm2.alpha.reshape(-1), layer.norm2.eps),
                        g.linear_out.weight, x)
    return x


def _embed_code(emb: nn.Module, code: Tensor) -> Tensor:
    """``emb(code)`` for a sampled code (never -1, the zero input): no clamp and no zeroing."""
    y = F.embedding(code, emb.weight)
    return emb.low_rank(y) if emb.low_rank is not None else y
