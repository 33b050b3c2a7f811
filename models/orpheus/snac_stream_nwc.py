"""The channels-last step of ``models.orpheus.snac_stream.StreamingSnac`` (its ``torch.compile``
path): the same streamed decoder on activations [B, T, C], as a pure function of the state rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from models.orpheus.snac_stream import _Conv, _masks, _snake

if TYPE_CHECKING:
    from models.orpheus.snac_stream import StreamingSnac

__all__ = ["ChannelsLastStep"]


class ChannelsLastStep:
    """``StreamingSnac.step``'s decoder on activations [B, T, C], as a pure function.

    ``forward(state rows, counters, ends, frames) -> (audio, new state rows)`` reads and
    returns whole state rows (no in-place update), so ``torch.compile`` sees one side-effect
    free graph and the pool's gather / scatter stay outside it. Why channels-last: every
    pointwise convolution (and the noise projection) is then one GEMM [B*T, C_in] x
    [C_in, C_out]; ConvTranspose1d(k=2s, stride s) is one GEMM [B*(n+1), C_in] x
    [C_in, 2s*C_out] plus an overlap-add of the two halves; a depthwise k7 convolution is 7
    shifted multiply-adds along T, which Inductor fuses with the Snake and mask around it.
    """

    def __init__(self, snac: StreamingSnac) -> None:
        self.snac = snac  # geometry, tables, masks; its NCW weights are converted below
        self.stem = (_nwc_conv(snac._stem[0]), _linear(snac._stem[1]))
        self.blocks = []
        for b, out_delay in snac._blocks:
            c_in, c_out, k = b.up.weight.shape  # ConvTranspose1d weight [C_in, C_out, 2s]
            # [2s * C_out, C_in], rows ordered (tap, out channel): y[..., j, tap, :] per input j.
            up = b.up.weight.permute(2, 1, 0).reshape(k * c_out, c_in).contiguous()
            units = [(_vec(u.alpha1), _nwc_conv(u.conv), _vec(u.alpha2), _linear(u.pointwise)) for u in b.units]
            self.blocks.append((b, out_delay, _vec(b.alpha), up, b.up.bias, b.noise_weight[:, :, 0].contiguous(),
                                units))
        self.head_alpha = _vec(snac._head_alpha)
        self.head = _nwc_conv(snac._head_conv)

    def forward(self, st: Tensor, c: Tensor, end: Tensor, frames: Tensor) -> tuple[Tensor, Tensor]:
        """st [B, state] (time-major pieces), c / end [B] int64, frames [B, 7] ->
        (float32 audio [B, 2048], new state rows [B, state])."""
        snac = self.snac
        views = snac._layout.views_time_major(st)  # each [B, L, C]
        new: list[Tensor | None] = [None] * len(views)
        masks = {k: m[:, :, None] for k, m in _masks(snac, c, end).items()}  # [B, n, 1]
        r = snac.rates
        x = (snac._tables[0][frames[:, snac._code_idx[0]]]
             + snac._tables[1][frames[:, snac._code_idx[1]]]
             + snac._tables[2][frames[:, snac._code_idx[2]]])  # [B, 4, 768]
        i = snac._stem_state
        x, new[i] = _stream_conv(x * masks[r[0], 0], views[i], self.stem[0])
        x = F.linear(x, *self.stem[1])  # [B, 4, 1024]
        for k, (b, out_delay, alpha, up_w, up_b, noise_w, units) in enumerate(self.blocks):
            y = _snake(x, alpha) * masks[r[k], b.in_delay]  # [B, n, C]
            full = torch.cat((views[b.up_state], y), dim=1)  # [B, n + 1, C]
            new[b.up_state] = full[:, -1:]
            s = b.stride
            taps = F.linear(full, up_w).unflatten(2, (2 * s, -1))  # [B, n + 1, 2s, C/2]
            # Output m*s + q (m < n) = tap s+q of input m (previous) + tap q of input m+1 (new).
            x = (taps[:, :-1, s:] + taps[:, 1:, :s]).flatten(1, 2)  # [B, n*s, C/2]
            if up_b is not None:
                x = x + up_b
            if snac.has_noise:
                pos = c[:, None] * r[k + 1] - out_delay + snac._aranges[r[k + 1]]  # [B, n*s]
                noise = b.noise_table[pos % b.noise_table.numel()][:, :, None].to(x.dtype)  # [B, n*s, 1]
                x = x + noise * F.linear(x, noise_w)
            for u, (a1, conv, a2, pw) in zip(b.units, units):
                y, new[u.conv_state] = _stream_conv(_snake(x, a1) * masks[r[k + 1], u.in_delay],
                                                    views[u.conv_state], conv)
                y = F.linear(_snake(y, a2), *pw)
                skip = torch.cat((views[u.skip_state], x), dim=1)  # [B, L + n, C]: x delayed by L
                new[u.skip_state] = skip[:, x.shape[1]:]
                x = y + skip[:, :x.shape[1]]
        i = snac._head_state
        x, new[i] = _stream_conv(_snake(x, self.head_alpha) * masks[r[-1], snac._head_in_delay], views[i], self.head)
        rows = st.shape[0]
        new_st = torch.cat([t.reshape(rows, -1) for t in new], dim=1)  # [B, state]
        return torch.tanh(x[:, :, 0]).float(), new_st


def _vec(alpha: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    return alpha[0].reshape(-1), alpha[1].reshape(-1)  # [1, C, 1] -> [C]: broadcasts over [B, T, C]


def _linear(conv: _Conv) -> tuple[Tensor, Tensor | None]:
    return conv.weight[:, :, 0].contiguous(), conv.bias  # k=1 conv weight [C_out, C_in, 1] -> [C_out, C_in]


@dataclass(frozen=True)
class _NwcConv:
    """A temporal conv for [B, T, C]: depthwise taps [k, C], or a dense GEMM weight [k*C_out, C_in]."""

    taps: Tensor
    bias: Tensor | None
    dilation: int
    depthwise: bool


def _nwc_conv(conv: _Conv) -> _NwcConv:
    w = conv.weight  # [C_out, C_in / groups, k]
    c_out, c_in_g, k = w.shape
    if conv.groups == c_out and c_in_g == 1:
        return _NwcConv(w[:, 0, :].t().contiguous(), conv.bias, conv.dilation, True)  # [k, C]
    if conv.groups != 1:
        raise ValueError(f"channels-last path: grouped conv (groups={conv.groups}) not supported")
    return _NwcConv(w.permute(2, 0, 1).reshape(k * c_out, c_in_g).contiguous(), conv.bias, conv.dilation, False)


def _stream_conv(x: Tensor, state: Tensor, conv: _NwcConv) -> tuple[Tensor, Tensor]:
    """Streamed 'same' conv of the new (already masked) inputs x [B, n, C] with the last inputs
    ``state`` [B, E-1, C]: (outputs [B, n, C_out], new state [B, E-1, C])."""
    n, ctx = x.shape[1], state.shape[1]
    full = torch.cat((state, x), dim=1)  # [B, E - 1 + n, C]
    d, k = conv.dilation, ctx // conv.dilation + 1
    if conv.depthwise:
        out = full[:, :n] * conv.taps[0]
        for j in range(1, k):  # addcmul: one kernel per tap when eager
            out = torch.addcmul(out, full[:, j * d:j * d + n], conv.taps[j])  # [B, n, C]
    else:
        g = F.linear(full, conv.taps).unflatten(2, (k, -1))  # [B, E - 1 + n, k, C_out]
        out = g[:, :n, 0]
        for j in range(1, k):
            out = out + g[:, j * d:j * d + n, j]  # [B, n, C_out]
    if conv.bias is not None:
        out = out + conv.bias
    return out, full[:, n:]
