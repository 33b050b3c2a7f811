"""The AudioVAE (V2): a causal convolutional VAE (16 kHz in, 25 Hz latents of 64, 48 kHz out), and
``VAEStream``, a streaming decoder with per-slot state (docs/models/voxcpm2.md, "Streaming
audio").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.voxcpm2.config import AudioVAEConfig

__all__ = ["AudioVAE", "VAEStream"]

# pad(conv, x) -> x with the conv's left context prepended; the whole decode pads zeros, a
# stream the slot's saved inputs.
_Pad = "callable"


class _Conv(nn.Conv1d):
    """A causal Conv1d: ``ctx = (k - 1) * dilation`` inputs of left context (for a strided
    conv, ``stride``, as the reference pads it)."""

    def __init__(self, cin: int, cout: int, kernel: int, *, stride: int = 1, dilation: int = 1, groups: int = 1,
                 bias: bool = True) -> None:
        super().__init__(cin, cout, kernel, stride=stride, dilation=dilation, groups=groups, bias=bias)
        self.ctx = stride if stride > 1 else (kernel - 1) * dilation


class _TConv(nn.ConvTranspose1d):
    """Causal transposed conv, kernel 2s, stride s: one input of left context."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__(cin, cout, 2 * stride, stride=stride)
        self.ctx = 1


class _Snake(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, dim, 1))

    def forward(self, x: Tensor) -> Tensor:
        a = self.alpha
        return x + (a + 1e-9).reciprocal() * torch.sin(a * x).pow(2)


def _zero_pad(conv: nn.Module, x: Tensor) -> Tensor:
    return F.pad(x, (conv.ctx, 0))


def _run(m: nn.Module, x: Tensor, pad) -> Tensor:
    """Apply one layer (conv, transposed conv, snake, residual unit, block) with ``pad``."""
    if isinstance(m, _TConv):
        full = pad(m, x)  # [N, C, 1 + n]
        y = F.conv_transpose1d(full, m.weight, m.bias, stride=m.stride)
        s = m.stride[0]
        return y[..., s: s + x.shape[-1] * s]
    if isinstance(m, _Conv):
        return m._conv_forward(pad(m, x), m.weight, m.bias)
    if isinstance(m, _ResidualUnit):
        h = x
        for sub in m.block:
            h = _run(sub, h, pad)
        return x + h
    if isinstance(m, (_EncoderBlock, _DecoderBlock)):
        m = m.block
    if isinstance(m, nn.Sequential):
        for sub in m:
            x = _run(sub, x, pad)
        return x
    return m(x)


class _ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int, groups: int) -> None:
        super().__init__()
        self.block = nn.Sequential(_Snake(dim), _Conv(dim, dim, 7, dilation=dilation, groups=groups),
                                   _Snake(dim), _Conv(dim, dim, 1))


def _units(dim: int, groups: int) -> list[nn.Module]:
    return [_ResidualUnit(dim, d, groups) for d in (1, 3, 9)]


class _EncoderBlock(nn.Module):
    def __init__(self, dim_in: int, dim_out: int, stride: int, groups: int) -> None:
        super().__init__()
        self.block = nn.Sequential(*_units(dim_in, groups), _Snake(dim_in), _Conv(dim_in, dim_out, 2 * stride,
                                                                                  stride=stride))


class _Encoder(nn.Module):
    def __init__(self, c: AudioVAEConfig) -> None:
        super().__init__()
        d = c.encoder_dim
        layers: list[nn.Module] = [_Conv(1, d, 7)]
        for s in c.encoder_rates:
            layers.append(_EncoderBlock(d, 2 * d, s, d if c.depthwise else 1))
            d *= 2
        self.block = nn.Sequential(*layers)
        self.fc_mu = _Conv(d, c.latent_dim, 3)
        self.fc_logvar = _Conv(d, c.latent_dim, 3)  # unused at inference; loaded for a strict match


class _DecoderBlock(nn.Module):
    def __init__(self, dim_in: int, dim_out: int, stride: int, groups: int) -> None:
        super().__init__()
        self.block = nn.Sequential(_Snake(dim_in), _TConv(dim_in, dim_out, stride), *_units(dim_out, groups))
        self.input_channels = dim_in


class _SRCond(nn.Module):
    def __init__(self, dim: int, buckets: int, cond_type: str) -> None:
        super().__init__()
        if cond_type == "add":
            self.cond_embed = nn.Embedding(buckets, dim)
        else:
            self.scale_embed = nn.Embedding(buckets, dim)
            self.bias_embed = nn.Embedding(buckets, dim)

    def forward(self, x: Tensor, bucket: int) -> Tensor:
        if hasattr(self, "cond_embed"):
            return x + self.cond_embed.weight[bucket][None, :, None]
        return x * self.scale_embed.weight[bucket][None, :, None] + self.bias_embed.weight[bucket][None, :, None]


class _Decoder(nn.Module):
    def __init__(self, c: AudioVAEConfig) -> None:
        super().__init__()
        latent, ch = c.latent_dim, c.decoder_dim
        layers: list[nn.Module] = ([_Conv(latent, latent, 7, groups=latent), _Conv(latent, ch, 1)] if c.depthwise
                                   else [_Conv(latent, ch, 7)])
        for i, s in enumerate(c.decoder_rates):
            dim_out = ch // 2 ** (i + 1)
            layers.append(_DecoderBlock(ch // 2 ** i, dim_out, s, dim_out if c.depthwise else 1))
        layers += [_Snake(dim_out), _Conv(dim_out, 1, 7), nn.Tanh()]
        self.model = nn.ModuleList(layers) if c.sr_bin_boundaries else nn.Sequential(*layers)
        self.bucket = c.sr_bucket
        if c.sr_bin_boundaries:
            n = len(c.sr_bin_boundaries) + 1
            self.sr_cond_model = nn.ModuleList(
                _SRCond(m.input_channels, n, c.cond_type) if isinstance(m, _DecoderBlock) else nn.Identity()
                for m in layers)
            self.register_buffer("sr_bin_boundaries", torch.tensor(c.sr_bin_boundaries, dtype=torch.int32))

    def run(self, z: Tensor, pad) -> Tensor:
        """z [N, D, T] -> audio [N, 1, T * hop]."""
        x = z
        conds = getattr(self, "sr_cond_model", None)
        for i, m in enumerate(self.model):
            if conds is not None and isinstance(m, _DecoderBlock):
                x = conds[i](x, self.bucket)
            x = _run(m, x, pad)
        return x


class AudioVAE(nn.Module):
    """``encoder.*`` and ``decoder.*``; ``encode`` at the input rate, ``decode`` at the output rate."""

    def __init__(self, config: AudioVAEConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = _Encoder(config)
        self.decoder = _Decoder(config)

    def encode(self, wav: Tensor) -> Tensor:
        """wav [B, S] at ``sample_rate`` (right-padded to whole latent frames) -> mu [B, D, T].
        Runs in the encoder's dtype (keep it float32: the latents condition the whole generation)."""
        hop = self.config.hop_length
        x = wav.to(self.encoder.fc_mu.weight.dtype)[:, None]
        x = F.pad(x, (0, -x.shape[-1] % hop))
        h = _run(self.encoder.block, x, _zero_pad)
        return _run(self.encoder.fc_mu, h, _zero_pad)

    def encode_patches(self, wav: Tensor, patch_size: int, *, left_pad: bool = False) -> Tensor:
        """Reference audio wav [S] at ``sample_rate`` -> patches [T, P, D] (float32), padded to
        whole patches with zeros on the right (a reference voice) or the left (a continuation
        prompt, so its last patch ends where the audio does), as the reference does."""
        n = patch_size * self.config.hop_length
        extra = -wav.shape[-1] % n
        wav = F.pad(wav, (extra, 0) if left_pad else (0, extra))
        mu = self.encode(wav[None])[0].float()  # [D, T * P]
        return mu.view(mu.shape[0], -1, patch_size).permute(1, 2, 0).contiguous()

    def decode(self, z: Tensor) -> Tensor:
        """z [B, D, T] -> audio [B, T * decode_hop] in [-1, 1] (the decoder's dtype)."""
        dtype = self.decoder.model[-2].weight.dtype
        return self.decoder.run(z.to(dtype), _zero_pad)[:, 0]


class VAEStream:
    """Chunked streaming decode with per-slot causal state; each chunk is decoded exactly once.

    ``step(slots [N], z [N, D, F])`` decodes the next ``F`` latent frames of each slot (F fixed per
    instance for static shapes: ``chunk_frames``) -> audio [N, F * decode_hop]. ``reset(slots)``
    starts slots afresh. Padding rows use ``scratch_slot``. Concatenated chunks equal the whole
    decode (``delay_samples == 0``); a final partial chunk is zero-padded by the caller and cut.
    """

    delay_samples = 0

    def __init__(self, vae: AudioVAE, max_slots: int, chunk_frames: int) -> None:
        if chunk_frames <= 0:
            raise ValueError(f"chunk_frames must be positive, got {chunk_frames}")
        self.vae = vae
        self.chunk_frames = chunk_frames
        self.scratch_slot = max_slots
        self.hop = vae.config.decode_hop
        w = vae.decoder.model[-2].weight
        self.dtype, self.device = w.dtype, w.device
        self.state: dict[int, Tensor] = {}
        for m in vae.decoder.modules():
            if isinstance(m, (_Conv, _TConv)) and m.ctx > 0:
                cin = m.in_channels
                self.state[id(m)] = torch.zeros(max_slots + 1, cin, m.ctx, dtype=self.dtype, device=self.device)

    def reset(self, slots: Tensor) -> None:
        for s in self.state.values():
            s.index_fill_(0, slots, 0)

    def step(self, slots: Tensor, z: Tensor) -> Tensor:
        if z.shape[-1] != self.chunk_frames:
            raise ValueError(f"VAEStream.step takes {self.chunk_frames} frames, got {z.shape[-1]}")

        def pad(conv: nn.Module, x: Tensor) -> Tensor:
            if conv.ctx == 0:
                return x
            st = self.state[id(conv)]
            full = torch.cat((st.index_select(0, slots), x), dim=-1)  # [N, C, ctx + n]
            st.index_copy_(0, slots, full[..., full.shape[-1] - conv.ctx:])
            return full

        return self.vae.decoder.run(z.to(self.dtype), pad)[:, 0]
