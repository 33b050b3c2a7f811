"""``MimiDecodeStream``: Mimi's decoder one frame at a time, with per-slot state tensors (static
shapes, no delay); what it keeps and what it equals: docs/models/kyutai_tts.md, "The Mimi codec".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.mimi.attend_triton import ATTENTIONS, ring_attend_steps
from models.mimi.codec import Mimi
from models.mimi.modules import ProjectedTransformer, StreamConv, StreamConvTr, _ResBlock, attend, attend_mask, rope_table

__all__ = ["MimiDecodeStream", "projected_codebooks"]


def projected_codebooks(mimi: Mimi, num_codebooks: int) -> Tensor:
    """The first ``num_codebooks`` codebooks' tables, each through its split RVQ's output
    projection (the semantic one's for codebook 0, the acoustic one's after), in float32:
    [num_codebooks * bins, C]. The projection is linear and bias-free, so the sum of a frame's
    rows equals ``SplitRVQ.decode`` (rounded in another order): one gather and one sum a step
    instead of four kernels a codebook (each table's division, its lookup and the running sum)."""
    q = mimi.quantizer
    with torch.no_grad():
        parts = []
        for k in range(num_codebooks):
            rvq, layer = (q.rvq_first, 0) if k == 0 else (q.rvq_rest, k - 1)
            table = rvq.vq.layers[layer]._codebook.table().float()  # [bins, d]
            parts.append(table @ rvq.output_proj.weight[:, :, 0].float().T)  # [bins, C]
        return torch.cat(parts)


def _scaled(linear: nn.Linear, scale: nn.Module) -> Tensor:
    """``linear``'s weight with a layer scale after it folded in (``scale(linear(x)) =
    x @ (scale * W).T``), computed in float32 and rounded once."""
    w = linear.weight
    if not hasattr(scale, "scale"):  # nn.Identity: no layer scale
        return w
    with torch.no_grad():
        return (scale.scale.float()[:, None] * w.float()).to(w.dtype)


class MimiDecodeStream:
    """Per-slot streaming decode: ``reset(slots)``, then ``step(slots, codes)`` once per frame.

    ``slots`` int64 [N] in ``[0, max_slots)``, or ``scratch_slot`` for padding rows (their output
    is garbage; they never touch a real slot's state). ``num_codebooks``: how many codebooks each
    frame carries (the first K of the codec's; fixed per instance so shapes stay static).
    """

    delay_samples = 0  # see the module docstring

    def __init__(self, mimi: Mimi, max_slots: int, *, num_codebooks: int | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                 attention: str = "sdpa") -> None:
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
        # "triton": each transformer layer's ring writes and attention in one kernel
        # (``attend_triton.ring_attend_steps``); "sdpa": the writes, a gather and a masked SDPA
        self.attention = attention
        if max_slots <= 0:
            raise ValueError(f"max_slots must be positive, got {max_slots}")
        n_q = mimi.config.quantizer.n_q
        self.num_codebooks = n_q if num_codebooks is None else num_codebooks
        if not 1 <= self.num_codebooks <= n_q:
            raise ValueError(f"num_codebooks must be in [1, {n_q}], got {num_codebooks}")
        self.mimi, self.max_slots = mimi, max_slots
        self.scratch_slot = max_slots
        self.frame_size = mimi.frame_size
        p = next(mimi.decoder.parameters())
        device, dtype = device or p.device, dtype or p.dtype
        s = max_slots + 1
        self._convs: dict[int, Tensor] = {}  # id(StreamConv) -> [S, Cin, context]
        self._tconvs: dict[int, Tensor] = {}  # id(StreamConvTr) -> [S, Cout, overlap]
        mods = [*mimi.decoder.modules()] + ([mimi.upsample.convtr] if mimi.upsample is not None else [])
        for m in mods:
            if isinstance(m, StreamConv) and m.context:
                self._convs[id(m)] = torch.zeros(s, m.inner.in_channels, m.context, device=device, dtype=dtype)
            elif isinstance(m, StreamConvTr) and m.overlap:
                self._tconvs[id(m)] = torch.zeros(s, m.inner.out_channels, m.overlap, device=device, dtype=dtype)
        # the quantizer's decode as one lookup: every codebook's table already through its
        # output projection, [K * bins, C], the codes offset by k * bins (``step``)
        self._codebooks = projected_codebooks(mimi, self.num_codebooks).to(device=device, dtype=dtype)
        bins = mimi.config.quantizer.bins
        self._code_offsets = torch.arange(self.num_codebooks, device=device, dtype=torch.int64) * bins
        t = mimi.config.transformer
        # each layer's two output projections with its layer scale folded in (one matmul a
        # branch, not a matmul and a multiply; ``_finish``)
        self._scaled = [(_scaled(layer.self_attn.out_projs[0], layer.layer_scale_1), _scaled(layer.linear2, layer.layer_scale_2))
                        for layer in mimi.decoder_transformer.transformer.layers]
        kv = (s, t.context, t.num_heads, t.head_dim)
        self.k = [torch.zeros(kv, device=device, dtype=dtype) for _ in range(t.num_layers)]
        self.v = [torch.zeros(kv, device=device, dtype=dtype) for _ in range(t.num_layers)]
        self.pos = torch.zeros(s, dtype=torch.int64, device=device)  # transformer steps decoded per slot

    @torch.no_grad()
    def reset(self, slots: Tensor) -> None:
        """Start ``slots`` [N] afresh (idempotent)."""
        for buf in (*self._convs.values(), *self._tconvs.values(), *self.k, *self.v):
            buf.index_fill_(0, slots, 0)
        self.pos.index_fill_(0, slots, 0)

    # -- one module, one chunk ----------------------------------------------------------------
    def _conv(self, m: StreamConv, x: Tensor, slots: Tensor) -> Tensor:
        if not m.context:
            return m.inner(x)
        state = self._convs[id(m)]
        full = torch.cat((state.index_select(0, slots), x), dim=-1)  # [N, C, context + n]
        state.index_copy_(0, slots, full[..., full.shape[-1] - m.context:])
        return m.inner(full)

    def _tconv(self, m: StreamConvTr, x: Tensor, slots: Tensor) -> Tensor:
        inner = m.inner
        if x.shape[-1] == 1 and inner.groups == inner.in_channels == inner.out_channels:
            # One input step through a channel-wise transposed conv (the 12.5 -> 25 Hz upsample):
            # each output is one product, so a broadcast multiply gives the convolution's values
            # exactly, without cuDNN's grouped transposed-conv kernel (0.6 ms at 128 rows on an H200).
            y = x * inner.weight[:, 0][None].to(x.dtype)  # [N, C, kernel]
            if inner.bias is not None:
                y = y + inner.bias[:, None]
        else:
            y = inner(x)  # [N, Cout, (n - 1) * stride + kernel]
        if not m.overlap:
            return y
        state = self._tconvs[id(m)]
        pt = m.overlap
        head = y[..., :pt] + state.index_select(0, slots)
        tail = y[..., y.shape[-1] - pt:]
        if m.inner.bias is not None:
            tail = tail - m.inner.bias[:, None]
        state.index_copy_(0, slots, tail)
        return torch.cat((head, y[..., pt: y.shape[-1] - pt]), dim=-1)

    def _transformer(self, tr: ProjectedTransformer, x: Tensor, slots: Tensor) -> Tensor:
        """x [N, C, n] at each slot's next n steps -> [N, C, n]."""
        c = tr.config
        w = c.context
        z = tr.project_in(x)  # [N, n, d]
        n = z.shape[1]
        pos0 = self.pos.index_select(0, slots)  # [N]
        q_pos = pos0[:, None] + torch.arange(n, device=z.device)  # [N, n]
        table = rope_table(q_pos, c.head_dim, c.max_period)  # every layer's rotations
        fused = self.attention == "triton"  # (the kernel finds the ring entries and mask itself)
        if not fused:
            ring = q_pos % w
            last = q_pos[:, -1:]  # [N, 1]
            j = torch.arange(w, device=z.device)[None]
            k_pos = last - (last - j) % w  # [N, W] the position each ring entry holds (< 0: empty)
            rows = slots[:, None].expand(-1, n)
            mask = attend_mask(q_pos, k_pos, w)  # and mask
        for layer, kc, vc, (w_out, w_2) in zip(tr.transformer.layers, self.k, self.v, self._scaled):
            q, k, v = layer.qkv(layer.norm1(z), q_pos, table)
            if fused:  # the ring writes and the attention in one kernel
                o = ring_attend_steps(q, k, v, kc, vc, slots, pos0)
            else:
                kc[rows, ring] = k
                vc[rows, ring] = v
                o = attend(q, kc.index_select(0, slots), vc.index_select(0, slots), q_pos, k_pos, w, mask)
            z = z + F.linear(o, w_out)  # = layer.finish(z, o), the layer scales folded
            z = z + F.linear(F.gelu(layer.linear1(layer.norm2(z))), w_2)
        self.pos.index_copy_(0, slots, pos0 + n)
        return tr.project_out(z)

    def _seanet(self, x: Tensor, slots: Tensor) -> Tensor:
        for m in self.mimi.decoder.model:
            if isinstance(m, StreamConv):
                x = self._conv(m, x, slots)
            elif isinstance(m, StreamConvTr):
                x = self._tconv(m, x, slots)
            elif isinstance(m, _ResBlock):
                h = x
                for sub in m.block:
                    h = self._conv(sub, h, slots) if isinstance(sub, StreamConv) else sub(h)
                x = x + h
            elif isinstance(m, nn.ELU):
                x = m(x)
            else:  # a module the streaming path does not know would silently break equality
                raise TypeError(f"MimiDecodeStream: unexpected decoder module {type(m).__name__}")
        return x

    @torch.no_grad()
    def step(self, slots: Tensor, codes: Tensor) -> Tensor:
        """slots int64 [N], codes int64 [N, K] (one frame each, K = num_codebooks) ->
        pcm float [N, frame_size] (unclipped, as moshi's decode)."""
        mimi = self.mimi
        # = mimi.quantizer.decode(codes[:, :, None]): each codebook's vector projected, summed
        emb = F.embedding(codes + self._code_offsets, self._codebooks).sum(1)[:, :, None]  # [N, C, 1]
        if mimi.upsample is not None:
            emb = self._tconv(mimi.upsample.convtr, emb, slots)  # [N, C, stride]
        emb = self._transformer(mimi.decoder_transformer, emb, slots)
        return self._seanet(emb, slots)[:, 0]
