"""benchmark.head_ops: the frame heads' operator counts stay within what their kernel cuts reached.

A head in a CUDA graph pays per kernel (docs/performance.md, "Frame heads alone"); these budgets
are the counts at the commit that cut them (docs/performance.md, "Operators a head dispatches"),
plus 10%: a change that puts per-codebook work back (a noise hash per codebook, a mask or a
table built each step) fails here, on the CPU, before it costs a GPU run.
"""

from __future__ import annotations

import pytest

from benchmark.head_ops import count_head_ops

BUDGETS = {"csm-tiny": 2060, "kyutai-tts-tiny": 1586, "qwen3-tts-tiny": 1410, "voxcpm2-tiny": 490}


@pytest.mark.parametrize("model", sorted(BUDGETS))
def test_a_head_dispatches_no_more_operators_than_its_budget(model: str) -> None:
    got = count_head_ops(model)
    assert 0 < got.ops <= int(BUDGETS[model] * 1.1), (got.ops, got.kinds)
