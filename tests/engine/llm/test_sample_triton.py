"""The runtime sampler's draw in one Triton kernel (``--sampler-kernel triton``,
``engine.llm.sample_triton``), run in Triton's CPU interpreter (``tests.triton_interpreter``)
against the sampler's torch path on the same rows."""

from __future__ import annotations

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
    return run_interpreted(Path(__file__).resolve().parent / "sampler_triton_run.py")


def test_the_kernel_draws_what_the_torch_path_draws(interpreted: dict) -> None:
    """The same ids for every row: greedy, temperatures, top-k off / 1 / 5 / 20 / 50 / wider than
    the vocabulary, top-p 1 / 0.95 / 0.8 / 0.5 / 0.3, a repetition penalty over seen columns, a
    column masked off, widths 2,048, 300 and 97, with and without top-k, and logits rounded to
    bfloat16 (ties at the k-th value, kept as the torch path keeps them)."""
    cases = interpreted["cases"]
    assert len(cases) == 7
    for case, (want, got) in cases.items():
        assert got == want, case
        assert 7 not in want  # (the masked column)
    assert len({i for want, _ in cases.values() for i in want}) > 30  # (draws, not one column)


def test_without_the_kernel_or_past_its_width_the_torch_path_runs() -> None:
    """On the CPU outside the interpreter, and for a width over 8,192 columns, ``kernel="triton"``
    samples as the torch path (it is not used there)."""
    from engine.llm.sampler import Sampler

    g = torch.Generator().manual_seed(1)
    for v in (64, 9000):
        logits = torch.randn(3, v, generator=g)
        kw = dict(temperature=torch.tensor([0.0, 0.8, 1.2]), top_p=torch.tensor([1.0, 0.9, 0.5]),
                  top_k=torch.tensor([0, 10, 40]), repetition_penalty=torch.ones(3), seeds=torch.arange(3),
                  steps=torch.zeros(3, dtype=torch.int64))
        plain, kernel = Sampler(), Sampler()
        kernel.kernel = "triton"
        assert torch.equal(plain(logits, **kw), kernel(logits, **kw))
