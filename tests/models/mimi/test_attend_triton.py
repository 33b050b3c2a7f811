"""Mimi's decoder-transformer ring kernel (``mimi_attention=triton``), run in Triton's CPU
interpreter (``tests.triton_interpreter``): against the ring writes and the masked SDPA it
replaces, and the streamed decode with it against the decode without; the setting refused
without CUDA outside the interpreter, and a bad name."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.triton_interpreter import run_interpreted

pytestmark = pytest.mark.timeout(900)  # (the interpreter run lands on the module's first test)


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted(Path(__file__).resolve().parent / "triton_run.py")


def test_the_kernel_equals_the_ring_writes_and_the_masked_sdpa(interpreted: dict) -> None:
    """One, two and three steps a row, Mimi's real head shape and window (8 x 64, 250) and a toy
    one, rows before their window filled and after it wrapped: float32 within 1e-6 relative,
    float16 within its rounding; the rings hold exactly the keys and values the writes put there."""
    kernel = interpreted["kernel"]
    assert len(kernel) == 10
    for case, err in kernel.items():
        if case.endswith("rings"):
            assert err == 0.0, case
        else:
            assert err < (3e-3 if "float16" in case else 1e-6), (case, err)


def test_the_streamed_decode_with_it_equals_the_decode_without(interpreted: dict) -> None:
    """Three slots starting two frames apart, 11 frames each (the window wraps several times):
    the audio within 1e-5 relative, and not silent."""
    assert interpreted["stream_finite"] and interpreted["stream_std"] > 1e-3
    assert interpreted["stream"] < 1e-5


def _ctx(device: str, **given):
    return SimpleNamespace(device=device, setting=lambda name, default: given.get(name, default))


def test_the_setting() -> None:
    """``mimi_attention``: "sdpa" by default on every device; "triton" refused without CUDA
    outside the interpreter and where Triton is missing; another name refused with the two it
    takes."""
    from models.mimi import attend_triton
    from models.mimi.attend_triton import attention_setting

    assert attention_setting(_ctx("cuda")) == "sdpa" and attention_setting(_ctx("cpu")) == "sdpa"
    with pytest.raises(ValueError, match="sdpa or triton"):
        attention_setting(_ctx("cuda", mimi_attention="flash"))
    if os.environ.get("TRITON_INTERPRET") != "1":
        with pytest.raises(ValueError, match="CUDA"):
            attention_setting(_ctx("cpu", mimi_attention="triton"))
    if attend_triton.triton is None:
        with pytest.raises(ValueError, match="needs Triton"):
            attention_setting(_ctx("cuda", mimi_attention="triton"))
    else:
        assert attention_setting(_ctx("cuda", mimi_attention="triton")) == "triton"


def test_a_stream_refuses_an_unknown_attention() -> None:
    from models.mimi.codec import Mimi
    from models.mimi.config import TINY
    from models.mimi.stream import MimiDecodeStream

    with pytest.raises(ValueError, match="attention must be one of"):
        MimiDecodeStream(Mimi(TINY), 2, attention="flash")
