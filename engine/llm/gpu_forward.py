"""A fused GPU forward for ``models.orpheus.llama.LlamaModel`` (same function, fewer kernels).

The reference forward launches about 40 kernels per layer (RMSNorm alone is seven elementwise
ops, RoPE ten); at decode batch sizes each costs more in launch and tail than in work, which
made a captured Orpheus-3B decode step twice the weight-streaming time. Here, per layer:
add+RMSNorm (one kernel), one QKV GEMM, RoPE (one kernel), the attention backend, the output
GEMM, add+RMSNorm, one gate-up GEMM, SiLU-mul (one kernel), the down GEMM.

The elementwise parts are ``torch.compile``d small functions (Inductor emits one Triton kernel
each on the GPU); they are not CUDA-graphed by torch, so the engine's own decode graphs capture
them. Weights are shared, not copied: the QKV and gate-up matrices are concatenated once and
the model's ``q_proj``/``k_proj``/``v_proj``/``gate_proj``/``up_proj`` weights become views
into them, so the model's own forward still works and memory does not grow.

Numerics: the same ops in the same dtypes as the reference, except that fused kernels keep
intermediates in float32 (SiLU-mul, the RMSNorm reduction order); the GPU check compares both.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["FusedLlamaForward"]


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


def _share(first: nn.Linear, *rest: nn.Linear) -> Tensor:
    """Concatenate the linears' weights along the output dim; make each weight a view into it."""
    linears = (first, *rest)
    fused = torch.cat([m.weight.data for m in linears], dim=0)  # [sum out, in]
    start = 0
    for m in linears:
        n = m.weight.shape[0]
        m.weight = nn.Parameter(fused[start : start + n], requires_grad=False)
        start += n
    return fused


class FusedLlamaForward:
    """Callable with ``LlamaModel.forward``'s signature: ``(input_ids[T], positions[T], attn) -> hidden[T, D]``."""

    def __init__(self, model: Any, *, compile: bool = True) -> None:
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
                    a.o_proj.weight,
                    layer.post_attention_layernorm.weight,
                    _share(m.gate_proj, m.up_proj),  # [2I, hidden]
                    m.down_proj.weight,
                ))
        wrap = (lambda f: torch.compile(f, dynamic=True, fullgraph=True)) if compile else (lambda f: f)
        self._rmsnorm = wrap(_rmsnorm)
        self._add_rmsnorm = wrap(_add_rmsnorm)
        self._rope = wrap(_rope)
        self._silu_mul = wrap(_silu_mul)

    @classmethod
    def for_model(cls, model: Any, *, compile: bool = True) -> FusedLlamaForward:
        """The model's fused forward, built once per model (its weights are shared, not copied)."""
        fwd = getattr(model, "_fused_forward", None)
        if fwd is None:
            fwd = cls(model, compile=compile)
            model._fused_forward = fwd
        return fwd

    def __call__(self, input_ids: Tensor, positions: Tensor, attn: Any) -> Tensor:
        m = self.model
        h = m.model.embed_tokens(input_ids)  # [T, hidden]
        cs = m.rope.index_select(0, positions).to(h.dtype)  # [T, 2, D]
        cos, sin = cs[:, 0:1], cs[:, 1:2]  # [T, 1, D]
        t = h.shape[0]
        residual = h
        x = self._rmsnorm(h, self.layers[0][0], self.eps)
        for i, (w_in, w_qkv, w_o, w_post, w_gu, w_down) in enumerate(self.layers):
            if i > 0:
                x, residual = self._add_rmsnorm(h, residual, w_in, self.eps)
            q, k, v = self._rope(F.linear(x, w_qkv), cos, sin, self.hq, self.hkv, self.d)
            o = attn(i, q, k, v)  # [T, hq, d]
            h = F.linear(o.reshape(t, self.hq * self.d), w_o)  # [T, hidden]
            x, residual = self._add_rmsnorm(h, residual, w_post, self.eps)
            h = F.linear(self._silu_mul(F.linear(x, w_gu)), w_down)  # [T, hidden]
        out, _ = self._add_rmsnorm(h, residual, m.model.norm.weight, self.eps)
        return out
