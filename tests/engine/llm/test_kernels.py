"""The runtime's kernel choices (``engine.llm.kernels``): "auto" is the program's on CUDA where
Triton imports and FlashInfer's / torch's elsewhere; names are checked wherever they are given."""

from __future__ import annotations

import pytest

from engine.llm.kernels import DECODE_ATTENTION_KERNELS, KV_WRITE_KINDS, check_kernel, resolve_kernel


def test_auto_takes_the_programs_kernel_on_cuda_with_triton_only() -> None:
    for name, fallback in (("decode_attention", "cuda-cores"), ("kv_write", "index")):
        assert resolve_kernel(name, "auto", "triton", cuda=True, triton_imports=True) == "triton"
        assert resolve_kernel(name, "auto", "triton", cuda=True, triton_imports=False) == fallback
        assert resolve_kernel(name, "auto", "triton", cuda=False, triton_imports=True) == fallback
        assert resolve_kernel(name, "auto", fallback, cuda=True, triton_imports=True) == fallback
        # a kernel asked for stands, whatever the program prefers (the build refuses what cannot run)
        assert resolve_kernel(name, fallback, "triton", cuda=True, triton_imports=True) == fallback
        assert resolve_kernel(name, "triton", fallback, cuda=True, triton_imports=True) == "triton"
    assert resolve_kernel("decode_attention", "auto", "tensor-cores", cuda=True, triton_imports=False) == "tensor-cores"
    assert resolve_kernel("decode_attention", "auto", "tensor-cores", cuda=False, triton_imports=False) == "cuda-cores"


def test_unknown_names_are_refused_with_the_choices() -> None:
    assert check_kernel("decode_attention", "auto") == "auto"
    with pytest.raises(ValueError, match="decode_attention must be one of cuda-cores, tensor-cores, triton, got 'auto'"):
        check_kernel("decode_attention", "auto", auto=False)
    with pytest.raises(ValueError, match="kv_write must be one of auto, index, triton, got 'scatter'"):
        resolve_kernel("kv_write", "scatter", "index", cuda=True, triton_imports=True)
    with pytest.raises(ValueError, match="kv_write must be one of index, triton, got 'auto'"):
        resolve_kernel("kv_write", "auto", "auto", cuda=True, triton_imports=True)  # a program's must be a kernel
    assert set(DECODE_ATTENTION_KERNELS) == {"cuda-cores", "tensor-cores", "triton"}
    assert set(KV_WRITE_KINDS) == {"index", "triton"}


def test_serving_defaults_check_their_kernels_and_orpheus_names_the_triton_ones() -> None:
    from engine.llm.program import ServingDefaults
    from models.orpheus.build import ORPHEUS_DEFAULTS

    assert (ServingDefaults().decode_attention, ServingDefaults().kv_write) == ("cuda-cores", "index")
    assert (ORPHEUS_DEFAULTS.decode_attention, ORPHEUS_DEFAULTS.kv_write) == ("triton", "triton")
    with pytest.raises(ValueError, match="decode_attention must be one of cuda-cores"):
        ServingDefaults(decode_attention="flash")
    with pytest.raises(ValueError, match="kv_write must be one of index, triton, got 'auto'"):
        ServingDefaults(kv_write="auto")
