"""Model runner: turns a ``ScheduledBatch`` into tensors, runs the model, samples.

It owns the device buffers: the paged KV cache, the attention backend (plain torch here;
FlashInfer and CUDA graphs plug in through ``attention_backend_factory`` and by overriding
the ``_forward`` / ``_sample`` seams) and the per-slot repetition-penalty masks.
``execute`` has exactly one host synchronisation: reading the sampled tokens at the end.
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
from engine.llm.sampler import Sampler
from engine.llm.scheduler import ScheduledBatch
from engine.llm.sequence import PENDING

__all__ = ["AttentionBackendFactory", "LaunchedStep", "ModelRunner", "allowed_columns", "host_input_ids", "kv_bytes_per_page", "num_pages_for_memory"]

AttentionBackendFactory = Callable[[KVCacheSpec, list[torch.Tensor]], AttentionBackend]


def kv_bytes_per_page(config: Any, page_size: int, dtype: torch.dtype) -> int:
    """Bytes one page takes across all layers (K and V); ``dtype`` is the KV cache's (fp8: 1 byte)."""
    elem = torch.empty((), dtype=dtype).element_size()
    return config.num_hidden_layers * 2 * page_size * config.num_key_value_heads * config.head_dim * elem


def num_pages_for_memory(
    config: Any,
    *,
    page_size: int,
    dtype: torch.dtype,
    device: torch.device,
    gpu_memory_utilization: float,
    reserve_bytes: int = 0,
) -> int:
    """KV pages that fit in ``total * utilization`` minus what is already in use on the GPU.

    ``dtype`` is the KV cache's (``kv_cache_dtype``), not the weights'. Call after the weights
    are loaded (and quantised); ``reserve_bytes`` keeps room for activations, the
    sampler's buffers and CUDA graphs.
    """
    if not 0 < gpu_memory_utilization < 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1), got {gpu_memory_utilization}")
    free, total = torch.cuda.mem_get_info(device)
    budget = int(total * gpu_memory_utilization) - (total - free) - reserve_bytes
    num_pages = budget // kv_bytes_per_page(config, page_size, dtype)
    if num_pages < 1:
        raise ValueError(
            f"no GPU memory left for the KV cache: {free / 2**30:.1f} GiB free of "
            f"{total / 2**30:.1f} GiB at gpu_memory_utilization={gpu_memory_utilization}"
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
        toks = s.token_slice(s.num_computed_tokens, s.num_computed_tokens + n)
        if toks and toks[-1] == PENDING:
            if feed is None or s.pending_row < 0:
                raise ValueError(f"sequence {s.seq_id}'s last token is pending and no step feeds it")
            if prev is None:
                prev = feed.tolist()
            toks = [*toks[:-1], prev[s.pending_row]]
        ids.extend(toks)
    return ids


def allowed_columns(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bool [R, K] column masks -> (int64 [R, M] each row's allowed columns ascending, padded
    with column 0; bool [R, M] which entries are real), M = the largest row count."""
    counts = table.sum(dim=1)  # [R]
    m = max(int(counts.max()), 1)
    cols = torch.zeros(table.shape[0], m, dtype=torch.int64, device=table.device)
    valid = torch.arange(m, device=table.device).unsqueeze(0) < counts.unsqueeze(1)  # [R, M]
    for r in range(table.shape[0]):
        idx = torch.nonzero(table[r]).flatten()
        cols[r, : idx.numel()] = idx
    return cols, valid


class ModelRunner:
    """Runs one engine step on ``model`` (``forward(ids, positions, attn)`` + ``compute_logits``).

    ``vocab_ids`` restricts the head (and sampling) to a subset of the vocabulary; sampled
    indices are mapped back to token ids. ``allowed_table`` (bool [R, K]) masks columns per
    row: each sequence's ``allowed_row`` picks one row. ``kv_cache_dtype`` stores the KV pages
    in another dtype than the model's (float8_e4m3fn: ``engine.llm.fp8``); None = ``dtype``.
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
    ) -> None:
        self.model = model
        self.config = config
        self.device = torch.device(device)
        self.dtype = dtype
        self.page_size = page_size
        self.max_num_seqs = max_num_seqs
        # A KV page no sequence owns (CUDA-graph padding rows write there); set by subclasses
        # that allocate one, or by ``build_orpheus_backend``.
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
        self.sampler = Sampler()
        self.vocab_ids: torch.Tensor | None = None
        if vocab_ids is not None:
            self.vocab_ids = torch.as_tensor(vocab_ids, dtype=torch.int64).to(self.device)  # [K]
        num_cols = config.vocab_size if self.vocab_ids is None else int(self.vocab_ids.numel())
        if allowed_table is not None and allowed_table.shape[-1] != num_cols:
            raise ValueError(f"allowed_table has {allowed_table.shape[-1]} columns, logits have {num_cols}")
        self.allowed_table = None if allowed_table is None else allowed_table.to(self.device, torch.bool)
        # The sampler works on each row's allowed columns only (Orpheus: 4,097 of 28,673).
        self.allowed_cols: torch.Tensor | None = None  # int64 [R, M]
        self.allowed_valid: torch.Tensor | None = None  # bool [R, M]
        if self.allowed_table is not None:
            self.allowed_cols, self.allowed_valid = allowed_columns(self.allowed_table)
        # Tokens each slot's sequence generated so far (repetition penalty), in column space.
        self.seen = torch.zeros(max_num_seqs, num_cols, dtype=torch.bool, device=self.device)

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch, feed: torch.Tensor | None = None) -> torch.Tensor:
        """Run one step; returns the sampled token ids, int64 [B] on the CPU.

        Rows whose chunk does not reach the end of their sequence (``is_sampled`` false) get a
        token too; it is meaningless and the caller drops it. ``feed``: the previous launched
        step's tokens (``LaunchedStep.tokens``), for rows whose last token is still ``PENDING``.
        """
        meta = build_attention_metadata(batch, self.page_size)
        input_ids = torch.tensor(host_input_ids(batch, feed), dtype=torch.int64)  # [T]
        logits = self._forward(input_ids, meta)  # [B, K] float32
        cols = self._sample(logits, batch)  # [B]
        tokens = cols if self.vocab_ids is None else self.vocab_ids.index_select(0, cols)
        return tokens.cpu()  # the step's only host sync

    def launch(self, batch: ScheduledBatch, feed: torch.Tensor | None = None) -> LaunchedStep:
        """Start one step; the returned call waits for its tokens (``execute``, split in two so
        the caller can do host work while the device runs). Here: all at once."""
        tokens = self.execute(batch, feed)
        values = tokens.tolist()
        return LaunchedStep(lambda: values, tokens)

    def _forward(self, input_ids: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Host input_ids [T] + host metadata -> float32 logits [B, K] of each row's last token."""
        self.attn.begin_step(meta)
        ids = input_ids.to(self.device, non_blocking=True)
        positions = meta.positions.to(self.device, non_blocking=True)
        hidden = self.model(ids, positions, self.attn)  # [T, hidden]
        last = (meta.qo_indptr[1:].to(torch.int64) - 1).to(self.device, non_blocking=True)  # [B]
        return self.model.compute_logits(hidden.index_select(0, last), self.vocab_ids)

    def _sample(self, logits: torch.Tensor, batch: ScheduledBatch) -> torch.Tensor:
        """float32 logits [B, K] -> sampled column indices [B]; updates the penalty masks."""
        dev = self.device
        seqs = batch.seqs
        fresh = [s.slot for s in seqs if s.num_computed_tokens == 0]
        if fresh:  # a new sequence took this slot: forget its predecessor's tokens
            self.seen[torch.tensor(fresh, dtype=torch.int64).to(dev)] = False
        slots = torch.tensor([s.slot for s in seqs], dtype=torch.int64).to(dev)  # [B]
        f32 = torch.float32
        params = [s.params for s in seqs]
        allowed = columns = None
        if self.allowed_table is not None:
            rows = torch.tensor([s.allowed_row for s in seqs], dtype=torch.int64).to(dev)
            columns = self.allowed_cols.index_select(0, rows)  # [B, M]
            allowed = self.allowed_valid.index_select(0, rows)  # [B, M]
        cols = self.sampler(
            logits,
            temperature=torch.tensor([p.temperature for p in params], dtype=f32).to(dev),
            top_p=torch.tensor([p.top_p for p in params], dtype=f32).to(dev),
            repetition_penalty=torch.tensor([p.repetition_penalty for p in params], dtype=f32).to(dev),
            seeds=torch.tensor([p.seed for p in params], dtype=torch.int64).to(dev),
            steps=torch.tensor([s.num_output_tokens for s in seqs], dtype=torch.int64).to(dev),
            seen=self.seen.index_select(0, slots),
            allowed=allowed,
            columns=columns,
            all_greedy=all(p.temperature <= 0 for p in params),
            any_top_p=any(p.top_p < 1 for p in params),
        )  # [B]
        keep = torch.tensor(batch.is_sampled, dtype=torch.bool).to(dev)  # [B]
        self.seen[slots, cols] = self.seen[slots, cols] | keep
        return cols
