"""--max-model-len auto: a program's ``model_len`` and the runtime taking the length it returns."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from engine.llm.program import DEFAULT_MAX_MODEL_LEN, LoadContext, ProgramModel, model_len


def _ctx(max_model_len: int, auto: bool) -> LoadContext:
    return LoadContext(model_id="m", device="cpu", dtype=torch.float32, load_format="dummy", max_num_seqs=1,
                       max_model_len=max_model_len, quantise_fp8=False, use_graphs=False,
                       setting=lambda name, default: default, max_model_len_auto=auto)


def test_auto_takes_the_fewer_of_the_default_and_the_models_positions() -> None:
    assert model_len(_ctx(DEFAULT_MAX_MODEL_LEN, True), 1024) == 1024
    assert model_len(_ctx(DEFAULT_MAX_MODEL_LEN, True), 131072) == DEFAULT_MAX_MODEL_LEN
    assert model_len(_ctx(DEFAULT_MAX_MODEL_LEN, True), 1024, extendable=True) == 1024


def test_an_asked_length_is_kept_or_refused_naming_the_flag() -> None:
    assert model_len(_ctx(512, False), 1024) == 512
    assert model_len(_ctx(4096, False), 2048, extendable=True) == 4096  # (the program warns)
    with pytest.raises(ValueError, match=r"--max-model-len 4096 exceeds the model's 2048 positions: pass 2048 or less"):
        model_len(_ctx(4096, False), 2048)


def test_the_runtime_serves_the_programs_length_and_refuses_a_longer_one() -> None:
    """A load that returns a shorter row length sets the scheduler's; one longer than asked is a
    program bug the build names."""
    from engine.llm.build import build_lm_backend
    from models.voxcpm2.build import load

    def returning(n: int) -> Any:
        def wrapped(ctx: LoadContext) -> ProgramModel:
            return dataclasses.replace(load(ctx), max_model_len=n)
        return wrapped

    b = build_lm_backend(returning(256), "tiny", device="cpu", load_format="dummy", max_num_seqs=1,
                         max_model_len=512, warmup=False)
    assert b.scheduler.config.max_model_len == 256
    with pytest.raises(ValueError, match=r"returned max_model_len=1024, not in \[2, 512\)"):
        build_lm_backend(returning(1024), "tiny", device="cpu", load_format="dummy", max_num_seqs=1,
                         max_model_len=512, warmup=False)
