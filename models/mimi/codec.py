"""The Mimi codec: whole-sequence ``encode`` (24 kHz waveform -> codes) and ``decode``, with
moshi's checkpoint key names (pipeline: docs/models/kyutai_tts.md, "The Mimi codec").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.mimi.config import MimiConfig
from models.mimi.modules import ProjectedTransformer, SEANetDecoder, SEANetEncoder, SplitRVQ, StreamConv, StreamConvTr

__all__ = ["Mimi"]


class _Downsample(nn.Module):
    """moshi ``ConvDownsample1d`` (learnt): ``conv.conv.conv`` is the Conv1d, replicate padding."""

    def __init__(self, stride: int, dim: int) -> None:
        super().__init__()
        self.conv = StreamConv(dim, dim, 2 * stride, stride=stride, bias=False, pad_mode="replicate")

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x)


class _Upsample(nn.Module):
    """moshi ``ConvTrUpsample1d`` (learnt, channel-wise): ``convtr.convtr.convtr`` is the ConvTranspose1d."""

    def __init__(self, stride: int, dim: int) -> None:
        super().__init__()
        self.convtr = StreamConvTr(dim, dim, 2 * stride, stride, groups=dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.convtr(x)


class Mimi(nn.Module):
    def __init__(self, config: MimiConfig) -> None:
        super().__init__()
        c = self.config = config
        self.encoder = SEANetEncoder(c.seanet)
        self.decoder = SEANetDecoder(c.seanet)
        self.encoder_transformer = ProjectedTransformer(c.transformer)
        self.decoder_transformer = ProjectedTransformer(c.transformer)
        self.quantizer = SplitRVQ(c.quantizer)
        stride = c.resample_stride
        self.downsample = _Downsample(stride, c.seanet.dimension) if stride > 1 else None
        self.upsample = _Upsample(stride, c.seanet.dimension) if stride > 1 else None
        self.num_codebooks = c.quantizer.n_q

    @property
    def frame_size(self) -> int:
        return self.config.frame_size

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @property
    def cardinality(self) -> int:
        return self.config.quantizer.bins

    def set_num_codebooks(self, n: int) -> None:
        """How many codebooks ``encode`` returns (1..n_q)."""
        if not 1 <= n <= self.config.quantizer.n_q:
            raise ValueError(f"num_codebooks must be in [1, {self.config.quantizer.n_q}], got {n}")
        self.num_codebooks = n

    @torch.no_grad()
    def encode(self, wav: Tensor) -> Tensor:
        """wav float [B, channels, S] -> codes int64 [B, num_codebooks, ceil(S / frame_size)]; the
        waveform is zero-padded at the end to a whole number of frames (as moshi does)."""
        if wav.dim() != 3 or wav.shape[1] != self.config.channels:
            raise ValueError(f"encode expects [B, {self.config.channels}, S], got {tuple(wav.shape)}")
        pad = -wav.shape[-1] % self.frame_size
        x = F.pad(wav, (0, pad)) if pad else wav
        emb = self.encoder_transformer(self.encoder(x))
        if self.downsample is not None:
            emb = self.downsample(emb)
        return self.quantizer.encode(emb, self.num_codebooks)

    @torch.no_grad()
    def decode(self, codes: Tensor) -> Tensor:
        """codes int64 [B, K, T] (K <= n_q) -> wav float [B, channels, T * frame_size] (unclipped)."""
        if codes.dim() != 3 or not 1 <= codes.shape[1] <= self.config.quantizer.n_q:
            raise ValueError(f"decode expects [B, K<={self.config.quantizer.n_q}, T], got {tuple(codes.shape)}")
        emb = self.quantizer.decode(codes)
        if self.upsample is not None:
            emb = self.upsample(emb)
        return self.decoder(self.decoder_transformer(emb))
