"""Building blocks of Kyutai's LM (``RMSNorm``, ``Gating``, ``ScaledEmbedding``,
``DemuxEmbedding``), numerically as moshi 0.2.13 computes them, names as its keys
(docs/models/kyutai_tts.md, "Layers").
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["RMSNorm", "rms_norm", "Gating", "ScaledEmbedding", "DemuxEmbedding", "demux_rows", "gating_hidden"]


class RMSNorm(nn.Module):
    """moshi's ``rms_norm_f32``: ``x * (alpha * rsqrt(eps + mean(x ** 2)))`` in float32, rounded to
    x's dtype. One fused ``F.rms_norm`` kernel on CUDA (not nine): with ``alpha`` in x's dtype
    (as the loader leaves it) torch normalises a bfloat16 ``x`` in float32 and rounds once, as
    moshi does, scaling by ``rsqrt`` before ``alpha`` (within one ulp of moshi's order; on an
    H200 1e-5 of the outputs differ by one ulp). Another ``alpha`` dtype casts around it."""

    def __init__(self, dim: int, eps: float = 1e-8) -> None:
        super().__init__()
        self.eps = eps
        self.alpha = nn.Parameter(torch.ones(1, 1, dim))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.alpha.reshape(-1), self.eps)


def rms_norm(x: Tensor, alpha: Tensor, eps: float) -> Tensor:
    """``RMSNorm`` with its weight ``alpha`` [dim] given (the depth transformer's step passes it)."""
    if alpha.dtype == x.dtype:  # fused only when the dtypes match
        return F.rms_norm(x, alpha.shape, alpha, eps)
    return F.rms_norm(x.float(), alpha.shape, alpha.float(), eps).to(x.dtype)


def gating_hidden(dim: int, dim_feedforward: int) -> int:
    return (21 * dim) // 8 if dim_feedforward == 4 * dim else (2 * dim_feedforward) // 3


class Gating(nn.Module):
    def __init__(self, dim: int, dim_feedforward: int) -> None:
        super().__init__()
        hidden = gating_hidden(dim, dim_feedforward)
        self.linear_in = nn.Linear(dim, 2 * hidden, bias=False)
        self.linear_out = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        h = self.linear_in(x)
        h = h.view(*h.shape[:-1], 2, -1)
        return self.linear_out(F.silu(h[..., 0, :]) * h[..., 1, :])

    def add_to(self, residual: Tensor, x: Tensor, silu_mul: Callable[[Tensor], Tensor] | None = None) -> Tensor:
        """``residual + self(x)`` for 2-D [T, dim] inputs, the sum in the output matmul (addmm);
        ``silu_mul``: [T, 2, H] -> silu(h[:, 0]) * h[:, 1] (a compiled one: one kernel, not two)."""
        h = self.linear_in(x)
        h = h.view(h.shape[0], 2, -1)
        g = silu_mul(h) if silu_mul is not None else F.silu(h[:, 0]) * h[:, 1]
        return torch.addmm(residual, g, self.linear_out.weight.t())


class ScaledEmbedding(nn.Module):
    """``weight`` [N, r or D] (+ ``low_rank`` [D, r]); id -1 -> 0."""

    def __init__(self, num: int, dim: int, low_rank: int | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num, low_rank or dim))
        self.low_rank = nn.Linear(low_rank, dim, bias=False) if low_rank else None

    def forward(self, ids: Tensor) -> Tensor:
        y = F.embedding(ids.clamp(min=0), self.weight)
        y = torch.where((ids == -1)[..., None], torch.zeros((), dtype=y.dtype, device=y.device), y)
        return self.low_rank(y) if self.low_rank is not None else y


class DemuxEmbedding(nn.Module):
    """``weight`` [N, r or D], ``out1`` / ``out2`` [D, r or D] (+ an unused ``low_rank``)."""

    def __init__(self, num: int, dim: int, low_rank: int | None = None) -> None:
        super().__init__()
        width = low_rank or dim
        self.num = num
        self.weight = nn.Parameter(torch.empty(num, width))
        self.low_rank = nn.Linear(low_rank, dim, bias=False) if low_rank else None  # unused, as in moshi
        self.out1 = nn.Linear(width, dim, bias=False)
        self.out2 = nn.Linear(width, dim, bias=False)

    def forward(self, ids: Tensor) -> Tensor:
        is_zero = (ids == -1)[..., None]
        x = ids.clamp(min=0)
        left, right = x % self.num, x // self.num - 1  # right: the second token, -1 = none
        y = self.out1(F.embedding(left, self.weight))
        second = self.out2(F.embedding(right.clamp(min=0), self.weight))
        zero = torch.zeros((), dtype=y.dtype, device=y.device)
        y = y + torch.where((right < 0)[..., None], zero, second)
        return torch.where(is_zero, zero, y)


def demux_rows(ids: Tensor, n: int, zero: int) -> tuple[Tensor, Tensor]:
    """The rows of a folded ``DemuxEmbedding`` table ``[out1(E); out2(E); 0]`` ([2 n + 1, D]) that
    ids ``(second + 1) * n + first`` (-1: none) sum: ``first``, ``n + second`` (``zero``, the last
    row, for no second token and for -1)."""
    second = ids // n - 1
    first_row = torch.where(ids < 0, zero, ids % n)
    second_row = torch.where((ids < 0) | (second < 0), zero, second + n)
    return first_row, second_row
