"""The code predictor (``talker.code_predictor.*``) and ``decode_frame``: one frame's 16 codes.

Static shapes only, so all of ``decode_frame`` runs inside a captured CUDA graph; how the
reference builds a frame: docs/models/qwen3_tts.md, "Code predictor".
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.qwen3_tts.config import TalkerConfig
from models.qwen3_tts.talker import Qwen3Layer, RMSNorm, rope_cos_sin, rope_inv_freq

__all__ = ["CodePredictor", "SampleFn", "decode_frame", "code0_mask", "MIN_FRAMES_BEFORE_EOS"]

# A sampler: logits [B, V] float32 and a salt (one per codebook, so each draws its own noise)
# -> ids [B] int64 (column indices).
SampleFn = Callable[[Tensor, int], Tensor]

MIN_FRAMES_BEFORE_EOS = 2  # the reference's talker generate(min_new_tokens=2)


class _PredictorBackbone(nn.Module):
    """``talker.code_predictor.model.*``."""

    def __init__(self, talker: TalkerConfig) -> None:
        super().__init__()
        c = talker.code_predictor
        self.layers = nn.ModuleList(
            Qwen3Layer(c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
                       c.head_dim, c.rms_norm_eps, i) for i in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        # Tables for codebooks 1..G-1, in the *talker's* width (projected like the hidden state).
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(c.vocab_size, talker.hidden_size) for _ in range(c.num_code_groups - 1))


class _DenseCache:
    """Per-call KV cache [B, Hkv, S, D] per layer; ``__call__`` is the attention contract over
    inputs [B, n, H, D] written at the static offset ``self.offset``.

    Grouped-query attention without repeating the cache: each kv head's ``H / Hkv`` query heads
    are its queries (rows), so one query position (every step but a frame's first) needs no mask
    and no copy of its inputs or output. Softmax attention in the inputs' dtype
    (``scaled_dot_product_attention``), as the reference's default (sdpa) attention computes it."""

    def __init__(self, num_layers: int, batch: int, length: int, kv_heads: int, head_dim: int,
                 like: Tensor, attend: Callable[..., Tensor] | None = None) -> None:
        shape = (batch, kv_heads, length, head_dim)
        self.k = [like.new_zeros(shape) for _ in range(num_layers)]
        self.v = [like.new_zeros(shape) for _ in range(num_layers)]
        self.length = length
        self.offset = 0
        self.attend = attend  # one position's write and attention in one kernel (``attend_triton``), or None

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        b, n, h, d = q.shape
        p, hkv = self.offset, k.shape[2]
        if n == 1 and self.attend is not None:
            return self.attend(q, k, v, self.k[layer], self.v[layer], p)
        rep = h // hkv
        self.k[layer][:, :, p:p + n] = k.transpose(1, 2)
        self.v[layer][:, :, p:p + n] = v.transpose(1, 2)
        kc, vc = self.k[layer][:, :, :p + n], self.v[layer][:, :, :p + n]  # [B, Hkv, S, D] (S static)
        if n == 1:  # every key is at or before the one query position: no mask
            o = F.scaled_dot_product_attention(q.view(b, hkv, rep, d), kc, vc)  # [B, Hkv, rep, D]
            return o.view(b, 1, h, d)
        qb = q.view(b, n, hkv, rep, d).permute(0, 2, 1, 3, 4).reshape(b, hkv, n * rep, d)  # rows (i, r)
        pos = torch.arange(p, p + n, device=q.device).repeat_interleave(rep)  # [n * rep]
        mask = torch.arange(p + n, device=q.device)[None, :] <= pos[:, None]  # [n * rep, S]
        o = F.scaled_dot_product_attention(qb, kc, vc, attn_mask=mask)  # [B, Hkv, n * rep, D]
        return o.view(b, hkv, n, rep, d).permute(0, 2, 1, 3, 4).reshape(b, n, h, d)


class CodePredictor(nn.Module):
    """``talker.code_predictor.*``: 5 Qwen3 layers (1.7B: x 1024) and 15 heads of 2048 codes."""

    def __init__(self, talker: TalkerConfig) -> None:
        super().__init__()
        c = talker.code_predictor
        self.config = c
        self.model = _PredictorBackbone(talker)
        self.lm_head = nn.ModuleList(nn.Linear(c.hidden_size, c.vocab_size, bias=False)
                                     for _ in range(c.num_code_groups - 1))
        self.small_to_mtp_projection = (nn.Linear(talker.hidden_size, c.hidden_size, bias=True)
                                        if c.hidden_size != talker.hidden_size else nn.Identity())
        self.register_buffer("inv_freq", torch.empty(c.head_dim // 2), persistent=False)
        # cos and sin of the frame's positions 0..G-1 (a frame is G positions), in the weights' dtype
        self.register_buffer("rope_cos", torch.empty(c.num_code_groups, 1, c.head_dim), persistent=False)
        self.register_buffer("rope_sin", torch.empty(c.num_code_groups, 1, c.head_dim), persistent=False)
        # one new position's attention (passes 2..15): None for the cache writes and SDPA, or
        # ``attend_triton.attend_position`` (``code_predictor_attention=triton``)
        self.attend: Callable[..., Tensor] | None = None

    @torch.no_grad()
    def setup_rope(self, device: torch.device | str | None = None) -> None:
        """The RoPE frequencies and the frame's cos/sin tables (computed in float32, stored in the
        weights' dtype), built here once rather than per step (never first inside a graph capture)."""
        c = self.config
        self.inv_freq = rope_inv_freq(c.head_dim, c.rope_theta, device)
        pos = torch.arange(c.num_code_groups, device=device)
        self.rope_cos, self.rope_sin = rope_cos_sin(pos, self.inv_freq, self.lm_head[0].weight.dtype)

    def fuse_(self) -> None:
        """Each layer's q/k/v and gate/up projections as one matmul each (``Qwen3Layer.fuse_``;
        the loader calls it once the weights are in)."""
        for layer in self.model.layers:
            layer.fuse_()

    def _run(self, x: Tensor, cache: _DenseCache) -> Tensor:
        """x [B, n, H_talker] at positions cache.offset.. -> normed hidden [B, n, H_cp]."""
        b, n, _ = x.shape
        h = self.small_to_mtp_projection(x)
        p = cache.offset
        # [n, 1, D] broadcasts over [B, n, H, D] (``to``: a no-op unless the model's dtype changed)
        cos, sin = self.rope_cos[p:p + n].to(h.dtype), self.rope_sin[p:p + n].to(h.dtype)
        for layer in self.model.layers:
            h = layer(h, cos, sin, cache)
        cache.offset += n
        return self.model.norm(h)

    def predict(self, hidden: Tensor, code0_embed: Tensor, sample: SampleFn) -> Tensor:
        """hidden, code0_embed [B, H_talker] -> codes 1..G-1 [B, G-1] (salts 1..G-1)."""
        c = self.config
        cache = _DenseCache(c.num_hidden_layers, hidden.shape[0], c.num_code_groups, c.num_key_value_heads,
                            c.head_dim, hidden, self.attend)
        h = self._run(torch.stack((hidden, code0_embed), dim=1), cache)[:, -1]  # [B, H_cp]
        codes = []
        for k in range(1, c.num_code_groups):
            code = sample(self.lm_head[k - 1](h).float(), k)  # [B]
            codes.append(code)
            if k < c.num_code_groups - 1:
                x = self.model.codec_embedding[k - 1](code)[:, None]  # [B, 1, H_talker]
                h = self._run(x, cache)[:, -1]
        return torch.stack(codes, dim=1)


def code0_mask(config: TalkerConfig, device: torch.device | str | None = None) -> Tensor:
    """bool [vocab]: the codec ids codebook 0 may take (the reference suppresses
    ``[vocab - 1024, vocab)`` except eos: codes 0..2047, and eos)."""
    allowed = torch.ones(config.vocab_size, dtype=torch.bool, device=device)
    allowed[max(config.vocab_size - 1024, 0):] = False
    allowed[config.codec_eos_token_id] = True
    return allowed


def decode_frame(talker: nn.Module, hidden: Tensor, sample: SampleFn, *, allowed: Tensor,
                 eos_ok: Tensor | None = None, slots: Tensor | None = None,
                 last_codes: Tensor | None = None) -> Tensor:
    """One frame per row: talker hidden [B, H] -> codes [B, G] (codebook 0 may be eos).

    ``allowed`` is ``code0_mask(...)`` (pass one tensor, built once). ``eos_ok`` bool [B]: rows that
    may stop now (the reference forbids eos before frame ``MIN_FRAMES_BEFORE_EOS``); None = all.
    Salt 0 samples codebook 0, salt k codebook k. With ``slots`` [B] and ``last_codes``
    [num_slots, G] (the per-slot device state the next decode row embeds), the codes are also
    written there (padding rows should point at a scratch slot).
    """
    cfg = talker.config
    logits = talker.codec_logits(hidden)  # [B, V] float32
    mask = allowed[None, :].expand_as(logits)
    if eos_ok is not None:
        eos = torch.arange(allowed.numel(), device=allowed.device) == cfg.codec_eos_token_id  # (capturable)
        mask = mask & ~(eos[None, :] & ~eos_ok[:, None])
    code0 = sample(logits.masked_fill(~mask, float("-inf")), 0)  # [B]
    rest = talker.code_predictor.predict(hidden, talker.model.codec_embedding(code0), sample)  # [B, G-1]
    codes = torch.cat((code0[:, None], rest), dim=1)
    if last_codes is not None:
        if slots is None:
            raise ValueError("decode_frame: last_codes needs slots")
        last_codes.index_copy_(0, slots, codes)
    return codes
