"""The runtime's kernel choices by name (the decode attention its CUDA graphs capture, how a step's
keys and values are written) and what "auto" means for them: the program's choice
(``ServingDefaults``) on CUDA where Triton imports, the FlashInfer and torch kernels elsewhere.
Imports neither torch nor msgpack, so that ``engine.config``, the CLI and a program's defaults
check names without them."""

from __future__ import annotations

__all__ = ["DECODE_ATTENTION_KERNELS", "KV_WRITE_KINDS", "check_kernel", "resolve_kernel"]

# The decode attention in the CUDA graphs (``engine.llm.cuda_graphs.graph_decode_attention``):
# FlashInfer's decode kernel ("cuda-cores") or its prefill kernel ("tensor-cores"), or the
# runtime's Triton kernel (``engine.llm.decode_attention_triton``)
DECODE_ATTENTION_KERNELS = ("cuda-cores", "tensor-cores", "triton")
# How a step's keys and values are stored (``engine.llm.attention.set_kv_write``): two index_put
# kernels a layer, or one Triton kernel (``engine.llm.kv_write_triton``)
KV_WRITE_KINDS = ("index", "triton")
_FALLBACK = {"decode_attention": "cuda-cores", "kv_write": "index"}  # "auto" off CUDA or without Triton
_KINDS = {"decode_attention": DECODE_ATTENTION_KERNELS, "kv_write": KV_WRITE_KINDS}


def check_kernel(name: str, value: str, *, auto: bool = True) -> str:
    """``value`` for the setting ``name`` ("decode_attention" or "kv_write"), or a ValueError
    naming the choices; "auto" is one of them where ``auto``."""
    kinds = _KINDS[name]
    allowed = (("auto",) if auto else ()) + kinds
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def resolve_kernel(name: str, asked: str, program_default: str, *, cuda: bool, triton_imports: bool) -> str:
    """The kernel a backend uses for ``name``: ``asked`` unless it is "auto"; for "auto", the
    program's default on CUDA (a Triton one only where Triton imports), else the FlashInfer / torch
    kernel (``_FALLBACK``)."""
    check_kernel(name, asked)
    if asked != "auto":
        return asked
    check_kernel(name, program_default, auto=False)
    if not cuda or (program_default == "triton" and not triton_imports):
        return _FALLBACK[name]
    return program_default
