"""Run by tests/models/orpheus/test_layer_triton.py in the Triton venv with TRITON_INTERPRET=1:
``layer_triton.rope_qkv`` against ``fused_forward._rope`` (eager) on Orpheus-3B's head layout
and the tiny one, float32 and bfloat16, rows of the projection wider than the projection (a
strided view) and cos / sin as the fused forward slices them; ``layer_triton.silu_mul`` against
``fused_forward._silu_mul``. Prints one JSON object."""

from __future__ import annotations

import json
import os

import torch

assert os.environ.get("TRITON_INTERPRET") == "1"
from models.orpheus.fused_forward import _rope, _silu_mul  # noqa: E402
from models.orpheus.layer_triton import rope_qkv, silu_mul  # noqa: E402

g = torch.Generator().manual_seed(0)
cases = {}
# (tokens, hq, hkv, d, dtype, extra columns beside each row of the projection)
for t, hq, hkv, d, dtype, pad in ((5, 24, 8, 128, torch.float32, 0), (3, 24, 8, 128, torch.bfloat16, 0),
                                  (7, 4, 2, 16, torch.float32, 0), (1, 4, 2, 16, torch.bfloat16, 0),
                                  (4, 6, 2, 24, torch.float32, 8), (6, 3, 3, 8, torch.bfloat16, 0)):
    width = (hq + 2 * hkv) * d
    qkv = (torch.randn(t, width + pad, generator=g) * 2).to(dtype)[:, :width]
    angles = torch.rand(t, d // 2, generator=g) * 40.0
    angles = torch.cat([angles, angles], dim=-1)  # the Llama table: each half the same angles
    cs = torch.stack([angles.cos(), angles.sin()], dim=1).to(dtype)  # [T, 2, D] as the fused forward
    cos, sin = cs[:, 0:1], cs[:, 1:2]
    got = rope_qkv(qkv, cos, sin, hq, hkv, d)
    # the reference in float32, rounded once (as torch.compile computes a bf16 pointwise chain):
    # to nearest (a GPU's cast) or toward zero (the interpreter's cast from float32 to bfloat16)
    want32 = _rope(qkv.float(), cos.float(), sin.float(), hq, hkv, d)
    nearest = [w.to(dtype) for w in want32]
    toward_zero = [(w.view(torch.int32) & ~0xFFFF).view(torch.float32).to(dtype) for w in want32]
    eager = _rope(qkv, cos, sin, hq, hkv, d)  # the eager form, rounding after each op
    name = f"{t}x{hq}+{hkv}x{d} {str(dtype).removeprefix('torch.')} pad={pad}"
    cases[name] = {
        "shapes": [list(x.shape) for x in got] == [list(x.shape) for x in eager],
        "contiguous": all(x.is_contiguous() for x in got),
        "dtype": all(x.dtype == dtype for x in got),
        "v_equal": bool(torch.equal(got[2], eager[2])),
        "rounded_once": all(bool(((a == n) | (a == z)).all()) for a, n, z in zip(got, nearest, toward_zero)),
        "equal_fp32": all(bool(torch.equal(a, w)) for a, w in zip(got, want32)) if dtype == torch.float32 else None,
        "max_err_eager": max(float((a.float() - b.float()).abs().max()) for a, b in zip(got, eager)),
        "max_abs": max(float(b.abs().max()) for b in want32),
    }
try:
    rope_qkv(torch.zeros(2, 10), torch.zeros(2, 1, 2), torch.zeros(2, 1, 2), 1, 1, 2)
    cases["refused"] = False
except ValueError as e:
    cases["refused"] = str(e)

def _one_rounding(got: torch.Tensor, want32: torch.Tensor) -> bool:
    """``got`` is ``want32`` rounded once to its dtype: to nearest or toward zero."""
    nearest = want32.to(got.dtype)
    toward_zero = (want32.view(torch.int32) & ~0xFFFF).view(torch.float32).to(got.dtype)
    return bool(((got == nearest) | (got == toward_zero)).all())


silu = {}
# (tokens, width I, dtype, extra columns beside each row): Orpheus-3B's 8,192, the tiny 128, a
# width that is no multiple of the block
for t, width, dtype, pad in ((3, 8192, torch.float32, 0), (2, 8192, torch.bfloat16, 0), (5, 128, torch.bfloat16, 0),
                             (4, 3000, torch.float32, 16), (1, 37, torch.bfloat16, 0)):
    gu = (torch.randn(t, 2 * width + pad, generator=g) * 3).to(dtype)[:, : 2 * width]
    got = silu_mul(gu)
    want32 = _silu_mul(gu.float())
    name = f"{t}x{width} {str(dtype).removeprefix('torch.')} pad={pad}"
    silu[name] = {
        "shape": list(got.shape) == [t, width], "dtype": got.dtype == dtype, "contiguous": got.is_contiguous(),
        # float32: the same to float32 rounding (exp and the division are the interpreter's numpy ones)
        "max_rel_fp32": float(((got.float() - want32).abs() / want32.abs().clamp_min(1e-6)).max()),
        "rounded_once": _one_rounding(got, want32) if dtype == torch.bfloat16 else None,
    }
try:
    silu_mul(torch.zeros(2, 7))
    silu["refused"] = False
except ValueError as e:
    silu["refused"] = str(e)
print(json.dumps({"cases": cases, "silu": silu}))
