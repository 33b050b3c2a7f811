"""A program setting that picks between one of our Triton kernels and a torch form (Qwen3-TTS's
``code_predictor_attention`` and ``codec_attention``, Mimi's ``mimi_attention``): the one check
of its value, the device and Triton's presence that each of them makes."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["triton_asked"]


def triton_asked(ctx: Any, name: str, default: str, other: str, triton: Any) -> bool:
    """Whether setting ``name`` of a load context (``default`` when not given) asks for its
    Triton kernel rather than ``other``; "triton" is refused without CUDA outside Triton's CPU
    interpreter and where Triton (the kernel module's ``triton``) is missing, any other name with
    the two it takes."""
    value = str(ctx.setting(name, default))
    if value == other:
        return False
    if value != "triton":
        raise ValueError(f"{name} must be {other} or triton, got {value!r}")
    if not ctx.device.startswith("cuda") and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"{name}=triton needs a CUDA device (its kernel is Triton's)")
    if triton is None:
        raise ValueError(f"{name}=triton needs Triton (it comes with CUDA torch)")
    return True
