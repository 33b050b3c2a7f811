"""Run by tests/models/orpheus/test_layer_norm_triton.py in the Triton venv with TRITON_INTERPRET=1:
``layer_triton.add_rmsnorm`` against ``fused_forward._add_rmsnorm`` / ``_rmsnorm`` and, quantising,
against ``engine.llm.fp8.quantise_rowwise`` of them; ``silu_mul`` quantising and ``quantise_rows``
likewise. The kernels quantise to float32 here (the values before their cast to fp8): the
interpreter's own float32-to-fp8 cast is not a GPU's (it rounds ties away from zero and takes
127.9 to 64), so the cast is torch's, applied to both sides. The reference is the eager form with
its bfloat16 roundings made toward zero (``_toward_zero``), as the interpreter casts float32 to
bfloat16, or to nearest: the kernel must equal one of the two. Prints one JSON object."""

from __future__ import annotations

import json
import os

import torch

assert os.environ.get("TRITON_INTERPRET") == "1"
from engine.llm.fp8 import FP8_DTYPE, quantise_rowwise  # noqa: E402
from models.orpheus.layer_triton import add_rmsnorm, quantise_rows, silu_mul  # noqa: E402

g = torch.Generator().manual_seed(0)


def _toward_zero(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 ``x`` to ``dtype`` as the interpreter rounds (bfloat16: the low 16 bits dropped)."""
    if dtype != torch.bfloat16:
        return x.to(dtype)
    return (x.float().contiguous().view(torch.int32) & ~0xFFFF).view(torch.float32).to(dtype)


def _nearest(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype)


def _norm_ref(x, residual, w, eps, rnd):
    """``fused_forward._add_rmsnorm`` (``_rmsnorm`` without a residual) with each of its
    roundings to the activations' dtype made by ``rnd``."""
    dt = x.dtype
    r = rnd(x.float() + residual.float(), dt) if residual is not None else x
    h = r.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return rnd(w.float() * rnd(h, dt).float(), dt), (r if residual is not None else None)


def _ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """The most units in the last place of ``a``'s dtype between two tensors of it."""
    ia = a.contiguous().view(torch.int16 if a.element_size() == 2 else torch.int32).long()
    ib = b.contiguous().view(torch.int16 if b.element_size() == 2 else torch.int32).long()
    return int((ia - ib).abs().max()) if a.numel() else 0


def _quant_ref(y: torch.Tensor):
    """``quantise_rowwise`` of ``y`` with the scaled values kept in float32 (before the cast)."""
    x8, scale = quantise_rowwise(y)
    return (y.float() / scale).clamp(-448.0, 448.0), scale, x8


def _quant_case(got_pre, got_scale, y_ref):
    want_pre, want_scale, want_x8 = _quant_ref(y_ref)
    return {
        "scale_shape": list(got_scale.shape) == [y_ref.shape[0], 1] and got_scale.dtype == torch.float32,
        "scale_rel": float(((got_scale - want_scale).abs() / want_scale).max()),
        "pre_rel": float(((got_pre - want_pre).abs() / want_pre.abs().clamp_min(1e-3)).max()),
        "pre_max_abs": float(got_pre.abs().max()),
        # torch's fp8 cast of the kernel's values: the same bytes as quantise_rowwise's but for
        # values within a float32 rounding of a tie
        "x8_equal_share": float((got_pre.to(FP8_DTYPE).view(torch.uint8) == want_x8.view(torch.uint8)).float().mean()),
    }


norm = {}
# (tokens, width D, dtype, residual, extra columns beside each row): Orpheus-3B's 3,072 (block
# 4,096, masked), the tiny 64, one row, no residual (the first layer), a strided x
for t, width, dtype, with_res, pad in ((3, 3072, torch.bfloat16, True, 0), (4, 3072, torch.float32, True, 0),
                                       (5, 64, torch.bfloat16, True, 0), (1, 3072, torch.bfloat16, False, 0),
                                       (2, 200, torch.bfloat16, True, 8)):
    x = (torch.randn(t, width + pad, generator=g) * 2).to(dtype)[:, :width]
    res = (torch.randn(t, width, generator=g) * 4).to(dtype) if with_res else None
    w = (1.0 + 0.2 * torch.randn(width, generator=g)).to(dtype)
    eps = 1e-5
    name = f"{t}x{width} {str(dtype).removeprefix('torch.')} residual={with_res} pad={pad}"
    y, r = add_rmsnorm(x, res, w, eps)
    refs = [_norm_ref(x, res, w, eps, rnd) for rnd in (_toward_zero, _nearest)]
    case = {
        "dtype": y.dtype == dtype and (r is None or r.dtype == dtype),
        "r_none": r is None if not with_res else None,
        "r_equal": any(bool(torch.equal(r, ref[1])) for ref in refs) if with_res else None,
        # the reduction's order is the kernel's: at most one unit in the last place from either rounding
        "y_ulps": min(_ulps(y, ref[0]) for ref in refs),
        "y_equal_share": max(float((y == ref[0]).float().mean()) for ref in refs),
    }
    (pre, scale), r8 = add_rmsnorm(x, res, w, eps, quantise=torch.float32)
    case["r_same_quantising"] = bool(torch.equal(r8, r)) if with_res else None
    case.update(_quant_case(pre, scale, y))  # against quantise_rowwise of the kernel's own y
    (x8, _), _ = add_rmsnorm(x, res, w, eps, quantise=FP8_DTYPE)
    case["fp8_dtype"] = x8.dtype == FP8_DTYPE and list(x8.shape) == [t, width]
    norm[name] = case
for bad, why in (((torch.zeros(2, 8), None, torch.ones(7)), "weight"), ((torch.zeros(2, 8), torch.zeros(3, 8), torch.ones(8)), "residual")):
    try:
        add_rmsnorm(*bad, 1e-5)
        norm[f"refused {why}"] = False
    except ValueError as e:
        norm[f"refused {why}"] = str(e)

silu_q = {}
for t, width, dtype, pad in ((3, 8192, torch.bfloat16, 0), (2, 128, torch.float32, 0), (4, 3000, torch.bfloat16, 16)):
    gu = (torch.randn(t, 2 * width + pad, generator=g) * 3).to(dtype)[:, : 2 * width]
    y = silu_mul(gu)  # the kernel's activation (test_layer_triton checks it against _silu_mul)
    pre, scale = silu_mul(gu, quantise=torch.float32)
    case = _quant_case(pre, scale, y)
    case["fp8_dtype"] = silu_mul(gu, quantise=FP8_DTYPE)[0].dtype == FP8_DTYPE
    silu_q[f"{t}x{width} {str(dtype).removeprefix('torch.')} pad={pad}"] = case

rows = {}
for t, width, dtype, zero_row in ((3, 3072, torch.bfloat16, False), (2, 64, torch.float32, True), (1, 24, torch.bfloat16, False)):
    x = (torch.randn(t, width, generator=g) * 5).to(dtype)
    if zero_row:
        x[0] = 0  # the smallest scale, no division by zero
    pre, scale = quantise_rows(x, torch.float32)
    case = _quant_case(pre, scale, x)
    case["finite"] = bool(torch.isfinite(pre).all())
    rows[f"{t}x{width} {str(dtype).removeprefix('torch.')} zero_row={zero_row}"] = case
try:
    quantise_rows(torch.zeros(2, 8), torch.bfloat16)
    rows["refused dtype"] = False
except ValueError as e:
    rows["refused dtype"] = str(e)


def _forwards() -> dict:
    """The tiny model's whole fused forward (eager, compile=False) with every kernel against
    without, bf16 and fp8 weights (the fp8 GEMM's float32 reference): bf16 within its roundings;
    fp8 within what the interpreter's fp8 cast (above) moves, and the kernels called."""
    from engine.llm.fp8 import quantise_decoder_linears_
    from models.orpheus import layer_triton
    from models.orpheus.config import TINY
    from models.orpheus.fused_forward import FusedLlamaForward
    from models.orpheus.llama import LlamaModel
    from tests.models.orpheus.dense_attention import causal_attention

    calls = {"add_rmsnorm": 0, "quantise_rows": 0, "silu_mul": 0}
    for fn in calls:  # the forward imports them at set_* time: count through the module
        def counted(*a, _f=getattr(layer_triton, fn), _n=fn, **k):
            calls[_n] += 1
            return _f(*a, **k)
        setattr(layer_triton, fn, counted)
    ids, pos = torch.randint(0, 1000, (5,), generator=g), torch.arange(5)

    out = {}
    for kind in ("bf16", "fp8"):
        model = LlamaModel(TINY, max_seq_len=64).init_random_(seed=0).eval().to(torch.bfloat16)
        if kind == "fp8":
            quantise_decoder_linears_(model, use_scaled_mm=False)
        fwd = FusedLlamaForward(model, compile=False, use_scaled_mm=False)
        with torch.inference_mode():
            want = fwd(ids, pos, causal_attention).float()
            fwd.set_norm("triton")
            fwd.set_silu_mul("triton")
            before = dict(calls)
            got = fwd(ids, pos, causal_attention).float()
        layers = TINY.num_hidden_layers
        out[kind] = {
            "is_fp8": fwd.is_fp8,
            # a layer: two norms, one SiLU-mul, one quantisation of the attention's output (fp8);
            # then the final norm
            "calls": {n: calls[n] - before[n] for n in calls},
            "expected_calls": {"add_rmsnorm": 2 * layers + 1, "silu_mul": layers,
                               "quantise_rows": layers if kind == "fp8" else 0},
            "max_abs_err": float((got - want).abs().max()),
            "scale": float(want.abs().max()),
            "finite": bool(torch.isfinite(got).all()),
        }
    return out


print(json.dumps({"norm": norm, "silu_q": silu_q, "rows": rows, "forwards": _forwards()}))
