"""The depth transformer's Triton attention (``kyutai_depth_attention=triton``), run in Triton's
CPU interpreter (``tests.triton_interpreter``): against ``attend_sdpa`` per codebook and over a
whole frame's codes; refused without CUDA outside the interpreter."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.triton_interpreter import run_interpreted

# The module's interpreter run (a fixture) lands on its first test: minutes in Triton's CPU
# interpreter (4 min 43 s alone on a 2-core machine for the Qwen3 runner), past the suite's
# 300 s default.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted(Path(__file__).resolve().parent / "triton_run.py")


def test_the_kernel_equals_sdpa_and_writes_the_cache(interpreted: dict) -> None:
    """Every codebook position 0..23: the output within 1e-6 relative in float32 (float16 within
    its rounding), the cache's written positions equal ``attend_sdpa``'s."""
    fp32, fp16 = interpreted["kernel"]["torch.float32"], interpreted["kernel"]["torch.float16"]
    assert fp32["rel"] < 1e-6 and fp16["rel"] < 3e-3
    assert fp32["cache_equal"] and fp16["cache_equal"]


def test_a_frame_decoded_with_it_gives_the_same_codes(interpreted: dict) -> None:
    """A sampled frame of the tiny model's 32 codebooks for 4 rows: the same codes either way."""
    assert interpreted["frame_equal"] and interpreted["frame_distinct_codes"] > 20


def test_the_top_k_draw_kernel_draws_as_top_k_draw(interpreted: dict) -> None:
    """``kyutai_sampling=triton``: the same ids as ``sampling.top_k_draw`` for Kyutai's audio
    card and k of 250, widths not a power of two, k over the width, a greedy row, top-p off, 0.9
    and 0.3; a frame decoded with it gives the same codes."""
    draws = interpreted["draws"]
    assert len(draws) == 9
    for case, (want, got) in draws.items():
        assert got == want, case
    assert len({tuple(w) for w, _ in draws.values()}) > 3  # (top-p and widths change the draws)
    assert interpreted["frame_drawn_equal"]
    head = interpreted["head"]  # a built head with kyutai_sampling=triton: its text and codes
    assert head["triton_draw"] and head["equal"]
    assert all(t >= 0 for row in head["tokens"] for t in row[1:])  # (text and both codebooks drawn)


def test_without_cuda_it_is_refused_and_a_bad_name_too() -> None:
    from models.kyutai_tts.build import build_kyutai_backend

    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter is on in this process")
    for value, words in (("triton", "CUDA"), ("flash", "sdpa or triton")):
        with pytest.raises(ValueError, match=words):
            build_kyutai_backend("tiny", device="cpu", max_num_seqs=2, max_model_len=128, warmup=False,
                                 load_format="dummy", kyutai_n_q=4, kyutai_depth_attention=value)
    for value, words in (("triton", "CUDA"), ("radix", "torch, triton, triton-select")):
        with pytest.raises(ValueError, match=words):
            build_kyutai_backend("tiny", device="cpu", max_num_seqs=2, max_model_len=128, warmup=False,
                                 load_format="dummy", kyutai_n_q=4, kyutai_sampling=value)
    for value, words in (("triton", "CUDA"), ("flash", "sdpa or triton")):  # (Mimi's, models/mimi/attend_triton.py)
        with pytest.raises(ValueError, match=words):
            build_kyutai_backend("tiny", device="cpu", max_num_seqs=2, max_model_len=128, warmup=False,
                                 load_format="dummy", kyutai_n_q=4, mimi_attention=value)


def test_it_is_the_default_on_cuda_where_triton_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing set: each Triton kernel (depth attention, voice cross-attention, top-k draw by bisection) on
    CUDA (the faster steps served on the H200s), torch's forms on the CPU and where Triton is
    missing; a setting given wins."""
    from types import SimpleNamespace

    from models.kyutai_tts import attend_triton, cross_triton, draw_triton
    from models.kyutai_tts.build import cross_attention, depth_attention, sampling

    def ctx(device: str, **given):
        return SimpleNamespace(device=device, setting=lambda name, default: given.get(name, default))

    for pick, module, name, torch_form, on_cuda in (
            (depth_attention, attend_triton, "kyutai_depth_attention", "sdpa", "triton"),
            (cross_attention, cross_triton, "kyutai_cross_attention", "sdpa", "triton"),
            (sampling, draw_triton, "kyutai_sampling", "torch", "triton-select")):
        monkeypatch.setattr(module, "triton", object())
        assert pick(ctx("cuda")) == on_cuda and pick(ctx("cuda:1")) == on_cuda, name
        assert pick(ctx("cpu")) == torch_form, name
        assert pick(ctx("cuda", **{name: torch_form})) == torch_form, name
        monkeypatch.setattr(module, "triton", None)
        assert pick(ctx("cuda")) == torch_form, name
        assert pick(ctx("cpu", **{name: "triton"})) == "triton", name  # (refused later, by the part that needs CUDA)


def test_light_steps_are_kyutais_default_on_cuda_only() -> None:
    """Four light steps in a row for a new turn on CUDA (its head's cheap variants, captured up to
    16 rows), none on the CPU; a count given wins, 0 turns them off."""
    from types import SimpleNamespace

    from engine.llm.build import _light_steps
    from models.kyutai_tts.build import KYUTAI_DEFAULTS

    head = SimpleNamespace(light_until_step=18, variants=(16, 16))
    assert _light_steps(-1, head, KYUTAI_DEFAULTS, "cuda") == {"light_steps_max": 4, "light_until_step": 18,
                                                               "light_max_rows": 16, "light_slack_s": 0.05}
    assert _light_steps(-1, head, KYUTAI_DEFAULTS, "cpu") == {}
    assert _light_steps(0, head, KYUTAI_DEFAULTS, "cuda") == {}
    assert _light_steps(2, head, KYUTAI_DEFAULTS, "cpu")["light_steps_max"] == 2


def test_the_voice_cross_attention_kernel_equals_the_masked_sdpa(interpreted: dict) -> None:
    """``kyutai_cross_attention=triton``: each token attends over its own voice's keys only, equal
    to ``VoiceBank.attend``'s SDPA over every voice with the others masked, within 1e-5 relative in
    float32 (float16 within its rounding), for one token, blocks with one voice unused, blocks
    that span several programs, and a bank length not a multiple of the kernel's 64 keys."""
    cross = interpreted["cross"]
    assert cross["torch.float32"]["rel"] < 1e-5 and cross["torch.float16"]["rel"] < 3e-3
    assert "sdpa or triton" in cross["bad_name"]


def test_the_voice_cross_attention_kernel_is_refused_without_cuda() -> None:
    import torch

    from models.kyutai_tts.conditioning import VoiceBank

    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter is on in this process")
    with pytest.raises(ValueError, match="CUDA"):
        VoiceBank(1, 1, 8, 1, 16, device="cpu", dtype=torch.float32, attention="triton")
