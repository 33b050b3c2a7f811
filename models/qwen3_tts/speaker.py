"""Speaker encoder of Base checkpoints: an ECAPA-TDNN x-vector from a 128-bin log-mel at 24 kHz,
the reference's mel in plain torch (its parameters: docs/models/qwen3_tts.md, "Speaker encoder").
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.qwen3_tts.config import SpeakerEncoderConfig

__all__ = ["SpeakerEncoder", "mel_filterbank", "log_mel", "MEL_PARAMS"]

MEL_PARAMS = {"n_fft": 1024, "hop": 256, "win": 1024, "n_mels": 128, "sr": 24000, "fmin": 0.0, "fmax": 12000.0}


def _hz_to_mel(f: Tensor) -> Tensor:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, math.log(6.4) / 27.0
    lin = f / f_sp
    return torch.where(f >= min_log_hz, min_log_mel + torch.log(f.clamp(min=1e-10) / min_log_hz) / logstep, lin)


def _mel_to_hz(m: Tensor) -> Tensor:
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, math.log(6.4) / 27.0
    return torch.where(m >= min_log_mel, min_log_hz * torch.exp(logstep * (m - min_log_mel)), f_sp * m)


def mel_filterbank(sr: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> Tensor:
    """float32 [n_mels, n_fft // 2 + 1]: librosa.filters.mel(htk=False, norm='slaney')."""
    fft_freqs = torch.linspace(0, sr / 2, n_fft // 2 + 1, dtype=torch.float64)
    mels = torch.linspace(float(_hz_to_mel(torch.tensor(fmin, dtype=torch.float64))),
                          float(_hz_to_mel(torch.tensor(fmax, dtype=torch.float64))), n_mels + 2,
                          dtype=torch.float64)
    mel_f = _mel_to_hz(mels)  # [n_mels + 2]
    fdiff = mel_f[1:] - mel_f[:-1]
    ramps = mel_f[:, None] - fft_freqs[None, :]  # [n_mels + 2, F]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = torch.clamp(torch.minimum(lower, upper), min=0.0)
    weights = weights * (2.0 / (mel_f[2:] - mel_f[:-2]))[:, None]  # Slaney area normalisation
    return weights.float()


def log_mel(wav: Tensor, filterbank: Tensor | None = None) -> Tensor:
    """wav float [B, S] at 24 kHz -> log-mel [B, frames, 128] (float32)."""
    p = MEL_PARAMS
    fb = filterbank if filterbank is not None else mel_filterbank(p["sr"], p["n_fft"], p["n_mels"], p["fmin"],
                                                                  p["fmax"])
    wav = wav.float()
    pad = (p["n_fft"] - p["hop"]) // 2
    x = F.pad(wav[:, None], (pad, pad), mode="reflect")[:, 0]
    spec = torch.stft(x, p["n_fft"], hop_length=p["hop"], win_length=p["win"],
                      window=torch.hann_window(p["win"], device=wav.device), center=False, normalized=False,
                      onesided=True, return_complex=True)
    mag = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)  # [B, F, frames]
    mel = torch.matmul(fb.to(mag.device), mag)  # [B, n_mels, frames]
    return torch.log(torch.clamp(mel, min=1e-5)).transpose(1, 2)


class _TDNN(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, padding="same", padding_mode="reflect")

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.conv(x))


def _conv1(cin: int, cout: int) -> nn.Conv1d:
    return nn.Conv1d(cin, cout, 1, padding="same", padding_mode="reflect")


class _Res2Net(nn.Module):
    def __init__(self, channels: int, scale: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.scale = scale
        part = channels // scale
        self.blocks = nn.ModuleList(_TDNN(part, part, kernel, dilation) for _ in range(scale - 1))

    def forward(self, x: Tensor) -> Tensor:
        parts = torch.chunk(x, self.scale, dim=1)
        outs = [parts[0]]
        y = None
        for i in range(1, self.scale):
            y = self.blocks[i - 1](parts[i] if i == 1 else parts[i] + y)
            outs.append(y)
        return torch.cat(outs, dim=1)


class _SE(nn.Module):
    def __init__(self, channels: int, se_channels: int) -> None:
        super().__init__()
        self.conv1 = _conv1(channels, se_channels)
        self.conv2 = _conv1(se_channels, channels)

    def forward(self, x: Tensor) -> Tensor:
        s = torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * s


class _SERes2Net(nn.Module):
    def __init__(self, cin: int, cout: int, scale: int, se_channels: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.tdnn1 = _TDNN(cin, cout, 1, 1)
        self.res2net_block = _Res2Net(cout, scale, kernel, dilation)
        self.tdnn2 = _TDNN(cout, cout, 1, 1)
        self.se_block = _SE(cout, se_channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x)))) + x


def _stats(x: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    """Weighted mean and std over time: x [B, C, L], w [B, C or 1, L] summing to 1."""
    mean = (w * x).sum(2)
    std = torch.sqrt((w * (x - mean[..., None]).pow(2)).sum(2).clamp(1e-12))
    return mean, std


class _ASP(nn.Module):
    """Attentive statistics pooling (every frame valid: no padding mask)."""

    def __init__(self, channels: int, attention_channels: int) -> None:
        super().__init__()
        self.tdnn = _TDNN(channels * 3, attention_channels, 1, 1)
        self.conv = _conv1(attention_channels, channels)

    def forward(self, x: Tensor) -> Tensor:
        length = x.shape[-1]
        uniform = torch.full_like(x[:, :1], 1.0 / length)  # [B, 1, L]
        mean, std = _stats(x, uniform)
        ctx = torch.cat((x, mean[..., None].expand_as(x), std[..., None].expand_as(x)), dim=1)
        att = F.softmax(self.conv(torch.tanh(self.tdnn(ctx))), dim=2)  # [B, C, L]
        mean, std = _stats(x, att)
        return torch.cat((mean, std), dim=1)[..., None]  # [B, 2C, 1]


class SpeakerEncoder(nn.Module):
    """log-mel [B, frames, mel_dim] -> x-vector [B, enc_dim]; ``embed(wav)`` from 24 kHz audio."""

    def __init__(self, config: SpeakerEncoderConfig) -> None:
        super().__init__()
        c = self.config = config
        ch, ks, dl = c.enc_channels, c.enc_kernel_sizes, c.enc_dilations
        self.blocks = nn.ModuleList([_TDNN(c.mel_dim, ch[0], ks[0], dl[0])])
        for i in range(1, len(ch) - 1):
            self.blocks.append(_SERes2Net(ch[i - 1], ch[i], c.enc_res2net_scale, c.enc_se_channels, ks[i], dl[i]))
        self.mfa = _TDNN(sum(ch[1:-1]), ch[-1], ks[-1], dl[-1])
        self.asp = _ASP(ch[-1], c.enc_attention_channels)
        self.fc = _conv1(ch[-1] * 2, c.enc_dim)

    def forward(self, mels: Tensor) -> Tensor:
        x = mels.transpose(1, 2)  # [B, mel, L]
        outs = []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        x = self.mfa(torch.cat(outs[1:], dim=1))
        return self.fc(self.asp(x))[..., 0]

    @torch.no_grad()
    def embed(self, wav: Tensor) -> Tensor:
        """wav float [S] or [B, S] at ``config.sample_rate`` -> x-vector [enc_dim] or [B, enc_dim]."""
        single = wav.dim() == 1
        w = self.fc.weight
        x = self(log_mel(wav[None] if single else wav).to(w.device, w.dtype))
        return x[0] if single else x
