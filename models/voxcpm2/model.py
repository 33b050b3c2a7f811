"""The VoxCPM2 language side: MiniCPM4 backbone, scalar-quantisation bottleneck, residual acoustic
LM, local patch encoder, local DiT (the flow-matching estimator), projections and stop head
(one step per patch, packed ids: docs/models/voxcpm2.md, "The model in one step").
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.voxcpm2.config import MiniCPMConfig, VoxCPM2Config
from models.voxcpm2.minicpm import AttentionBackend, DenseAttention, MiniCPMStack

__all__ = ["KIND_SHIFT", "LAST_PATCH", "PROMPT_PATCH", "STOP", "LocalDiT", "LocalEncoder", "VoxCPM2Model",
           "pack_prompt_patch", "unpack"]

KIND_SHIFT = 24
_LOW = (1 << KIND_SHIFT) - 1
PROMPT_PATCH = 1 << KIND_SHIFT  # | j: patch j of the slot's prompt features (reference audio)
LAST_PATCH = 2 << KIND_SHIFT  # the slot's last generated patch: every decode row's id
STOP = 3 << KIND_SHIFT  # the head's stop token (never an input)


def pack_prompt_patch(j: int) -> int:
    return PROMPT_PATCH | j


def unpack(ids: Tensor) -> tuple[Tensor, Tensor]:
    """ids int64 [T] -> (kind [T]: 0 text, 1 prompt patch, 2 last patch; low field [T])."""
    return ids >> KIND_SHIFT, ids & _LOW


class _FSQ(nn.Module):
    """``fsq_layer``: project to ``latent``, tanh, round to multiples of 1/scale, project back."""

    def __init__(self, dim: int, latent: int, scale: int) -> None:
        super().__init__()
        self.scale = scale
        self.in_proj = nn.Linear(dim, latent)
        self.out_proj = nn.Linear(latent, dim)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.in_proj(x))
        return self.out_proj(torch.round(h * self.scale) / self.scale)


class LocalEncoder(nn.Module):
    """``feat_encoder``: a learned token before the patch's P frames, a bidirectional MiniCPM
    stack over the P + 1 positions, the first position's output. patches [N, P, D] -> [N, H]."""

    def __init__(self, c: MiniCPMConfig, feat_dim: int) -> None:
        super().__init__()
        self.special_token = nn.Parameter(torch.zeros(1, 1, 1, c.hidden_size))
        self.in_proj = nn.Linear(feat_dim, c.hidden_size)
        self.encoder = MiniCPMStack(c)

    def forward(self, patches: Tensor) -> Tensor:
        x = self.in_proj(patches)  # [N, P, H]
        x = torch.cat((self.special_token[0].expand(x.shape[0], 1, -1), x), dim=1)  # [N, P + 1, H]
        pos = torch.arange(x.shape[1], device=x.device)
        return self.encoder(x, pos, DenseAttention())[:, 0]


class _TimeMLP(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(dim, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


def sinusoidal(t: Tensor, dim: int, scale: float = 1000.0) -> Tensor:
    """t [N] -> [N, dim]: sin | cos of ``scale * t * exp(-i log(1e4) / (dim/2 - 1))`` (in t's dtype)."""
    half = dim // 2
    freq = torch.exp(torch.arange(half, dtype=t.dtype, device=t.device) * -(math.log(10000) / (half - 1)))
    emb = scale * t.unsqueeze(1) * freq.unsqueeze(0)
    return torch.cat((emb.sin(), emb.cos()), dim=-1)


class LocalDiT(nn.Module):
    """``feat_decoder.estimator``: the velocity field of one patch.

    Sequence (bidirectional, RoPE positions 0..): the two conditioning vectors (``mu`` [N, 2 * Hd]
    viewed as 2 positions: backbone and residual streams), the time embedding, the previous
    patch (``cond``), the noisy patch ``x``; the velocity is read from the last P positions.
    The token head runs it as ``models.voxcpm2.dit.FusedDiT`` (the same arithmetic, fewer kernels).
    """

    def __init__(self, c: MiniCPMConfig, feat_dim: int) -> None:
        super().__init__()
        h = c.hidden_size
        self.in_proj = nn.Linear(feat_dim, h)
        self.cond_proj = nn.Linear(feat_dim, h)
        self.out_proj = nn.Linear(h, feat_dim)
        self.time_mlp = _TimeMLP(h)
        self.delta_time_mlp = _TimeMLP(h)
        self.decoder = MiniCPMStack(c)

    def forward(self, x: Tensor, mu: Tensor, t: Tensor, cond: Tensor, dt: Tensor) -> Tensor:
        """x [N, D, P], mu [N, 2 * Hd], t/dt [N], cond [N, D, P'] -> velocity [N, D, P]."""
        xh = self.in_proj(x.transpose(1, 2))  # [N, P, Hd]
        ch = self.cond_proj(cond.transpose(1, 2))  # [N, P', Hd]
        h = xh.shape[-1]
        te = self.time_mlp(sinusoidal(t, h).to(xh.dtype)) + self.delta_time_mlp(sinusoidal(dt, h).to(xh.dtype))
        mu = mu.view(xh.shape[0], -1, h)  # [N, 2, Hd]
        seq = torch.cat((mu, te.unsqueeze(1), ch, xh), dim=1)
        pos = torch.arange(seq.shape[1], device=seq.device)
        out = self.decoder(seq, pos, DenseAttention())[:, mu.shape[1] + 1 + ch.shape[1]:]
        return self.out_proj(out).transpose(1, 2)


class _FeatDecoder(nn.Module):
    """Holds ``feat_decoder.estimator`` (the solver lives in ``flow.py``)."""

    def __init__(self, c: MiniCPMConfig, feat_dim: int) -> None:
        super().__init__()
        self.estimator = LocalDiT(c, feat_dim)


class VoxCPM2Model(nn.Module):
    """The checkpoint's ``model.safetensors`` (everything but the AudioVAE)."""

    def __init__(self, config: VoxCPM2Config) -> None:
        super().__init__()
        self.config = config
        lm, h = config.lm, config.lm.hidden_size
        self.base_lm = MiniCPMStack(lm)
        self.residual_lm = MiniCPMStack(config.residual, layer_offset=lm.num_hidden_layers)
        self.feat_encoder = LocalEncoder(config.encoder_lm, config.feat_dim)
        self.feat_decoder = _FeatDecoder(config.dit_lm, config.feat_dim)
        self.fsq_layer = _FSQ(h, config.scalar_quantization_latent_dim, config.scalar_quantization_scale)
        self.enc_to_lm_proj = nn.Linear(config.encoder.hidden_dim, h)
        self.lm_to_dit_proj = nn.Linear(h, config.dit.hidden_dim)
        self.res_to_dit_proj = nn.Linear(h, config.dit.hidden_dim)
        self.fusion_concat_proj = nn.Linear(2 * h, h)
        self.stop_proj = nn.Linear(h, h)
        self.stop_head = nn.Linear(h, 2, bias=False)
        self.slot_feats: SlotFeatures | None = None  # the per-slot patches ``forward`` reads

    @property
    def num_layers(self) -> int:
        """Layers in the runtime's paged cache: the backbone's, then the residual LM's."""
        return self.config.lm.num_hidden_layers + self.config.residual_lm_num_layers

    def setup_rope(self, device: torch.device | str | None = None) -> None:
        for m in self.modules():
            if isinstance(m, MiniCPMStack):
                m.setup_rope(device)

    # -- the step ------------------------------------------------------------------------------
    def embed_patches(self, patches: Tensor) -> Tensor:
        """patches [N, P, D] -> backbone-width embeddings [N, H]."""
        return self.enc_to_lm_proj(self.feat_encoder(patches))

    def step(self, ids: Tensor, patches: Tensor, positions: Tensor, attn: AttentionBackend) -> Tensor:
        """ids [T] (text ids or patch kinds), patches [T, P, D] (read where the id is a patch),
        positions [T] -> hidden [T, 2H] = [backbone (bottlenecked at patches) | residual]."""
        kind, low = unpack(ids)
        is_patch = (kind != 0)[:, None]  # [T, 1]
        text = torch.where(kind == 0, low, torch.zeros_like(low))
        pemb = self.embed_patches(patches.to(self.stop_head.weight.dtype))  # [T, H]
        temb = self.base_lm.embed_tokens(text) * self.config.lm.embed_scale
        x = torch.where(is_patch, pemb, temb)
        h = self.base_lm(x, positions, attn)
        lm = torch.where(is_patch, self.fsq_layer(h), h)
        res_in = self.fusion_concat_proj(torch.cat((lm, torch.where(is_patch, pemb, torch.zeros_like(pemb))), dim=-1))
        res = self.residual_lm(res_in, positions, attn)
        return torch.cat((lm, res), dim=-1)

    def forward(self, ids: Tensor, positions: Tensor, attn: AttentionBackend, token_rows: Tensor) -> Tensor:
        """The runtime's step: ids [T], positions [T], attn, each token's slot [T] -> hidden [T, 2H]."""
        if self.slot_feats is None:
            raise RuntimeError("VoxCPM2Model.forward needs slot_feats (the per-slot patch buffers)")
        return self.step(ids, self.slot_feats.gather(ids, token_rows), positions, attn)

    def stop_logits(self, lm: Tensor) -> Tensor:
        """Backbone stream [B, H] -> float32 [B, 2] (column 1: stop)."""
        return self.stop_head(F.silu(self.stop_proj(lm))).float()

    def dit_condition(self, hidden: Tensor) -> Tensor:
        """hidden [B, 2H] -> the DiT's mu [B, 2 * Hd]."""
        lm, res = hidden.chunk(2, dim=-1)
        return torch.cat((self.lm_to_dit_proj(lm), self.res_to_dit_proj(res)), dim=-1)


class SlotFeatures:
    """Per-slot patch buffers the step's inputs read (device tensors, ``max_slots + 1`` rows, the
    last one the padding rows'): ``prompt [S+1, F, P, D]`` (reference-audio patches a program
    writes before the prompt runs) and ``last [S+1, P, D]`` (the last generated patch, written by
    the head, read by the next decode row and as the next patch's DiT condition)."""

    def __init__(self, max_slots: int, max_prompt_patches: int, patch_size: int, feat_dim: int, *,
                 device: torch.device | str, dtype: torch.dtype = torch.float32) -> None:
        self.max_prompt_patches = max_prompt_patches
        self.prompt = torch.zeros(max_slots + 1, max(max_prompt_patches, 1), patch_size, feat_dim, device=device,
                                  dtype=dtype)
        self.last = torch.zeros(max_slots + 1, patch_size, feat_dim, device=device, dtype=dtype)

    def gather(self, ids: Tensor, rows: Tensor) -> Tensor:
        """ids [T], token rows [T] -> each position's patch [T, P, D] (zeros for text)."""
        kind, low = unpack(ids)
        j = torch.where(kind == 1, low, torch.zeros_like(low)).clamp_(max=self.prompt.shape[1] - 1)
        from_prompt = self.prompt[rows, j]  # [T, P, D]
        from_last = self.last.index_select(0, rows)
        out = torch.where((kind == 2)[:, None, None], from_last, from_prompt)
        return torch.where((kind == 0)[:, None, None], torch.zeros_like(out), out)
