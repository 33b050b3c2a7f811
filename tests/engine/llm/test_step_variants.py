"""A token head's cheaper step variants in the decode graphs: which (variant, bucket) graphs are
captured and which variant a step of some rows replays (engine.llm.cuda_graphs.DecodeGraphs)."""

from __future__ import annotations

import torch

from engine.llm.cuda_graphs import DecodeGraphs


def _graphs(variants: tuple[int, ...]) -> DecodeGraphs:
    cache = torch.zeros(4, 2, 16, 1, 8)  # pages, K/V, page size, heads, head dim (never captured here)
    return DecodeGraphs(lambda *a, **k: None, [cache], num_q_heads=1, scratch_page=3, max_pages_per_seq=2,
                        buckets=(1, 2, 4, 8, 16, 32), variants=variants)


def test_a_variant_is_captured_only_up_to_its_row_limit() -> None:
    g = _graphs((4,))
    assert sorted(g.keys()) == sorted([(0, b) for b in (1, 2, 4, 8, 16, 32)] + [(1, 1), (1, 2), (1, 4)])
    assert _graphs(()).keys() == [(0, b) for b in (1, 2, 4, 8, 16, 32)]


def test_a_step_replays_its_variant_where_captured_else_the_full_step() -> None:
    g = _graphs((4,))
    assert g.resolve(1, 1) == 1 and g.resolve(3, 1) == 1  # bucket 4
    assert g.resolve(5, 1) == 0  # bucket 8: not captured as variant 1
    assert g.resolve(2, 2) == 0  # no variant 2
    assert g.resolve(2, 0) == 0
