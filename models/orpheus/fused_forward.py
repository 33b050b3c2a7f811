"""A fused GPU forward for ``models.orpheus.llama.LlamaModel`` (same function, fewer kernels),
over bf16 or fp8 (``engine.llm.fp8``) weights.

The kernels per layer, weight sharing and numerics: docs/orpheus.md, "Fused forward".
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.llm.fp8 import FP8_DTYPE, Fp8Linear, Fp8Weight, fp8_gemm, quantise_rowwise

__all__ = ["FusedLlamaForward"]

Weight = Tensor | Fp8Weight  # a bf16 weight [N, K], or an fp8 one with its scales


def _rmsnorm(x: Tensor, w: Tensor, eps: float) -> Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def _add_rmsnorm(x: Tensor, residual: Tensor, w: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    r = x + residual  # [T, hidden] in the activation dtype, as the reference's residual add
    return _rmsnorm(r, w, eps), r


def _rope(qkv: Tensor, cos: Tensor, sin: Tensor, hq: int, hkv: int, d: int) -> tuple[Tensor, Tensor, Tensor]:
    # qkv [T, (hq + 2 hkv) d]; cos/sin [T, 1, d] in qkv's dtype -> q [T, hq, d], k/v [T, hkv, d]
    t = qkv.shape[0]
    q = qkv[:, : hq * d].view(t, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d)
    v = qkv[:, (hq + hkv) * d :].view(t, hkv, d)
    half = d // 2

    def rot(x: Tensor) -> Tensor:
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    return rot(q).contiguous(), rot(k).contiguous(), v.contiguous()


def _silu_mul(gu: Tensor) -> Tensor:
    # gu [T, 2I] -> [T, I]
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g) * u


# The same producers with the fp8 row-wise quantisation of their output fused in: each returns
# (x8 [T, K] fp8, x_scale [T, 1] f32) where the bf16 version returns x, plus the residual.
def _rmsnorm_q(x: Tensor, w: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return quantise_rowwise(_rmsnorm(x, w, eps))


def _add_rmsnorm_q(x: Tensor, residual: Tensor, w: Tensor, eps: float) -> tuple[tuple[Tensor, Tensor], Tensor]:
    y, r = _add_rmsnorm(x, residual, w, eps)
    return quantise_rowwise(y), r


def _silu_mul_q(gu: Tensor) -> tuple[Tensor, Tensor]:
    return quantise_rowwise(_silu_mul(gu))


def _share(first: nn.Module, *rest: nn.Module) -> Weight:
    """Concatenate the linears' weights along the output dim; make each weight a view into it.

    ``nn.Linear`` modules give a plain weight; ``Fp8Linear`` modules an ``Fp8Weight`` (fp8
    weights and their per-row scales concatenated alike). All modules must be of one kind.
    """
    linears = (first, *rest)
    if all(isinstance(m, Fp8Linear) for m in linears):
        w8 = torch.cat([m.weight for m in linears], dim=0)  # [sum out, in] fp8
        scale = torch.cat([m.weight_scale for m in linears], dim=0)  # [sum out] f32
        start = 0
        for m in linears:
            n = m.out_features
            m.weight, m.weight_scale = w8[start : start + n], scale[start : start + n]
            start += n
        return Fp8Weight(w8, scale)
    if any(isinstance(m, Fp8Linear) for m in linears):
        raise ValueError("cannot fuse fp8 and non-fp8 linears")
    fused = torch.cat([m.weight.data for m in linears], dim=0)  # [sum out, in]
    start = 0
    for m in linears:
        n = m.weight.shape[0]
        m.weight = nn.Parameter(fused[start : start + n], requires_grad=False)
        start += n
    return fused


def _single(m: nn.Module) -> Weight:
    return Fp8Weight(m.weight, m.weight_scale) if isinstance(m, Fp8Linear) else m.weight


class FusedLlamaForward:
    """Callable with ``LlamaModel.forward``'s signature: ``(input_ids[T], positions[T], attn) -> hidden[T, D]``.

    With fp8 decoder linears (``engine.llm.fp8.quantise_decoder_linears_`` applied before),
    the GEMMs run in fp8 (``use_scaled_mm``: None = on CUDA); ``is_fp8`` tells which.
    ``rope``: how the queries and keys are rotated out of the QKV projection, one of ``ROPE``:
    "compiled" (``_rope`` through ``torch.compile``, or eager without ``compile``) or "triton"
    (``models.orpheus.layer_triton``, one kernel; CUDA; a one-row step keeps the compiled form).
    ``silu_mul``: the gate's SiLU times the up projection, "compiled" or "triton" (one kernel,
    CUDA; with fp8 weights it quantises its output too, as the compiled form). ``norm``: the
    residual adds and RMSNorms, "compiled" or "triton" (one kernel each, CUDA; with fp8 weights
    they quantise their outputs, and the attention's output is quantised by a kernel too).
    """

    ROPE = ("compiled", "triton")
    SILU_MUL = ("compiled", "triton")
    NORM = ("compiled", "triton")

    def __init__(self, model: Any, *, compile: bool = True, use_scaled_mm: bool | None = None,
                 rope: str = "compiled", silu_mul: str = "compiled", norm: str = "compiled") -> None:
        cfg = model.config
        self.model = model
        self.hq, self.hkv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.eps = cfg.rms_norm_eps
        self.layers = []
        with torch.no_grad():
            for layer in model.model.layers:
                a, m = layer.self_attn, layer.mlp
                self.layers.append((
                    layer.input_layernorm.weight,
                    _share(a.q_proj, a.k_proj, a.v_proj),  # [(hq + 2 hkv) d, hidden]
                    _single(a.o_proj),
                    layer.post_attention_layernorm.weight,
                    _share(m.gate_proj, m.up_proj),  # [2I, hidden]
                    _single(m.down_proj),
                ))
        kinds = {isinstance(w, Fp8Weight) for row in self.layers for w in (row[1], row[2], row[4], row[5])}
        if len(kinds) > 1:
            raise ValueError("some decoder linears are fp8 and some are not")
        self.is_fp8 = kinds == {True}
        self.use_scaled_mm = use_scaled_mm
        wrap = (lambda f: torch.compile(f, dynamic=True, fullgraph=True)) if compile else (lambda f: f)
        self._compiled_rope = wrap(_rope)
        self.set_rope(rope)
        self._compiled_silu_mul = wrap(_silu_mul_q if self.is_fp8 else _silu_mul)
        self.set_silu_mul(silu_mul)
        if self.is_fp8:
            self._compiled_norm = (wrap(_rmsnorm_q), wrap(_add_rmsnorm_q), wrap(quantise_rowwise), wrap(_add_rmsnorm))
        else:
            rms, add_rms = wrap(_rmsnorm), wrap(_add_rmsnorm)
            self._compiled_norm = (rms, add_rms, lambda x: x, add_rms)
        self.set_norm(norm)

    @classmethod
    def for_model(cls, model: Any, *, compile: bool = True, rope: str = "compiled",
                  silu_mul: str = "compiled", norm: str = "compiled") -> FusedLlamaForward:
        """The model's fused forward, built once per model (its weights are shared, not copied)."""
        fwd = getattr(model, "_fused_forward", None)
        if fwd is None:
            fwd = cls(model, compile=compile, rope=rope, silu_mul=silu_mul, norm=norm)
            model._fused_forward = fwd
        else:
            fwd.set_rope(rope)
            fwd.set_silu_mul(silu_mul)
            fwd.set_norm(norm)
        return fwd

    @classmethod
    def check(cls, rope: str = "compiled", silu_mul: str = "compiled", norm: str = "compiled") -> None:
        """Refuse an unknown ``orpheus_rope`` / ``orpheus_silu_mul`` / ``orpheus_norm`` (ValueError)."""
        for name, value, known in (("orpheus_rope", rope, cls.ROPE), ("orpheus_silu_mul", silu_mul, cls.SILU_MUL),
                                   ("orpheus_norm", norm, cls.NORM)):
            if value not in known:
                raise ValueError(f"{name} {value!r}: expected one of {', '.join(known)}")

    def set_rope(self, rope: str) -> None:
        """Rotate the queries and keys the ``rope`` way (before graphs are captured)."""
        self.check(rope=rope)
        if rope == "triton":
            from models.orpheus.layer_triton import rope_qkv

            self._rope = rope_qkv
        else:
            self._rope = self._compiled_rope
        self.rope = rope

    def set_silu_mul(self, silu_mul: str) -> None:
        """Take the gate's SiLU times the up projection the ``silu_mul`` way (before capture)."""
        self.check(silu_mul=silu_mul)
        self._silu_mul = self._compiled_silu_mul
        if silu_mul == "triton":
            from models.orpheus.layer_triton import silu_mul as silu_mul_triton

            self._silu_mul = functools.partial(silu_mul_triton, quantise=FP8_DTYPE) if self.is_fp8 else silu_mul_triton
        self.silu_mul = silu_mul

    def set_norm(self, norm: str) -> None:
        """Take the residual adds and RMSNorms (and with fp8 weights the activations'
        quantisation) the ``norm`` way (before capture)."""
        self.check(norm=norm)
        self._rmsnorm, self._add_rmsnorm, self._quant, self._final_add_rmsnorm = self._compiled_norm
        if norm == "triton":
            from models.orpheus.layer_triton import add_rmsnorm, quantise_rows

            q = FP8_DTYPE if self.is_fp8 else None
            self._rmsnorm = lambda x, w, eps: add_rmsnorm(x, None, w, eps, quantise=q)[0]
            self._add_rmsnorm = lambda x, r, w, eps: add_rmsnorm(x, r, w, eps, quantise=q)
            self._final_add_rmsnorm = lambda x, r, w, eps: add_rmsnorm(x, r, w, eps)
            if self.is_fp8:
                self._quant = lambda x: quantise_rows(x, FP8_DTYPE)
        self.norm = norm

    def _linear(self, x: Any, w: Weight, dtype: torch.dtype) -> Tensor:
        """x: an activation [T, K] (bf16 weights) or its (x8, scale) pair (fp8) -> [T, N] in ``dtype``."""
        if isinstance(w, Fp8Weight):
            x8, xs = x
            use = x8.is_cuda if self.use_scaled_mm is None else self.use_scaled_mm
            return fp8_gemm(x8, xs, w.weight, w.scale, out_dtype=dtype, use_scaled_mm=use)
        return F.linear(x, w)

    def __call__(self, input_ids: Tensor, positions: Tensor, attn: Any) -> Tensor:
        m = self.model
        h = m.model.embed_tokens(input_ids)  # [T, hidden]
        dt = h.dtype
        cs = m.rope.index_select(0, positions).to(dt)  # [T, 2, D]
        cos, sin = cs[:, 0:1], cs[:, 1:2]  # [T, 1, D]
        t = h.shape[0]
        # one row: the compiled form's two kernels beat the Triton kernel (on an H100 7.6 against
        # 10.7 µs alone in a graph, 1.5 µs a layer in the forward); from 16 rows up the kernel wins
        rope = self._compiled_rope if t == 1 else self._rope
        residual = h
        x = self._rmsnorm(h, self.layers[0][0], self.eps)  # [T, hidden] or its fp8 pair
        for i, (w_in, w_qkv, w_o, w_post, w_gu, w_down) in enumerate(self.layers):
            if i > 0:
                x, residual = self._add_rmsnorm(h, residual, w_in, self.eps)
            q, k, v = rope(self._linear(x, w_qkv, dt), cos, sin, self.hq, self.hkv, self.d)
            o = attn(i, q, k, v)  # [T, hq, d]
            h = self._linear(self._quant(o.reshape(t, self.hq * self.d)), w_o, dt)  # [T, hidden]
            x, residual = self._add_rmsnorm(h, residual, w_post, self.eps)
            h = self._linear(self._silu_mul(self._linear(x, w_gu, dt)), w_down, dt)  # [T, hidden]
        out, _ = self._final_add_rmsnorm(h, residual, m.model.norm.weight, self.eps)
        return out
