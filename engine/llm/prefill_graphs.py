"""CUDA graphs for the prefill of one fresh sequence (the first-audio critical path).

A new stream's first step is the prefill of its whole prompt, usually alone in the batch when
latency matters most. Eagerly, 28 layers of small launches from Python cost ~30 ms for a
60-token prompt, ten times the GPU work. Here the step (forward, head, sampling) is captured
per token-count bucket; the prompt is padded at its end, so with a causal mask no real token
sees a padding token. Attention is plain causal SDPA over the new tokens (a fresh sequence has
no cached context), K/V are written to the paged cache as usual; padding tokens write to the
scratch page.

Steps that do not fit (several sequences, decode rows, a chunked or continued prefill, longer
prompts) run eagerly with FlashInfer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from engine.llm.cuda_graphs import TensorSpec, _as_tuple, _progress, bucket_for
from engine.llm.flashinfer_attention import _write_kv, slot_to_page_offset

__all__ = ["DEFAULT_PREFILL_BUCKETS", "GraphPrefillAttention", "PrefillGraphs", "pad_prefill_slots"]

DEFAULT_PREFILL_BUCKETS: tuple[int, ...] = (32, 64, 128, 256, 512)


def pad_prefill_slots(slot_mapping: torch.Tensor, num_tokens: int, *, scratch_page: int, page_size: int) -> torch.Tensor:
    """Slots [num_tokens] int64: the real ones, then padding tokens spread over the scratch page."""
    n = int(slot_mapping.numel())
    if num_tokens < n:
        raise ValueError(f"cannot pad {n} tokens down to {num_tokens}")
    pad = scratch_page * page_size + torch.arange(num_tokens - n, dtype=torch.int64) % page_size
    return torch.cat([slot_mapping.to("cpu", torch.int64), pad])


class GraphPrefillAttention:
    """Causal attention of one fresh sequence over its own ``num_tokens`` (padded) new tokens."""

    def __init__(self, kv_caches: list[torch.Tensor], *, num_q_heads: int, num_tokens: int) -> None:
        self.kv_caches = kv_caches
        self.page_size = int(kv_caches[0].shape[2])
        self.group = num_q_heads // int(kv_caches[0].shape[3])
        dev = kv_caches[0].device
        self._page = torch.zeros(num_tokens, dtype=torch.int64, device=dev)
        self._offset = torch.zeros(num_tokens, dtype=torch.int64, device=dev)

    def begin_step(self, slots: torch.Tensor) -> None:
        """Stage the padded slots [num_tokens] (outside the graph)."""
        page, offset = slot_to_page_offset(slots.to(self._page.device, non_blocking=True), self.page_size)
        self._page.copy_(page)
        self._offset.copy_(offset)

    def __call__(
        self,
        layer: int,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
    ) -> torch.Tensor:  # [T, Hq, D]
        cache = self.kv_caches[layer]
        _write_kv(cache, self._page, self._offset, k, v)
        kk = k.to(q.dtype).repeat_interleave(self.group, dim=1).transpose(0, 1)  # [Hq, T, D]
        vv = v.to(q.dtype).repeat_interleave(self.group, dim=1).transpose(0, 1)  # [Hq, T, D]
        o = F.scaled_dot_product_attention(q.transpose(0, 1), kk, vv, is_causal=True)  # [Hq, T, D]
        return o.transpose(0, 1).contiguous()


class PrefillGraphs:
    """``step_fn(ids[T], positions[T], attn, last[1], *extras) -> Tensor | tuple`` per token bucket.

    ``extras`` are per-sequence inputs with batch dim 1 (``extra_specs`` as in ``DecodeGraphs``).
    """

    def __init__(
        self,
        step_fn: Callable[..., Any],
        kv_caches: list[torch.Tensor],
        *,
        num_q_heads: int,
        scratch_page: int,
        buckets: Sequence[int] = DEFAULT_PREFILL_BUCKETS,
        extra_specs: Sequence[TensorSpec] = (),
    ) -> None:
        if not buckets:
            raise ValueError("no buckets")
        self.step_fn = step_fn
        self.kv_caches = kv_caches
        self.num_q_heads = num_q_heads
        self.scratch_page = scratch_page
        self.page_size = int(kv_caches[0].shape[2])
        self.buckets = tuple(sorted(set(buckets)))
        self.extra_specs = list(extra_specs)
        self.device = kv_caches[0].device
        self._graphs: dict[int, _PrefillGraph] = {}

    def can_run(self, batch: Any) -> bool:
        """True for one fresh sequence prefilling its whole prompt, within the largest bucket."""
        if batch.num_decode_seqs != 0 or len(batch.seqs) != 1:
            return False
        seq, n = batch.seqs[0], batch.num_new_tokens[0]
        return seq.num_computed_tokens == 0 and n == seq.num_tokens and n <= self.buckets[-1] and bool(self._graphs)

    def capture(self, *, progress: bool = True) -> None:
        pool = torch.cuda.graph_pool_handle()
        for t in _progress(sorted(self.buckets, reverse=True), "prefill graphs", progress):
            attn = GraphPrefillAttention(self.kv_caches, num_q_heads=self.num_q_heads, num_tokens=t)
            ids = torch.zeros(t, dtype=torch.int64, device=self.device)
            pos = torch.arange(t, dtype=torch.int64, device=self.device)
            last = torch.zeros(1, dtype=torch.int64, device=self.device)
            extras = [torch.zeros((1, *s), dtype=dt, device=self.device) for s, dt in self.extra_specs]
            attn.begin_step(pad_prefill_slots(torch.zeros(0, dtype=torch.int64), t, scratch_page=self.scratch_page,
                                              page_size=self.page_size))
            with torch.inference_mode():
                self.step_fn(ids, pos, attn, last, *extras)  # warm-up outside the graph
                torch.cuda.synchronize(self.device)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool):
                    outs = _as_tuple(self.step_fn(ids, pos, attn, last, *extras))
            self._graphs[t] = _PrefillGraph(g, attn, ids, pos, last, extras, outs)
        torch.cuda.synchronize(self.device)

    def run(self, input_ids: torch.Tensor, slot_mapping: torch.Tensor, *extras: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Replay for one prompt: ``input_ids[n]`` (host or device), its ``slot_mapping[n]``."""
        n = int(input_ids.shape[0])
        t = bucket_for(n, self.buckets)
        if t is None or t not in self._graphs:
            raise ValueError(f"no prefill graph for {n} tokens (buckets {self.buckets})")
        gr = self._graphs[t]
        gr.attn.begin_step(pad_prefill_slots(slot_mapping, t, scratch_page=self.scratch_page, page_size=self.page_size))
        gr.ids[:n].copy_(input_ids, non_blocking=True)
        gr.ids[n:].zero_()
        gr.last.fill_(n - 1)
        for dst, src in zip(gr.extras, extras):
            dst.copy_(src, non_blocking=True)
        gr.graph.replay()
        return gr.outs


@dataclasses.dataclass
class _PrefillGraph:
    graph: torch.cuda.CUDAGraph
    attn: GraphPrefillAttention
    ids: torch.Tensor
    pos: torch.Tensor
    last: torch.Tensor
    extras: list[torch.Tensor]
    outs: tuple[torch.Tensor, ...]
