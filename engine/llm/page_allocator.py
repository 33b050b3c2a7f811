"""Pure-Python page allocator for the paged KV cache: hands out ids of ``num_pages`` pages of
``page_size`` tokens and never touches tensors.

Pinned by property tests: a page is handed out at most once until freed, a double free raises
``ValueError``, and ``can_allocate(n)`` is true exactly when ``allocate(n)`` would succeed.
"""

from __future__ import annotations

__all__ = ["PageAllocator", "num_pages_for"]


def num_pages_for(num_tokens: int, page_size: int) -> int:
    """Pages needed to hold ``num_tokens`` tokens."""
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    return -(-num_tokens // page_size)


class PageAllocator:
    """Hands out page ids from a fixed pool; LIFO reuse keeps recently freed pages warm."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {num_pages}")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        # Pop from the end: page 0 is handed out first.
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._used: set[int] = set()

    @property
    def num_free_pages(self) -> int:
        return len(self._free)

    @property
    def num_used_pages(self) -> int:
        return len(self._used)

    def can_allocate(self, num_pages: int) -> bool:
        """True if ``allocate(num_pages)`` would succeed now."""
        return 0 <= num_pages <= len(self._free)

    def allocate(self, num_pages: int) -> list[int]:
        """Take ``num_pages`` pages; raises ``ValueError`` if not enough are free."""
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        if num_pages > len(self._free):
            raise ValueError(f"cannot allocate {num_pages} pages: only {len(self._free)} free")
        pages = [self._free.pop() for _ in range(num_pages)]
        self._used.update(pages)
        return pages

    def deallocate(self, pages: list[int]) -> None:
        """Return pages to the pool. All of them must be in use (checked before any is freed)."""
        if len(set(pages)) != len(pages):
            raise ValueError("deallocate: duplicate page ids")
        bad = [p for p in pages if p not in self._used]
        if bad:
            raise ValueError(f"deallocate: pages not in use: {bad[:8]}")
        for p in reversed(pages):
            self._used.discard(p)
            self._free.append(p)
