"""A step's new keys and values stored into the paged KV cache by one Triton kernel
(``--kv-write triton``), where ``attention.write_kv`` makes two ``index_put`` kernels a layer.

On an H100 at 448 decode rows (Orpheus-3B, 8 KV heads of 128) each of those took 5.6 µs for
0.9 MB (engine_profile's kernel table, 2026-12-05): 11 µs a layer, 3% of the step's device time.
Here a program is a block of one token's K and V columns: it reads the token's page and offset
once and writes both. Caches in fp8 keep ``index_put`` (their saturating cast). The default for
a program that names it (``ServingDefaults.kv_write``; Orpheus); ``index`` for the others.
"""

from __future__ import annotations

from torch import Tensor

try:  # Triton serves this kernel on CUDA (it comes with CUDA torch); a CPU install need not have it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

__all__ = ["write_kv_triton"]


def write_kv_triton(cache: Tensor, page: Tensor, offset: Tensor, k: Tensor, v: Tensor) -> None:
    """Store ``k`` and ``v`` [T, Hkv, Dh] at ``(page, offset)`` [T] of ``cache`` [N, 2, P, Hkv, Dh]
    (contiguous; K at index 0 of dim 1, V at 1), cast to the cache's dtype: what
    ``attention.write_kv`` does, in one kernel."""
    if triton is None:
        raise RuntimeError("--kv-write triton needs Triton (it comes with CUDA torch)")
    t = k.shape[0]
    if cache.dim() != 5 or cache.shape[1] != 2 or not cache.is_contiguous():
        raise ValueError(f"write_kv_triton: cache {tuple(cache.shape)} is not a contiguous [N, 2, P, Hkv, Dh]")
    if k.shape != v.shape or k.shape[1:] != cache.shape[3:] or page.shape != (t,) or offset.shape != (t,):
        raise ValueError(f"write_kv_triton: k {tuple(k.shape)}, v {tuple(v.shape)}, page {tuple(page.shape)} and "
                         f"offset {tuple(offset.shape)} do not fit cache {tuple(cache.shape)}")
    if t == 0:
        return
    width = cache.shape[3] * cache.shape[4]
    k2, v2 = k.reshape(t, width), v.reshape(t, width)  # (a view where each row is contiguous)
    if k2.stride(1) != 1:
        k2 = k2.contiguous()
    if v2.stride(1) != 1:
        v2 = v2.contiguous()
    block = min(1024, triton.next_power_of_2(width))
    write_kv_kernel[(t, triton.cdiv(width, block))](cache, page, offset, k2, v2, k2.stride(0), v2.stride(0),
                                                     cache.shape[2], width, BLOCK=block, num_warps=4)


if triton is not None:  # (else the kernel is not made: the caller says Triton is needed)
    @triton.jit
    def write_kv_kernel(cache_ptr, page_ptr, offset_ptr, k_ptr, v_ptr, k_stride, v_stride, PAGE_SIZE, WIDTH,
                        BLOCK: tl.constexpr):
        tok = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = c < WIDTH
        page = tl.load(page_ptr + tok).to(tl.int64)
        off = tl.load(offset_ptr + tok).to(tl.int64)
        k_at = ((page * 2) * PAGE_SIZE + off) * WIDTH  # [page, 0, off] of the cache
        v_at = k_at + PAGE_SIZE * WIDTH  # [page, 1, off]
        kv = tl.load(k_ptr + tok * k_stride + c, mask=inside, other=0.0)
        vv = tl.load(v_ptr + tok * v_stride + c, mask=inside, other=0.0)
        tl.store(cache_ptr + k_at + c, kv.to(cache_ptr.dtype.element_ty), mask=inside)
        tl.store(cache_ptr + v_at + c, vv.to(cache_ptr.dtype.element_ty), mask=inside)
