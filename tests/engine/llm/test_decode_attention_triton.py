"""Paged decode attention in one Triton kernel (``--decode-attention triton``,
``engine.llm.decode_attention_triton``), run in Triton's CPU interpreter
(``tests.triton_interpreter``) against attention over each row's gathered pages; the graph
attention over a scheduled step's metadata; the option where it is given."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.triton_interpreter import run_interpreted

pytestmark = pytest.mark.timeout(900)  # (the module's interpreter run lands on its first test)


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_interpreted(Path(__file__).resolve().parent / "decode_attention_triton_run.py")


def test_it_attends_as_the_gathered_pages_do(interpreted: dict) -> None:
    """Orpheus-3B's heads (24 over 8 of 128) and other groupings (1, 3 and 4 query heads a KV
    head); rows of 1 token to 250, on and across page (16) and block (64) edges, pages out of
    order; float32 to float32 rounding, bf16 and fp8 pages to the output's bfloat16 rounding."""
    cases = {k: v for k, v in interpreted["cases"].items() if k != "refused"}
    assert len(cases) == 5
    for name, c in cases.items():
        assert c["shape"] and c["dtype"], name
        assert c["spread"] > 0.5, name  # (outputs differ from row to row and head to head)
        tol = 1e-5 if "float32" in name else 2 ** -6
        assert c["max_err"] <= tol * c["max_abs"], (name, c)


def test_shapes_that_do_not_fit_are_refused(interpreted: dict) -> None:
    assert "a power-of-two head size" in interpreted["cases"]["refused"]


def test_the_graph_attention_stores_the_new_keys_then_attends(interpreted: dict) -> None:
    g = interpreted["graph"]
    assert g["stored"]
    assert g["max_err"] <= 2 ** -6 * g["max_abs"]
    assert g["refused_batch"] == "graph for batch 3 got 2 rows"


def test_the_option_is_known_and_needs_cuda() -> None:
    from engine.config import EngineConfig
    from engine.llm.kernels import DECODE_ATTENTION_KERNELS

    assert "triton" in DECODE_ATTENTION_KERNELS
    EngineConfig(decode_attention="triton")  # a known value
    with pytest.raises(ValueError, match="decode_attention must be one of auto, cuda-cores, tensor-cores, triton"):
        EngineConfig(decode_attention="flash")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_it_matches_flashinfer() -> None:
    """bf16 pages at Orpheus-3B's shape, rows of varied lengths: the kernel against FlashInfer's
    decode (the default) to bfloat16 rounding."""
    import flashinfer

    from engine.llm.decode_attention_triton import paged_decode_attention

    g = torch.Generator(device="cuda").manual_seed(0)
    hq, hkv, d, page = 24, 8, 128, 16
    lengths = [1, 17, 64, 105, 200, 513]
    num_pages = sum(-(-n // page) for n in lengths) + 3
    cache = torch.randn(num_pages, 2, page, hkv, d, device="cuda", generator=g).to(torch.bfloat16)
    perm = torch.randperm(num_pages, device="cuda", generator=g).to(torch.int32)
    counts = [-(-n // page) for n in lengths]
    indptr = torch.tensor([0] + list(torch.tensor(counts).cumsum(0)), dtype=torch.int32, device="cuda")
    indices = perm[: sum(counts)].contiguous()
    last = torch.tensor([n - (c - 1) * page for n, c in zip(lengths, counts)], dtype=torch.int32, device="cuda")
    q = torch.randn(len(lengths), hq, d, device="cuda", generator=g).to(torch.bfloat16)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, device="cuda"), "NHD")
    wrapper.plan(indptr.cpu(), indices, last.cpu(), hq, hkv, d, page, q_data_type=torch.bfloat16,
                 kv_data_type=torch.bfloat16)  # (as benchmark.gpu.decode_attention plans it)
    want = wrapper.run(q, cache)
    got = paged_decode_attention(q, cache, indptr, indices, last)
    assert torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2)
