"""CUDA-graph replays emulated on the CPU: each replay runs the captured step function eagerly,
so ``CudaGraphModelRunner``'s graph path (decode input tables, packed prompts, the token feed of
asynchronous steps) is tested without a GPU."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["emulate_replays"]


def emulate_replays(runner: Any, *, num_tokens: int = 32, record: list[str] | None = None) -> None:
    """Replace the runner's decode and prefill replays (one prefill bucket of ``num_tokens``)
    by their step functions; ``record`` gets "decode" / "prefill" per replay."""
    from engine.llm.attention import TorchPagedAttention
    from engine.llm.prefill_graphs import GraphPrefillAttention, pad_prefill_slots

    def decode_run(ids, meta, *extras):  # noqa: ANN001, ANN202  (the step function, eagerly)
        if record is not None:
            record.append("decode")
        attn = TorchPagedAttention(runner.spec, runner.kv_caches)
        attn.begin_step(meta)
        return runner._graph_step(ids, meta.positions, attn, *extras)

    def prefill_run(ids, positions, seg, slots, last, *extras):  # noqa: ANN001, ANN202
        if record is not None:
            record.append("prefill")
        attn = GraphPrefillAttention(runner.kv_caches, num_q_heads=runner.config.num_attention_heads,
                                     num_tokens=num_tokens)
        pad = torch.zeros(num_tokens - ids.numel(), dtype=torch.int64)
        attn.begin_step(pad_prefill_slots(slots, num_tokens, scratch_page=runner.scratch_page,
                                          page_size=runner.page_size),
                        torch.cat([seg, pad + 99]))
        return runner._prefill_step(torch.cat([ids, pad]), torch.cat([positions, pad]), attn, last, *extras)

    runner.graphs.run = decode_run
    runner.prefill_graphs.run = prefill_run
    runner.prefill_graphs._graphs = {num_tokens: None}
    runner.use_graphs = True
