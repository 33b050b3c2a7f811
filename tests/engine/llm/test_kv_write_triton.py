"""The KV cache write in one Triton kernel (``--kv-write triton``, ``engine.llm.kv_write_triton``),
run in Triton's CPU interpreter (``tests.triton_interpreter``) against ``attention.write_kv``'s
index_put; the option checked where it is given (the CLI and EngineConfig: test_build.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.triton_interpreter import run_interpreted

pytestmark = pytest.mark.timeout(900)  # (the module's interpreter run lands on its first test)


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted(Path(__file__).resolve().parent / "kv_write_triton_run.py")


def test_it_writes_what_index_put_writes(interpreted: dict) -> None:
    """The same cache, bit for bit, every other place untouched: Orpheus-3B's layout and small
    ones, one row and several, K and V as views of one tensor; each row's K and V written."""
    cases = {k: v for k, v in interpreted["cases"].items() if k != "refused"}
    assert len(cases) == 4
    for name, c in cases.items():
        assert c["equal"], name
        assert c["changed"] == 2 * c["rows"], name  # (the comparison is not vacuous)


def test_shapes_that_do_not_fit_are_refused(interpreted: dict) -> None:
    assert "do not fit cache" in interpreted["cases"]["refused"]


def test_the_option_is_checked() -> None:
    from engine.llm import attention, kv_write_triton

    with pytest.raises(ValueError, match="kv_write must be one of index, triton"):
        attention.set_kv_write("scatter")
    if kv_write_triton.triton is None:  # (a CPU install: torch's CPU wheel has no Triton)
        with pytest.raises(ValueError, match="--kv-write triton needs Triton"):
            attention.set_kv_write("triton")
    assert attention._kv_write == "index"
    with pytest.raises(ValueError, match="kv_write must be one of index, triton, got 'auto'"):
        attention.set_kv_write("auto")  # (the build resolves "auto" first)


def test_triton_without_cuda_is_refused_before_the_model_loads() -> None:
    from models.orpheus.build import build_orpheus_backend

    with pytest.raises(ValueError, match="--kv-write triton needs CUDA"):
        build_orpheus_backend("tiny", device="cpu", load_format="dummy", max_num_seqs=2, max_model_len=64,
                              kv_write="triton")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_write_kv_takes_the_kernel_when_asked() -> None:
    """``set_kv_write("triton")``: ``write_kv`` on a CUDA bf16 cache gives the index_put cache."""
    from engine.llm import attention

    g = torch.Generator(device="cuda").manual_seed(0)
    cache = torch.randn(8, 2, 16, 8, 128, device="cuda", generator=g).to(torch.bfloat16)
    slots = torch.randperm(8 * 16, device="cuda", generator=g)[:37]
    k, v = (torch.randn(37, 8, 128, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
    want, got = cache.clone(), cache.clone()
    attention.write_kv(want, slots // 16, slots % 16, k, v)
    attention.set_kv_write("triton")
    try:
        attention.write_kv(got, slots // 16, slots % 16, k, v)
    finally:
        attention.set_kv_write("index")
    assert torch.equal(got, want) and not torch.equal(got, cache)
