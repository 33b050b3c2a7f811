"""The depth transformer's fused matmuls (``kyutai_depth_gemm=triton``), run in Triton's CPU
interpreter (``tests.triton_interpreter``): each against the torch ops it replaces (the fused
attention of ``triton-attend`` too), a whole
frame and a built head's tokens the same either way; refused without CUDA outside the
interpreter, torch's matmuls by default."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.triton_interpreter import run_interpreted

pytestmark = pytest.mark.timeout(900)  # (the module's interpreter run lands on its first test)


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted(Path(__file__).resolve().parent / "gemm_triton_run.py")


def test_each_kernel_equals_the_torch_ops_it_replaces(interpreted: dict) -> None:
    """The norm and the matmul, the same with the silu-mul, the matmul and the residual sum: rows
    of 1 to 70, widths not multiples of the blocks; float32 within 1e-5 relative, float16 within
    its rounding (the kernels round where the ops do)."""
    fp32, fp16 = interpreted["kernels"]["torch.float32"], interpreted["kernels"]["torch.float16"]
    for name in ("rms", "rms_glu", "residual", "rms_attend"):
        assert fp32[name] < 1e-5, (name, fp32)
        assert fp16[name] < 4e-3, (name, fp16)
    assert fp32["cache_equal"] and fp16["cache_equal"]  # (the attention's keys and values written at k)


def test_mismatched_shapes_are_refused(interpreted: dict) -> None:
    refused = interpreted["refused"]
    assert len(refused) == 4
    assert "do not match" in refused[0] and "two halves" in refused[1] and "residual" in refused[2]
    assert "cache" in refused[3]


def test_a_frame_and_a_head_give_the_same_codes(interpreted: dict) -> None:
    """A sampled frame of the tiny model's 32 codebooks for 4 rows, norms not all ones, with the
    fused matmuls and with the attention fused too; a head built with ``triton-attend``: its
    text and codes equal the same head's with torch's matmuls."""
    assert interpreted["frame_equal"] and interpreted["frame_attend_equal"] and interpreted["frame_distinct_codes"] > 20
    head = interpreted["head"]
    assert head["gemms"] and head["equal"]
    assert all(t >= 0 for row in head["tokens"] for t in row[1:])


def test_without_cuda_it_is_refused_and_torch_is_the_default() -> None:
    from models.kyutai_tts.build import build_kyutai_backend

    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter is on in this process")
    for value, words in (("triton", "CUDA"), ("triton-attend", "CUDA"), ("cublas", "torch, triton, triton-attend")):
        with pytest.raises(ValueError, match=words):
            build_kyutai_backend("tiny", device="cpu", max_num_seqs=2, max_model_len=128, warmup=False,
                                 load_format="dummy", kyutai_n_q=4, kyutai_depth_gemm=value)
    backend = build_kyutai_backend("tiny", device="cpu", max_num_seqs=2, max_model_len=128, warmup=False,
                                   load_format="dummy", kyutai_n_q=4)
    assert backend.runner.head.fns.gemms is None
