"""Llama-3 decoder (Orpheus backbone), gpt-fast style, attention delegated to the engine.

Parameter names equal ``LlamaForCausalLM``'s state-dict keys (``lm_head.weight`` only when
embeddings are not tied); ``forward`` takes a step's tokens flattened, with no padding
(docs/orpheus.md, "Model interface").
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.orpheus.config import LlamaConfig

__all__ = ["AttentionBackend", "LlamaModel", "rope_inv_freq", "rope_cos_sin"]


class AttentionBackend(Protocol):
    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """q [T, H, D], k/v [T, Hkv, D] (RoPE applied) -> o [T, H, D].

        Stores k/v for this step's tokens in the cache of ``layer``, then computes causal
        attention of each token over its own sequence's cached keys (itself included).
        """
        ...


def rope_inv_freq(config: LlamaConfig) -> Tensor:
    """Inverse RoPE frequencies [D/2] (float32), with llama3 frequency scaling if configured."""
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = config.rope_scaling
    if s is None:
        return inv_freq
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are stretched by `factor`, short ones kept, the band between blended.
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(is_medium, blended, scaled)


def rope_cos_sin(config: LlamaConfig, max_seq_len: int, device: torch.device | str | None = None) -> Tensor:
    """Table [max_seq_len, 2, D] float32: cos and sin of every position (halves duplicated)."""
    inv_freq = rope_inv_freq(config).to(device)  # [D/2]
    pos = torch.arange(max_seq_len, device=device, dtype=torch.int64).float()  # [S]
    freqs = pos[:, None] * inv_freq[None, :]  # [S, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [S, D]
    return torch.stack((emb.cos(), emb.sin()), dim=1)  # [S, 2, D]


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x [T, H, D]; cos/sin [T, 1, D] already in x's dtype
    return x * cos + _rotate_half(x) * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # One fused kernel where torch has one (CUDA), not eight; it normalises in float32 and
        # scales before rounding to x's dtype (transformers rounds first: within one ulp).
        return F.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.eps)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attn: AttentionBackend) -> Tensor:
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.num_heads, self.head_dim)  # [T, H, D]
        k = self.k_proj(x).view(t, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        o = attn(self.layer_idx, q, k, v)  # [T, H, D]
        return self.o_proj(o.reshape(t, self.num_heads * self.head_dim))  # [T, hidden]


class MLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attn: AttentionBackend) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attn)
        return x + self.mlp(self.post_attention_layernorm(x))


class _Backbone(nn.Module):
    """Holds the ``model.*`` parameters (HF naming)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaModel(nn.Module):
    """Llama causal LM over a ragged flattened batch; see the module docstring.

    Build on the meta device, ``load_state_dict(sd, assign=True)``, then ``setup_rope()``
    (the RoPE table is a non-persistent buffer, so it is not part of the checkpoint).
    """

    def __init__(self, config: LlamaConfig, *, max_seq_len: int | None = None) -> None:
        super().__init__()
        self.config = config
        self.max_seq_len = max_seq_len or config.max_position_embeddings
        self.model = _Backbone(config)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(
            config.hidden_size, config.vocab_size, bias=False
        )
        self.register_buffer("rope", torch.empty(self.max_seq_len, 2, config.head_dim), persistent=False)
        self._head_cache: tuple[tuple, Tensor] | None = None
        if not self.model.embed_tokens.weight.is_meta:
            self.setup_rope()

    @torch.no_grad()
    def setup_rope(self, device: torch.device | str | None = None) -> None:
        """(Re)compute the RoPE table [max_seq_len, 2, D] in float32 on ``device``."""
        if device is None:
            device = self.model.embed_tokens.weight.device
        self.rope = rope_cos_sin(self.config, self.max_seq_len, device)

    @torch.no_grad()
    def init_random_(self, *, seed: int = 0, std: float = 0.02) -> LlamaModel:
        """Fill every weight with random values (normal(0, std), norms at 1): ``--load-format dummy``."""
        gen = torch.Generator(device=self.model.embed_tokens.weight.device).manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.fill_(1.0)
            else:
                p.normal_(0.0, std, generator=gen)
        self._head_cache = None
        return self

    @property
    def head_weight(self) -> Tensor:
        """[vocab, hidden]: the output projection (the embedding when tied)."""
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def forward(self, input_ids: Tensor, positions: Tensor, attn: AttentionBackend) -> Tensor:
        """input_ids [T], positions [T] (absolute, per sequence) -> final-normed hidden [T, hidden]."""
        x = self.model.embed_tokens(input_ids)  # [T, hidden]
        cs = self.rope.index_select(0, positions).to(x.dtype)  # [T, 2, D]
        cos, sin = cs[:, 0:1], cs[:, 1:2]  # [T, 1, D] each, broadcast over heads
        for layer in self.model.layers:
            x = layer(x, cos, sin, attn)
        return self.model.norm(x)

    def compute_logits(self, hidden: Tensor, vocab_ids: Tensor | None = None) -> Tensor:
        """hidden [N, hidden] -> float32 logits [N, vocab], or [N, K] over ``vocab_ids`` [K].

        The K gathered head rows are cached per ``vocab_ids`` tensor (same storage and length),
        so pass the same, never-mutated tensor every step; the gather then runs once.
        """
        if vocab_ids is None:
            return F.linear(hidden, self.head_weight).float()  # [N, V]
        key = (vocab_ids.data_ptr(), vocab_ids.numel(), vocab_ids.device, self.head_weight.data_ptr())
        if self._head_cache is None or self._head_cache[0] != key:
            k = vocab_ids.numel()
            # Rows padded with zeros to a multiple of 8: GEMMs with an odd output width (28,673
            # for Orpheus) miss the aligned fast kernels; the padding columns are cut off.
            weight = self.head_weight.new_zeros(-(-k // 8) * 8, self.head_weight.shape[1])  # [K8, hidden]
            weight[:k] = self.head_weight.index_select(0, vocab_ids)
            self._head_cache = (key, weight)
        return F.linear(hidden, self._head_cache[1])[:, : vocab_ids.numel()].float()  # [N, K]
