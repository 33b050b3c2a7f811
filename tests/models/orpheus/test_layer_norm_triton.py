"""The residual add, RMSNorm and fp8 quantisation kernels of the fused layer (``orpheus_norm=triton``,
and ``orpheus_silu_mul=triton`` with fp8 weights), run in Triton's CPU interpreter
(``tests.triton_interpreter``): the same activations as the fused forward's eager forms with
their bfloat16 roundings, the same row-wise quantisation as ``engine.llm.fp8.quantise_rowwise``
(values before the fp8 cast: the interpreter's own cast is not a GPU's), the whole tiny forward
with the kernels against without; the setting's values checked."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.models.orpheus.dense_attention import causal_attention
from tests.triton_interpreter import run_interpreted

pytestmark = pytest.mark.timeout(900)  # (the module's interpreter run lands on its first test)


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted(Path(__file__).resolve().parent / "layer_norm_triton_run.py")


def _quantised_as_quantise_rowwise(c: dict, name: str) -> None:
    assert c["scale_shape"], name
    assert c["scale_rel"] <= 1e-6 and c["pre_rel"] <= 1e-6, name
    assert c["pre_max_abs"] == 448.0, name  # each row's largest magnitude maps to fp8's largest
    assert c["x8_equal_share"] >= 0.999, name


def test_add_rmsnorm_is_the_eager_form(interpreted: dict) -> None:
    """Orpheus-3B's width (3,072: a block of 4,096 masked), the tiny one, one row without a
    residual (the first layer), a strided x; bfloat16 and float32: the residual sum equal, the
    normalised row equal to the eager form's with its roundings, within one unit in the last
    place; quantising, the same residual and quantise_rowwise of that row."""
    cases = {k: v for k, v in interpreted["norm"].items() if not k.startswith("refused")}
    assert len(cases) == 5
    for name, c in cases.items():
        assert c["dtype"], name
        if "residual=True" in name:
            assert c["r_equal"] and c["r_same_quantising"], name
        else:
            assert c["r_none"], name
        assert c["y_ulps"] <= 1 and c["y_equal_share"] >= 0.99, name
        _quantised_as_quantise_rowwise(c, name)
        assert c["fp8_dtype"], name


def test_bad_shapes_are_refused(interpreted: dict) -> None:
    norm = interpreted["norm"]
    assert "weight (7,) are not [T, D]" in norm["refused weight"]
    assert "the residual (3, 8) is not x's (2, 8)" in norm["refused residual"]
    assert "float8_e4m3fn (or float32" in interpreted["rows"]["refused dtype"]


def test_silu_mul_and_the_attention_output_quantise_as_quantise_rowwise(interpreted: dict) -> None:
    """SiLU-mul quantising its product (Orpheus-3B's 8,192, widths no power of two, a strided
    projection) and the attention's output alone (3,072, an all-zero row: a finite scale)."""
    assert len(interpreted["silu_q"]) == 3
    for name, c in interpreted["silu_q"].items():
        _quantised_as_quantise_rowwise(c, name)
        assert c["fp8_dtype"], name
    rows = {k: v for k, v in interpreted["rows"].items() if not k.startswith("refused")}
    assert len(rows) == 3
    for name, c in rows.items():
        assert c["finite"], name
        if "zero_row=True" in name:  # the zero row's values are 0: the others still reach 448
            assert c["scale_shape"] and c["pre_max_abs"] == 448.0, name
        _quantised_as_quantise_rowwise(c, name)


def test_the_tiny_forward_with_the_kernels_is_the_eager_one(interpreted: dict) -> None:
    """The whole forward, bf16 and fp8 weights: every norm, SiLU-mul and (fp8) the attention
    output's quantisation through a kernel, the hidden states within bfloat16's roundings (fp8:
    within what the interpreter's fp8 cast moves, a few percent)."""
    for kind, tol in (("bf16", 0.05), ("fp8", 0.15)):
        c = interpreted["forwards"][kind]
        assert c["is_fp8"] == (kind == "fp8")
        assert c["calls"] == c["expected_calls"], kind
        assert c["finite"] and c["max_abs_err"] <= tol * c["scale"], (kind, c)


def test_an_unknown_norm_setting_is_refused_before_the_weights_load() -> None:
    from models.orpheus.build import build_orpheus_backend

    with pytest.raises(ValueError, match="orpheus_norm 'fast': expected one of compiled, triton"):
        build_orpheus_backend("tiny", device="cpu", load_format="dummy", max_num_seqs=2, max_model_len=64,
                              orpheus_norm="fast")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fp8", [False, True])
def test_on_cuda_the_forward_with_the_norm_kernels_is_the_compiled_ones(fp8: bool) -> None:
    """The tiny model's fused forward on the GPU (bf16, and fp8 weights through
    ``torch._scaled_mm``), the norm, SiLU-mul and quantisation kernels against the compiled
    forms: the same hidden states to the activations' rounding (fp8: its own)."""
    from engine.llm.fp8 import quantise_decoder_linears_
    from models.orpheus.config import TINY
    from models.orpheus.fused_forward import FusedLlamaForward
    from models.orpheus.llama import LlamaModel

    model = LlamaModel(TINY, max_seq_len=64).init_random_(seed=0).eval().to("cuda", torch.bfloat16)
    if fp8:
        quantise_decoder_linears_(model)
    fwd = FusedLlamaForward(model)
    ids = torch.randint(0, 1000, (9,), device="cuda")
    pos = torch.arange(9, device="cuda")

    with torch.inference_mode():
        want = fwd(ids, pos, causal_attention)
        fwd.set_norm("triton")
        fwd.set_silu_mul("triton")
        got = fwd(ids, pos, causal_attention)
    tol = 0.1 if fp8 else 0.05
    assert torch.allclose(got.float(), want.float(), rtol=tol, atol=tol)
