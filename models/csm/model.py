"""The CSM model: a Llama backbone over summed frame embeddings and a depth decoder that fills a
frame's codebooks 1..31, gpt-fast style, with the checkpoint's key names (positions and packed
ids: docs/models/csm.md, "How a segment runs").
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.csm.config import CsmConfig
from models.csm.depth import FusedDepth
from models.orpheus.llama import DecoderLayer, RMSNorm, rope_cos_sin

__all__ = ["KIND_SHIFT", "LAST_FRAME", "POOL_FRAME", "STOP", "CsmModel", "SampleFn", "pack_pool", "unpack"]

KIND_SHIFT = 32
_LOW = (1 << KIND_SHIFT) - 1
POOL_FRAME = 1 << KIND_SHIFT  # | row: frame ``row`` of the context pool
LAST_FRAME = 2 << KIND_SHIFT  # the slot's last generated frame (every decode row's id)
STOP = 3 << KIND_SHIFT  # the head's token for the end-of-speech frame (never an input)

# A sampler: logits [B, V] float32 and a salt (one per codebook) -> ids [B] int64.
SampleFn = Callable[[Tensor, int], Tensor]


def pack_pool(row: int) -> int:
    return POOL_FRAME | row


def unpack(ids: Tensor) -> tuple[Tensor, Tensor]:
    """ids int64 [T] -> (kind [T]: 0 text, 1 pool frame, 2 last frame; low field [T])."""
    return ids >> KIND_SHIFT, ids & _LOW


class _AudioEmbeddings(nn.Module):
    """``backbone_model.embed_tokens``: one table for all codebooks, codebook k at offset k * V."""

    def __init__(self, c: CsmConfig) -> None:
        super().__init__()
        self.embed_audio_tokens = nn.Embedding(c.num_codebooks * c.codebook_size, c.backbone.hidden_size)


class _Backbone(nn.Module):
    def __init__(self, c: CsmConfig) -> None:
        super().__init__()
        b = c.backbone
        self.embed_tokens = _AudioEmbeddings(c)
        self.layers = nn.ModuleList(DecoderLayer(b, i) for i in range(b.num_hidden_layers))
        self.norm = RMSNorm(b.hidden_size, b.rms_norm_eps)


class _DepthModel(nn.Module):
    def __init__(self, c: CsmConfig) -> None:
        super().__init__()
        d = c.depth
        self.embed_tokens = nn.Embedding(c.num_codebooks * c.codebook_size, c.backbone.hidden_size)
        self.inputs_embeds_projector = nn.Linear(c.backbone.hidden_size, d.hidden_size, bias=False)
        self.layers = nn.ModuleList(DecoderLayer(d, i) for i in range(d.num_hidden_layers))
        self.norm = RMSNorm(d.hidden_size, d.rms_norm_eps)


class _CodebooksHead(nn.Module):
    def __init__(self, c: CsmConfig) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(c.num_codebooks - 1, c.depth.hidden_size, c.codebook_size))


class _DepthDecoder(nn.Module):
    def __init__(self, c: CsmConfig) -> None:
        super().__init__()
        self.model = _DepthModel(c)
        self.codebooks_head = _CodebooksHead(c)


class _DenseAttention:
    """The depth decoder's attention over one frame: a dense cache [B, 2, Hkv, L, D] per layer
    (keys and values side by side: one write), inputs q ``[B * n, H, D]`` and kv ``[B * n, 2 Hkv,
    D]`` (keys then values; rows ordered batch-major) written at the static ``offset``.

    Grouped-query attention without repeating the cache: each kv head's ``H / Hkv`` query
    heads are its queries (rows), so one query position (every step but a frame's first) needs
    no mask and no copy of its inputs or output: fewer kernels in a step that runs 31 times."""

    def __init__(self, num_layers: int, batch: int, length: int, kv_heads: int, head_dim: int, like: Tensor) -> None:
        shape = (batch, 2, kv_heads, length, head_dim)
        self.kv = [like.new_zeros(shape) for _ in range(num_layers)]
        self.batch = batch
        self.offset = 0

    def __call__(self, layer: int, q: Tensor, kv: Tensor) -> Tensor:
        b, p = self.batch, self.offset
        n = q.shape[0] // b
        cache = self.kv[layer]
        hkv, d = cache.shape[2], q.shape[2]
        rep = q.shape[1] // hkv
        cache[:, :, :, p:p + n] = kv.view(b, n, 2, hkv, d).permute(0, 2, 3, 1, 4)
        kc, vc = cache[:, 0, :, :p + n], cache[:, 1, :, :p + n]  # [B, Hkv, S, D]
        if n == 1:  # every key is at or before the one query position: no mask
            o = F.scaled_dot_product_attention(q.view(b, hkv, rep, d), kc, vc)  # [B, Hkv, rep, D]
            return o.reshape(b, hkv * rep, d)
        qb = q.view(b, n, hkv, rep, d).permute(0, 2, 1, 3, 4).reshape(b, hkv, n * rep, d)  # rows (i, r)
        pos = torch.arange(p, p + n, device=q.device).repeat_interleave(rep)  # [n * rep]
        mask = torch.arange(p + n, device=q.device)[None, :] <= pos[:, None]  # [n * rep, S]
        o = F.scaled_dot_product_attention(qb, kc, vc, attn_mask=mask)  # [B, Hkv, n * rep, D]
        return o.view(b, hkv, n, rep, d).permute(0, 2, 1, 3, 4).reshape(b * n, hkv * rep, d)


class CsmModel(nn.Module):
    """Backbone, depth decoder, text embedding and codebook-0 head; see the module docstring.

    Build on the meta device, load, then ``setup()`` (RoPE tables, audio offsets, the tied
    codebook embedding)."""

    def __init__(self, config: CsmConfig, *, max_seq_len: int | None = None) -> None:
        super().__init__()
        self.config = config
        c = config
        self.max_seq_len = max(max_seq_len or 0, c.backbone.max_position_embeddings)
        self.embed_text_tokens = nn.Embedding(c.text_vocab_size, c.backbone.hidden_size)
        self.lm_head = nn.Linear(c.backbone.hidden_size, c.codebook_size, bias=False)
        self.backbone_model = _Backbone(c)
        self.depth_decoder = _DepthDecoder(c)
        self.register_buffer("rope", torch.empty(self.max_seq_len, 2, c.backbone.head_dim), persistent=False)
        self.register_buffer("depth_rope", torch.empty(c.num_codebooks, 2, c.depth.head_dim), persistent=False)
        self.register_buffer("offsets", torch.empty(c.num_codebooks, dtype=torch.int64), persistent=False)

    @torch.no_grad()
    def setup(self, device: torch.device | str) -> None:
        """Non-persistent buffers (after a meta-device load), the tie of the codebook tables and
        the depth decoder's fused weights (``models.csm.depth``: call again after changing weights)."""
        c = self.config
        self.rope = rope_cos_sin(c.backbone, self.max_seq_len, device)
        self.depth_rope = rope_cos_sin(c.depth, c.num_codebooks, device)
        self.offsets = torch.arange(c.num_codebooks, device=device, dtype=torch.int64) * c.codebook_size
        if c.tie_codebooks_embeddings:
            self.backbone_model.embed_tokens.embed_audio_tokens.weight = self.depth_decoder.model.embed_tokens.weight
        d = c.depth
        self.fused_depth = FusedDepth(self.depth_decoder.model.layers, self.depth_rope, d.num_attention_heads,
                                      d.num_key_value_heads, d.rms_norm_eps)

    # -- backbone -----------------------------------------------------------------------------
    def embed_audio(self, codes: Tensor) -> Tensor:
        """codes [N, K] (K = num_codebooks) -> the summed frame embedding [N, H]."""
        table = self.backbone_model.embed_tokens.embed_audio_tokens
        return table(codes + self.offsets).sum(dim=1)

    def embed(self, ids: Tensor, pool: Tensor, last_frames: Tensor) -> Tensor:
        """Packed ids [T] (``pack_pool`` / text ids / ``LAST_FRAME``), the context pool [P, K] and
        each position's slot's last frame [T, K] -> input embeddings [T, H]."""
        kind, low = unpack(ids)
        text = self.embed_text_tokens(torch.where(kind == 0, low, torch.zeros_like(low)))  # [T, H]
        frames = pool.index_select(0, torch.where(kind == 1, low, torch.zeros_like(low)))  # [T, K]
        frames = torch.where((kind == 2)[:, None], last_frames, frames)
        return torch.where((kind == 0)[:, None], text, self.embed_audio(frames).to(text.dtype))

    def forward(self, embeds: Tensor, positions: Tensor, attn: Callable[..., Tensor]) -> Tensor:
        """embeds [T, H], positions [T] -> the backbone's final-normed hidden [T, H]."""
        cs = self.rope.index_select(0, positions).to(embeds.dtype)  # [T, 2, D]
        cos, sin = cs[:, 0:1], cs[:, 1:2]
        x = embeds
        for layer in self.backbone_model.layers:
            x = layer(x, cos, sin, attn)
        return self.backbone_model.norm(x)

    def codebook0_logits(self, hidden: Tensor) -> Tensor:
        """hidden [B, H] -> float32 [B, V]."""
        return self.lm_head(hidden).float()

    # -- depth decoder ------------------------------------------------------------------------
    def _depth(self, x: Tensor, attn: _DenseAttention) -> Tensor:
        """x [B, n, H_backbone] at positions attn.offset.. -> normed [B, H_depth] of the last one."""
        dm = self.depth_decoder.model
        b, n, _ = x.shape
        h = dm.inputs_embeds_projector(x).reshape(b * n, -1)  # [B * n, Hd], batch-major
        h = self.fused_depth(h, attn.offset, n, attn)
        attn.offset += n
        return dm.norm(h.view(b, n, -1)[:, -1])

    def decode_frame(self, hidden: Tensor, code0: Tensor, sample: SampleFn) -> Tensor:
        """The backbone's hidden [B, H] and codebook 0 [B] -> the frame's codes [B, K]; codebook k
        is sampled with salt k. Static shapes: the K - 1 steps are unrolled."""
        c = self.config
        d, dm = c.depth, self.depth_decoder.model
        heads = self.depth_decoder.codebooks_head.weight  # [K-1, Hd, V]
        attn = _DenseAttention(d.num_hidden_layers, hidden.shape[0], c.num_codebooks, d.num_key_value_heads,
                               d.head_dim, hidden)
        x = torch.stack((hidden, dm.embed_tokens(code0).to(hidden.dtype)), dim=1)  # [B, 2, Hb]
        h = self._depth(x, attn)
        codes = [code0]
        for k in range(1, c.num_codebooks):
            code = sample((h @ heads[k - 1]).float(), k)  # [B]
            codes.append(code)
            if k < c.num_codebooks - 1:
                h = self._depth(dm.embed_tokens(code + k * c.codebook_size)[:, None].to(hidden.dtype), attn)
        return torch.stack(codes, dim=1)
