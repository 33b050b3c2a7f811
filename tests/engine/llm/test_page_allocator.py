"""Page allocator: property tests of the no-double-handout and full-return invariants."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.llm.page_allocator import PageAllocator, num_pages_for

# An operation: ("alloc", n) or ("free", index into the live allocations).
ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(0, 12)),
        st.tuples(st.just("free"), st.integers(0, 50)),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(num_pages=st.integers(1, 40), ops=ops)
def test_never_hands_out_a_page_twice_and_gets_all_back(num_pages, ops):
    """Live allocations are disjoint, can_allocate matches allocate, and all pages come back."""
    alloc = PageAllocator(num_pages, page_size=16)
    live: list[list[int]] = []
    for op, arg in ops:
        if op == "alloc":
            ok = alloc.can_allocate(arg)
            if ok:
                live.append(alloc.allocate(arg))
            else:
                with pytest.raises(ValueError):
                    alloc.allocate(arg)
        elif live:
            alloc.deallocate(live.pop(arg % len(live)))
        held = [p for pages in live for p in pages]
        assert len(held) == len(set(held)), "a page is held twice"
        assert all(0 <= p < num_pages for p in held)
        assert alloc.num_free_pages + len(held) == num_pages
    for pages in live:
        alloc.deallocate(pages)
    assert alloc.num_free_pages == num_pages
    assert alloc.can_allocate(num_pages) and not alloc.can_allocate(num_pages + 1)


def test_double_free_and_foreign_pages_are_refused():
    """Deallocating a page not in use raises and changes nothing."""
    alloc = PageAllocator(4, page_size=16)
    pages = alloc.allocate(2)
    alloc.deallocate(pages)
    with pytest.raises(ValueError):
        alloc.deallocate(pages)
    with pytest.raises(ValueError):
        alloc.deallocate([99])
    assert alloc.num_free_pages == 4


def test_num_pages_for_rounds_up():
    """Token counts map to whole pages."""
    assert [num_pages_for(n, 16) for n in (0, 1, 16, 17, 32)] == [0, 1, 1, 2, 2]
