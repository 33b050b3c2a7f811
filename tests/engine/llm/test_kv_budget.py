"""kv_budget_bytes: the KV cache's share of a GPU, alone on it (as before) or shared by engines."""

from __future__ import annotations

import pytest

from engine.llm.model_runner import kv_budget_bytes

GIB = 1 << 30


def test_alone_on_the_gpu_the_budget_is_unchanged() -> None:
    """Share 1: total * utilization minus everything in use now minus the reserve (the formula
    the single-engine server has always used; own memory plays no part)."""
    budget = kv_budget_bytes(free_bytes=100 * GIB, total_bytes=140 * GIB, own_bytes=999 * GIB,
                             gpu_memory_utilization=0.85, reserve_bytes=2 * GIB)
    assert budget == int(140 * GIB * 0.85) - 40 * GIB - 2 * GIB


def test_shared_engines_each_get_their_part_whatever_the_others_hold() -> None:
    """Share 2: each engine's budget is half of total * utilization minus its own memory, so the
    second engine to size its cache gets as much as the first."""
    total, weights, reserve = 140 * GIB, 8 * GIB, 2 * GIB
    first = kv_budget_bytes(free_bytes=total - 2 * weights, total_bytes=total, own_bytes=weights,
                            gpu_memory_utilization=0.8, gpu_memory_share=2, reserve_bytes=reserve)
    free_after_first = total - 2 * weights - first
    second = kv_budget_bytes(free_bytes=free_after_first, total_bytes=total, own_bytes=weights,
                             gpu_memory_utilization=0.8, gpu_memory_share=2, reserve_bytes=reserve)
    assert first == second == int(total * 0.8 / 2) - weights - reserve
    # together they stay within utilization, each with its reserve still free
    assert 2 * (weights + first + reserve) <= total * 0.8


def test_a_shared_budget_never_exceeds_what_is_free() -> None:
    """Another tenant holding most of the GPU leaves a shared engine only what is free."""
    budget = kv_budget_bytes(free_bytes=10 * GIB, total_bytes=140 * GIB, own_bytes=8 * GIB,
                             gpu_memory_utilization=0.9, gpu_memory_share=2, reserve_bytes=2 * GIB)
    assert budget == 10 * GIB - 2 * GIB


@pytest.mark.parametrize("kwargs", [{"gpu_memory_utilization": 1.0},
                                    {"gpu_memory_utilization": 0.5, "gpu_memory_share": 0}])
def test_bad_settings_are_refused(kwargs: dict) -> None:
    """A utilization outside (0, 1) or a share below 1 is a ValueError, not a silent budget."""
    with pytest.raises(ValueError):
        kv_budget_bytes(free_bytes=GIB, total_bytes=GIB, own_bytes=0, **kwargs)
