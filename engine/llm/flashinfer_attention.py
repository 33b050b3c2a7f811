"""FlashInfer paged attention behind the engine's ``AttentionBackend`` protocol (GPU only).

A step calls ``begin_step(meta)`` once (plans the wrappers), then ``attn(layer, q, k, v)`` per
layer; ``GraphDecodeAttention`` is the variant captured in decode CUDA graphs. ``flashinfer`` is
imported lazily, so importing this module needs no GPU (details: docs/architecture.md).
"""

from __future__ import annotations

from typing import Any

import torch

from engine.llm.attention import write_kv
from engine.llm.fp8 import is_fp8

__all__ = ["FlashInferAttention", "GraphDecodeAttention", "slot_to_page_offset"]

_WORKSPACE_BYTES = 128 * 1024 * 1024
# The head sizes FlashInfer's kernels are built for (its DISPATCH_HEAD_DIM); others fail inside
# its first plan or run ("Unsupported head_dim"), so the build refuses them at once.
HEAD_DIMS = (64, 128, 256, 512)


def slot_to_page_offset(slot_mapping: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split flat slots (``page * page_size + offset``) into page and in-page offset tensors."""
    return slot_mapping // page_size, slot_mapping % page_size


def _host(t: torch.Tensor) -> torch.Tensor:
    """The tensor on the CPU; FlashInfer's ``plan`` needs host copies of the index arrays."""
    return t if t.device.type == "cpu" else t.cpu()


_write_kv = write_kv  # (cache [N, 2, P, Hkv, Dh], page [T], offset [T], k/v [T, Hkv, Dh]); fp8-aware


class _Shape:
    def __init__(self, kv_caches: list[torch.Tensor], num_q_heads: int, q_dtype: torch.dtype | None = None) -> None:
        if not kv_caches:
            raise ValueError("kv_caches is empty")
        first = kv_caches[0]
        if first.dim() != 5 or first.shape[1] != 2:
            raise ValueError(f"KV cache must be [num_pages, 2, page_size, heads, dim], got {tuple(first.shape)}")
        self.num_pages, _, self.page_size, self.num_kv_heads, self.head_dim = first.shape
        if num_q_heads % self.num_kv_heads:
            raise ValueError(f"num_q_heads {num_q_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        self.num_q_heads = num_q_heads
        self.dtype = first.dtype  # the pages'
        # Queries (and the output) stay in the model's dtype over fp8 pages.
        self.q_dtype = q_dtype or (torch.bfloat16 if is_fp8(first.dtype) else first.dtype)
        self.device = first.device


class FlashInferAttention:
    """Eager FlashInfer attention for any step: decode rows, prefill rows, or both mixed."""

    def __init__(
        self,
        kv_caches: list[torch.Tensor],
        *,
        num_q_heads: int,
        workspace_bytes: int = _WORKSPACE_BYTES,
        q_dtype: torch.dtype | None = None,
    ) -> None:
        import flashinfer

        self.kv_caches = kv_caches
        self.shape = _Shape(kv_caches, num_q_heads, q_dtype)
        dev = self.shape.device
        # Separate workspaces: decode and prefill run one after the other in every layer.
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            torch.zeros(workspace_bytes, dtype=torch.uint8, device=dev), "NHD"
        )
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            torch.zeros(workspace_bytes, dtype=torch.uint8, device=dev), "NHD"
        )
        self._num_decode = 0
        self._num_tokens = 0
        self._page: torch.Tensor | None = None
        self._offset: torch.Tensor | None = None

    def begin_step(self, meta: Any) -> None:
        """Plan this step's kernels; call once per step, before the model's forward."""
        s = self.shape
        qo_indptr = _host(meta.qo_indptr).to(torch.int32)
        kv_indptr = _host(meta.kv_indptr).to(torch.int32)
        kv_indices = _host(meta.kv_indices).to(torch.int32)
        last_len = _host(meta.kv_last_page_len).to(torch.int32)
        nd = int(meta.num_decode_seqs)
        batch = last_len.numel()
        if not 0 <= nd <= batch:
            raise ValueError(f"num_decode_seqs {nd} outside [0, {batch}]")
        self._num_decode = nd
        self._num_tokens = int(qo_indptr[-1])
        if int(qo_indptr[nd]) != nd:
            raise ValueError("decode rows must come first with one query token each")
        slots = meta.slot_mapping.to(s.device, dtype=torch.int64, non_blocking=True)
        self._page, self._offset = slot_to_page_offset(slots, s.page_size)
        common = dict(q_data_type=s.q_dtype, kv_data_type=s.dtype)
        if nd > 0:
            n_idx = int(kv_indptr[nd])
            self._decode.plan(
                kv_indptr[: nd + 1], kv_indices[:n_idx], last_len[:nd],
                s.num_q_heads, s.num_kv_heads, s.head_dim, s.page_size, **common,
            )
        if nd < batch:
            kv0 = int(kv_indptr[nd])
            self._prefill.plan(
                qo_indptr[nd:] - nd, kv_indptr[nd:] - kv0, kv_indices[kv0 : int(kv_indptr[-1])], last_len[nd:],
                s.num_q_heads, s.num_kv_heads, s.head_dim, s.page_size, causal=True, **common,
            )

    def __call__(
        self,
        layer: int,
        q: torch.Tensor,  # [T, Hq, Dh]
        k: torch.Tensor,  # [T, Hkv, Dh]
        v: torch.Tensor,  # [T, Hkv, Dh]
    ) -> torch.Tensor:  # [T, Hq, Dh]
        cache = self.kv_caches[layer]
        _write_kv(cache, self._page, self._offset, k, v)
        q = q.to(self.shape.q_dtype)
        nd, t = self._num_decode, q.shape[0]
        out = torch.empty_like(q)
        if nd > 0:
            self._decode.run(q[:nd].contiguous(), cache, out=out[:nd])
        if nd < t:
            self._prefill.run(q[nd:].contiguous(), cache, out=out[nd:])
        return out


class GraphDecodeAttention:
    """Decode-only attention at a fixed batch size, for CUDA-graph capture and replay.

    The metadata given to ``begin_step`` must have exactly ``batch_size`` decode rows (pad
    first) and at most ``max_num_pages`` page indices in all. ``tensor_cores``: FlashInfer's
    tensor-core decode (its prefill kernel) instead of the CUDA-core one; fixed at capture.
    """

    def __init__(
        self,
        kv_caches: list[torch.Tensor],
        *,
        num_q_heads: int,
        batch_size: int,
        max_num_pages: int,
        workspace: torch.Tensor,
        q_dtype: torch.dtype | None = None,
        async_plan: bool = False,
        tensor_cores: bool = False,
    ) -> None:
        import flashinfer

        self.kv_caches = kv_caches
        self.shape = _Shape(kv_caches, num_q_heads, q_dtype)
        self.batch_size = batch_size
        self.async_plan = async_plan  # see begin_step
        dev = self.shape.device
        self._page = torch.zeros(batch_size, dtype=torch.int64, device=dev)
        self._offset = torch.zeros(batch_size, dtype=torch.int64, device=dev)
        # tensor_cores: FlashInfer's prefill kernel runs the decode (tensor-core MMAs over the
        # query heads of a KV head) instead of its CUDA-core decode kernel (EngineConfig.decode_attention)
        self.tensor_cores = tensor_cores
        self._wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=tensor_cores,
            paged_kv_indptr_buffer=torch.zeros(batch_size + 1, dtype=torch.int32, device=dev),
            paged_kv_indices_buffer=torch.zeros(max_num_pages, dtype=torch.int32, device=dev),
            paged_kv_last_page_len_buffer=torch.zeros(batch_size, dtype=torch.int32, device=dev),
        )
        self._planned: torch.cuda.Event | None = None  # after the last plan's copies (see begin_step)

    def begin_step(self, meta: Any) -> None:
        """Plan for this replay and stage the K/V slots in the fixed buffers (outside the graph)."""
        s = self.shape
        last_len = _host(meta.kv_last_page_len).to(torch.int32)
        if last_len.numel() != self.batch_size or int(meta.num_decode_seqs) != self.batch_size:
            raise ValueError(f"graph for batch {self.batch_size} got {last_len.numel()} rows")
        slots = meta.slot_mapping.to(s.device, dtype=torch.int64, non_blocking=True)
        page, offset = slot_to_page_offset(slots, s.page_size)
        self._page.copy_(page)
        self._offset.copy_(offset)
        indices = _host(meta.kv_indices).to(torch.int32)
        if self.async_plan:
            # Given on the host, the page ids are copied by FlashInfer's graph-mode plan with a
            # blocking copy, which waits for all the device work queued so far, the step still
            # running included: with asynchronous steps the host then launches each step only
            # once the previous one has finished (that wait was 36% of the engine's time at 64
            # streams on the H200, py-spy). ``async_plan`` sends them from pinned memory
            # without waiting. The plan writes its schedule into a pinned host buffer of its
            # own and copies it behind the queued work; before overwriting that buffer, wait
            # for the previous plan's copy (queued before the previous replay: not for it).
            indices = indices.pin_memory().to(s.device, non_blocking=True)
            if self._planned is not None:
                self._planned.synchronize()
        self._wrapper.plan(
            _host(meta.kv_indptr).to(torch.int32), indices, last_len,
            s.num_q_heads, s.num_kv_heads, s.head_dim, s.page_size,
            q_data_type=s.q_dtype, kv_data_type=s.dtype,
        )
        if self.async_plan:
            if self._planned is None:
                self._planned = torch.cuda.Event()
            self._planned.record()

    def __call__(
        self,
        layer: int,
        q: torch.Tensor,  # [B, Hq, Dh]
        k: torch.Tensor,  # [B, Hkv, Dh]
        v: torch.Tensor,  # [B, Hkv, Dh]
    ) -> torch.Tensor:  # [B, Hq, Dh]
        cache = self.kv_caches[layer]
        _write_kv(cache, self._page, self._offset, k, v)
        return self._wrapper.run(q.to(self.shape.q_dtype).contiguous(), cache)
