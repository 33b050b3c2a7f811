"""Keep the start-up heap out of Python's full garbage collections (``gc.freeze()``), and count
the collections' pauses (``GcProbe``); why: docs/architecture.md, "Engine".
"""

from __future__ import annotations

import gc
import time
from typing import Any

__all__ = ["GcProbe", "freeze_startup_heap"]


def freeze_startup_heap() -> int:
    """Collect once, then freeze what is left; returns how many objects are frozen in all."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class GcProbe:
    """Counts this process's collections and their pauses while installed. ``frozen_objects``:
    what ``freeze_startup_heap`` froze, reported as given: ``gc.get_freeze_count()`` walks the
    whole permanent generation (75 ms for a loaded Orpheus-3B engine on the H200's host, which
    stopped every stream's audio once per Stats report), so it is never called per report."""

    def __init__(self, frozen_objects: int = 0) -> None:
        self.frozen_objects = frozen_objects
        self.num_collections = 0
        self.num_full_collections = 0  # generation 2
        self.pause_s = 0.0
        self.max_pause_s = 0.0
        self._t0: float | None = None

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        if self._t0 is None:
            return
        dt = time.perf_counter() - self._t0
        self._t0 = None
        self.num_collections += 1
        self.num_full_collections += info.get("generation") == 2
        self.pause_s += dt
        self.max_pause_s = max(self.max_pause_s, dt)

    def install(self) -> GcProbe:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)
        return self

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def totals(self) -> dict[str, float]:
        """Counters since install, for the engine's Stats (``voxgate_engine_totals``)."""
        return {"gc_collections": self.num_collections, "gc_full_collections": self.num_full_collections,
                "gc_pause_s": self.pause_s, "gc_max_pause_s": self.max_pause_s,
                "gc_frozen_objects": self.frozen_objects}
