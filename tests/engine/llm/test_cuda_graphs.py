"""CPU tests of the CUDA-graph bucket and padding logic (no GPU needed)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from engine.llm.cuda_graphs import bucket_for, pad_decode_metadata
from engine.llm.flashinfer_attention import slot_to_page_offset


@dataclass
class _Meta:
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    slot_mapping: torch.Tensor
    positions: torch.Tensor
    num_decode_seqs: int


def _decode_meta() -> _Meta:
    # Two decode rows: seq A with 20 tokens (pages 3, 5; next token at position 20),
    # seq B with 3 tokens (page 7; next token at position 3).
    return _Meta(
        qo_indptr=torch.tensor([0, 1, 2], dtype=torch.int32),
        kv_indptr=torch.tensor([0, 2, 3], dtype=torch.int32),
        kv_indices=torch.tensor([3, 5, 7], dtype=torch.int32),
        kv_last_page_len=torch.tensor([5, 4], dtype=torch.int32),
        slot_mapping=torch.tensor([5 * 16 + 4, 7 * 16 + 3], dtype=torch.int64),
        positions=torch.tensor([20, 3], dtype=torch.int64),
        num_decode_seqs=2,
    )


def test_bucket_for_picks_smallest_holding_bucket() -> None:
    """A batch goes to the smallest bucket >= its size; beyond the largest there is none."""
    buckets = (1, 2, 4, 8)
    assert [bucket_for(n, buckets) for n in (1, 2, 3, 4, 5, 8)] == [1, 2, 4, 4, 8, 8]
    assert bucket_for(9, buckets) is None
    with pytest.raises(ValueError):
        bucket_for(0, buckets)


def test_pad_keeps_real_rows_and_sends_padding_to_scratch_page() -> None:
    """Padding rows are one-token sequences in the scratch page; real rows are unchanged."""
    padded = pad_decode_metadata(_decode_meta(), 4, scratch_page=99, page_size=16)
    assert padded.num_decode_seqs == 4
    assert padded.qo_indptr.tolist() == [0, 1, 2, 3, 4]
    assert padded.kv_indptr.tolist() == [0, 2, 3, 4, 5]
    assert padded.kv_indices.tolist() == [3, 5, 7, 99, 99]
    assert padded.kv_last_page_len.tolist() == [5, 4, 1, 1]
    assert padded.slot_mapping.tolist() == [5 * 16 + 4, 7 * 16 + 3, 99 * 16, 99 * 16]
    assert padded.positions.tolist() == [20, 3, 0, 0]
    assert padded.kv_indptr.dtype == torch.int32 and padded.slot_mapping.dtype == torch.int64


def test_pad_to_same_size_is_identity_on_values() -> None:
    """Padding to the batch's own size changes no value."""
    meta = _decode_meta()
    padded = pad_decode_metadata(meta, 2, scratch_page=0, page_size=16)
    for name in ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len", "slot_mapping", "positions"):
        assert getattr(padded, name).tolist() == getattr(meta, name).tolist()


def test_pad_rejects_prefill_rows_and_shrinking() -> None:
    """Steps with prefill rows cannot be graphed; a bucket smaller than the batch is refused."""
    meta = _decode_meta()
    meta.num_decode_seqs = 1
    with pytest.raises(ValueError):
        pad_decode_metadata(meta, 4, scratch_page=0, page_size=16)
    with pytest.raises(ValueError):
        pad_decode_metadata(_decode_meta(), 1, scratch_page=0, page_size=16)


def test_slot_to_page_offset_inverts_flat_slots() -> None:
    """A flat slot page*P+off splits back into (page, off)."""
    page, off = slot_to_page_offset(torch.tensor([0, 15, 16, 16 * 7 + 3]), 16)
    assert page.tolist() == [0, 0, 1, 7] and off.tolist() == [0, 15, 0, 3]


def test_stream_codec_buckets_keep_padding_small() -> None:
    """The stateful codec's buckets pad fewer than 8 rows up to 128 rows, 16 up to 256 and 32
    up to 512 (its cost is about linear in rows; power-of-two buckets waste up to half)."""
    from engine.llm.cuda_graphs import STREAM_CODEC_BUCKETS

    for n in range(1, 513):
        pad = bucket_for(n, STREAM_CODEC_BUCKETS) - n
        assert pad < (8 if n <= 128 else 16 if n <= 256 else 32), n


class _FakeGraph:
    """A captured graph stand-in: replay doubles the static input into the static output."""

    def __init__(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        self.inp, self.out = inp, out

    def replay(self) -> None:
        self.out.copy_(self.inp * 2)


def test_batch_graphs_count_rows_run_and_replayed() -> None:
    """``run`` pads to the smallest bucket; ``rows_run`` counts the rows given, ``rows_replayed``
    the bucket rows computed, so their difference is the padding."""
    from engine.llm.cuda_graphs import BatchGraphs

    graphs = BatchGraphs(lambda x: x * 2, [((3,), torch.float32)], buckets=(4, 8), device="cpu")
    for b in graphs.buckets:  # what capture() would leave, without a GPU
        inp, out = torch.zeros(b, 3), torch.zeros(b, 3)
        graphs._graphs[b] = (_FakeGraph(inp, out), [inp], (out,))
    (out,) = graphs.run(torch.ones(3, 3))
    assert out.shape == (3, 3) and torch.equal(out, torch.full((3, 3), 2.0))
    graphs.run(torch.ones(5, 3))
    graphs.run(torch.ones(8, 3))
    assert (graphs.rows_run, graphs.rows_replayed) == (16, 4 + 8 + 8)
