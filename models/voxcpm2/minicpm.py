"""MiniCPM4 decoder stacks: the backbone and residual LM over the runtime's paged attention, and
the small bidirectional stacks (local encoder, DiT) over one patch with dense attention
(what differs from Llama: docs/models/voxcpm2.md, "MiniCPM4 layers").
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.voxcpm2.config import MiniCPMConfig

__all__ = ["AttentionBackend", "DenseAttention", "MiniCPMStack", "RMSNorm", "apply_rope", "rope_table"]


class AttentionBackend(Protocol):
    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] (RoPE applied) -> o [T, Hq, D]; stores k/v, causal."""
        ...


def rope_table(c: MiniCPMConfig, device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """LongRoPE cos, sin [max_position_embeddings, head_dim] float32 (scaled)."""
    dim = c.head_dim
    inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, dim, 2, device=device).float() / dim))
    long = c.max_position_embeddings > c.original_max_position_embeddings
    factors = torch.tensor(c.long_factor if long else c.short_factor, dtype=torch.float32, device=device)
    t = torch.arange(c.max_position_embeddings, device=device, dtype=torch.float32)
    freqs = torch.mul(torch.outer(t, 1.0 / factors), inv_freq)  # [P, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    scale = math.sqrt(1 + math.log(c.max_position_embeddings / c.original_max_position_embeddings)
                      / math.log(c.original_max_position_embeddings))
    return emb.cos() * scale, emb.sin() * scale


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [..., T, H, D] with cos/sin [T, 1, D] float32 -> rotated x in its own dtype."""
    xf = x.float()
    return (xf * cos + _rotate_half(xf) * sin).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # One fused op (one kernel on CUDA, not eight): it normalises in float32 as the reference
        # does and scales before rounding to x's dtype (the reference rounds first: within an ulp).
        return F.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.eps)


class _Attention(nn.Module):
    def __init__(self, c: MiniCPMConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx, self.num_heads, self.num_kv_heads, self.head_dim = (
            layer_idx, c.num_attention_heads, c.num_key_value_heads, c.head_dim)
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None, attn: AttentionBackend) -> Tensor:
        lead = x.shape[:-1]  # [T] or [N, n]
        q = self.q_proj(x).view(*lead, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(*lead, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(*lead, self.num_kv_heads, self.head_dim)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        o = attn(self.layer_idx, q, k, v)  # [..., Hq, D]
        return self.o_proj(o.reshape(*lead, self.num_heads * self.head_dim))


class _MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, c: MiniCPMConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = _Attention(c, layer_idx)
        self.mlp = _MLP(c.hidden_size, c.intermediate_size)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.scale = c.residual_scale
        self.use_mup = c.use_mup

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None, attn: AttentionBackend) -> Tensor:
        alpha = self.scale if self.use_mup else 1.0  # the mup scaling rides on the residual add
        x = torch.add(x, self.self_attn(self.input_layernorm(x), rope, attn), alpha=alpha)
        return torch.add(x, self.mlp(self.post_attention_layernorm(x)), alpha=alpha)


class MiniCPMStack(nn.Module):
    """``embed_tokens`` (if the vocabulary is not empty), ``layers``, ``norm``; RoPE tables as
    non-persistent buffers. ``forward(x, positions, attn)`` runs the layers on embeddings
    (``layer_offset`` shifts the layer index handed to ``attn``: the residual LM shares the
    backbone's paged cache, after its layers)."""

    def __init__(self, c: MiniCPMConfig, *, layer_offset: int = 0) -> None:
        super().__init__()
        self.config = c
        if c.vocab_size > 0:
            self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(_Layer(c, layer_offset + i) for i in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)
        if not self.norm.weight.is_meta:
            self.setup_rope()

    @torch.no_grad()
    def setup_rope(self, device: torch.device | str | None = None) -> None:
        """(Re)build the RoPE table (after a meta-device load)."""
        if self.config.no_rope:
            return
        self.rope_cos, self.rope_sin = rope_table(self.config, device or self.norm.weight.device)

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor] | None:
        """positions [T] -> cos, sin [T, 1, D] float32 (None without RoPE)."""
        if self.config.no_rope:
            return None
        return self.rope_cos[positions][:, None], self.rope_sin[positions][:, None]

    def forward(self, x: Tensor, positions: Tensor, attn: AttentionBackend) -> Tensor:
        """x [T, H] (or [N, n, H] with positions [n]) -> final-normed hidden of the same shape."""
        rope = self.rope(positions)
        for layer in self.layers:
            x = layer(x, rope, attn)
        return self.norm(x)


class DenseAttention:
    """Bidirectional attention over [N, n, H, D] inputs (the local stacks: one patch per row)."""

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           enable_gqa=True)  # [N, Hq, n, D]
        return o.transpose(1, 2)
