"""The top-k draw by bisection (``kyutai_sampling=triton-select``), run in Triton's CPU
interpreter (``tests.triton_interpreter``): the same ids as the sorting kernel and as
``sampling.top_k_draw`` (where ``torch.topk``'s choice among equal values is not at stake);
refused without CUDA outside the interpreter."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.triton_interpreter import run_interpreted

pytestmark = pytest.mark.timeout(900)  # (the module's interpreter run lands on its first test)


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted(Path(__file__).resolve().parent / "draw_select_run.py")


def test_it_draws_as_the_sort_and_as_top_k_draw(interpreted: dict) -> None:
    """Kyutai's audio width with k 250 and 25, its text width (8,001) with k 25, widths not a
    power of two, k of the whole width and over it; logits rounded to bfloat16 (many equal
    values); a greedy row in each; rows with top-p (sorted) beside rows without (selected). (The
    sorting kernel runs on four of them: its sort is slow in the interpreter.)"""
    cases = {k: v for k, v in interpreted["cases"].items() if k != "ties at the k-th"}
    assert len(cases) == 10
    for case, (want, by_sort, got) in cases.items():
        assert got == by_sort == want, case
    assert len({tuple(w) for w, _, _ in cases.values()}) > 5


def test_equal_values_at_the_k_th_are_kept_lowest_column_first(interpreted: dict) -> None:
    """100 columns above the cut and 40 equal ones at it, k 120: the lowest 20 of the 40 kept
    (row 1's noise favours column 230, not kept, then 205, kept), and the greedy row takes the
    lowest column of its equal maxima: as the sorting kernel (``torch.topk`` leaves the order
    of equal values unspecified)."""
    want, by_sort, got = interpreted["cases"]["ties at the k-th"]
    assert got == by_sort == [0, 205]


def test_without_cuda_it_is_refused() -> None:
    from models.kyutai_tts.build import build_kyutai_backend

    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter is on in this process")
    with pytest.raises(ValueError, match="CUDA"):
        build_kyutai_backend("tiny", device="cpu", max_num_seqs=2, max_model_len=128, warmup=False,
                             load_format="dummy", kyutai_n_q=4, kyutai_sampling="triton-select")
