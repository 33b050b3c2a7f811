"""The gateway's side of admission: a stream no engine has room for is refused here, before
the engine sees it, and every ``capacity`` refusal carries a retry hint sized to the crowd of
refused clients waiting to retry (policy: docs/scheduling.md, "Refusals at the gateway").

Pure Python with an injected clock; the server makes one and its sessions share it.
"""

from __future__ import annotations

import heapq
import math
import time
from typing import Callable, Protocol

__all__ = ["AdmissionDoor"]

_DEFAULT_HINT_S = 1.0  # no engine hint known
_MIN_HINT_S = 0.1
_MAX_HINT_S = 30.0
# How fast the departure rate forgets (seconds): streams that left over about this long.
_TAU_S = 5.0
_MAX_WAITING = 100_000  # refused clients tracked (past it the hint is at its cap anyway)
# Retries aimed at per freed place: more than one, so that a place that frees is taken soon
# (retries and departures both come at random), not so many that refusals swamp the server.
_RETRIES_PER_PLACE = 2.0
# Each hint is spread over +-25% (a golden-ratio sequence: deterministic, evenly spread), so
# that clients refused together do not all come back together.
_JITTER = 0.25
# Departures (decayed) to size a crowd by: before them, the engine's hint (one departure in the
# first 10 ms would read a crowd of hundreds as one waiting for hours).
_MIN_DEPARTURES = 10.0
_GOLDEN = 0.6180339887498949


class _Counter(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class AdmissionDoor:
    """Refuses at the gateway when no engine has room, and sizes retry hints to the crowd.

    ``full_hint()`` is the engines' state as the gateway sees it: None while some engine has
    room for one more stream (by its last report and the streams sent to it since:
    ``gateway.placement.is_full``), else the engines' own retry hint. The crowd: the refused
    clients whose hint has not yet run out (each is waiting to retry), and a place frees for
    one of them each time a stream leaves. The hint given is the time for
    ``_RETRIES_PER_PLACE`` retries per place at the rate streams leave (spread by +-25%),
    never below the engine's own hint."""

    def __init__(self, full_hint: Callable[[], float | None], *,
                 clock: Callable[[], float] = time.monotonic,
                 refused_counter: _Counter | None = None) -> None:
        self._full_hint = full_hint
        self._clock = clock
        self._counter = refused_counter
        self._t0 = self._t = clock()
        self._left = 0.0  # streams that left, decayed
        self._waiting: list[float] = []  # when each refused client's hint runs out (a heap)
        self._num_hints = 0
        self.num_refused_here = 0

    def _decay(self, now: float) -> None:
        dt = now - self._t
        if dt > 0:
            self._left *= math.exp(-dt / _TAU_S)
            self._t = now

    def leave_rate(self) -> float | None:
        """Streams leaving per second (None: too few seen yet)."""
        now = self._clock()
        self._decay(now)
        if self._left < _MIN_DEPARTURES:
            return None
        seen_s = _TAU_S * (1.0 - math.exp(-max(now - self._t0, 1e-9) / _TAU_S))
        return self._left / seen_s

    def crowd(self) -> int:
        """Refused clients whose hint has not yet run out."""
        now = self._clock()
        waiting = self._waiting
        while waiting and waiting[0] <= now:
            heapq.heappop(waiting)
        return len(waiting)

    def check(self) -> float | None:
        """A stream is starting: None to send it on to an engine, or the retry hint (seconds)
        of its refusal here."""
        engine_hint = self._full_hint()
        if engine_hint is None:
            return None
        self.num_refused_here += 1
        if self._counter is not None:
            self._counter.inc()
        return self.refused(engine_hint)

    def refused(self, engine_hint_s: float | None) -> float:
        """A ``capacity`` refusal (here or by an engine, with its hint): the hint to give."""
        hint = _DEFAULT_HINT_S if engine_hint_s is None else float(engine_hint_s)
        rate = self.leave_rate()
        crowd = self.crowd()
        if rate is not None and crowd:
            crowd_s = crowd / (_RETRIES_PER_PLACE * rate)
            if crowd_s > hint:
                self._num_hints += 1
                spread = (self._num_hints * _GOLDEN) % 1.0
                hint = crowd_s * (1.0 - _JITTER + 2 * _JITTER * spread)
        hint = round(min(max(hint, _MIN_HINT_S), _MAX_HINT_S), 2)
        if len(self._waiting) < _MAX_WAITING:
            heapq.heappush(self._waiting, self._clock() + hint)
        return hint

    def stream_left(self) -> None:
        """A stream that had a place is done (its place frees)."""
        self._decay(self._clock())
        self._left += 1.0
