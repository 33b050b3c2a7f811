"""Mimi's building blocks (causal convolutions, transposed convolutions, windowed RoPE attention),
with the parameter names of moshi's checkpoints (docs/models/kyutai_tts.md, "The Mimi codec").
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.mimi.config import QuantizerConfig, SEANetConfig, TransformerConfig

__all__ = [
    "StreamConv", "StreamConvTr", "SEANetEncoder", "SEANetDecoder", "ProjectedTransformer", "SplitRVQ",
    "attend", "attend_mask", "rope_table", "rotate",
]


def _holder(name: str, module: nn.Module) -> nn.Module:
    """A parameterless wrapper whose only child is ``module`` (moshi's Norm* wrappers, for key names)."""
    m = nn.Module()
    m.add_module(name, module)
    return m


class StreamConv(nn.Module):
    """moshi ``StreamingConv1d``: ``conv.conv`` is the ``nn.Conv1d``; left context
    ``(kernel - 1) * dilation + 1 - stride``."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, dilation: int = 1, groups: int = 1,
                 bias: bool = True, pad_mode: str = "constant") -> None:
        super().__init__()
        if pad_mode not in ("constant", "replicate"):
            raise ValueError(f"pad_mode {pad_mode!r}")
        self.conv = _holder("conv", nn.Conv1d(cin, cout, kernel, stride, dilation=dilation, groups=groups, bias=bias))
        self.stride = stride
        self.context = (kernel - 1) * dilation + 1 - stride
        self.pad_mode = pad_mode

    @property
    def inner(self) -> nn.Conv1d:
        return self.conv.conv

    def left_pad(self, x: Tensor) -> Tensor:
        """The state a fresh stream starts from: [B, C, context] zeros (or the first sample)."""
        if self.pad_mode == "replicate":
            return x[..., :1].expand(*x.shape[:-1], self.context)
        return x.new_zeros(*x.shape[:-1], self.context)

    def forward(self, x: Tensor) -> Tensor:
        """x [B, C, T] (T a multiple of the stride) -> [B, Cout, T / stride]."""
        if self.context:
            x = torch.cat((self.left_pad(x), x), dim=-1)
        return self.inner(x)


class StreamConvTr(nn.Module):
    """moshi ``StreamingConvTranspose1d``: ``convtr.convtr`` is the ``nn.ConvTranspose1d``; the last
    ``kernel - stride`` outputs overlap the next input's and are trimmed at the end of a sequence."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, groups: int = 1, bias: bool = True) -> None:
        super().__init__()
        self.convtr = _holder("convtr", nn.ConvTranspose1d(cin, cout, kernel, stride, groups=groups, bias=bias))
        self.stride = stride
        self.overlap = kernel - stride

    @property
    def inner(self) -> nn.ConvTranspose1d:
        return self.convtr.convtr

    def forward(self, x: Tensor) -> Tensor:
        """x [B, C, T] -> [B, Cout, T * stride]."""
        y = self.inner(x)
        return y[..., : y.shape[-1] - self.overlap] if self.overlap else y


class _ResBlock(nn.Module):
    """SEANet residual unit: ELU, conv k (dilated), ELU, conv 1, plus the identity skip."""

    def __init__(self, dim: int, c: SEANetConfig, dilation: int) -> None:
        super().__init__()
        hidden = dim // c.compress
        self.block = nn.Sequential(nn.ELU(), StreamConv(dim, hidden, c.residual_kernel_size, dilation=dilation),
                                   nn.ELU(), StreamConv(hidden, dim, 1))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.block(x)


class SEANetEncoder(nn.Module):
    """waveform [B, channels, S] -> latent [B, dimension, S / hop] (``model.<i>`` as in moshi)."""

    def __init__(self, c: SEANetConfig) -> None:
        super().__init__()
        mult = 1
        layers: list[nn.Module] = [StreamConv(c.channels, c.n_filters, c.kernel_size)]
        for ratio in reversed(c.ratios):
            width = mult * c.n_filters
            layers += [_ResBlock(width, c, c.dilation_base ** j) for j in range(c.n_residual_layers)]
            layers += [nn.ELU(), StreamConv(width, width * 2, 2 * ratio, stride=ratio)]
            mult *= 2
        layers += [nn.ELU(), StreamConv(mult * c.n_filters, c.dimension, c.last_kernel_size)]
        self.model = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)


class SEANetDecoder(nn.Module):
    """latent [B, dimension, T] -> waveform [B, channels, T * hop] (``model.<i>`` as in moshi)."""

    def __init__(self, c: SEANetConfig) -> None:
        super().__init__()
        mult = 2 ** len(c.ratios)
        layers: list[nn.Module] = [StreamConv(c.dimension, mult * c.n_filters, c.kernel_size)]
        for ratio in c.ratios:
            width = mult * c.n_filters
            layers += [nn.ELU(), StreamConvTr(width, width // 2, 2 * ratio, ratio)]
            layers += [_ResBlock(width // 2, c, c.dilation_base ** j) for j in range(c.n_residual_layers)]
            mult //= 2
        layers += [nn.ELU(), StreamConv(c.n_filters, c.channels, c.last_kernel_size)]
        self.model = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)


# -- transformer ------------------------------------------------------------------------------
def rope_table(positions: Tensor, dim: int, max_period: float) -> Tensor:
    """RoPE's rotations for positions [..., T]: complex64 [..., T, 1, D/2], ``cos + i sin`` of
    ``position * max_period ** (-2i / D)`` in float32 (moshi's). The same for every layer of a
    step: made once, applied by ``rotate``."""
    ds = torch.arange(dim // 2, device=positions.device, dtype=torch.float32)
    freqs = torch.exp(ds * (-math.log(max_period) * 2 / dim))  # [D/2]
    ang = positions.float()[..., None, None] * freqs  # [..., T, 1, D/2]
    return torch.complex(torch.cos(ang), torch.sin(ang))


def rotate(x: Tensor, table: Tensor) -> Tensor:
    """moshi's RoPE on x [..., D] (interleaved pairs (x[2i], x[2i+1]) rotated in float32, rounded to
    x's dtype) by ``rope_table``'s rotations, broadcast against x's pairs: one complex product,
    ``(xr cos - xi sin, xr sin + xi cos)``, in three kernels rather than fourteen."""
    d = x.shape[-1]
    pairs = torch.view_as_complex(x.float().contiguous().view(*x.shape[:-1], d // 2, 2))
    return torch.view_as_real(pairs * table).to(x.dtype).view(x.shape)


def attend_mask(q_pos: Tensor, k_pos: Tensor, context: int | None) -> Tensor:
    """``attend``'s mask [B, 1, T, S] for q_pos [B, T] and k_pos [B, S] (-1: empty): a key is seen
    when it is filled, not after the query and, with ``context``, fewer than it steps before."""
    delta = q_pos[:, :, None] - k_pos[:, None, :]  # [B, T, S]
    mask = (k_pos[:, None, :] >= 0) & (delta >= 0)
    if context is not None:
        mask = mask & (delta < context)
    return mask[:, None]


def attend(q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor, context: int | None,
           mask: Tensor | None = None) -> Tensor:
    """q [B, T, H, D], k/v [B, S, H, D], q_pos [B, T], k_pos [B, S] (-1: empty) -> [B, T, H * D]
    (``mask``: ``attend_mask(q_pos, k_pos, context)`` made once for several layers)."""
    if mask is None:
        mask = attend_mask(q_pos, k_pos, context)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask)
    return o.transpose(1, 2).flatten(2)


class _LayerScale(nn.Module):
    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x


class _SelfAttention(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.in_projs = nn.ModuleList([nn.Linear(dim, 3 * dim, bias=False)])
        self.out_projs = nn.ModuleList([nn.Linear(dim, dim, bias=False)])


class TransformerLayer(nn.Module):
    """Pre-norm: x + ls1(attn(norm1(x))), then x + ls2(linear2(gelu(linear1(norm2(x)))))."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.config = c
        self.self_attn = _SelfAttention(c.d_model)
        self.norm1 = nn.LayerNorm(c.d_model, eps=1e-5)
        self.norm2 = nn.LayerNorm(c.d_model, eps=1e-5)
        self.linear1 = nn.Linear(c.d_model, c.dim_feedforward, bias=False)
        self.linear2 = nn.Linear(c.dim_feedforward, c.d_model, bias=False)
        self.layer_scale_1 = _LayerScale(c.d_model, c.layer_scale) if c.layer_scale is not None else nn.Identity()
        self.layer_scale_2 = _LayerScale(c.d_model, c.layer_scale) if c.layer_scale is not None else nn.Identity()

    def qkv(self, x: Tensor, positions: Tensor, table: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """x [B, T, C] (normed), positions [B, T] (or their ``rope_table``) -> q, k (rotated), v,
        each [B, T, H, D]."""
        c = self.config
        qkv = self.self_attn.in_projs[0](x).view(*x.shape[:2], 3, c.num_heads, c.head_dim)
        if table is None:
            table = rope_table(positions, c.head_dim, c.max_period)
        q, k = rotate(qkv[:, :, :2], table[:, :, None]).unbind(2)  # q and k in one rotation
        return q, k, qkv[:, :, 2]

    def finish(self, x: Tensor, o: Tensor) -> Tensor:
        """x the layer input, o the attention output [B, T, C] -> the layer output."""
        x = x + self.layer_scale_1(self.self_attn.out_projs[0](o))
        return x + self.layer_scale_2(self.linear2(F.gelu(self.linear1(self.norm2(x)))))

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        q, k, v = self.qkv(self.norm1(x), positions)
        return self.finish(x, attend(q, k, v, positions, positions, self.config.context))


class _Transformer(nn.Module):
    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(c) for _ in range(c.num_layers))


class ProjectedTransformer(nn.Module):
    """[B, C, T] -> [B, C, T] (conv layout), moshi's ``ProjectedTransformer`` with one output."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.config = c
        self.transformer = _Transformer(c)
        self.input_proj = nn.Linear(c.input_dimension, c.d_model, bias=False) if c.input_dimension != c.d_model else None
        out = c.output_dimensions[0]
        self.output_projs = nn.ModuleList([nn.Linear(c.d_model, out, bias=False) if out != c.d_model else nn.Identity()])

    def project_in(self, x: Tensor) -> Tensor:
        """[B, C, T] -> [B, T, d_model]."""
        x = x.transpose(1, 2)
        return self.input_proj(x) if self.input_proj is not None else x

    def project_out(self, z: Tensor) -> Tensor:
        """[B, T, d_model] -> [B, C, T]."""
        return self.output_projs[0](z).transpose(1, 2)

    def forward(self, x: Tensor) -> Tensor:
        z = self.project_in(x)
        positions = torch.arange(z.shape[1], device=z.device)[None].expand(z.shape[0], -1)
        for layer in self.transformer.layers:
            z = layer(z, positions)
        return self.project_out(z)


# -- quantizer --------------------------------------------------------------------------------
class _Codebook(nn.Module):
    """Buffers of moshi's ``EuclideanCodebook``: vectors are ``embedding_sum / cluster_usage``."""

    def __init__(self, bins: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("_initialized", torch.tensor([1.0]))
        self.register_buffer("cluster_usage", torch.ones(bins))
        self.register_buffer("embedding_sum", torch.zeros(bins, dim))

    def table(self) -> Tensor:
        return self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]  # [bins, dim]


class _VQ(nn.Module):
    def __init__(self, bins: int, dim: int) -> None:
        super().__init__()
        self._codebook = _Codebook(bins, dim)


class _VQLayers(nn.Module):
    def __init__(self, n: int, bins: int, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_VQ(bins, dim) for _ in range(n))


class _RVQ(nn.Module):
    def __init__(self, n: int, c: QuantizerConfig) -> None:
        super().__init__()
        self.input_proj = nn.Conv1d(c.input_dimension, c.dimension, 1, bias=False)
        self.output_proj = nn.Conv1d(c.dimension, c.output_dimension, 1, bias=False)
        self.vq = _VQLayers(n, c.bins, c.dimension)

    def decode(self, codes: Tensor) -> Tensor:
        """codes [B, n, T] -> [B, output_dimension, T] (the first n codebooks, summed)."""
        q: Tensor | float = 0.0
        for i in range(codes.shape[1]):
            q = q + F.embedding(codes[:, i], self.vq.layers[i]._codebook.table())  # [B, T, d]
        return self.output_proj(q.transpose(1, 2))

    def encode(self, x: Tensor, n: int) -> Tensor:
        """x [B, input_dimension, T] -> codes [B, n, T]: residual nearest-vector search."""
        residual = self.input_proj(x).transpose(1, 2)  # [B, T, d]
        out = []
        for layer in self.vq.layers[:n]:
            table = layer._codebook.table()
            flat = residual.reshape(-1, residual.shape[-1])
            idx = torch.cdist(flat[None], table[None], p=2)[0].argmin(dim=-1).view(residual.shape[:-1])
            residual = residual - F.embedding(idx, table)
            out.append(idx)
        return torch.stack(out, dim=1)


class SplitRVQ(nn.Module):
    """One semantic codebook (``rvq_first``) and the acoustic ones (``rvq_rest``), each with its
    own 1x1 projections; decode sums both, encode runs both on the same input."""

    def __init__(self, c: QuantizerConfig) -> None:
        super().__init__()
        self.config = c
        self.rvq_first = _RVQ(1, c)
        self.rvq_rest = _RVQ(c.n_q - 1, c)

    def decode(self, codes: Tensor) -> Tensor:
        """codes [B, K, T] (K <= n_q: the first K codebooks) -> [B, output_dimension, T]."""
        out = self.rvq_first.decode(codes[:, :1])
        if codes.shape[1] > 1:
            out = out + self.rvq_rest.decode(codes[:, 1:])
        return out

    def encode(self, x: Tensor, num_codebooks: int) -> Tensor:
        """x [B, input_dimension, T] -> codes [B, num_codebooks, T]."""
        codes = self.rvq_first.encode(x, 1)
        if num_codebooks > 1:
            codes = torch.cat((codes, self.rvq_rest.encode(x, num_codebooks - 1)), dim=1)
        return codes
