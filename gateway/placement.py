"""Which engine a new stream goes to (``choose_engine``): the serving one with the most headroom.
Pure Python, no I/O; the policy is in docs/deploy.md, "Placement".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

__all__ = ["EngineLoad", "choose_engine"]


@dataclass(frozen=True)
class EngineLoad:
    """One engine as placement sees it."""

    index: int
    is_ready: bool
    num_open: int  # streams open on it now (the gateway's count, live)
    capacity: int | None = None  # from its last admission report; None: no limit known
    demand: int = 0  # speaking + queued, in that report
    num_open_at_report: int = 0  # num_open when that report arrived

    @property
    def demand_now(self) -> int:
        """The report's demand moved on by the streams opened (or closed) since it."""
        return max(self.demand + self.num_open - self.num_open_at_report, 0)

    @property
    def headroom(self) -> int | None:
        """Capacity minus demand now; None with no limit known."""
        return None if self.capacity is None else self.capacity - self.demand_now


def choose_engine(engines: Sequence[EngineLoad]) -> int | None:
    """The index of the engine a new stream goes to, or None when none is serving."""
    ready = [e for e in engines if e.is_ready]
    if not ready:
        return None
    if all(e.capacity is not None for e in ready):
        best = min(ready, key=lambda e: (-(e.headroom or 0), e.num_open, e.index))
    else:
        best = min(ready, key=lambda e: (e.num_open, e.index))
    return best.index
