"""Speaker and CFG conditioning (moshi's ``condition_provider`` + ``fuser``), and ``VoiceBank``:
each voice's cross-attention keys/values computed once, in rows of a fixed-capacity bank
(docs/models/kyutai_tts.md, "Conditioning").
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.kyutai_tts.config import ConditionConfig

__all__ = ["ConditionProvider", "VoiceBank", "sin_embedding"]


def sin_embedding(length: int, dim: int, max_period: float = 10000.0, device: torch.device | str | None = None) -> Tensor:
    """moshi's ``create_sin_embedding`` for positions 0..length-1: [length, dim] float32 (cos | sin)."""
    half = dim // 2
    pos = torch.arange(length, device=device, dtype=torch.float32)[:, None]
    adim = torch.arange(half, device=device, dtype=torch.float32)[None]
    phase = pos / (torch.full([], max_period, device=device, dtype=torch.float32) ** (adim / (half - 1)))
    return torch.cat((torch.cos(phase), torch.sin(phase)), dim=-1)


class _Conditioner(nn.Module):
    def __init__(self, dim_in: int, dim: int, lut: int | None = None) -> None:
        super().__init__()
        if lut is not None:
            self.embed = nn.Embedding(lut + 1, dim_in)  # + 1: the "missing" entry
        self.output_proj = nn.Linear(dim_in, dim, bias=False)
        self.learnt_padding = nn.Parameter(torch.zeros(1, 1, dim))

    def project(self, x: Tensor, mask: Tensor) -> Tensor:
        """x [T, dim_in], mask bool [T] -> [T, dim]: projected where present, learnt padding elsewhere."""
        cond = self.output_proj(x)
        m = mask.to(cond.dtype)[:, None]
        return cond * m + self.learnt_padding.reshape(1, -1) * (1 - m)


class _Conditioners(nn.Module):
    def __init__(self, c: ConditionConfig, dim: int) -> None:
        super().__init__()
        self.speaker_wavs = _Conditioner(c.speaker_dim, dim)
        self.cfg = _Conditioner(c.cfg_dim, dim, lut=len(c.cfg_values))
        self.control = _Conditioner(c.control_dim, dim, lut=len(c.control_values))


class ConditionProvider(nn.Module):
    """``condition_provider.conditioners.*`` of the checkpoint (kept in float32, as moshi does)."""

    def __init__(self, c: ConditionConfig, dim: int) -> None:
        super().__init__()
        self.config = c
        self.dim = dim
        self.conditioners = _Conditioners(c, dim)

    def _lut(self, cond: _Conditioner, values: tuple[str, ...], value: str | None) -> Tensor:
        if value is not None and value not in values:
            raise ValueError(f"condition value {value!r} is not one of {values}")
        idx = len(values) if value is None else values.index(value)
        dev = cond.learnt_padding.device
        x = cond.embed(torch.tensor([idx], device=dev))  # [1, dim_in]
        return cond.project(x, torch.tensor([value is not None], device=dev))[0]

    @torch.no_grad()
    def sum_condition(self, cfg: str | None, control: str | None = "ok") -> Tensor:
        """The vector added to every frame's input: control + cfg, [dim] float32."""
        c, cs = self.config, self.conditioners
        return self._lut(cs.control, c.control_values, control) + self._lut(cs.cfg, c.cfg_values, cfg)

    @torch.no_grad()
    def cross_source(self, voices: list[Tensor]) -> Tensor:
        """Voice embeddings ([speaker_dim, voice_frames] each, as in a ``speaker_wavs`` file without
        its batch dim; at most ``max_speakers``) -> the cross-attention source [cross_len, dim] float32."""
        c = self.config
        if not 1 <= len(voices) <= c.max_speakers:
            raise ValueError(f"between 1 and {c.max_speakers} voices, got {len(voices)}")
        cond = self.conditioners.speaker_wavs
        dev = cond.learnt_padding.device
        x = torch.zeros(c.max_speakers, c.voice_frames, c.speaker_dim, device=dev)
        mask = torch.zeros(c.max_speakers, c.voice_frames, dtype=torch.bool, device=dev)
        for i, v in enumerate(voices):
            if tuple(v.shape) != (c.speaker_dim, c.voice_frames):
                raise ValueError(f"a voice embedding must be [{c.speaker_dim}, {c.voice_frames}], got {tuple(v.shape)}")
            x[i] = v.to(dev, torch.float32).t()
            mask[i] = True
        src = cond.project(x.view(-1, c.speaker_dim), mask.view(-1))  # [cross_len, dim]
        return src + c.cross_pos_emb_scale * sin_embedding(src.shape[0], src.shape[1], device=dev)


class VoiceBank:
    """Per-voice cross-attention keys/values for every layer, ``capacity`` voices at a time;
    ``attention``: how a token attends to its voice ("sdpa": ``attend``'s masked SDPA over every
    voice; "triton": ``cross_triton.attend_voices``, the voices in use only, CUDA)."""

    ATTENTIONS = ("sdpa", "triton")

    def __init__(self, num_layers: int, capacity: int, length: int, heads: int, head_dim: int, *,
                 device: torch.device | str, dtype: torch.dtype, attention: str = "sdpa") -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        if attention not in self.ATTENTIONS:
            raise ValueError(f"kyutai_cross_attention must be sdpa or triton, got {attention!r}")
        if attention == "triton" and torch.device(device).type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("kyutai_cross_attention=triton needs a CUDA device (its kernel is Triton's)")
        self.attention = attention
        self.capacity, self.length, self.heads, self.head_dim = capacity, length, heads, head_dim
        shape = (num_layers, capacity, length, heads, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.owner = torch.arange(capacity, device=device).repeat_interleave(length)  # [S]: each key's bank row
        self._mask: tuple[Tensor, Tensor] | None = None  # (rows, its mask): one per step, not per layer

    @torch.no_grad()
    def load(self, row: int, source: Tensor, kv_weights: list[Tensor]) -> None:
        """Fill bank row ``row`` from a cross source [length, dim] (cast to the bank's dtype, as
        moshi casts it to the LM's) and each layer's key/value projection [2 * dim, dim]."""
        if not 0 <= row < self.capacity:
            raise ValueError(f"voice bank row {row} outside [0, {self.capacity})")
        src = source.to(self.k.device, self.k.dtype)
        for layer, w in enumerate(kv_weights):
            kv = F.linear(src, w).view(self.length, 2, self.heads, self.head_dim)
            self.k[layer, row] = kv[:, 0]
            self.v[layer, row] = kv[:, 1]

    def attend(self, layer: int, q: Tensor, rows: Tensor) -> Tensor:
        """q [T, H, D] of tokens whose voices are bank rows ``rows`` [T] -> [T, H * D].

        All bank rows' keys are scored and the other voices' masked: one read of the bank per
        layer (a gather would copy each token's voice), in one fused attention kernel: the
        scores [H, T, capacity * length] never reach memory. Four-dimensional inputs: with
        three, torch's attention fell back to its unfused float32 path (H200, 128 rows, a
        layer: 542 us, against 201 us unfused in bfloat16 and 136 us fused; at one row 155, 40
        and 24 us). Unmasked within a voice, as moshi's cross-attention."""
        if self.attention == "triton":
            from models.kyutai_tts.cross_triton import attend_voices

            return attend_voices(q.contiguous(), self.k[layer], self.v[layer], rows)
        k = self.k[layer].flatten(0, 1).transpose(0, 1)[None]  # [1, H, S = V * L, D]
        v = self.v[layer].flatten(0, 1).transpose(0, 1)[None]
        if self._mask is None or self._mask[0] is not rows:  # the same rows in every layer of a step
            self._mask = (rows, (self.owner[None, :] == rows[:, None])[None, None])  # [1, 1, T, S]
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k, v, attn_mask=self._mask[1])  # [1, H, T, D]
        return o[0].transpose(0, 1).flatten(1)
