"""CUDA-graph replays emulated on the CPU (each replay runs the captured step eagerly), so the
graph runner's paths are tested without a GPU."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["emulate_replays"]


def emulate_replays(runner: Any, *, num_tokens: int = 32, record: list[str] | None = None) -> None:
    """Replace the runner's decode and prefill replays (one prefill bucket of ``num_tokens``)
    by their step functions; ``record`` gets "decode" / "prefill" per replay ("decode:V" for a
    head's step variant V > 0, resolved at the step's bucket as ``DecodeGraphs.run`` does)."""
    from engine.llm.attention import TorchPagedAttention
    from engine.llm.prefill_graphs import GraphPrefillAttention, pad_prefill_slots

    def decode_run(ids, meta, *extras, variant=0):  # noqa: ANN001, ANN202  (the step function, eagerly)
        variant = runner.graphs.resolve(int(ids.shape[0]), variant)
        if record is not None:
            record.append(f"decode:{variant}" if variant else "decode")
        attn = TorchPagedAttention(runner.spec, runner.kv_caches)
        attn.begin_step(meta)
        return runner._graph_step(_static(ids), _static(meta.positions), attn, *map(_static, extras), variant=variant)

    def prefill_run(ids, positions, seg, slots, last, *extras):  # noqa: ANN001, ANN202
        if record is not None:
            record.append("prefill")
        attn = GraphPrefillAttention(runner.kv_caches, num_q_heads=runner.config.num_attention_heads,
                                     num_tokens=num_tokens)
        pad = torch.zeros(num_tokens - ids.numel(), dtype=torch.int64)
        attn.begin_step(pad_prefill_slots(slots, num_tokens, scratch_page=runner.scratch_page,
                                          page_size=runner.page_size),
                        torch.cat([seg, pad + 99]))
        return runner._prefill_step(_static(torch.cat([ids, pad])), _static(torch.cat([positions, pad])), attn,
                                    _static(last), *map(_static, extras))

    runner.graphs.run = decode_run
    runner.prefill_graphs.run = prefill_run
    runner.prefill_graphs._graphs = {num_tokens: None}
    runner.use_graphs = True


def _static(x: torch.Tensor) -> torch.Tensor:
    """x in a tensor made as a captured graph's static inputs are (``DecodeGraphs.capture``):
    outside inference mode, so a normal tensor even while the step runs in inference mode (a
    compiled piece traced with inference tensors sees the difference in its guards)."""
    with torch.inference_mode(False):
        buf = torch.empty_like(x)
    buf.copy_(x)
    return buf


class _Replay:
    """A captured graph's stand-in: replay runs the step function on the static buffers."""

    def __init__(self, fn, outs):  # noqa: ANN001
        self.fn, self.outs = fn, outs

    def replay(self) -> None:
        for dst, src in zip(self.outs, self.fn()):
            dst.copy_(src)


def emulate_mixed(runner: Any, *, record: list[str] | None = None) -> None:
    """Fill ``runner.mixed_graphs`` with stand-ins of every (decode bucket, token bucket) graph:
    ``MixedGraphs.run`` fills the static buffers as on the GPU, and the replay runs the step
    function on them eagerly (torch paged attention for the decode rows)."""
    from engine.llm.attention import TorchPagedAttention
    from engine.llm.mixed_graphs import MixedAttention, _MixedGraph
    from engine.llm.prefill_graphs import GraphPrefillAttention

    mixed = runner.mixed_graphs
    r = mixed.max_prompts
    for b in mixed.decode_buckets:
        for t in mixed.token_buckets:
            attn = MixedAttention(TorchPagedAttention(runner.spec, runner.kv_caches),
                                  GraphPrefillAttention(runner.kv_caches, num_q_heads=runner.config.num_attention_heads,
                                                        num_tokens=t), b)
            ids = torch.zeros(b + t, dtype=torch.int64)
            pos = torch.zeros(b + t, dtype=torch.int64)
            last = torch.zeros(r, dtype=torch.int64)
            extras = [torch.zeros((b + r, *s), dtype=dt) for s, dt in mixed.extra_specs]
            num_cols = runner.seen.shape[1]
            outs = (torch.zeros(b + r, dtype=torch.int64), torch.zeros(b + r, num_cols))

            def step(ids=ids, pos=pos, attn=attn, last=last, extras=extras):  # noqa: ANN001, ANN202
                if record is not None:
                    record.append("mixed")
                return runner._mixed_step(ids, pos, attn, last, *extras)

            mixed._graphs[(b, t)] = _MixedGraph(_Replay(step, outs), attn, ids, pos, last, extras, outs)


def emulated_graph_runner(*, counts: dict[str, int] | None = None, record: list[str] | None = None,
                          runners: list[Any] | None = None, num_tokens: int = 32, max_model_len: int = 512) -> Any:
    """A ``runner_factory`` for a program's ``build_*_backend``: a ``CudaGraphModelRunner`` on the
    CPU (torch paged attention, nothing captured) whose replays ``emulate_replays`` runs;
    ``counts["eager"]`` counts the steps that fell back to the eager path, ``record`` gets the
    replays, ``runners`` the runners built."""

    def factory(model, shape, **kw):  # noqa: ANN001, ANN003, ANN202
        from engine.llm.attention import torch_paged_attention_factory
        from engine.llm.cuda_graphs import CudaGraphModelRunner

        runner = CudaGraphModelRunner(model, shape, capture=False, prefill_buckets=(num_tokens,),
                                      max_model_len=max_model_len,
                                      attention_backend_factory=torch_paged_attention_factory, **kw)
        emulate_replays(runner, num_tokens=num_tokens, record=record)
        if counts is not None:
            counts.setdefault("eager", 0)
            real = runner._execute_eager

            def count(*a, **k):  # noqa: ANN002, ANN003, ANN202
                counts["eager"] += 1
                return real(*a, **k)

            runner._execute_eager = count
        if runners is not None:
            runners.append(runner)
        return runner

    return factory
