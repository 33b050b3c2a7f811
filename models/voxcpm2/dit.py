"""The local DiT's flow steps in as few kernels as a step allows (the token head runs
``max_steps - 1`` of them per patch, inside the captured step).

``FusedDiT`` is built from ``LocalDiT``'s modules once the weights are in place (``PatchHead``'s
constructor, after the load and any LoRA fold; build a new head after changing weights): each
layer's q, k and v projections in one matrix and its gate and up projections in another
(copies, not parameters), the RoPE tables of the DiT's fixed positions with the sign of
``rotate_half`` folded into sin (bit for bit the same rotation, one kernel fewer) and the time
embedding's frequencies. Same arithmetic as ``LocalDiT.forward`` over ``MiniCPMStack``
(RMSNorm normalising in float32, q and k rotated in float32 and cast back), arranged so that:

- what does not change over a patch's flow steps runs once per head call (``prefix``): the
  condition projections, the previous patch's projection and every step's time embedding;
- classifier-free guidance's conditional and unconditional rows share what is equal in both
  (the time embedding, the previous patch, the noisy patch's projection: computed on B rows and
  broadcast into the 2B-row sequence), and run the layers as one batch of 2B rows;
- RMSNorm is one fused op, the sub-layers' mup scaling rides on the residual add (``alpha``),
  q and k are rotated in one pass of three kernels (a multiply that promotes to float32, the
  halves' swap, one ``addcmul`` that writes the rounded result), and attention is one
  ``scaled_dot_product_attention`` call without a mask (bidirectional) or repeated k/v
  (``enable_gqa``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from models.voxcpm2.config import MiniCPMConfig

__all__ = ["FusedDiT"]


class FusedDiT:
    """``dit`` (a ``LocalDiT``), its stack's config ``c``, ``patch_size`` P (the noisy patch and
    the previous patch both have P frames). ``prefix`` once per patch, ``velocity`` per step."""

    def __init__(self, dit, c: MiniCPMConfig, patch_size: int) -> None:  # noqa: ANN001
        stack = dit.decoder
        self.nh, self.nkv, self.hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.eps = c.rms_norm_eps
        self.scale = c.residual_scale if c.use_mup else 1.0
        self.patch_size = patch_size
        self.dit = dit
        w = stack.norm.weight
        self.dtype = w.dtype
        with torch.no_grad():
            self.qkv, self.gate_up, self.o, self.down, self.ln1, self.ln2 = [], [], [], [], [], []
            for layer in stack.layers:
                a, m = layer.self_attn, layer.mlp
                self.qkv.append(torch.cat((a.q_proj.weight, a.k_proj.weight, a.v_proj.weight)).detach())
                self.gate_up.append(torch.cat((m.gate_proj.weight, m.up_proj.weight)).detach())
                self.o.append(a.o_proj.weight.detach())
                self.down.append(m.down_proj.weight.detach())
                self.ln1.append(layer.input_layernorm.weight.detach())
                self.ln2.append(layer.post_attention_layernorm.weight.detach())
            self.norm = w.detach()
            n = 2 + 1 + 2 * patch_size  # mu (2), time, previous patch, noisy patch
            if c.no_rope:
                self.cos = self.sin = None
            else:
                cos, sin = stack.rope_cos[:n], stack.rope_sin[:n]  # [n, D] float32
                half = self.hd // 2
                self.cos = cos[:, None].clone()  # [n, 1, D]
                self.sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)[:, None]  # rotate_half's sign
            h = c.hidden_size // 2
            self.freq = torch.exp(torch.arange(h, dtype=self.dtype, device=w.device)
                                  * -(math.log(10000) / (h - 1)))  # ``model.sinusoidal``'s, in the model's dtype

    def _sinusoidal(self, t: Tensor) -> Tensor:
        emb = 1000.0 * t.unsqueeze(1) * self.freq.unsqueeze(0)
        return torch.cat((emb.sin(), emb.cos()), dim=-1)

    def prefix(self, mu: Tensor, cond: Tensor, t: Tensor, dt: Tensor) -> Tensor:
        """mu [B, 2 * Hd], cond [B, P, D] (the previous patch), t/dt [B, S] in the model's dtype
        (one column per flow step) -> [S, 2, B, 3 + P, Hd]: each step's sequence before the noisy
        patch, the conditional rows (0) and the unconditional ones (1, mu = 0)."""
        d = self.dit
        b, s = t.shape
        te = (d.time_mlp(self._sinusoidal(t.T.reshape(-1))) + d.delta_time_mlp(self._sinusoidal(dt.T.reshape(-1))))
        hd = te.shape[-1]
        te = te.view(s, 1, b, 1, hd).expand(s, 2, b, 1, hd)
        mu = mu.view(1, b, 2, hd)
        mu2 = torch.cat((mu, torch.zeros_like(mu))).expand(s, 2, b, 2, hd)
        ch = d.cond_proj(cond).expand(s, 2, b, cond.shape[1], hd)
        return torch.cat((mu2, te, ch), dim=3)

    def velocity(self, prefix: Tensor, x: Tensor) -> Tensor:
        """One step's ``prefix`` [2, B, 3 + P, Hd] and the noisy patch x [B, P, D] -> velocity
        [2, B, P, D] (conditional, unconditional)."""
        d = self.dit
        two, b, _, hd = prefix.shape
        p = x.shape[1]
        xh = d.in_proj(x)  # [B, P, Hd]
        h = torch.cat((prefix, xh.expand(two, b, p, hd)), dim=2).view(two * b, -1, hd)  # [2B, n, Hd]
        nh, nkv, dh = self.nh, self.nkv, self.hd
        half = dh // 2
        rows, n = h.shape[0], h.shape[1]
        for i in range(len(self.qkv)):
            a = F.rms_norm(h, (hd,), self.ln1[i], self.eps)
            qkv = F.linear(a, self.qkv[i]).view(rows, n, nh + 2 * nkv, dh)
            qk = qkv[:, :, :nh + nkv]
            if self.cos is not None:  # in float32 (q * cos promotes), rounded once to h's dtype on the way out
                out = torch.empty(qk.shape, dtype=h.dtype, device=h.device)
                qk = torch.addcmul(qk * self.cos, torch.cat((qk[..., half:], qk[..., :half]), dim=-1), self.sin,
                                   out=out)
            o = F.scaled_dot_product_attention(qk[:, :, :nh].transpose(1, 2), qk[:, :, nh:].transpose(1, 2),
                                               qkv[:, :, nh + nkv:].transpose(1, 2), enable_gqa=nkv != nh)
            o = F.linear(o.transpose(1, 2).reshape(rows, n, nh * dh), self.o[i])
            h = torch.add(h, o, alpha=self.scale)
            gate, up = F.linear(F.rms_norm(h, (hd,), self.ln2[i], self.eps), self.gate_up[i]).chunk(2, dim=-1)
            h = torch.add(h, F.linear(F.silu(gate) * up, self.down[i]), alpha=self.scale)
        # every position through the final norm and out_proj (row-wise), then the patch's: no copy
        v = d.out_proj(F.rms_norm(h, (hd,), self.norm, self.eps))  # [2B, n, D]
        return v.view(two, b, n, -1)[:, :, n - p:]
