"""The 12 Hz speech-tokenizer decoder: whole-sequence ``Codec.forward`` and a stateful
``CodecStream`` that decodes each frame exactly once (1,920 samples a frame at 24 kHz).

The codec is causal, so streaming needs no look-ahead and nothing to flush; the pipeline and
the per-slot state: docs/models/qwen3_tts.md, "Codec".
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.qwen3_tts.config import CodecConfig
from models.qwen3_tts.talker import RMSNorm, apply_rope, rope_cos_sin, rope_inv_freq

__all__ = ["Codec", "CodecStream"]


# -- modules (names as in the checkpoint) -----------------------------------------------------
class _Codebook(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def table(self) -> Tensor:
        return self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]  # [K, d]


class _VQ(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self._codebook = _Codebook(size, dim)


class _RVQLayers(nn.Module):
    def __init__(self, n: int, size: int, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_VQ(size, dim) for _ in range(n))


class _RVQ(nn.Module):
    """input_proj is only used by the encoder; it is here so the checkpoint loads strictly."""

    def __init__(self, n: int, size: int, dim: int, io_dim: int) -> None:
        super().__init__()
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        self.vq = _RVQLayers(n, size, dim)

    def decode(self, codes: Tensor) -> Tensor:
        """codes [B, T, n] -> [B, io_dim, T]."""
        q = 0
        for i, layer in enumerate(self.vq.layers):
            q = q + F.embedding(codes[..., i], layer._codebook.table())  # [B, T, d]
        return self.output_proj(q.transpose(1, 2))


class _Quantizer(nn.Module):
    def __init__(self, c: CodecConfig) -> None:
        super().__init__()
        dim = c.codebook_dim // 2
        self.rvq_first = _RVQ(1, c.codebook_size, dim, c.codebook_dim)
        self.rvq_rest = _RVQ(c.num_quantizers - 1, c.codebook_size, dim, c.codebook_dim)

    def decode(self, codes: Tensor) -> Tensor:
        """codes [B, T, G] -> [B, codebook_dim, T]."""
        return self.rvq_first.decode(codes[..., :1]) + self.rvq_rest.decode(codes[..., 1:])


class _CausalConv(nn.Module):
    """Left-padded conv (stride 1): ``context`` past timesteps feed each output."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, groups=groups)
        self.context = (kernel - 1) * dilation

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, (self.context, 0)))

    def run(self, full: Tensor) -> Tensor:
        """full [N, C, context + n] (context prepended) -> [N, Cout, n]."""
        return self.conv(full)


class _CausalTransConv(nn.Module):
    """Transposed conv with the last ``kernel - stride`` outputs trimmed (kernel = stride or 2 x stride)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int) -> None:
        super().__init__()
        if kernel not in (stride, 2 * stride):
            raise ValueError(f"transposed conv kernel {kernel} must be stride or 2 x stride ({stride})")
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.stride, self.context = stride, (kernel - stride) // stride  # inputs of look-back: 0 or 1

    def forward(self, x: Tensor) -> Tensor:
        y = self.conv(x)
        trim = self.conv.kernel_size[0] - self.stride
        return y[..., : y.shape[-1] - trim] if trim else y

    def run(self, full: Tensor) -> Tensor:
        """full [N, C, context + n] -> [N, Cout, n * stride]: the outputs of the n new inputs."""
        y = self.conv(full)
        n = full.shape[-1] - self.context
        start = self.context * self.stride
        return y[..., start:start + n * self.stride]


class _Snake(nn.Module):
    """SnakeBeta: x + sin^2(x e^alpha) / (e^beta + 1e-9), per channel."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        alpha = self.alpha.exp()[None, :, None]
        beta = self.beta.exp()[None, :, None]
        return x + (1.0 / (beta + 1e-9)) * torch.sin(x * alpha).pow(2)


class _ConvNeXt(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = _CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(1e-6 * torch.ones(dim))

    def tail(self, x: Tensor, h: Tensor) -> Tensor:
        """x [B, C, n] the block input, h its depthwise conv -> the block output."""
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h.transpose(1, 2)))))
        return x + (self.gamma * h).transpose(1, 2)


class _ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = _Snake(dim)
        self.conv1 = _CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = _Snake(dim)
        self.conv2 = _CausalConv(dim, dim, 1)


class _DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, rate: int) -> None:
        super().__init__()
        self.block = nn.ModuleList([_Snake(cin), _CausalTransConv(cin, cout, 2 * rate, rate),
                                    *(_ResidualUnit(cout, d) for d in (1, 3, 9))])


class _LayerScale(nn.Module):
    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))


class _TLayer(nn.Module):
    def __init__(self, c: CodecConfig) -> None:
        super().__init__()
        h, d = c.hidden_size, c.head_dim
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(h, c.num_attention_heads * d, bias=False)
        self.self_attn.k_proj = nn.Linear(h, c.num_key_value_heads * d, bias=False)
        self.self_attn.v_proj = nn.Linear(h, c.num_key_value_heads * d, bias=False)
        self.self_attn.o_proj = nn.Linear(c.num_attention_heads * d, h, bias=False)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(h, c.intermediate_size, bias=False)
        self.mlp.up_proj = nn.Linear(h, c.intermediate_size, bias=False)
        self.mlp.down_proj = nn.Linear(c.intermediate_size, h, bias=False)
        self.input_layernorm = RMSNorm(h, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, c.rms_norm_eps)
        self.self_attn_layer_scale = _LayerScale(h, c.layer_scale_initial_scale)
        self.mlp_layer_scale = _LayerScale(h, c.layer_scale_initial_scale)

    def qkv(self, x: Tensor, heads: int, kv_heads: int, d: int) -> tuple[Tensor, Tensor, Tensor]:
        a = self.self_attn
        lead = x.shape[:-1]
        return (a.q_proj(x).view(*lead, heads, d), a.k_proj(x).view(*lead, kv_heads, d),
                a.v_proj(x).view(*lead, kv_heads, d))

    def finish(self, x: Tensor, o: Tensor) -> Tensor:
        """x the layer input, o the attention output [..., Hq * D] -> the layer output."""
        x = x + self.self_attn_layer_scale.scale * self.self_attn.o_proj(o)
        m = self.mlp
        h = self.post_attention_layernorm(x)
        return x + self.mlp_layer_scale.scale * m.down_proj(F.silu(m.gate_proj(h)) * m.up_proj(h))


class _Transformer(nn.Module):
    def __init__(self, c: CodecConfig) -> None:
        super().__init__()
        self.input_proj = nn.Linear(c.latent_dim, c.hidden_size)
        self.output_proj = nn.Linear(c.hidden_size, c.latent_dim)
        self.layers = nn.ModuleList(_TLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


def _attend(q: Tensor, k: Tensor, v: Tensor, keep: Tensor) -> Tensor:
    """q [B, n, Hq, D], k/v [B, S, Hkv, D], keep bool broadcastable to [B, 1, n, S] -> [B, n, Hq*D]."""
    rep = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
    scores = torch.einsum("bnhd,bshd->bhns", q.float(), k.float()) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~keep, float("-inf"))
    o = torch.einsum("bhns,bshd->bnhd", scores.softmax(-1), v.float()).to(q.dtype)
    return o.flatten(2)


class Codec(nn.Module):
    """``decoder.*`` of the speech tokenizer; ``forward(codes [B, T, 16]) -> audio [B, T * 1920]``."""

    def __init__(self, config: CodecConfig) -> None:
        super().__init__()
        c = self.config = config
        self.quantizer = _Quantizer(c)
        self.pre_conv = _CausalConv(c.codebook_dim, c.latent_dim, 3)
        self.pre_transformer = _Transformer(c)
        self.upsample = nn.ModuleList(
            nn.ModuleList([_CausalTransConv(c.latent_dim, c.latent_dim, f, f), _ConvNeXt(c.latent_dim)])
            for f in c.upsampling_ratios)
        dims = [c.decoder_dim // 2 ** i for i in range(len(c.upsample_rates) + 1)]
        self.decoder = nn.ModuleList([
            _CausalConv(c.latent_dim, c.decoder_dim, 7),
            *(_DecoderBlock(dims[i], dims[i + 1], r) for i, r in enumerate(c.upsample_rates)),
            _Snake(dims[-1]), _CausalConv(dims[-1], 1, 7)])
        self.register_buffer("inv_freq", torch.empty(c.head_dim // 2), persistent=False)
        if not self.pre_conv.conv.weight.is_meta:
            self.setup_rope()

    @torch.no_grad()
    def setup_rope(self, device: torch.device | str | None = None) -> None:
        device = device or self.pre_conv.conv.weight.device
        self.inv_freq = rope_inv_freq(self.config.head_dim, self.config.rope_theta, device)

    @property
    def samples_per_frame(self) -> int:
        return self.config.samples_per_frame

    def _transformer_whole(self, x: Tensor) -> Tensor:
        """x [B, T, latent] -> [B, T, latent], causal attention over the last ``window`` frames."""
        c, t = self.config, self.pre_transformer
        h = t.input_proj(x)
        n = h.shape[1]
        i = torch.arange(n, device=h.device)
        cos, sin = rope_cos_sin(i, self.inv_freq, h.dtype)  # [T, 1, D] over [B, T, H, D]
        keep = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - c.sliding_window)  # [n, S]
        for layer in t.layers:
            q, k, v = layer.qkv(layer.input_layernorm(h), c.num_attention_heads, c.num_key_value_heads, c.head_dim)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            h = layer.finish(h, _attend(q, k, v, keep))
        return t.output_proj(t.norm(h))

    def forward(self, codes: Tensor) -> Tensor:
        """codes int64 [B, T, G] -> float audio [B, T * samples_per_frame] in [-1, 1]."""
        h = self.pre_conv(self.quantizer.decode(codes))  # [B, latent, T]
        h = self._transformer_whole(h.transpose(1, 2)).transpose(1, 2)
        for up, cnx in self.upsample:
            h = up(h)
            h = cnx.tail(h, cnx.dwconv(h))
        h = self.decoder[0](h)
        for blk in self.decoder[1:-2]:
            snake, tconv, *units = blk.block
            h = tconv(snake(h))
            for u in units:
                h = h + u.conv2(u.act2(u.conv1(u.act1(h))))
        h = self.decoder[-1](self.decoder[-2](h))
        return h.clamp(-1.0, 1.0)[:, 0]


class CodecStream:
    """Per-slot streaming state for ``Codec``: ``reset(slots)``, then ``step(slots, codes)`` once a
    frame. Equal to ``Codec.forward`` on the concatenated frames (the decoder is causal).

    ``slots`` int64 [N] index ``[0, max_slots)``; padding rows pass ``scratch_slot``. A slot's
    state is whatever its previous ``step`` left; ``reset`` starts it afresh (frame 0).
    """

    delay_samples = 0  # strictly causal: frame t's samples are final when frame t is decoded

    def __init__(self, codec: Codec, max_slots: int, *, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        if max_slots <= 0:
            raise ValueError(f"max_slots must be positive, got {max_slots}")
        c = codec.config
        self.codec, self.max_slots = codec, max_slots
        self.scratch_slot = max_slots
        w = codec.pre_conv.conv.weight
        device, dtype = device or w.device, dtype or w.dtype
        s = max_slots + 1
        self._convs: dict[int, Tensor] = {}  # id(module) -> [S, C, context]
        self._tconvs: dict[int, Tensor] = {}  # id(module) -> [S, C, 1]
        for m in codec.modules():
            if isinstance(m, _CausalConv) and m.context:
                self._convs[id(m)] = torch.zeros(s, m.conv.in_channels, m.context, device=device, dtype=dtype)
            elif isinstance(m, _CausalTransConv) and m.context:
                self._tconvs[id(m)] = torch.zeros(s, m.conv.in_channels, m.context, device=device, dtype=dtype)
        kv_shape = (s, c.sliding_window, c.num_key_value_heads, c.head_dim)
        self.k = [torch.zeros(kv_shape, device=device, dtype=dtype) for _ in range(c.num_hidden_layers)]
        self.v = [torch.zeros(kv_shape, device=device, dtype=dtype) for _ in range(c.num_hidden_layers)]
        self.pos = torch.zeros(s, dtype=torch.int64, device=device)  # frames decoded per slot
        # The transformer's write and attention of a layer in one call (``ring_attend``'s
        # signature: ``codec_attention=triton``), or None: the ring writes and ``_attend``.
        self.attend: Callable[..., Tensor] | None = None

    @torch.no_grad()
    def reset(self, slots: Tensor) -> None:
        """Start ``slots`` [N] afresh (idempotent)."""
        for buf in (*self._convs.values(), *self._tconvs.values(), *self.k, *self.v):
            buf.index_fill_(0, slots, 0)
        self.pos.index_fill_(0, slots, 0)

    def _conv(self, m: _CausalConv, x: Tensor, slots: Tensor) -> Tensor:
        if not m.context:
            return m.conv(x)
        state = self._convs[id(m)]
        full = torch.cat((state.index_select(0, slots), x), dim=-1)  # [N, C, ctx + n]
        state.index_copy_(0, slots, full[..., -m.context:])
        return m.run(full)

    def _tconv(self, m: _CausalTransConv, x: Tensor, slots: Tensor) -> Tensor:
        if not m.context:
            return m.conv(x)
        state = self._tconvs[id(m)]
        full = torch.cat((state.index_select(0, slots), x), dim=-1)
        state.index_copy_(0, slots, full[..., -m.context:])
        return m.run(full)

    def _transformer(self, x: Tensor, slots: Tensor) -> Tensor:
        """x [N, 1, latent] at each slot's position -> [N, 1, latent]."""
        c, t = self.codec.config, self.codec.pre_transformer
        w = c.sliding_window
        pos = self.pos.index_select(0, slots)  # [N]
        cos, sin = rope_cos_sin(pos, self.codec.inv_freq, x.dtype)  # [N, 1, D]
        cos, sin = cos[:, None], sin[:, None]  # [N, 1, 1, D] over [N, n=1, H, D]
        attend = self.attend
        if attend is None:
            ring = pos % w  # [N] where this frame's k/v go
            j = torch.arange(w, device=x.device)
            entry_pos = pos[:, None] - (pos[:, None] - j[None, :]) % w  # [N, W] position held by entry j
            keep = (entry_pos >= 0)[:, None, None, :]  # [N, 1, 1, W]
        h = t.input_proj(x)
        for layer, kc, vc in zip(t.layers, self.k, self.v):
            q, k, v = layer.qkv(layer.input_layernorm(h), c.num_attention_heads, c.num_key_value_heads, c.head_dim)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            if attend is not None:  # the ring write and the attention in one call
                h = layer.finish(h, attend(q, k, v, kc, vc, slots, pos))
                continue
            kc[slots, ring] = k[:, 0]
            vc[slots, ring] = v[:, 0]
            h = layer.finish(h, _attend(q, kc.index_select(0, slots), vc.index_select(0, slots), keep))
        self.pos.index_copy_(0, slots, pos + 1)
        return t.output_proj(t.norm(h))

    @torch.no_grad()
    def step(self, slots: Tensor, codes: Tensor) -> Tensor:
        """slots int64 [N], codes int64 [N, G] (one frame each) -> audio [N, samples_per_frame]."""
        cd = self.codec
        h = cd.quantizer.decode(codes[:, None, :])  # [N, codebook_dim, 1]
        h = self._conv(cd.pre_conv, h, slots)
        h = self._transformer(h.transpose(1, 2), slots).transpose(1, 2)  # [N, latent, 1]
        for up, cnx in cd.upsample:
            h = self._tconv(up, h, slots)
            h = cnx.tail(h, self._conv(cnx.dwconv, h, slots))
        h = self._conv(cd.decoder[0], h, slots)
        for blk in cd.decoder[1:-2]:
            snake, tconv, *units = blk.block
            h = self._tconv(tconv, snake(h), slots)
            for u in units:
                h = h + u.conv2(u.act2(self._conv(u.conv1, u.act1(h), slots)))
        h = self._conv(cd.decoder[-1], cd.decoder[-2](h), slots)
        return h.clamp(-1.0, 1.0)[:, 0]
