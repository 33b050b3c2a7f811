"""The fused layer's Triton kernels (``orpheus_rope=triton``, ``orpheus_silu_mul=triton``), run in
Triton's CPU interpreter (``tests.triton_interpreter``): the same q, k and v as the fused
forward's ``_rope``, exactly in float32 and within one rounding of it in bfloat16; the same
SiLU-mul as ``_silu_mul`` to float32 rounding, within one bfloat16 rounding; the settings'
values checked."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.models.orpheus.dense_attention import causal_attention
from tests.triton_interpreter import run_interpreted

pytestmark = pytest.mark.timeout(900)  # (the module's interpreter run lands on its first test)


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted(Path(__file__).resolve().parent / "layer_triton_run.py")


def test_it_rotates_as_the_fused_forward(interpreted: dict) -> None:
    """Orpheus-3B's 24 + 8 heads of 128 and small layouts (heads not a power of two, a head of
    24), one token and several, the projection a strided view: float32 equal to ``_rope``;
    bfloat16 the float32 result rounded once (never off by more than a rounding), the values
    copied unchanged; q, k and v contiguous in the input's dtype."""
    cases = {k: v for k, v in interpreted["cases"].items() if k != "refused"}
    assert len(cases) == 6
    for name, c in cases.items():
        assert c["shapes"] and c["contiguous"] and c["dtype"] and c["v_equal"], name
        assert c["rounded_once"], name
        if "float32" in name:
            assert c["equal_fp32"], name
        else:  # the eager form rounds after each op: within a few bfloat16 steps of the values' size
            assert c["max_err_eager"] <= c["max_abs"] * 2 ** -6, name


def test_a_projection_of_the_wrong_width_is_refused(interpreted: dict) -> None:
    assert "is not [T, 6]" in interpreted["cases"]["refused"]


def test_silu_mul_is_the_fused_forwards(interpreted: dict) -> None:
    """Orpheus-3B's width (8,192), the tiny one, widths that are no multiple of the kernel's
    block, one row and several, the projection a strided view; an odd width refused."""
    cases = {k: v for k, v in interpreted["silu"].items() if k != "refused"}
    assert len(cases) == 5
    for name, c in cases.items():
        assert c["shape"] and c["dtype"] and c["contiguous"], name
        if "float32" in name:
            assert c["max_rel_fp32"] < 1e-6, name
        else:  # one rounding to bfloat16 (8 bits): at most 2^-7 of the value, toward zero
            assert c["max_rel_fp32"] <= 2 ** -7, name
            assert c["max_rel_fp32"] > 0, name  # (it was rounded: the comparison is not vacuous)
    assert "is not [T, 2I]" in interpreted["silu"]["refused"]


def test_an_unknown_setting_is_refused_before_the_weights_load() -> None:
    from models.orpheus.build import build_orpheus_backend

    with pytest.raises(ValueError, match="orpheus_rope 'fast': expected one of compiled, triton"):
        build_orpheus_backend("tiny", device="cpu", load_format="dummy", max_num_seqs=2, max_model_len=64,
                              orpheus_rope="fast")
    with pytest.raises(ValueError, match="orpheus_silu_mul 'fast': expected one of compiled, triton"):
        build_orpheus_backend("tiny", device="cpu", load_format="dummy", max_num_seqs=2, max_model_len=64,
                              orpheus_silu_mul="fast")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_the_forward_is_the_compiled_ones() -> None:
    """The tiny model's fused forward on the GPU in bfloat16, the kernels against the compiled
    rotation and SiLU-mul: the same hidden states to bfloat16 rounding."""
    from models.orpheus.config import TINY
    from models.orpheus.fused_forward import FusedLlamaForward
    from models.orpheus.llama import LlamaModel

    model = LlamaModel(TINY, max_seq_len=64).init_random_(seed=0).eval().to("cuda", torch.bfloat16)
    fwd = FusedLlamaForward(model)
    ids = torch.randint(0, 1000, (9,), device="cuda")
    pos = torch.arange(9, device="cuda")

    with torch.inference_mode():
        want, want1 = fwd(ids, pos, causal_attention), fwd(ids[:1], pos[:1], causal_attention)
        fwd.set_rope("triton")
        fwd.set_silu_mul("triton")
        got, got1 = fwd(ids, pos, causal_attention), fwd(ids[:1], pos[:1], causal_attention)  # (one row: the compiled form)
    assert torch.allclose(got.float(), want.float(), rtol=0.05, atol=0.05)
    assert torch.allclose(got1.float(), want1.float(), rtol=0.05, atol=0.05)
