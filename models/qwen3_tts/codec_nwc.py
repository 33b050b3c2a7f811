"""``CodecStream`` on channels-last activations [N, T, C]: the same streamed decode, with every
convolution a GEMM over its taps and no layout changes between layers (``--model-setting
codec_layout=nwc``; docs/models/qwen3_tts.md, "Codec").

Why: on an H200 the channels-first step spends more time in cuDNN's layout transposes, a legacy
implicit-GEMM convolution and unfused elementwise work than in its arithmetic
(docs/performance.md, the Qwen3-TTS codec profile). Here a dense convolution of kernel k is one
GEMM of its k gathered taps [N*n, k*C_in] x [k*C_in, C_out] (or cuDNN's channels-last
convolution: ``codec_conv=cudnn``), a transposed convolution of kernel 2s and stride s one GEMM
of each input beside the one before it [N*n, 2*C_in] x [2*C_in, s*C_out], a depthwise one k
shifted multiply-adds, and SnakeBeta takes its exponentials precomputed (and one fused kernel
with ``codec_compile``).
"""

from __future__ import annotations

import logging
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from models.qwen3_tts.codec import Codec, CodecStream, _CausalConv, _CausalTransConv, _ConvNeXt, _Snake

__all__ = ["CodecStreamNWC", "CODEC_CONVS", "CODEC_LAYOUTS", "compiled_snake", "make_codec_stream", "snake"]

CODEC_LAYOUTS = ("ncw", "nwc")
CODEC_CONVS = ("gemm", "cudnn", "triton", "fused", "fused-state")
_TRITON_CONVS = ("triton", "fused", "fused-state")

log = logging.getLogger(__name__)


class _Dense:
    """A causal conv (dense or depthwise) for [N, n, C] with its state [S, ctx, C_in]; a dense one
    with k > 1 as a GEMM of its gathered taps (``conv="gemm"``), as cuDNN's convolution on the
    channels-last view of the same memory (``conv="cudnn"``: an implicit GEMM, no gathered copy)
    or as our Triton implicit GEMM over the same memory (``conv="triton"``, ``conv_triton``); with
    ``conv="fused"`` that kernel also adds the residual after it and applies the SnakeBeta the
    next convolution takes to its output (``__call__``'s ``residual`` and ``out_act``; k = 1
    included), and with ``conv="fused-state"`` it also reads a row's first inputs from its
    state rather than from a [state, inputs] concatenation."""

    def __init__(self, m: _CausalConv, state: Tensor | None, dtype: torch.dtype, conv: str = "gemm") -> None:
        w = m.conv.weight.detach().to(dtype)  # [C_out, C_in / groups, k]
        c_out, c_in_g, k = w.shape
        self.k, self.dilation, self.context = k, m.conv.dilation[0], m.context
        self.bias = None if m.conv.bias is None else m.conv.bias.detach().to(dtype)
        self.depthwise = m.conv.groups > 1
        self.cudnn = conv == "cudnn" and not self.depthwise and k > 1
        self.triton = conv in _TRITON_CONVS and not self.depthwise and k > 1
        self.fused = conv in ("fused", "fused-state") and not self.depthwise
        self.from_state = conv == "fused-state" and self.triton
        if self.triton or self.fused:
            from models.qwen3_tts.conv_triton import taps_weight

            self.weight = taps_weight(w)  # [k * C_in, C_out]
        elif self.cudnn:  # [C_out, C_in, 1, k] channels-last: the layout of [N, 1, n, C] activations
            self.weight = w[:, :, None, :].contiguous(memory_format=torch.channels_last)
        elif self.depthwise:
            if m.conv.groups != c_out or c_in_g != 1:
                raise ValueError(f"channels-last codec: grouped conv (groups={m.conv.groups}) not supported")
            self.weight = w[:, 0, :].t().contiguous()  # [k, C]
        else:
            self.weight = w.reshape(c_out, c_in_g * k).contiguous()  # column c*k + j: tap j of input c
        self.state = state  # [S, ctx, C_in] or None (k = 1)

    def __call__(self, x: Tensor, slots: Tensor, act: _SnakeNWC | None = None,
                 residual: Tensor | None = None, out_act: _SnakeNWC | None = None) -> Tensor:
        """out_act(conv(act(x)) + residual) ([N, n, C_out]), the three optional; ``out_act`` only
        with ``conv="fused"`` or "fused-state" (in the kernel's epilogue)."""
        if act is not None:
            x = act(x)
        if self.fused and (self.context or residual is not None or out_act is not None):
            return self._fused(x, slots, residual, out_act)  # (k = 1 with nothing to fold in: cuBLAS)
        if out_act is not None:
            raise ValueError("out_act needs codec_conv=fused or fused-state")
        y = self._conv(x, slots)
        return y if residual is None else residual + y

    def _fused(self, x: Tensor, slots: Tensor, residual: Tensor | None, out_act: _SnakeNWC | None) -> Tensor:
        from models.qwen3_tts.conv_triton import conv_taps

        res = None if residual is None else residual.contiguous()
        snake_out = None if out_act is None else (out_act.alpha, out_act.inv_beta)
        x = x.contiguous()
        if not self.context:  # k = 1
            return conv_taps(x, self.weight, self.bias, x.shape[1], 1, res, snake_out=snake_out)
        if not self.from_state:
            return conv_taps(self._with_state(x, slots), self.weight, self.bias, x.shape[1], self.dilation, res,
                             snake_out=snake_out)
        state = self.state
        assert state is not None
        out = conv_taps(x, self.weight, self.bias, x.shape[1], self.dilation, res, state=(state, slots),
                        snake_out=snake_out)
        _keep_last(state, slots, x, self.context)  # (after the kernel read them)
        return out

    def _with_state(self, x: Tensor, slots: Tensor) -> Tensor:
        """[state, x] ([N, ctx + n, C]) for the slots' rows; their states become its last ctx."""
        state = self.state
        assert state is not None
        full = torch.cat((state.index_select(0, slots), x), dim=1)
        state.index_copy_(0, slots, full[:, -self.context:])
        return full

    def _conv(self, x: Tensor, slots: Tensor) -> Tensor:
        if not self.context:
            if self.fused:  # (the taps' form of the weight: [C_in, C_out])
                return F.linear(x, self.weight.t(), self.bias)
            return F.linear(x, self.weight, self.bias)  # k = 1: [N, n, C_in] -> [N, n, C_out]
        n, d = x.shape[1], self.dilation
        full = self._with_state(x, slots)
        if self.triton or self.fused:  # the taps read where they lie: no gathered copy
            from models.qwen3_tts.conv_triton import conv_taps

            return conv_taps(full, self.weight, self.bias, n, d)
        if self.cudnn:  # [N, L, C] is [N, C, 1, L] in channels-last memory: no copy either way
            y = F.conv2d(full.permute(0, 2, 1).unsqueeze(2), self.weight, self.bias, dilation=(1, d))
            return y.squeeze(2).permute(0, 2, 1)  # [N, n, C_out] (contiguous: channels-last out)
        if self.depthwise:
            out = full[:, :n] * self.weight[0]
            for j in range(1, self.k):
                out = torch.addcmul(out, full[:, j * d:j * d + n], self.weight[j])
            return out if self.bias is None else out + self.bias
        # the n windows' taps, [N, n, C_in, k] -> [N, n, C_in * k] (one gather copy)
        taps = full.unfold(1, self.context + 1, 1)[..., ::d].reshape(*x.shape[:2], -1)
        return F.linear(taps, self.weight, self.bias)


def _keep_last(state: Tensor, slots: Tensor, x: Tensor, ctx: int) -> None:
    """The slots' states [S, ctx, C] become the last ``ctx`` of [state, x] (x [N, n, C])."""
    n = x.shape[1]
    if n >= ctx:
        state.index_copy_(0, slots, x[:, n - ctx:])
    else:
        state.index_copy_(0, slots, torch.cat((state.index_select(0, slots)[:, n:], x), dim=1))


class _Trans:
    """A causal transposed conv (kernel s or 2s, stride s) for [N, n, C] -> [N, n*s, C_out].

    Output m*s + q of the new inputs is tap q of input m plus, with kernel 2s, tap s + q of the
    input before it: one GEMM of [input before, input] against the stacked taps, the bias in its
    epilogue, its output already in time order."""

    def __init__(self, m: _CausalTransConv, state: Tensor | None, dtype: torch.dtype, conv: str = "gemm") -> None:
        w = m.conv.weight.detach().to(dtype)  # [C_in, C_out, K]
        c_in, c_out, _ = w.shape
        s = m.stride
        self.stride, self.context, self.c_out = s, m.context, c_out
        taps = w.permute(2, 1, 0)  # [K, C_out, C_in]
        now = taps[:s].reshape(s * c_out, c_in)  # rows (q, out channel): taps 0..s-1 of input m
        if self.context:  # columns [input m - 1, input m]: taps s..2s-1 of the one before
            before = taps[s:].reshape(s * c_out, c_in)
            self.weight = torch.cat((before, now), dim=1).contiguous()  # [s*C_out, 2*C_in]
        else:
            self.weight = now.contiguous()
        bias = None if m.conv.bias is None else m.conv.bias.detach().to(dtype)
        self.bias = None if bias is None else bias.repeat(s)  # [s*C_out], per (q, out channel)
        self.state = state  # [S, 1, C_in] with kernel 2s, else None
        # conv="triton": (before, now) are two taps of dilation 1 over [state, inputs], read in
        # place by the Triton GEMM (conv_triton), not a two-fold copy side by side
        self.taps = None
        self.from_state = conv == "fused-state" and bool(self.context)
        if conv in _TRITON_CONVS and self.context:
            from models.qwen3_tts.conv_triton import taps_weight

            self.taps = taps_weight(self.weight.view(s * c_out, 2, c_in).transpose(1, 2))  # [2*C_in, s*C_out]

    def __call__(self, x: Tensor, slots: Tensor, act: _SnakeNWC | None = None) -> Tensor:
        """The transposed conv of act(x) (``act`` optional)."""
        if act is not None:
            x = act(x)
        if self.context:
            state = self.state
            assert state is not None
            if self.from_state:  # the state read in the kernel, then the last input kept
                from models.qwen3_tts.conv_triton import conv_taps

                x = x.contiguous()
                out = conv_taps(x, self.taps, self.bias, x.shape[1], 1, state=(state, slots))
                state.index_copy_(0, slots, x[:, -1:])
                return out.view(out.shape[0], -1, self.c_out)  # [N, n*s, C_out]
            full = torch.cat((state.index_select(0, slots), x), dim=1)  # [N, 1 + n, C_in]
            state.index_copy_(0, slots, full[:, -1:])
            if self.taps is not None:
                from models.qwen3_tts.conv_triton import conv_taps

                out = conv_taps(full, self.taps, self.bias, x.shape[1], 1)  # [N, n, s*C_out]
                return out.view(out.shape[0], -1, self.c_out)
            x = torch.cat((full[:, :-1], full[:, 1:]), dim=2)  # [N, n, 2*C_in]: (before, now)
        out = F.linear(x, self.weight, self.bias)  # [N, n, s*C_out]
        return out.view(out.shape[0], -1, self.c_out)  # [N, n*s, C_out]


def snake(x: Tensor, alpha: Tensor, inv_beta: Tensor) -> Tensor:
    """SnakeBeta x + sin^2(x alpha) / beta' with alpha = exp(alpha), inv_beta = 1 / (exp(beta) + 1e-9)."""
    return torch.addcmul(x, inv_beta, torch.sin(x * alpha).square())


def compiled_snake(backend: str, device: torch.device, dtype: torch.dtype, *,
                   fallback: bool) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """``snake`` through ``torch.compile`` (dynamic shapes), compiled now on a small input of the
    codec's device and dtype, so that a machine where it cannot compile (no Triton, no C
    compiler) says so at load, not at the first frame served. With ``fallback`` (the compile was
    a default, not asked for) such a failure logs a warning and gives the eager ``snake``;
    without it, it raises."""
    fn = torch.compile(snake, dynamic=True, fullgraph=True, backend=backend)
    x = torch.zeros(2, 3, 4, device=device, dtype=dtype)  # (sizes 0 and 1 would be specialised)
    ones = torch.ones(4, device=device, dtype=dtype)
    try:
        fn(x, ones, ones)
    except Exception as exc:  # any backend failure: the eager form computes the same
        if not fallback:
            raise
        root: BaseException = exc
        while (inner := getattr(root, "inner_exception", None) or root.__cause__) is not None:
            root = inner  # (torch wraps the backend's own error)
        log.warning("the Qwen3-TTS codec's SnakeBeta did not compile here (%s: %s); running it "
                    "unfused (a slower codec step; --model-setting codec_compile=false hides this)",
                    type(root).__name__, (str(root).splitlines() or [""])[0])
        return snake
    return fn


class _SnakeNWC:
    """SnakeBeta with its per-channel exponentials computed once (as ``_Snake.forward`` does);
    ``fn`` is ``snake`` or its ``torch.compile``d form (one fused kernel)."""

    def __init__(self, m: _Snake, dtype: torch.dtype, fn: Callable[[Tensor, Tensor, Tensor], Tensor]) -> None:
        alpha, beta = m.alpha.detach().to(dtype), m.beta.detach().to(dtype)
        self.alpha = alpha.exp()  # [C]: broadcasts over [N, n, C]
        self.inv_beta = 1.0 / (beta.exp() + 1e-9)
        self.fn = fn

    def __call__(self, x: Tensor) -> Tensor:
        return self.fn(x, self.alpha, self.inv_beta)


def _interpreting() -> bool:
    """Triton's CPU interpreter is on (TRITON_INTERPRET=1: the tests run the kernel on the CPU)."""
    import os

    return os.environ.get("TRITON_INTERPRET", "") == "1"


class CodecStreamNWC(CodecStream):
    """``CodecStream``'s interface and per-slot state (conv states time-major, [S, ctx, C]),
    each step on activations [N, T, C] (module docstring). Equal to ``CodecStream`` and to
    ``Codec.forward`` within rounding."""

    def __init__(self, codec: Codec, max_slots: int, *, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None, compile: bool = False,
                 compile_backend: str = "inductor", compile_fallback: bool = False,
                 conv: str = "gemm") -> None:
        """``compile``: SnakeBeta through ``torch.compile`` (dynamic shapes: one fused kernel for
        every layer and batch size; compiled here, so before any graph capture; where it cannot
        compile, ``compile_fallback`` runs it unfused: ``compiled_snake``).
        ``conv``: the dense convolutions as GEMMs of their gathered taps ("gemm"), cuDNN's
        channels-last convolution ("cudnn"), the Triton implicit GEMM ("triton": CUDA only) or
        that kernel with each residual sum and each SnakeBeta that follows a convolution inside a
        residual unit in its epilogue ("fused"), and with the states read in the kernel too
        ("fused-state")."""
        if conv not in CODEC_CONVS:
            raise ValueError(f"codec_conv must be one of {', '.join(CODEC_CONVS)}, got {conv!r}")
        self._fused = conv in ("fused", "fused-state")
        if conv in _TRITON_CONVS and torch.device(device or "cpu").type != "cuda" and not _interpreting():
            raise ValueError(f"codec_conv={conv} needs a CUDA device (its kernel is Triton's)")
        super().__init__(codec, max_slots, device=device, dtype=dtype)
        dt = self.k[0].dtype
        fn = (compiled_snake(compile_backend, self.k[0].device, dt, fallback=compile_fallback)
              if compile else snake)
        # the channels-first states as time-major ones (same zeros, other shape)
        for states in (self._convs, self._tconvs):
            for key, buf in list(states.items()):
                states[key] = buf.new_zeros(buf.shape[0], buf.shape[2], buf.shape[1])
        cd = codec

        def dense(m: _CausalConv) -> _Dense:
            return _Dense(m, self._convs.get(id(m)), dt, conv)

        def trans(m: _CausalTransConv) -> _Trans:
            return _Trans(m, self._tconvs.get(id(m)), dt, conv)

        q = cd.quantizer
        self._tables = [[layer._codebook.table().detach().to(dt) for layer in rvq.vq.layers]
                        for rvq in (q.rvq_first, q.rvq_rest)]
        self._rvq_out = [rvq.output_proj.weight.detach()[:, :, 0].to(dt) for rvq in (q.rvq_first, q.rvq_rest)]
        self._pre = dense(cd.pre_conv)
        self._upsample = [(trans(up), dense(cnx.dwconv), cnx) for up, cnx in cd.upsample]
        self._first = dense(cd.decoder[0])
        self._blocks = []
        for blk in cd.decoder[1:-2]:
            act, tconv, *units = blk.block
            self._blocks.append((_SnakeNWC(act, dt, fn), trans(tconv),
                                 [(_SnakeNWC(u.act1, dt, fn), dense(u.conv1), _SnakeNWC(u.act2, dt, fn),
                                   dense(u.conv2)) for u in units]))
        self._last_snake = _SnakeNWC(cd.decoder[-2], dt, fn)
        self._last = dense(cd.decoder[-1])

    def _quantized(self, codes: Tensor) -> Tensor:
        """codes [N, G] -> [N, 1, codebook_dim] (``_Quantizer.decode`` channels-last)."""
        out = None
        first = [codes[:, :1], codes[:, 1:]]
        for tables, proj, cols in zip(self._tables, self._rvq_out, first):
            e = F.embedding(cols[:, 0], tables[0])
            for i in range(1, len(tables)):
                e = e + F.embedding(cols[:, i], tables[i])
            y = F.linear(e[:, None], proj)  # [N, 1, codebook_dim]
            out = y if out is None else out + y
        assert out is not None
        return out

    @staticmethod
    def _convnext(cnx: _ConvNeXt, x: Tensor, h: Tensor) -> Tensor:
        h = cnx.pwconv2(F.gelu(cnx.pwconv1(cnx.norm(h))))
        return x + cnx.gamma * h

    @torch.no_grad()
    def step(self, slots: Tensor, codes: Tensor) -> Tensor:
        """slots int64 [N], codes int64 [N, G] (one frame each) -> audio [N, samples_per_frame]."""
        h = self._pre(self._quantized(codes), slots)  # [N, 1, latent]
        h = self._transformer(h, slots)
        for up, dw, cnx in self._upsample:
            h = up(h, slots)
            h = self._convnext(cnx, h, dw(h, slots))
        h = self._first(h, slots)
        for act, tconv, units in self._blocks:
            h = tconv(h, slots, act)
            for act1, conv1, act2, conv2 in units:  # h + conv2(act2(conv1(act1(h))))
                if self._fused:  # act2 in conv1's epilogue (its output feeds nothing else), the sum in conv2's
                    h = conv2(conv1(h, slots, act1, out_act=act2), slots, residual=h)
                else:
                    h = conv2(conv1(h, slots, act1), slots, act2, residual=h)
        h = self._last(h, slots, self._last_snake)  # [N, n, 1]
        return h.clamp(-1.0, 1.0)[:, :, 0]


def make_codec_stream(codec: Codec, max_slots: int, *, layout: str = "ncw", compile: bool = False,
                      conv: str | None = None, device: torch.device | str | None = None,
                      dtype: torch.dtype | None = None, compile_backend: str = "inductor",
                      compile_fallback: bool = False) -> CodecStream:
    """The per-slot codec stream in ``layout`` ("ncw": ``CodecStream``; "nwc": ``CodecStreamNWC``,
    with ``compile`` its SnakeBeta fused by ``torch.compile`` (``compile_fallback``: unfused where
    it cannot compile, rather than an error), ``conv`` its dense convolutions' kind: "gemm", the
    default, "cudnn", "triton", "fused" or "fused-state")."""
    if layout not in CODEC_LAYOUTS:
        raise ValueError(f"codec_layout must be one of {', '.join(CODEC_LAYOUTS)}, got {layout!r}")
    if layout == "nwc":
        return CodecStreamNWC(codec, max_slots, device=device, dtype=dtype, compile=compile,
                              compile_backend=compile_backend, compile_fallback=compile_fallback,
                              conv=conv or "gemm")
    if compile or conv is not None:
        raise ValueError("codec_compile and codec_conv need codec_layout=nwc (the channels-first step "
                         "runs the reference's modules)")
    return CodecStream(codec, max_slots, device=device, dtype=dtype)
