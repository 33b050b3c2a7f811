"""Model runner: turns a ``ScheduledBatch`` into tensors, runs the program's model, samples.

It owns the device buffers: the paged KV cache and the attention backend (plain torch here;
FlashInfer and CUDA graphs plug in through ``attention_backend_factory`` and the subclass in
``engine.llm.cuda_graphs``). The program's token head (``engine.llm.token_head``) samples and
keeps its per-slot state. ``execute`` has exactly one host synchronisation: reading the
sampled tokens at the end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from engine.llm.attention import (
    AttentionBackend,
    AttentionMetadata,
    KVCacheSpec,
    allocate_kv_caches,
    build_attention_metadata,
    torch_paged_attention_factory,
)
from engine.llm.scheduler import ScheduledBatch
from engine.llm.sequence import PENDING
from engine.llm.token_head import RowInputs, SingleTokenHead, TokenHead, allowed_columns

__all__ = ["AttentionBackendFactory", "LaunchedStep", "ModelRunner", "allowed_columns", "host_input_ids",
           "kv_bytes_per_page", "kv_budget_bytes", "num_pages_for_memory",
           "CUDA_CONTEXT_ALLOWANCE_BYTES"]

AttentionBackendFactory = Callable[[KVCacheSpec, list[torch.Tensor]], AttentionBackend]


def kv_bytes_per_page(config: Any, page_size: int, dtype: torch.dtype) -> int:
    """Bytes one page takes across all layers (K and V); ``dtype`` is the KV cache's (fp8: 1 byte)."""
    elem = torch.empty((), dtype=dtype).element_size()
    return config.num_hidden_layers * 2 * page_size * config.num_key_value_heads * config.head_dim * elem


# What a CUDA process holds outside torch's allocator (its context, the libraries' own
# memory), which torch.cuda.memory_reserved does not count: an allowance, not a measurement.
CUDA_CONTEXT_ALLOWANCE_BYTES = 1 << 30


def kv_budget_bytes(
    *,
    free_bytes: int,
    total_bytes: int,
    own_bytes: int,
    gpu_memory_utilization: float,
    gpu_memory_share: int = 1,
    reserve_bytes: int = 0,
) -> int:
    """Bytes the KV cache may take on a GPU (negative: none). Pure arithmetic, no device.

    Alone on its GPU (``gpu_memory_share`` 1): ``total * utilization`` minus everything in use
    on it now (``total - free``: this process and any other) minus ``reserve_bytes``.
    Sharing it with ``gpu_memory_share - 1`` other engines that size their caches at the same
    moment: ``total * utilization / share`` minus this process's own memory (``own_bytes``),
    never more than is free now, minus ``reserve_bytes``. Counting only its own memory is what
    lets the engines start at once: each sees the others' weights and caches come and go.
    """
    if not 0 < gpu_memory_utilization < 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1), got {gpu_memory_utilization}")
    if gpu_memory_share < 1:
        raise ValueError(f"gpu_memory_share must be >= 1, got {gpu_memory_share}")
    if gpu_memory_share == 1:
        return int(total_bytes * gpu_memory_utilization) - (total_bytes - free_bytes) - reserve_bytes
    share = int(total_bytes * gpu_memory_utilization / gpu_memory_share) - own_bytes
    return min(share, free_bytes) - reserve_bytes


def num_pages_for_memory(
    config: Any,
    *,
    page_size: int,
    dtype: torch.dtype,
    device: torch.device,
    gpu_memory_utilization: float,
    gpu_memory_share: int = 1,
    reserve_bytes: int = 0,
) -> int:
    """KV pages that fit in the budget ``kv_budget_bytes`` gives on ``device`` now.

    ``dtype`` is the KV cache's (``kv_cache_dtype``), not the weights'. Call after the weights
    are loaded (and quantised); ``reserve_bytes`` keeps room for activations, the
    sampler's buffers and CUDA graphs. ``gpu_memory_share``: engines on this GPU (this one
    counted); its own memory is what torch's allocator holds plus
    ``CUDA_CONTEXT_ALLOWANCE_BYTES``.
    """
    free, total = torch.cuda.mem_get_info(device)
    own = torch.cuda.memory_reserved(device) + CUDA_CONTEXT_ALLOWANCE_BYTES
    budget = kv_budget_bytes(free_bytes=free, total_bytes=total, own_bytes=own,
                             gpu_memory_utilization=gpu_memory_utilization,
                             gpu_memory_share=gpu_memory_share, reserve_bytes=reserve_bytes)
    num_pages = budget // kv_bytes_per_page(config, page_size, dtype)
    if num_pages < 1:
        shared = (f", shared by {gpu_memory_share} engines" if gpu_memory_share > 1 else "")
        raise ValueError(
            f"no GPU memory left for the KV cache: {free / 2**30:.1f} GiB free of "
            f"{total / 2**30:.1f} GiB at gpu_memory_utilization={gpu_memory_utilization}{shared}"
        )
    return int(num_pages)


class LaunchedStep:
    """A launched step: call it to wait for its tokens (a list); ``tokens`` holds them where the
    runner put them (on the device for a GPU runner), to feed the next step's rows whose last
    token is still pending without a trip through the host."""

    __slots__ = ("_wait", "tokens")

    def __init__(self, wait: Callable[[], list[int]], tokens: torch.Tensor) -> None:
        self._wait = wait
        self.tokens = tokens

    def __call__(self) -> list[int]:
        return self._wait()


def host_input_ids(batch: ScheduledBatch, feed: torch.Tensor | None) -> list[int]:
    """A step's input ids on the host, ``PENDING`` ones taken from ``feed`` (a sync if it is on
    the device)."""
    ids: list[int] = []
    prev = None
    for s, n in zip(batch.seqs, batch.num_new_tokens):
        if s.next_input is not None and not s.is_prefill:  # the program's input for this position
            ids.append(s.next_input)
            continue
        toks = s.token_slice(s.num_computed_tokens, s.num_computed_tokens + n)
        if toks and toks[-1] == PENDING:
            if feed is None or s.pending_row < 0:
                raise ValueError(f"sequence {s.seq_id}'s last token is pending and no step feeds it")
            if prev is None:
                prev = feed.tolist()
            toks = [*toks[:-1], prev[s.pending_row]]
        ids.extend(toks)
    return ids


class ModelRunner:
    """Runs one engine step: ``forward(ids, positions, attn)`` (``token_rows`` too, for a
    program whose embedding reads per-slot state), then the program's token head.

    ``head``: the program's ``TokenHead``; None builds a ``SingleTokenHead`` over
    ``model.compute_logits`` with ``vocab_ids`` (a column subset of the vocabulary) and
    ``allowed_table`` (bool [R, K] per-position column masks: each sequence's ``allowed_row``
    picks one). ``config`` gives the KV cache's shape (``num_hidden_layers``,
    ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``; ``vocab_size`` for the default
    head). ``uses_token_rows``: ``forward`` takes a fourth argument, each token's state row (its
    sequence's slot). ``kv_cache_dtype`` stores the KV pages in another dtype than the model's
    (float8_e4m3fn: ``engine.llm.fp8``); None = ``dtype``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        config: Any,
        *,
        device: torch.device | str,
        dtype: torch.dtype,
        num_pages: int,
        page_size: int = 16,
        attention_backend_factory: AttentionBackendFactory = torch_paged_attention_factory,
        max_num_seqs: int = 64,
        vocab_ids: list[int] | torch.Tensor | None = None,
        allowed_table: torch.Tensor | None = None,
        kv_cache_dtype: torch.dtype | None = None,
        head: TokenHead | None = None,
        uses_token_rows: bool = False,
    ) -> None:
        self.model = model
        self.config = config
        self.device = torch.device(device)
        self.dtype = dtype
        self.page_size = page_size
        self.max_num_seqs = max_num_seqs
        self.uses_token_rows = uses_token_rows
        # A KV page no sequence owns (CUDA-graph padding rows write there); set by subclasses
        # that allocate one, or by ``engine.llm.build``.
        self.scratch_page: int | None = None
        self.spec = KVCacheSpec(
            num_layers=config.num_hidden_layers,
            num_pages=num_pages,
            page_size=page_size,
            num_qo_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            dtype=dtype,
            device=self.device,
            max_num_seqs=max_num_seqs,
            cache_dtype=kv_cache_dtype,
        )
        self.kv_caches = allocate_kv_caches(self.spec)
        self.attn = attention_backend_factory(self.spec, self.kv_caches)
        if head is None:
            head = SingleTokenHead(model.compute_logits, vocab_size=config.vocab_size, max_num_seqs=max_num_seqs,
                                   device=self.device, vocab_ids=vocab_ids, allowed_table=allowed_table)
        self.head: TokenHead = head

    @property
    def seen(self) -> torch.Tensor:
        """The default head's repetition-penalty rows of the slots (``SingleTokenHead.seen``)."""
        return self.head.seen  # type: ignore[attr-defined]

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch, feed: torch.Tensor | None = None) -> torch.Tensor:
        """Run one step; returns the sampled tokens on the CPU: int64 [B] (or [B, C] for a head
        that samples C codebooks per row).

        Rows whose chunk does not reach the end of their sequence (``is_sampled`` false) get a
        token too; it is meaningless and the caller drops it. ``feed``: the previous launched
        step's tokens (``LaunchedStep.tokens``), for rows whose last token is still ``PENDING``.
        """
        meta = build_attention_metadata(batch, self.page_size)
        input_ids = torch.tensor(host_input_ids(batch, feed), dtype=torch.int64)  # [T]
        hidden = self._hidden(input_ids, meta, batch)  # [B, H]
        tokens, _ = self._sample_eager(hidden, batch)
        return tokens.cpu()  # the step's only host sync

    def launch(self, batch: ScheduledBatch, feed: torch.Tensor | None = None) -> LaunchedStep:
        """Start one step; the returned call waits for its tokens (``execute``, split in two so
        the caller can do host work while the device runs). Here: all at once."""
        tokens = self.execute(batch, feed)
        values = tokens.tolist()
        return LaunchedStep(lambda: values, _feed_column(tokens))

    def _token_rows(self, meta: AttentionMetadata, batch: ScheduledBatch) -> torch.Tensor:
        """Each new token's state row (its sequence's slot), int64 [T] on the device."""
        counts = (meta.qo_indptr[1:] - meta.qo_indptr[:-1]).to(torch.int64)  # [B]
        slots = torch.tensor([s.slot for s in batch.seqs], dtype=torch.int64)
        return torch.repeat_interleave(slots, counts).to(self.device, non_blocking=True)

    def _run_forward(self, forward: Callable[..., torch.Tensor], ids: torch.Tensor, positions: torch.Tensor,
                     attn: Any, token_rows: Callable[[], torch.Tensor]) -> torch.Tensor:
        if self.uses_token_rows:
            return forward(ids, positions, attn, token_rows())
        return forward(ids, positions, attn)

    def _hidden(self, input_ids: torch.Tensor, meta: AttentionMetadata, batch: ScheduledBatch | None = None
                ) -> torch.Tensor:
        """Host input_ids [T] + host metadata -> hidden [B, H] of each row's last token."""
        self.attn.begin_step(meta)
        ids = input_ids.to(self.device, non_blocking=True)
        positions = meta.positions.to(self.device, non_blocking=True)
        hidden = self._run_forward(self.model, ids, positions, self.attn, lambda: self._token_rows(meta, batch))
        last = (meta.qo_indptr[1:].to(torch.int64) - 1).to(self.device, non_blocking=True)  # [B]
        return hidden.index_select(0, last)

    def _forward(self, input_ids: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Host input_ids [T] + host metadata -> float32 logits [B, K] of each row's last token
        (a ``SingleTokenHead``'s; for checks)."""
        return self.head.logits(self._hidden(input_ids, meta))  # type: ignore[attr-defined]

    def row_inputs(self, batch: ScheduledBatch) -> RowInputs:
        """A batch's sampling inputs on the device, with the eager sampler's host hints."""
        dev = self.device
        seqs = batch.seqs
        f32, i64 = torch.float32, torch.int64
        params = [s.params for s in seqs]
        top_k = [p.top_k for p in params]
        return RowInputs(
            temperature=torch.tensor([p.temperature for p in params], dtype=f32).to(dev),
            top_p=torch.tensor([p.top_p for p in params], dtype=f32).to(dev),
            repetition_penalty=torch.tensor([p.repetition_penalty for p in params], dtype=f32).to(dev),
            seeds=torch.tensor([p.seed for p in params], dtype=i64).to(dev),
            steps=torch.tensor([s.num_output_tokens for s in seqs], dtype=i64).to(dev),
            rows=torch.tensor([s.slot for s in seqs], dtype=i64).to(dev),
            allowed_rows=torch.tensor([s.allowed_row for s in seqs], dtype=i64).to(dev),
            keep=torch.tensor(batch.is_sampled, dtype=torch.bool).to(dev),
            top_k=torch.tensor(top_k, dtype=i64).to(dev) if any(top_k) else None,
            all_greedy=all(p.temperature <= 0 for p in params),
            any_top_p=any(p.top_p < 1 for p in params),
        )

    def _sample_eager(self, hidden: torch.Tensor, batch: ScheduledBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [B, H] -> the head's tokens; fresh sequences' state rows are reset first."""
        fresh = [s.slot for s in batch.seqs if s.num_computed_tokens == 0]
        if fresh:  # a new sequence took this slot: forget its predecessor's state
            self.head.reset(torch.tensor(fresh, dtype=torch.int64).to(self.device))
        return self.head.sample(hidden, self.row_inputs(batch))


def _feed_column(tokens: torch.Tensor) -> torch.Tensor:
    """The column a ``PENDING`` input takes from a step's tokens (the first codebook of a frame)."""
    return tokens if tokens.dim() == 1 else tokens[:, 0]
