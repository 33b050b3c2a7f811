"""Paged-attention metadata and the plain-torch paged attention backend (CPU or any device).

The KV cache is one ``[num_pages, 2, page_size, num_kv_heads, head_dim]`` tensor per layer
(FlashInfer's NHD layout; K at index 0 of dim 1, V at 1), in the model's dtype or fp8; a step's
rows are its decode rows first, then prefill chunks (docs/architecture.md, "The LM runtime").
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F

from engine.llm.fp8 import is_fp8, to_fp8_saturated
from engine.llm.kernels import KV_WRITE_KINDS, check_kernel

if TYPE_CHECKING:
    from engine.llm.scheduler import ScheduledBatch

__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "KVCacheSpec",
    "KV_WRITE_KINDS",
    "TorchPagedAttention",
    "allocate_kv_caches",
    "build_attention_metadata",
    "kv_write_kind",
    "set_kv_write",
    "torch_paged_attention_factory",
    "write_kv",
]

# How ``write_kv`` stores a step's keys and values (EngineConfig.kv_write): "index" (two
# index_put kernels) or "triton" (one kernel, ``engine.llm.kv_write_triton``; CUDA caches not in
# fp8, others keep index_put). One engine a process: ``build_lm_backend`` sets it.
_kv_write = "index"
_write_kv_triton = None  # kv_write_triton.write_kv_triton while "triton" is set


def kv_write_kind() -> str:
    """The process's KV write (``KV_WRITE_KINDS``), as ``set_kv_write`` last chose it."""
    return _kv_write


def set_kv_write(kind: str) -> None:
    """Choose ``write_kv``'s kernels for this process (``KV_WRITE_KINDS``); "triton" needs Triton."""
    global _kv_write, _write_kv_triton
    check_kernel("kv_write", kind, auto=False)
    writer = None
    if kind == "triton":
        from engine.llm import kv_write_triton

        if kv_write_triton.triton is None:
            raise ValueError("--kv-write triton needs Triton (it comes with CUDA torch)")
        writer = kv_write_triton.write_kv_triton
    _kv_write, _write_kv_triton = kind, writer


@dataclass(frozen=True)
class KVCacheSpec:
    """Everything an attention backend needs to know about the cache and the model's heads."""

    num_layers: int
    num_pages: int
    page_size: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype  # the model's activations (queries, attention output)
    device: torch.device
    max_num_seqs: int
    cache_dtype: torch.dtype | None = None  # the KV pages' dtype; None = ``dtype``

    @property
    def kv_dtype(self) -> torch.dtype:
        """The dtype the KV pages are stored in."""
        return self.dtype if self.cache_dtype is None else self.cache_dtype


@dataclass
class AttentionMetadata:
    """One step's batch layout. B sequences, T new tokens, P pages in use."""

    qo_indptr: torch.Tensor  # int32 [B+1] cumulative new tokens per sequence
    kv_indptr: torch.Tensor  # int32 [B+1] cumulative pages per sequence
    kv_indices: torch.Tensor  # int32 [P] page ids of each sequence, in order
    kv_last_page_len: torch.Tensor  # int32 [B] tokens in the last page (1..page_size), incl. new
    slot_mapping: torch.Tensor  # int64 [T] page * page_size + offset of each new token's K/V
    positions: torch.Tensor  # int64 [T]
    num_decode_seqs: int

    @property
    def num_seqs(self) -> int:
        return self.kv_last_page_len.shape[0]

    def to(self, device: torch.device | str, non_blocking: bool = True) -> AttentionMetadata:
        moved = {
            f.name: getattr(self, f.name).to(device, non_blocking=non_blocking)
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return AttentionMetadata(**moved, num_decode_seqs=self.num_decode_seqs)


def build_attention_metadata(batch: ScheduledBatch, page_size: int) -> AttentionMetadata:
    """Host-side metadata for a scheduled batch (pure Python lists, then CPU tensors)."""
    qo_indptr = [0]
    kv_indptr = [0]
    kv_indices: list[int] = []
    last_page_len: list[int] = []
    slots: list[int] = []
    positions: list[int] = []
    for seq, n in zip(batch.seqs, batch.num_new_tokens):
        start = seq.num_computed_tokens
        kv_len = start + n
        num_pages = -(-kv_len // page_size)
        if num_pages > len(seq.pages):
            raise ValueError(f"sequence {seq.seq_id} needs {num_pages} pages, holds {len(seq.pages)}")
        qo_indptr.append(qo_indptr[-1] + n)
        kv_indptr.append(kv_indptr[-1] + num_pages)
        kv_indices.extend(seq.pages[:num_pages])
        last_page_len.append(kv_len - (num_pages - 1) * page_size)
        for pos in range(start, kv_len):
            slots.append(seq.pages[pos // page_size] * page_size + pos % page_size)
            positions.append(pos)
    i32 = torch.int32
    return AttentionMetadata(
        qo_indptr=torch.tensor(qo_indptr, dtype=i32),
        kv_indptr=torch.tensor(kv_indptr, dtype=i32),
        kv_indices=torch.tensor(kv_indices, dtype=i32),
        kv_last_page_len=torch.tensor(last_page_len, dtype=i32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        positions=torch.tensor(positions, dtype=torch.int64),
        num_decode_seqs=batch.num_decode_seqs,
    )


def allocate_kv_caches(spec: KVCacheSpec) -> list[torch.Tensor]:
    """One zeroed ``[num_pages, 2, page_size, num_kv_heads, head_dim]`` tensor per layer, in ``spec.kv_dtype``."""
    shape = (spec.num_pages, 2, spec.page_size, spec.num_kv_heads, spec.head_dim)
    return [torch.zeros(shape, dtype=spec.kv_dtype, device=spec.device) for _ in range(spec.num_layers)]


def _as_stored(cache: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cache view, values) to index_put into: fp8 goes through uint8 views of both, so the
    write needs no fp8 kernel, and the values are saturated first."""
    if is_fp8(cache.dtype):
        return cache.view(torch.uint8), to_fp8_saturated(x).view(torch.uint8)
    return cache, x.to(cache.dtype)


def write_kv(
    cache: torch.Tensor,  # [N, 2, P, Hkv, Dh]
    page: torch.Tensor,  # [T] int64
    offset: torch.Tensor,  # [T] int64
    k: torch.Tensor,  # [T, Hkv, Dh]
    v: torch.Tensor,  # [T, Hkv, Dh]
) -> None:
    """Store each new token's K/V at ``(page, offset)``, cast to the cache's dtype (fp8: saturated).

    index_put on the K and V views (or, with ``set_kv_write("triton")`` and a CUDA cache not in
    fp8, one Triton kernel for both): no host sync, capturable in a CUDA graph.
    """
    if _write_kv_triton is not None and cache.is_cuda and not is_fp8(cache.dtype):
        _write_kv_triton(cache, page, offset, k, v)
        return
    dst, k = _as_stored(cache, k)
    dst[:, 0][page, offset] = k
    dst, v = _as_stored(cache, v)
    dst[:, 1][page, offset] = v


def read_pages(cache: torch.Tensor, pages: torch.Tensor, kv: int, dtype: torch.dtype) -> torch.Tensor:
    """K (``kv`` 0) or V (1) of ``pages`` as ``[len(pages) * page_size, Hkv, Dh]`` in ``dtype`` (fp8 upcast)."""
    if is_fp8(cache.dtype):
        raw = cache.view(torch.uint8)[pages, kv].view(cache.dtype)  # [n, P, Hkv, Dh]
    else:
        raw = cache[pages, kv]
    return raw.flatten(0, 1).to(dtype)


class AttentionBackend(Protocol):
    def begin_step(self, meta: AttentionMetadata) -> None:
        """Called once per step before the forward pass (plan kernels, cache index math).

        ``ModelRunner`` passes host (CPU) metadata, so planning needs no device->host sync;
        the backend copies what its kernels read to its device (non-blocking).
        """
        ...

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """Store this step's k/v for ``layer`` and return attention output ``[T, Hq, D]``."""
        ...


class TorchPagedAttention:
    """Reference paged attention in plain torch: a per-sequence loop, so a row's result never
    depends on its batch neighbours. Slow but simple; for the CPU path and for tests."""

    def __init__(self, spec: KVCacheSpec, kv_caches: list[torch.Tensor]) -> None:
        if spec.num_qo_heads % spec.num_kv_heads:
            raise ValueError("num_qo_heads must be a multiple of num_kv_heads")
        self.spec = spec
        self.kv_caches = kv_caches
        self._seqs: list[tuple[int, int, torch.Tensor, int]] = []
        self._page = self._offset = torch.empty(0, dtype=torch.int64)

    def begin_step(self, meta: AttentionMetadata) -> None:
        qo = meta.qo_indptr.tolist()
        kv = meta.kv_indptr.tolist()
        last = meta.kv_last_page_len.tolist()
        ps, dev = self.spec.page_size, self.spec.device
        indices = meta.kv_indices.to(dev, torch.int64, non_blocking=True)
        self._seqs = []
        for b in range(len(last)):
            kv_len = (kv[b + 1] - kv[b] - 1) * ps + last[b]
            self._seqs.append((qo[b], qo[b + 1], indices[kv[b] : kv[b + 1]], kv_len))
        slots = meta.slot_mapping.to(dev, torch.int64, non_blocking=True)
        self._page = torch.div(slots, ps, rounding_mode="floor")  # [T]
        self._offset = slots % ps  # [T]

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        # q: [T, Hq, D]; k, v: [T, Hkv, D]
        cache = self.kv_caches[layer]  # [P, 2, ps, Hkv, D]
        write_kv(cache, self._page, self._offset, k, v)
        group = self.spec.num_qo_heads // self.spec.num_kv_heads
        out = torch.empty_like(q)
        for q_start, q_end, pages, kv_len in self._seqs:
            n = q_end - q_start
            keys = read_pages(cache, pages, 0, q.dtype)[:kv_len]  # [L, Hkv, D]
            values = read_pages(cache, pages, 1, q.dtype)[:kv_len]  # [L, Hkv, D]
            keys = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, L, D]
            values = values.repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, L, D]
            query = q[q_start:q_end].transpose(0, 1)  # [Hq, n, D]
            # New token i sits at position kv_len - n + i and sees keys 0..that position.
            rows = torch.arange(n, device=q.device).unsqueeze(1) + (kv_len - n)  # [n, 1]
            mask = torch.arange(kv_len, device=q.device).unsqueeze(0) <= rows  # [n, L]
            o = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask)
            out[q_start:q_end] = o.transpose(0, 1)  # [n, Hq, D]
        return out


def torch_paged_attention_factory(spec: KVCacheSpec, kv_caches: list[torch.Tensor]) -> TorchPagedAttention:
    """The default ``attention_backend_factory`` of ``ModelRunner``."""
    return TorchPagedAttention(spec, kv_caches)
