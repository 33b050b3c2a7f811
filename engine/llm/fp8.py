"""fp8 (float8_e4m3fn) weights for the decoder's linear layers (``--quantization fp8``), and the
fp8 KV-cache helpers (``--kv-cache-dtype fp8``).

Scales, kernels and why scale 1.0 suffices for the KV cache: docs/orpheus.md, "fp8 option".
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

__all__ = [
    "FP8_DTYPE",
    "FP8_MAX",
    "Fp8Linear",
    "Fp8Weight",
    "dequantise",
    "fp8_gemm",
    "fp8_linear",
    "fp8_linear_reference",
    "is_fp8",
    "parse_kv_cache_dtype",
    "quantise_decoder_linears_",
    "quantise_rowwise",
    "quantise_weight",
    "resolve_fp8_options",
    "to_fp8_saturated",
]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448.0
_MIN_AMAX = 1e-12  # an all-zero row gets a tiny scale instead of a division by zero
LINEAR_NAMES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def is_fp8(dtype: torch.dtype) -> bool:
    """True for the float8 dtypes."""
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def parse_kv_cache_dtype(name: str | torch.dtype | None, model_dtype: torch.dtype) -> torch.dtype:
    """``"auto"``/None -> the model's dtype; ``"fp8"`` -> float8_e4m3fn; a torch dtype as is."""
    if name is None or name == "auto":
        return model_dtype
    if isinstance(name, torch.dtype):
        return name
    if name in ("fp8", "fp8_e4m3"):
        return FP8_DTYPE
    raise ValueError(f"kv_cache_dtype must be 'auto' or 'fp8', got {name!r}")


def resolve_fp8_options(kv_cache_dtype: str | None, quantization: str | None, *, device: str,
                        dtype: torch.dtype) -> tuple[torch.dtype, bool]:
    """Validate the fp8 options for a model about to be served; ``(kv cache dtype, quantise weights)``.

    Both options need CUDA and a bf16 model; fp8 weights need compute capability 8.9 or newer
    (Ada, Hopper: ``torch._scaled_mm``). Raises ``ValueError`` with the reason otherwise, at
    start-up rather than in the first step.
    """
    kv_name = kv_cache_dtype or "auto"
    quant = quantization or "none"
    if quant not in ("none", "fp8"):
        raise ValueError(f"quantization must be 'none' or 'fp8', got {quant!r}")
    kv_dtype = parse_kv_cache_dtype(kv_name, dtype)
    wanted = [n for n, on in (("kv_cache_dtype fp8", is_fp8(kv_dtype)), ("quantization fp8", quant == "fp8")) if on]
    if not wanted:
        return kv_dtype, False
    what = " and ".join(wanted)
    if device != "cuda" or not torch.cuda.is_available():
        raise ValueError(f"{what}: needs a CUDA GPU (device is {device}); the CPU serves bf16/fp32 only")
    if dtype != torch.bfloat16:
        raise ValueError(f"{what}: needs dtype bfloat16 (got {dtype}); use --dtype auto or bfloat16")
    if quant == "fp8" and torch.cuda.get_device_capability() < (8, 9):
        cap = ".".join(map(str, torch.cuda.get_device_capability()))
        raise ValueError(f"quantization fp8 needs compute capability >= 8.9 (fp8 GEMMs), this GPU has {cap}")
    return kv_dtype, quant == "fp8"


def to_fp8_saturated(x: Tensor) -> Tensor:
    """``x`` cast to float8_e4m3fn, values beyond +-448 clamped (a plain cast gives NaN on CUDA)."""
    return x.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def quantise_rowwise(x: Tensor) -> tuple[Tensor, Tensor]:
    """Per-row fp8 quantisation: ``x [M, K]`` -> ``(x8 [M, K] fp8, scale [M, 1] float32)``.

    ``x ~= x8.float() * scale``; each row's largest magnitude maps to 448.
    """
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp(min=_MIN_AMAX) / FP8_MAX  # [M, 1]
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def quantise_weight(w: Tensor) -> tuple[Tensor, Tensor]:
    """A linear weight ``[N, K]`` -> ``(w8 [N, K] fp8, scale [N] float32)``, one scale per output channel."""
    if w.dim() != 2:
        raise ValueError(f"expected a 2-D weight [out, in], got shape {tuple(w.shape)}")
    w8, scale = quantise_rowwise(w)
    return w8.contiguous(), scale.view(-1).contiguous()


def dequantise(x8: Tensor, scale: Tensor) -> Tensor:
    """float32 ``x8 * scale``; ``scale`` is [M, 1] (activations) or [N] (a weight's rows)."""
    s = scale.view(-1, 1) if scale.dim() == 1 else scale
    return x8.float() * s


def fp8_gemm(x8: Tensor, x_scale: Tensor, w8: Tensor, w_scale: Tensor, *, out_dtype: torch.dtype,
             use_scaled_mm: bool) -> Tensor:
    """``(x8 * x_scale) @ (w8 * w_scale[:, None]).T`` -> ``[M, N]`` in ``out_dtype``.

    x8 [M, K] fp8, x_scale [M, 1] f32, w8 [N, K] fp8, w_scale [N] f32. ``use_scaled_mm``:
    ``torch._scaled_mm`` with row-wise scales (needs bf16 output; K and N multiples of 16);
    otherwise the float32 dequantised reference.
    """
    if use_scaled_mm:
        return torch._scaled_mm(x8, w8.t(), scale_a=x_scale, scale_b=w_scale.view(1, -1), out_dtype=out_dtype)
    return (dequantise(x8, x_scale) @ dequantise(w8, w_scale).t()).to(out_dtype)


def _flat(x: Tensor) -> Tensor:
    return x.reshape(-1, x.shape[-1])


def fp8_linear(x: Tensor, w8: Tensor, w_scale: Tensor, *, use_scaled_mm: bool | None = None) -> Tensor:
    """``F.linear(x, W)`` with fp8 weights: ``x [..., K]`` -> ``[..., N]`` in ``x``'s dtype.

    Activations are quantised per row first. ``use_scaled_mm`` defaults to "x is on CUDA";
    ``torch._scaled_mm``'s row-wise path needs bf16 activations.
    """
    if use_scaled_mm is None:
        use_scaled_mm = x.is_cuda
    x8, xs = quantise_rowwise(_flat(x))  # [M, K], [M, 1]
    out = fp8_gemm(x8, xs, w8, w_scale, out_dtype=x.dtype, use_scaled_mm=use_scaled_mm)  # [M, N]
    return out.view(*x.shape[:-1], w8.shape[0])


def fp8_linear_reference(x: Tensor, w8: Tensor, w_scale: Tensor) -> Tensor:
    """The pure-torch path of ``fp8_linear`` (quantise, dequantise, float32 matmul)."""
    return fp8_linear(x, w8, w_scale, use_scaled_mm=False)


class Fp8Weight(NamedTuple):
    """A quantised linear weight: ``weight [N, K]`` float8_e4m3fn, ``scale [N]`` float32."""

    weight: Tensor
    scale: Tensor


class Fp8Linear(nn.Module):
    """Bias-free linear layer with an fp8 weight and per-output-channel scales (buffers).

    ``use_scaled_mm`` None picks ``torch._scaled_mm`` on CUDA and the reference on the CPU.
    """

    def __init__(self, weight: Tensor, scale: Tensor, *, use_scaled_mm: bool | None = None) -> None:
        super().__init__()
        if weight.dtype != FP8_DTYPE or scale.shape != weight.shape[:1]:
            raise ValueError("Fp8Linear needs an fp8 weight [N, K] and a float32 scale [N]")
        self.in_features, self.out_features = int(weight.shape[1]), int(weight.shape[0])
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale", scale.float())
        self.use_scaled_mm = use_scaled_mm

    @classmethod
    def from_linear(cls, linear: nn.Linear, **kw: Any) -> Fp8Linear:
        if linear.bias is not None:
            raise ValueError("Fp8Linear has no bias")
        w8, scale = quantise_weight(linear.weight.detach())
        return cls(w8, scale, **kw)

    def forward(self, x: Tensor) -> Tensor:
        return fp8_linear(x, self.weight, self.weight_scale, use_scaled_mm=self.use_scaled_mm)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8_e4m3 row-wise"


def _set(root: nn.Module, dotted: str, module: nn.Module) -> None:
    parent, _, name = dotted.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, module)


@torch.no_grad()
def quantise_decoder_linears_(model: Any, *, use_scaled_mm: bool | None = None) -> Any:
    """Replace the q/k/v/o and gate/up/down projections of every decoder layer by ``Fp8Linear``.

    In place; returns ``model``; on CUDA the freed memory goes back to the driver
    (``empty_cache``), so ``num_pages_for_memory`` sees it. A fused forward already built for this model
    (``model._fused_forward``) is dropped, since it holds the old bf16 weights: build runners
    after quantising. Layers that are already fp8 are left alone (idempotent).
    """
    for layer in model.model.layers:
        for name in LINEAR_NAMES:
            old = layer.get_submodule(name)
            if isinstance(old, Fp8Linear):
                continue
            _set(layer, name, Fp8Linear.from_linear(old, use_scaled_mm=use_scaled_mm))
            del old
    if getattr(model, "_fused_forward", None) is not None:
        model._fused_forward = None
    model.quantization = "fp8"
    if model.model.embed_tokens.weight.is_cuda:
        # Hand the freed bf16 weights back to the driver: the KV cache is sized from
        # torch.cuda.mem_get_info, which counts the caching allocator's free blocks as used.
        torch.cuda.empty_cache()
    return model
