"""``engine.gc_heap``: the start-up heap frozen out of full collections; pauses counted."""

from __future__ import annotations

import gc

import pytest

from engine.gc_heap import GcProbe, freeze_startup_heap


@pytest.fixture
def unfrozen():
    yield
    gc.unfreeze()  # give the test process its heap back


def test_freeze_moves_what_is_alive_out_of_the_collector(unfrozen) -> None:
    before = [[i] for i in range(1000)]  # tracked containers, alive at the freeze
    assert any(o is before for o in gc.get_objects())
    frozen = freeze_startup_heap()
    assert frozen >= 1000 and gc.get_freeze_count() == frozen
    assert not any(o is before for o in gc.get_objects())  # a full collection no longer walks it
    later = [[0]]
    assert any(o is later for o in gc.get_objects())  # what comes after is collected as usual


def test_probe_counts_collections_and_their_pauses() -> None:
    probe = GcProbe().install()
    try:
        gc.collect()
        gc.collect(0)
        t = probe.totals()
        assert t["gc_collections"] >= 2 and t["gc_full_collections"] >= 1
        assert t["gc_pause_s"] > 0 and 0 < t["gc_max_pause_s"] <= t["gc_pause_s"]
        assert "gc_frozen_objects" in t
    finally:
        probe.uninstall()
    n = probe.num_collections
    gc.collect()
    assert probe.num_collections == n  # uninstalled: no more counting
    probe.uninstall()  # idempotent


def test_totals_never_walk_the_frozen_heap(monkeypatch) -> None:
    """A report is O(1): gc.get_freeze_count() walks every frozen object (tens of ms for a
    loaded model), and the engine reports once a second between steps."""
    def walk() -> int:
        raise AssertionError("totals() walked the permanent generation")

    monkeypatch.setattr(gc, "get_freeze_count", walk)
    probe = GcProbe(frozen_objects=12345)
    assert probe.totals()["gc_frozen_objects"] == 12345
