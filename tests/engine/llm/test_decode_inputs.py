"""DecodeInputBuilder: the same padded metadata and graph inputs as the list-based path."""

from __future__ import annotations

import random

import pytest
import torch

from engine.llm.attention import build_attention_metadata
from engine.llm.cuda_graphs import pad_decode_metadata
from engine.llm.decode_inputs import DecodeInputBuilder
from engine.llm.scheduler import ScheduledBatch
from engine.llm.sequence import SamplingParams, Sequence

PAGE = 4


def _seq(i: int, rng: random.Random, slot: int) -> Sequence:
    params = SamplingParams(temperature=rng.random(), top_p=rng.random(), repetition_penalty=1 + rng.random(),
                            seed=rng.getrandbits(40), max_tokens=64)
    s = Sequence(seq_id=i, prompt_ids=[rng.randrange(1000) for _ in range(rng.randrange(2, 9))], params=params,
                 slot=slot)
    s.pages = rng.sample(range(200), 12)
    s.output_ids = [rng.randrange(1000) for _ in range(rng.randrange(0, 30))]
    s.num_computed_tokens = s.num_tokens - 1
    s.allowed_row = rng.randrange(7)
    return s


def _reference(seqs, bucket):
    batch = ScheduledBatch(seqs=seqs, num_new_tokens=[1] * len(seqs), is_sampled=[True] * len(seqs),
                           num_decode_seqs=len(seqs))
    meta = pad_decode_metadata(build_attention_metadata(batch, PAGE), bucket, scratch_page=199, page_size=PAGE)
    return meta


def test_builder_equals_list_path_over_steps_and_slot_changes() -> None:
    """Over several steps (tokens appended, one sequence replaced in its slot), the builder's
    metadata equals build_attention_metadata + pad_decode_metadata, and its packed inputs the
    per-row values, padding rows zero."""
    rng = random.Random(0)
    seqs = [_seq(i, rng, slot) for i, slot in enumerate([3, 0, 5, 1, 6])]
    builder = DecodeInputBuilder(max_num_seqs=8, max_pages_per_seq=12, page_size=PAGE, scratch_page=199)
    for step in range(4):
        if step == 2:
            seqs[1] = _seq(99, rng, 0)  # a new sequence takes slot 0
        bucket = 8
        meta, ints, floats, keep = builder.build(seqs, bucket, [True] * 4 + [False])
        ref = _reference(seqs, bucket)
        for name in ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len", "slot_mapping", "positions"):
            got, want = getattr(meta, name), getattr(ref, name)
            assert torch.equal(got.to(want.dtype), want), name
        assert meta.num_decode_seqs == ref.num_decode_seqs == bucket
        n = len(seqs)
        assert ints[:n, 0].tolist() == [s.token_slice(s.num_computed_tokens, s.num_tokens)[0] for s in seqs]
        assert ints[:n, 1].tolist() == [s.params.seed for s in seqs]
        assert ints[:n, 2].tolist() == [s.num_output_tokens for s in seqs]
        assert ints[:n, 3].tolist() == [s.slot + 1 for s in seqs]
        assert ints[:n, 4].tolist() == [s.allowed_row for s in seqs]
        assert torch.equal(floats[:n], torch.tensor([[s.params.temperature, s.params.top_p,
                                                       s.params.repetition_penalty] for s in seqs]))
        assert keep.tolist() == [True] * 4 + [False] * 4
        assert not ints[n:].any() and not floats[n:].any()
        for s in seqs:  # the step's token arrives
            s.output_ids.append(rng.randrange(1000))
            s.num_computed_tokens += 1


def test_builder_refuses_a_sequence_without_pages_for_its_token() -> None:
    """A sequence whose next token has no page is an error naming it, not a wrong write."""
    rng = random.Random(1)
    s = _seq(7, rng, 0)
    s.num_computed_tokens = 12 * PAGE  # the next token would need a 13th page
    builder = DecodeInputBuilder(max_num_seqs=2, max_pages_per_seq=12, page_size=PAGE, scratch_page=199)
    with pytest.raises(ValueError, match="sequence 7 needs 13 pages"):
        builder.build([s], 1, [True])
