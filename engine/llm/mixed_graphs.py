"""Decode rows and fresh whole prompts in one CUDA graph: one pass over the weights per step
(``--mixed-graphs on``).

Buckets, the split attention and the measurements behind it: docs/orpheus.md, "Mixed graphs".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from engine.llm.cuda_graphs import (TensorSpec, _progress, bucket_for, capture_step, graph_decode_attention,
                                    pad_decode_metadata, scratch_decode_metadata)
from engine.llm.prefill_graphs import GraphPrefillAttention, pad_prefill_slots

__all__ = ["MixedAttention", "MixedGraphs", "DEFAULT_MIXED_DECODE_BUCKETS", "DEFAULT_MIXED_TOKEN_BUCKETS",
           "mixed_decode_buckets"]

# Decode rows of a loaded step, every 32 from 64 (``mixed_decode_buckets``: up to the decode cap;
# without one, to 320); a step with more rows than the largest bucket replays the decode and
# prefill graphs one after the other
DEFAULT_MIXED_DECODE_BUCKETS: tuple[int, ...] = tuple(range(64, 321, 32))
# Prompt tokens: one to a few prompts (about 10-20 ids each with a typical tokenizer's lengths: served steps
# under load carried about 30 prompt tokens, docs/performance_history.md run 27), up to the largest
# prefill graph's 512; padding tokens go through every GEMM, hence 384 between 256 and 512
DEFAULT_MIXED_TOKEN_BUCKETS: tuple[int, ...] = (32, 64, 128, 256, 384, 512)


def mixed_decode_buckets(decode_cap: int) -> tuple[int, ...]:
    """Mixed graphs' decode buckets for a scheduler that decodes at most ``decode_cap`` rows a
    step (0: no cap): every 32 rows from 64 up to the cap rounded up to 32."""
    if decode_cap <= 0:
        return DEFAULT_MIXED_DECODE_BUCKETS
    return tuple(range(64, max(64, -(-decode_cap // 32) * 32) + 1, 32))


class MixedAttention:
    """The first ``num_decode`` rows through ``decode`` (paged attention over each row's
    context), the rest through ``prefill`` (causal attention within each packed prompt)."""

    def __init__(self, decode: Any, prefill: Any, num_decode: int) -> None:
        self.decode = decode
        self.prefill = prefill
        self.num_decode = num_decode

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b = self.num_decode
        od = self.decode(layer, q[:b], k[:b], v[:b])  # [b, Hq, D]
        op = self.prefill(layer, q[b:], k[b:], v[b:])  # [t, Hq, D]
        return torch.cat([od, op])


class MixedGraphs:
    """``step_fn(ids[b + t], positions[b + t], attn, last[r], *extras[b + r])`` per (b, t).

    ``attn`` is a ``MixedAttention`` whose ``num_decode`` is ``b``; ``last`` indexes each
    prompt's last token among the ``t`` prompt tokens; ``extras`` (``extra_specs``) are per
    sampled row: the ``b`` decode rows, then the ``r = max_prompts`` prompt rows. Outputs have
    ``b + r`` rows.
    """

    def __init__(
        self,
        step_fn: Callable[..., Any],
        kv_caches: list[torch.Tensor],
        *,
        num_q_heads: int,
        scratch_page: int,
        max_pages_per_seq: int,
        decode_buckets: Sequence[int] = DEFAULT_MIXED_DECODE_BUCKETS,
        token_buckets: Sequence[int] = DEFAULT_MIXED_TOKEN_BUCKETS,
        max_prompts: int = 16,
        extra_specs: Sequence[TensorSpec] = (),
        decode_tensor_cores: bool = False,
        decode_kernel: str | None = None,
    ) -> None:
        if not decode_buckets or not token_buckets:
            raise ValueError("no buckets")
        if max_prompts < 1:
            raise ValueError(f"max_prompts must be >= 1, got {max_prompts}")
        self.step_fn = step_fn
        self.kv_caches = kv_caches
        self.num_q_heads = num_q_heads
        self.scratch_page = scratch_page
        self.page_size = int(kv_caches[0].shape[2])
        self.max_pages_per_seq = max_pages_per_seq
        self.decode_buckets = tuple(sorted(set(decode_buckets)))
        self.token_buckets = tuple(sorted(set(token_buckets)))
        self.max_prompts = max_prompts
        self.extra_specs = list(extra_specs)
        # the decode rows' attention (DECODE_ATTENTION_KERNELS; None: from decode_tensor_cores)
        self.decode_kernel = decode_kernel or ("tensor-cores" if decode_tensor_cores else "cuda-cores")
        self.decode_tensor_cores = self.decode_kernel == "tensor-cores"
        self.device = kv_caches[0].device
        self._graphs: dict[tuple[int, int], _MixedGraph] = {}

    def decode_attentions(self) -> list[Any]:
        """The captured graphs' decode-row ``GraphDecodeAttention`` objects."""
        return [g.attn.decode for g in self._graphs.values()]

    def can_run(self, num_decode: int, prompt_lengths: Sequence[int]) -> bool:
        """True when ``num_decode`` decode rows and these whole fresh prompts fit a graph."""
        if not self._graphs or not prompt_lengths or len(prompt_lengths) > self.max_prompts:
            return False
        if not 1 <= num_decode <= self.decode_buckets[-1]:  # (fewer than the smallest bucket: padded up)
            return False
        return sum(prompt_lengths) <= self.token_buckets[-1]

    def capture(self, *, progress: bool = True) -> None:
        """One graph per (decode bucket, token bucket), largest first, sharing one memory pool."""
        pool = torch.cuda.graph_pool_handle()
        workspace = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device=self.device)
        r = self.max_prompts
        keys = [(b, t) for b in sorted(self.decode_buckets, reverse=True) for t in sorted(self.token_buckets, reverse=True)]
        for b, t in _progress(keys, "mixed graphs", progress):
            dec = graph_decode_attention(self.decode_kernel, self.kv_caches, num_q_heads=self.num_q_heads,
                                         batch_size=b, max_num_pages=b * self.max_pages_per_seq, workspace=workspace)
            pre = GraphPrefillAttention(self.kv_caches, num_q_heads=self.num_q_heads, num_tokens=t)
            attn = MixedAttention(dec, pre, b)
            ids = torch.zeros(b + t, dtype=torch.int64, device=self.device)
            pos = torch.zeros(b + t, dtype=torch.int64, device=self.device)
            last = torch.zeros(r, dtype=torch.int64, device=self.device)
            extras = [torch.zeros((b + r, *s), dtype=dt, device=self.device) for s, dt in self.extra_specs]
            dec.begin_step(scratch_decode_metadata(b, scratch_page=self.scratch_page, page_size=self.page_size))
            pre.begin_step(pad_prefill_slots(torch.zeros(0, dtype=torch.int64), t, scratch_page=self.scratch_page,
                                             page_size=self.page_size))
            g, outs = capture_step(self.step_fn, (ids, pos, attn, last, *extras), pool=pool, device=self.device)
            self._graphs[(b, t)] = _MixedGraph(g, attn, ids, pos, last, extras, outs)
        torch.cuda.synchronize(self.device)

    def run(self, num_decode: int, decode_ids: torch.Tensor, meta: Any, decode_extras: Sequence[torch.Tensor],
            prompt_ids: torch.Tensor, prompt_positions: torch.Tensor, seg: torch.Tensor, slot_mapping: torch.Tensor,
            last: torch.Tensor, prompt_extras: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """One replay: ``num_decode`` decode rows (``decode_ids``/``meta``/``decode_extras``,
        padded to a decode bucket or not) and ``p`` packed prompts (``pack_prefill``: tokens,
        positions, sequence index, slots, last token [p]; ``prompt_extras`` [p]). Returns the
        decode rows' and the prompts' tokens (the first output), views of the graph's buffer."""
        n, p = int(decode_ids.shape[0]), int(last.shape[0])
        num_tokens = int(prompt_ids.shape[0])
        b = bucket_for(max(n, num_decode), self.decode_buckets)
        t = bucket_for(num_tokens, self.token_buckets)
        if b is None or t is None or (b, t) not in self._graphs or p > self.max_prompts or n > b:
            raise ValueError(f"no mixed graph for {num_decode} decode rows and {num_tokens} tokens in {p} prompts")
        gr = self._graphs[(b, t)]
        r = self.max_prompts
        padded = meta if int(meta.kv_last_page_len.numel()) == b else pad_decode_metadata(
            meta, b, scratch_page=self.scratch_page, page_size=self.page_size)
        gr.attn.decode.begin_step(padded)
        seg_p = torch.cat([seg.to("cpu", torch.int64), torch.full((t - num_tokens,), r, dtype=torch.int64)])
        gr.attn.prefill.begin_step(pad_prefill_slots(slot_mapping, t, scratch_page=self.scratch_page,
                                                     page_size=self.page_size), seg_p)
        gr.ids[:n].copy_(decode_ids, non_blocking=True)
        gr.ids[n:b].zero_()
        gr.ids[b : b + num_tokens].copy_(prompt_ids, non_blocking=True)
        gr.ids[b + num_tokens :].zero_()
        gr.pos[:b].copy_(padded.positions, non_blocking=True)
        gr.pos[b : b + num_tokens].copy_(prompt_positions, non_blocking=True)
        gr.pos[b + num_tokens :].zero_()
        gr.last[:p].copy_(last, non_blocking=True)
        gr.last[p:].zero_()
        for dst, dsrc, psrc in zip(gr.extras, decode_extras, prompt_extras):
            dst[:n].copy_(dsrc, non_blocking=True)
            dst[n:b].zero_()
            dst[b : b + p].copy_(psrc, non_blocking=True)
            dst[b + p :].zero_()
        gr.graph.replay()
        out = gr.outs[0]
        return out[:num_decode], out[b : b + p]


@dataclasses.dataclass
class _MixedGraph:
    graph: torch.cuda.CUDAGraph
    attn: MixedAttention
    ids: torch.Tensor
    pos: torch.Tensor
    last: torch.Tensor
    extras: list[torch.Tensor]
    outs: tuple[torch.Tensor, ...]
