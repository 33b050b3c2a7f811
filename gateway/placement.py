"""Which engine a new stream goes to (``choose_engine``): the serving one with the most headroom;
and whether any has room for it at all (``is_full``: the gateway refuses a stream at its own
door when none has). Pure Python, no I/O; the policy is in docs/deploy.md, "Placement", and
docs/scheduling.md, "Refusals at the gateway".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

__all__ = ["EngineLoad", "choose_engine", "is_full"]


@dataclass(frozen=True)
class EngineLoad:
    """One engine as placement sees it."""

    index: int
    is_ready: bool
    num_open: int  # streams open on it now (the gateway's count, live)
    capacity: int | None = None  # from its last admission report; None: no limit known
    demand: int = 0  # speaking + queued, in that report
    num_open_at_report: int = 0  # num_open when that report arrived
    # Streams more it would admit or queue rather than refuse, in that report
    # (engine.admission.Admission.room); None: no limit known.
    room: int | None = None

    @property
    def demand_now(self) -> int:
        """The report's demand moved on by the streams opened (or closed) since it."""
        return max(self.demand + self.num_open - self.num_open_at_report, 0)

    @property
    def headroom(self) -> int | None:
        """Capacity minus demand now; None with no limit known."""
        return None if self.capacity is None else self.capacity - self.demand_now


    @property
    def room_now(self) -> int | None:
        """The report's room less the streams opened since it (streams that ended since give
        theirs back); None with no limit known."""
        if self.room is None:
            return None
        return self.room - (self.num_open - self.num_open_at_report)


def is_full(engines: Sequence[EngineLoad]) -> bool:
    """No serving engine has room for one more stream by its last report and the streams sent
    to it since (a stream sent now would be refused there); False while any serving engine
    reports no limit, and when none serves (that is another error: the engine is unavailable)."""
    ready = [e for e in engines if e.is_ready]
    return bool(ready) and all(e.room_now is not None and e.room_now <= 0 for e in ready)


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
