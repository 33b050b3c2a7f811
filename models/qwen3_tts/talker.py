"""The Qwen3-TTS talker: a Qwen3 decoder over summed text + codec embeddings, gpt-fast style.

Checkpoint parameter names, a ragged flattened batch with attention delegated to the engine,
plain RoPE, and prompt ids packed as ``text_id << 12 | codec`` (why and how:
docs/models/qwen3_tts.md, "Talker").
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.qwen3_tts.config import Qwen3TTSConfig, TalkerConfig

__all__ = [
    "AttentionBackend", "CODEC_BITS", "NO_CODEC", "XVECTOR", "pack", "unpack", "RMSNorm", "Qwen3Layer",
    "Talker", "Qwen3TTSModel", "rope_cos_sin",
]

CODEC_BITS = 12
NO_CODEC = (1 << CODEC_BITS) - 1  # 4095: a text-only position
XVECTOR = NO_CODEC - 1  # 4094: the codec track is the row's speaker x-vector
_CODEC_MASK = (1 << CODEC_BITS) - 1


def pack(text_id: int | Tensor, codec: int | Tensor) -> int | Tensor:
    """One int64 for a prompt position: ``text_id << 12 | codec`` (codec id, NO_CODEC or XVECTOR)."""
    return (text_id << CODEC_BITS) | codec


def unpack(packed: Tensor) -> tuple[Tensor, Tensor]:
    """packed int64 [T] -> (text ids [T], codec field [T])."""
    return packed >> CODEC_BITS, packed & _CODEC_MASK


class AttentionBackend(Protocol):
    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] (RoPE applied) -> o [T, Hq, D]; stores k/v, causal."""
        ...


def rope_inv_freq(head_dim: int, theta: float, device: torch.device | str | None = None) -> Tensor:
    """[D/2] float32, as transformers' default RoPE init computes it."""
    exps = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    return 1.0 / (theta ** exps)


def rope_cos_sin(positions: Tensor, inv_freq: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """positions [T] -> cos, sin [T, 1, D] in ``dtype`` (computed in float32, halves duplicated),
    the first half of ``sin`` negated: what ``apply_rope`` takes (it rotates with one roll)."""
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, D/2]
    s = freqs.sin()
    cos = torch.cat((freqs, freqs), dim=-1).cos()  # [T, D]
    return cos.to(dtype)[:, None], torch.cat((-s, s), dim=-1).to(dtype)[:, None]


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE with ``rope_cos_sin``'s tables: ``x * cos + rotate_half(x) * sin`` of the reference,
    bit for bit (``rotate_half(x) = cat(-x2, x1)``; ``roll(x) = cat(x2, x1)`` times the sin with
    its first half negated gives the same products), one kernel fewer than negate-and-cat."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # One fused kernel where torch has one (CUDA), not eight; it normalises in float32 and
        # scales before rounding to x's dtype (the reference rounds first: within one ulp).
        return F.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.eps)


class _Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx, self.num_heads, self.num_kv_heads, self.head_dim = layer_idx, heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)  # Qwen3: per-head norm before RoPE
        self.k_norm = RMSNorm(head_dim, eps)
        # ``fuse_``: q/k/v in one matmul, q and k normed and rotated as one tensor (None: unfused)
        self.register_buffer("qkv_weight", None, persistent=False)
        self.register_buffer("qk_norm_weight", None, persistent=False)

    @torch.no_grad()
    def fuse_(self) -> None:
        """One [Hq + 2 Hkv] x D projection whose slices become q/k/v_proj's weights (the same
        memory, the checkpoint's names), and the q/k norms' weights per head: three fewer kernels
        for the projections and four for RoPE, each step. After the weights are loaded; a later
        change of q/k_norm's weights is not seen (fuse again)."""
        w = torch.cat((self.q_proj.weight, self.k_proj.weight, self.v_proj.weight), dim=0)
        nq, nk = self.q_proj.weight.shape[0], self.k_proj.weight.shape[0]
        self.q_proj.weight = nn.Parameter(w[:nq], requires_grad=False)
        self.k_proj.weight = nn.Parameter(w[nq:nq + nk], requires_grad=False)
        self.v_proj.weight = nn.Parameter(w[nq + nk:], requires_grad=False)
        self.qkv_weight = w
        d = self.head_dim
        self.qk_norm_weight = torch.cat((self.q_norm.weight.expand(self.num_heads, d),
                                         self.k_norm.weight.expand(self.num_kv_heads, d)))  # [Hq + Hkv, D]

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attn: AttentionBackend) -> Tensor:
        lead = x.shape[:-1]  # [T] or [B, n]
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        if self.qkv_weight is not None:
            qkv = F.linear(x, self.qkv_weight.to(x.dtype)).view(*lead, hq + 2 * hkv, d)
            qk = F.rms_norm(qkv[..., :hq + hkv, :], (d,), None, self.q_norm.eps) * self.qk_norm_weight.to(x.dtype)
            qk = apply_rope(qk, cos, sin)  # [..., Hq + Hkv, D]
            q, k, v = qk[..., :hq, :], qk[..., hq:, :], qkv[..., hq + hkv:, :]
        else:
            q = self.q_norm(self.q_proj(x).view(*lead, hq, d))  # [..., Hq, D]
            k = self.k_norm(self.k_proj(x).view(*lead, hkv, d))  # [..., Hkv, D]
            v = self.v_proj(x).view(*lead, hkv, d)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        o = attn(self.layer_idx, q, k, v)  # [..., Hq, D]
        return self.o_proj(o.reshape(*lead, hq * d))


class _MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.register_buffer("gate_up_weight", None, persistent=False)  # ``fuse_``

    @torch.no_grad()
    def fuse_(self) -> None:
        """gate and up in one matmul (their weights become slices of it: the same memory)."""
        w = torch.cat((self.gate_proj.weight, self.up_proj.weight), dim=0)
        n = self.gate_proj.weight.shape[0]
        self.gate_proj.weight = nn.Parameter(w[:n], requires_grad=False)
        self.up_proj.weight = nn.Parameter(w[n:], requires_grad=False)
        self.gate_up_weight = w

    def forward(self, x: Tensor) -> Tensor:
        if self.gate_up_weight is not None:
            gate, up = F.linear(x, self.gate_up_weight.to(x.dtype)).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen3Layer(nn.Module):
    """Pre-norm Qwen3 decoder layer (q/k norm), shared by the talker and the code predictor."""

    def __init__(self, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int, eps: float,
                 layer_idx: int) -> None:
        super().__init__()
        self.self_attn = _Attention(hidden, heads, kv_heads, head_dim, eps, layer_idx)
        self.mlp = _MLP(hidden, intermediate)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)

    def fuse_(self) -> None:
        """Fused projections (``_Attention.fuse_``, ``_MLP.fuse_``): fewer kernels a step."""
        self.self_attn.fuse_()
        self.mlp.fuse_()

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attn: AttentionBackend) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attn)
        return x + self.mlp(self.post_attention_layernorm(x))


class _ResizeMLP(nn.Module):
    """text_projection: text_hidden -> text_hidden -> hidden, SiLU, with biases."""

    def __init__(self, d_in: int, d_mid: int, d_out: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(d_in, d_mid, bias=True)
        self.linear_fc2 = nn.Linear(d_mid, d_out, bias=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class _TalkerBackbone(nn.Module):
    """Holds the ``talker.model.*`` parameters."""

    def __init__(self, c: TalkerConfig) -> None:
        super().__init__()
        self.codec_embedding = nn.Embedding(c.vocab_size, c.hidden_size)
        self.text_embedding = nn.Embedding(c.text_vocab_size, c.text_hidden_size)
        self.layers = nn.ModuleList(
            Qwen3Layer(c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
                       c.head_dim, c.rms_norm_eps, i) for i in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class Talker(nn.Module):
    """``talker.*``: backbone, text projection, codec head and the code predictor."""

    def __init__(self, config: TalkerConfig) -> None:
        from models.qwen3_tts.code_predictor import CodePredictor

        super().__init__()
        self.config = config
        self.model = _TalkerBackbone(config)
        self.text_projection = _ResizeMLP(config.text_hidden_size, config.text_hidden_size, config.hidden_size)
        self.codec_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.code_predictor = CodePredictor(config)
        self.register_buffer("inv_freq", torch.empty(config.head_dim // 2), persistent=False)
        if not self.codec_head.weight.is_meta:
            self.setup_rope()

    @torch.no_grad()
    def setup_rope(self, device: torch.device | str | None = None) -> None:
        """(Re)compute the non-persistent RoPE frequencies (after a meta-device load)."""
        device = device or self.codec_head.weight.device
        self.inv_freq = rope_inv_freq(self.config.head_dim, self.config.rope_theta, device)
        self.code_predictor.setup_rope(device)

    # -- inputs -------------------------------------------------------------------------------
    def embed_text(self, text_ids: Tensor) -> Tensor:
        """text ids [N] -> the text track [N, H]: text_projection(text_embedding(ids))."""
        return self.text_projection(self.model.text_embedding(text_ids))

    def embed_codes(self, codes: Tensor) -> Tensor:
        """codes [B, G] of one frame -> the sum of their G embeddings [B, H]."""
        parts = [self.model.codec_embedding(codes[:, 0])]  # codebook 0: the talker's table
        tables = self.code_predictor.model.codec_embedding
        parts += [tables[i - 1](codes[:, i]) for i in range(1, codes.shape[1])]
        return torch.stack(parts, dim=1).sum(1)  # [B, H] (summed as the reference does)

    def embed_prompt(self, packed: Tensor, xvectors: Tensor | None = None) -> Tensor:
        """packed int64 [T] (see ``pack``) -> input embeddings [T, H].

        ``xvectors`` [T, H] supplies the codec track of rows whose field is ``XVECTOR`` (other rows
        are ignored); rows of ``XVECTOR`` without it are an error the caller must avoid.
        """
        text_ids, codec = unpack(packed)
        x = self.embed_text(text_ids)  # [T, H]
        is_codec = codec < XVECTOR
        cemb = self.model.codec_embedding(torch.where(is_codec, codec, torch.zeros_like(codec)))  # [T, H]
        track = torch.where(is_codec[:, None], cemb, torch.zeros_like(cemb))
        if xvectors is not None:
            track = torch.where((codec == XVECTOR)[:, None], xvectors.to(track.dtype), track)
        return x + track

    def embed_decode(self, text_ids: Tensor, last_codes: Tensor) -> Tensor:
        """Decode rows: text-track ids [B] and the previous frame's codes [B, G] -> [B, H]."""
        return self.embed_codes(last_codes) + self.embed_text(text_ids)

    def embed_decode_slots(self, text_ids: Tensor, slots: Tensor, last_codes: Tensor) -> Tensor:
        """Decode rows from the per-slot state: text ids [B], slots [B], last_codes [S, G] -> [B, H]."""
        return self.embed_decode(text_ids, last_codes.index_select(0, slots))

    # -- stack and head -----------------------------------------------------------------------
    def forward(self, embeds: Tensor, positions: Tensor, attn: AttentionBackend) -> Tensor:
        """embeds [T, H], positions [T] -> final-normed hidden [T, H]."""
        cos, sin = rope_cos_sin(positions, self.inv_freq, embeds.dtype)  # [T, 1, D]
        x = embeds
        for layer in self.model.layers:
            x = layer(x, cos, sin, attn)
        return self.model.norm(x)

    def codec_logits(self, hidden: Tensor) -> Tensor:
        """hidden [N, H] -> float32 codec logits [N, vocab] (codebook 0 and the specials)."""
        return self.codec_head(hidden).float()


class Qwen3TTSModel(nn.Module):
    """The checkpoint's ``model.safetensors``: ``talker.*`` and (Base) ``speaker_encoder.*``."""

    def __init__(self, config: Qwen3TTSConfig) -> None:
        from models.qwen3_tts.speaker import SpeakerEncoder

        super().__init__()
        self.config = config
        self.talker = Talker(config.talker)
        self.speaker_encoder = SpeakerEncoder(config.speaker_encoder) if config.speaker_encoder else None
