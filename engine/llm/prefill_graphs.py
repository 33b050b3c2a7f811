"""CUDA graphs for the prefill of fresh sequences (the first-audio critical path).

Up to ``R`` whole prompts packed into ``T`` tokens per (token bucket, row bucket) graph, with
a block-diagonal causal mask; other prefills run eagerly (docs/architecture.md,
"The LM runtime"; docs/orpheus.md, "Prefill").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from engine.llm.cuda_graphs import TensorSpec, _progress, bucket_for, capture_step
from engine.llm.flashinfer_attention import _write_kv, slot_to_page_offset

__all__ = [
    "DEFAULT_PREFILL_BUCKETS", "DEFAULT_PREFILL_ROW_BUCKETS", "GraphPrefillAttention", "PrefillGraphs",
    "pack_prefill", "pad_prefill_slots",
]

DEFAULT_PREFILL_BUCKETS: tuple[int, ...] = (32, 64, 128, 256, 512)
DEFAULT_PREFILL_ROW_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16)


def pad_prefill_slots(slot_mapping: torch.Tensor, num_tokens: int, *, scratch_page: int, page_size: int) -> torch.Tensor:
    """Slots [num_tokens] int64: the real ones, then padding tokens spread over the scratch page."""
    n = int(slot_mapping.numel())
    if num_tokens < n:
        raise ValueError(f"cannot pad {n} tokens down to {num_tokens}")
    pad = scratch_page * page_size + torch.arange(num_tokens - n, dtype=torch.int64) % page_size
    return torch.cat([slot_mapping.to("cpu", torch.int64), pad])


class GraphPrefillAttention:
    """Causal attention of packed fresh sequences over their own (padded) ``num_tokens`` tokens."""

    def __init__(self, kv_caches: list[torch.Tensor], *, num_q_heads: int, num_tokens: int) -> None:
        self.kv_caches = kv_caches
        self.page_size = int(kv_caches[0].shape[2])
        self.group = num_q_heads // int(kv_caches[0].shape[3])
        dev = kv_caches[0].device
        self.num_tokens = num_tokens
        self._page = torch.zeros(num_tokens, dtype=torch.int64, device=dev)
        self._offset = torch.zeros(num_tokens, dtype=torch.int64, device=dev)
        self._seg = torch.zeros(num_tokens, dtype=torch.int64, device=dev)  # sequence index per token
        self._mask: torch.Tensor | None = None
        # A bf16 kernel that takes the mask (memory-efficient attention) on CUDA: the math
        # fallback computes in float32, two GEMMs and a softmax per layer that took about 1.1 ms
        # of a step with 384 prompt tokens (H200 kernel table, docs/performance_history.md run 14)
        self._backends = ([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH] if dev.type == "cuda"
                          else [SDPBackend.MATH])

    @property
    def seg(self) -> torch.Tensor:
        """Each token's prompt index within the packed step, int64 [num_tokens] (padding: past
        the last prompt)."""
        return self._seg

    def begin_step(self, slots: torch.Tensor, seg: torch.Tensor | None = None) -> None:
        """Stage the padded slots [num_tokens] and sequence indices [num_tokens] (outside the graph).

        ``seg`` None: all tokens are one sequence.
        """
        page, offset = slot_to_page_offset(slots.to(self._page.device, non_blocking=True), self.page_size)
        self._page.copy_(page)
        self._offset.copy_(offset)
        if seg is None:
            self._seg.zero_()
        else:
            self._seg.copy_(seg, non_blocking=True)

    def __call__(
        self,
        layer: int,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
    ) -> torch.Tensor:  # [T, Hq, D]
        if layer == 0 or self._mask is None:  # once per forward, on the device (inside a graph too)
            t = self._seg.numel()
            causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril_()
            self._mask = (causal & (self._seg[:, None] == self._seg[None, :]))[None, None]  # [1, 1, T, T]
        cache = self.kv_caches[layer]
        _write_kv(cache, self._page, self._offset, k, v)
        kk = k.to(q.dtype).repeat_interleave(self.group, dim=1).transpose(0, 1)[None]  # [1, Hq, T, D]
        vv = v.to(q.dtype).repeat_interleave(self.group, dim=1).transpose(0, 1)[None]  # [1, Hq, T, D]
        with sdpa_kernel(self._backends):
            o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], kk, vv, attn_mask=self._mask)  # [1, Hq, T, D]
        return o[0].transpose(0, 1).contiguous()


def pack_prefill(prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh prompts packed back to back: ids [n], positions [n], sequence index [n], last token [r]."""
    lengths = [len(p) for p in prompts]
    ids = torch.tensor([t for p in prompts for t in p], dtype=torch.int64)
    positions = torch.cat([torch.arange(n, dtype=torch.int64) for n in lengths])
    seg = torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int64), torch.tensor(lengths))
    last = torch.tensor(lengths, dtype=torch.int64).cumsum(0) - 1
    return ids, positions, seg, last


class PrefillGraphs:
    """``step_fn(ids[T], positions[T], attn, last[R], *extras[R]) -> Tensor | tuple`` per (T, R) bucket.

    ``extras`` are per-sequence inputs (``extra_specs`` as in ``DecodeGraphs``); padding rows get
    zeros and ``last`` = 0. Outputs have ``R`` rows: the first ``r`` are the real sequences'.
    """

    def __init__(
        self,
        step_fn: Callable[..., Any],
        kv_caches: list[torch.Tensor],
        *,
        num_q_heads: int,
        scratch_page: int,
        buckets: Sequence[int] = DEFAULT_PREFILL_BUCKETS,
        row_buckets: Sequence[int] = DEFAULT_PREFILL_ROW_BUCKETS,
        extra_specs: Sequence[TensorSpec] = (),
    ) -> None:
        if not buckets or not row_buckets:
            raise ValueError("no buckets")
        self.step_fn = step_fn
        self.kv_caches = kv_caches
        self.num_q_heads = num_q_heads
        self.scratch_page = scratch_page
        self.page_size = int(kv_caches[0].shape[2])
        self.buckets = tuple(sorted(set(buckets)))
        self.row_buckets = tuple(sorted(set(b for b in row_buckets if b <= self.buckets[-1])))
        self.extra_specs = list(extra_specs)
        self.device = kv_caches[0].device
        self._graphs: dict[tuple[int, int], _PrefillGraph] = {}

    @property
    def max_num_seqs(self) -> int:
        return self.row_buckets[-1]

    @property
    def max_num_tokens(self) -> int:
        return self.buckets[-1]

    def can_run(self, batch: Any) -> bool:
        """True for fresh sequences prefilling their whole prompts, within the largest buckets."""
        if batch.num_decode_seqs != 0 or not 1 <= len(batch.seqs) <= self.row_buckets[-1] or not self._graphs:
            return False
        fresh = all(s.num_computed_tokens == 0 and n == s.num_tokens for s, n in zip(batch.seqs, batch.num_new_tokens))
        return fresh and sum(batch.num_new_tokens) <= self.buckets[-1]

    def capture(self, *, progress: bool = True) -> None:
        pool = torch.cuda.graph_pool_handle()
        keys = [(t, r) for t in sorted(self.buckets, reverse=True) for r in sorted(self.row_buckets, reverse=True)
                if r <= t]
        for t, r in _progress(keys, "prefill graphs", progress):
            attn = GraphPrefillAttention(self.kv_caches, num_q_heads=self.num_q_heads, num_tokens=t)
            ids = torch.zeros(t, dtype=torch.int64, device=self.device)
            pos = torch.arange(t, dtype=torch.int64, device=self.device)
            last = torch.zeros(r, dtype=torch.int64, device=self.device)
            extras = [torch.zeros((r, *s), dtype=dt, device=self.device) for s, dt in self.extra_specs]
            attn.begin_step(pad_prefill_slots(torch.zeros(0, dtype=torch.int64), t, scratch_page=self.scratch_page,
                                              page_size=self.page_size))
            g, outs = capture_step(self.step_fn, (ids, pos, attn, last, *extras), pool=pool, device=self.device)
            self._graphs[(t, r)] = _PrefillGraph(g, attn, ids, pos, last, extras, outs)
        torch.cuda.synchronize(self.device)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, seg: torch.Tensor, slot_mapping: torch.Tensor,
            last: torch.Tensor, *extras: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Replay for ``r`` packed prompts (``pack_prefill``): tokens [n] and their slots [n],
        ``last`` [r]; outputs sliced to the ``r`` rows."""
        n, r = int(input_ids.shape[0]), int(last.shape[0])
        t = bucket_for(n, self.buckets)
        rb = bucket_for(r, self.row_buckets)
        if t is None or rb is None or (t, rb) not in self._graphs:
            raise ValueError(f"no prefill graph for {n} tokens in {r} prompts "
                             f"(buckets {self.buckets}, rows {self.row_buckets})")
        gr = self._graphs[(t, rb)]
        seg_p = torch.cat([seg.to("cpu", torch.int64), torch.full((t - n,), rb, dtype=torch.int64)])
        gr.attn.begin_step(pad_prefill_slots(slot_mapping, t, scratch_page=self.scratch_page, page_size=self.page_size),
                           seg_p)
        gr.ids[:n].copy_(input_ids, non_blocking=True)
        gr.ids[n:].zero_()
        gr.pos[:n].copy_(positions, non_blocking=True)
        gr.pos[n:].zero_()
        gr.last[:r].copy_(last, non_blocking=True)
        gr.last[r:].zero_()
        for dst, src in zip(gr.extras, extras):
            dst[:r].copy_(src, non_blocking=True)
            dst[r:].zero_()
        gr.graph.replay()
        return tuple(o[:r] for o in gr.outs)


@dataclasses.dataclass
class _PrefillGraph:
    graph: torch.cuda.CUDAGraph
    attn: GraphPrefillAttention
    ids: torch.Tensor
    pos: torch.Tensor
    last: torch.Tensor
    extras: list[torch.Tensor]
    outs: tuple[torch.Tensor, ...]
