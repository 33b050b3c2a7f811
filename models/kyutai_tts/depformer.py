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
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.kyutai_tts.config import LMConfig
from models.kyutai_tts.layers import Gating, RMSNorm, rms_norm
from models.kyutai_tts.sampling import top_k_draw

__all__ = ["GREEDY", "AudioSampling", "DepformerLayers", "codebook_step", "decode_frame", "layer_weights"]


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


class _Consts:
    """Small index tensors a frame of ``n`` codebooks reads, made once per device (a codebook
    step takes its position and weight set as tensors, so one compiled step serves them all)."""

    def __init__(self, n: int, schedule: list[int], device: torch.device) -> None:
        self.index = [torch.tensor([k], device=device) for k in range(n)]  # each its own tensor
        self.weight_set = [torch.tensor([w], device=device) for w in schedule]
        seen = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        # [n]: 0 at the positions codebook k sees, -inf after them
        self.bias = [torch.zeros(n, device=device).masked_fill(~seen[k], float("-inf")) for k in range(n)]


def layer_weights(layer: _DepLayer, w: int) -> tuple[Tensor, ...]:
    """Weight set ``w`` of one layer: (norm1, in_proj, out_proj, norm2, linear_in, linear_out)."""
    a, g = layer.self_attn, layer.gating[w]
    return (layer.norm1.alpha.reshape(-1), a.in_projs[w].weight, a.out_projs[w].weight,
            layer.norm2.alpha.reshape(-1), g.linear_in.weight, g.linear_out.weight)


def _attend(q: Tensor, keys: Tensor, values: Tensor, bias: Tensor) -> Tensor:
    """One query per row over the frame's positions: q [B, H, D], keys / values [B, H, n, D],
    bias [n] (0 or -inf) -> [B, H, D], in float32 as SDPA accumulates, rounded once. Spelled
    out (products and sums over at most 32 positions) so that the compiler fuses it into a
    couple of kernels, where SDPA with a mask took one attention kernel and five for the mask."""
    scores = (q.float()[:, :, None] * keys.float()).sum(-1) * q.shape[-1] ** -0.5 + bias  # [B, H, n]
    return (scores.softmax(-1)[..., None] * values.float()).sum(-2).to(q.dtype)


def codebook_step(proj: Tensor, weight_set: Tensor, extra: Tensor | None, code: Tensor | None,
                  table: Tensor | None, low_rank: Tensor | None, cache: Tensor, index: Tensor, bias: Tensor,
                  weights: list[tuple[Tensor, ...]], out: Tensor, divisor: Tensor | None,
                  noise: Tensor | None, top_p: Tensor | None, *, heads: int, eps: float, top_k: int) -> Tensor:
    """One codebook of a frame through the depth transformer, sampled: every input a tensor
    (no module, no closure), so that ``torch.compile`` makes one program for every codebook
    after the first (docs/models/kyutai_tts.md, "Depth transformer").

    proj [B, sets, d]: the temporal hidden projected for every weight set; ``weight_set``
    [1]: this codebook's; ``extra`` [B, d] added to its input (codebook 0: the text
    embedding), else the previous codebook's ``code`` [B] looked up in ``table`` (times
    ``low_rank``); ``cache`` [layers, B, 2, H, n, D] keys and values, written at ``index``
    [1] (positions not yet written are zero and masked: ``bias`` [n], -inf there); ``weights``: each
    layer's ``layer_weights``; ``out`` the codebook's output projection [card, d];
    ``divisor`` / ``noise`` [B, card] (this codebook's) / ``top_p``: ``top_k_draw``'s -> ids [B]."""
    b = proj.shape[0]
    x = proj.index_select(1, weight_set)[:, 0]
    if extra is not None:
        x = x + extra
    else:
        y = F.embedding(code, table)
        x = x + (F.linear(y, low_rank) if low_rank is not None else y)
    for layer, (norm1, w_in, w_out, norm2, g_in, g_out) in enumerate(weights):
        qkv = F.linear(rms_norm(x, norm1, eps), w_in).view(b, 3, heads, -1)
        c = cache[layer]
        c.index_copy_(3, index, qkv[:, 1:, :, None])  # keys and values in one write
        o = _attend(qkv[:, 0], c[:, 0], c[:, 1], bias)  # [B, H, D]
        x = x + F.linear(o.reshape(b, -1), w_out)
        h = F.linear(rms_norm(x, norm2, eps), g_in)
        h = h.view(b, 2, -1)
        x = x + F.linear(F.silu(h[:, 0]) * h[:, 1], g_out)
    logits = F.linear(x, out)
    return top_k_draw(logits, top_k, divisor, noise, top_p)


def decode_frame(lm: nn.Module, hidden: Tensor, text_in: Tensor, sampling: AudioSampling, num_codebooks: int,
                 step: Callable[..., Tensor] = codebook_step) -> Tensor:
    """One frame's codebooks: temporal hidden [B, dim] and the machine's text output [B] ->
    codes [B, num_codebooks] (codebook k drawn with ``sampling.noise[k]``); ``step``:
    ``codebook_step`` or its ``torch.compile``d form."""
    c: LMConfig = lm.config.lm
    layers = lm.depformer.layers
    b = hidden.shape[0]
    first = layers[0]
    # Positions not yet written are read (masked): zero, so that no stale NaN reaches a sum. As
    # long as a whole frame's even when fewer codebooks are decoded (one shape: one compiled step).
    n = max(lm.num_active, num_codebooks)
    cache = hidden.new_zeros((len(layers), b, 2, first.heads, n, first.head_dim))
    # Every weight set the whole frame uses (``lm.num_active`` codebooks), even when fewer are
    # decoded: a shorter decode (step variant 2) computes codebook 0's input by the same matmul.
    sets = max(c.schedule(k) for k in range(max(lm.num_active, num_codebooks))) + 1
    d = c.depformer_dim
    joint = lm.depformer_in_joint
    if joint is not None:
        proj = F.linear(hidden, joint[: sets * d]).view(b, sets, d)  # [B, sets, d]
    else:
        proj = torch.stack([lm.depformer_in[w](hidden) for w in range(sets)], dim=1)
    consts = _frame_consts(lm, n, hidden.device)
    weights = _weights(lm)
    code: Tensor | None = None
    codes = []
    for k in range(num_codebooks):
        w = c.schedule(k)
        emb = lm.depformer_emb[k - 1] if k else None
        code = step(proj, consts.weight_set[k], lm.depformer_text_emb(text_in) if k == 0 else None, code,
                    None if emb is None else emb.weight,
                    None if emb is None or emb.low_rank is None else emb.low_rank.weight,
                    cache, consts.index[k], consts.bias[k], weights[w], lm.linears[k].weight,
                    sampling.divisor, None if sampling.noise is None else sampling.noise[k], sampling.top_p,
                    heads=first.heads, eps=first.norm1.eps, top_k=sampling.top_k)
        codes.append(code)
    return torch.stack(codes, dim=1)


def _frame_consts(lm: nn.Module, n: int, device: torch.device) -> _Consts:
    cache = getattr(lm, "_frame_consts", None)
    if cache is None:
        cache = lm._frame_consts = {}
    key = (n, str(device))
    if key not in cache:
        cache[key] = _Consts(n, [lm.config.lm.schedule(k) for k in range(n)], device)
    return cache[key]


def _weights(lm: nn.Module) -> list[list[tuple[Tensor, ...]]]:
    """Each weight set's per-layer weights (made on each call: cheap, and never stale after a load)."""
    return [[layer_weights(layer, w) for layer in lm.depformer.layers]
            for w in range(lm.config.lm.num_depformer_weights)]
