"""The Qwen3-TTS codec's Triton convolution (``codec_conv=triton``): run in Triton's CPU
interpreter, in the venv ``make_triton_venv.sh`` builds (CI builds it), against torch's
convolution and the channels-last step with gathered taps (itself tested against the reference
in test_qwen3_codec.py); and refused without CUDA outside the interpreter."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.triton_interpreter import run_interpreted

# The module's interpreter run (a fixture) lands on its first test: minutes in Triton's CPU
# interpreter (4 min 43 s alone on a 2-core machine for the Qwen3 runner), past the suite's
# 300 s default.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted(Path(__file__).resolve().parent / "triton_run.py")


def test_the_triton_convolution_equals_torchs(interpreted: dict) -> None:
    """Taps read in place equal ``F.conv1d`` over odd channel counts, dilations 1, 3 and 9, with
    and without bias: float32 within 1e-6 relative, float16 within its rounding."""
    errors = interpreted["kernel"]
    assert len(errors) == 5
    for case, err in errors.items():
        assert err < (2e-3 if "float16" in case else 1e-6), (case, err)


def test_the_codec_step_with_it_equals_the_step_with_gathered_taps(interpreted: dict) -> None:
    """The channels-last codec step streamed over 12 frames with ``conv="triton"`` (every dense
    convolution of more than one tap and every transposed one with a state through the kernel)
    equals ``conv="gemm"`` within 1e-5
    relative, on audio that is neither silent nor clipped."""
    assert interpreted["triton_calls"] >= 12
    assert interpreted["codec_finite"]
    assert 1e-3 < interpreted["codec_std"] and interpreted["codec_peak"] < 0.99
    assert interpreted["codec"] < 1e-5


def test_the_residual_and_the_next_snakebeta_folded_in_equal_them_apart(interpreted: dict) -> None:
    """``conv_taps`` with ``residual`` and ``snake_out`` (``codec_conv=fused``) equals torch's
    convolution, then the sum (rounded to the dtype), then SnakeBeta, for 7 taps with dilation 3
    and for one tap, and with ``state`` (a row's first inputs read from its slot's state, not a
    concatenation: ``fused-state``): float32 within 5e-6 relative (the kernel's sine is not
    torch's: 1.04e-6 seen), float16 within its rounding."""
    errors = interpreted["fused"]
    assert len(errors) == 5  # (the two of more than one tap again with their first inputs in a state)
    for case, err in errors.items():
        assert err < (2e-3 if "float16" in case else 5e-6), (case, err)


def test_the_codec_step_fused_equals_the_step_with_gathered_taps(interpreted: dict) -> None:
    """The streamed step with ``conv="fused"`` (each residual unit's inner SnakeBeta in its first
    convolution's epilogue, its sum in the second's) and with ``conv="fused-state"`` (the states
    read in the kernel too) equals ``conv="gemm"`` within 1e-5 relative over 12 frames."""
    assert interpreted["codec_fused"] < 1e-5
    assert interpreted["codec_fused_state"] < 1e-5


def test_the_code_predictors_one_kernel_attention_equals_its_cache_and_sdpa(interpreted: dict) -> None:
    """``code_predictor_attention=triton``: a frame's 15 codebooks (greedy) through the kernel that
    writes a pass's key and value and attends its grouped query heads equal the cache writes and
    SDPA; every pass's logits within 1e-5 relative in float32."""
    assert interpreted["predictor_codes_equal"] and interpreted["predictor_distinct_codes"] > 5
    assert interpreted["predictor_logits"] < 1e-5


def test_without_cuda_it_is_refused_at_load() -> None:
    """Outside the interpreter, a CPU codec with ``conv="triton"`` fails at load, naming CUDA."""
    from models.qwen3_tts.codec import Codec
    from models.qwen3_tts.codec_nwc import make_codec_stream
    from models.qwen3_tts.config import TINY

    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter is on in this process")
    for conv in ("triton", "fused", "fused-state"):
        with pytest.raises(ValueError, match="CUDA"):
            make_codec_stream(Codec(TINY.codec), 1, layout="nwc", conv=conv, device=torch.device("cpu"))


def test_the_codec_attention_kernel_equals_the_ring_writes_and_attend(interpreted: dict) -> None:
    """``ring_attend`` (``codec_attention=triton``) equals the ring writes and ``_attend`` of
    ``CodecStream._transformer``: grouped queries, a window of 72 (not a power of two), rows
    before their window filled and after it wrapped, slots out of order; float32 within 1e-5
    relative, float16 within its rounding; the new key and value land in the rings exactly."""
    errors = interpreted["ring"]
    assert len(errors) == 6
    for case, err in errors.items():
        if case.endswith("rings"):
            assert err == 0.0, case
        else:
            assert err < (2e-3 if "float16" in case else 1e-5), (case, err)


def test_the_codec_step_with_the_attention_kernel_equals_the_step_without(interpreted: dict) -> None:
    """Three slots starting 0, 3 and 5 frames apart, streamed for 14 frames (every window of 8
    wraps) with ``ring_attend`` equal the same without it within 1e-5 relative, on audio that is
    not silent."""
    assert interpreted["codec_ring_std"] > 1e-3
    assert interpreted["codec_ring"] < 1e-5
