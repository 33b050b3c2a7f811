"""Admission by measured capacity: how many streams the engine can keep real time, and what
happens to the one past it (policy and estimate: docs/scheduling.md). Pure Python with no clock
of its own, so tests drive it with a fake clock and simulated step times.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from engine.step_time import StepTimeModel

__all__ = ["ADMISSION_POLICIES", "Admission", "AdmissionConfig", "Decision"]

ADMISSION_POLICIES = ("queue", "refuse", "off")

_RETRY_AFTER_MIN_S = 0.1
_RETRY_AFTER_MAX_S = 30.0
_RETRY_AFTER_DEFAULT_S = 1.0  # before any stream has ended: nothing to go by
_DURATION_ALPHA = 0.1  # EWMA weight of one stream's time speaking (the retry-after hint)
_MAX_REPORTED_WAITS = 4096  # queue waits kept between two reports (``take_waits``)


@dataclass(frozen=True)
class AdmissionConfig:
    """How the engine admits streams (``voxgate serve --admission ...``)."""

    policy: str = "queue"  # queue | refuse | off
    max_queue: int = 256  # streams waiting for admission; one more is refused
    # The longest a stream waits: one whose expected wait is longer is refused at once, one
    # still waiting after it is refused then (its wait counts against its time to first audio).
    # 0.2 s: a stream that is not admitted must hear so within 300 ms (issue 21's target), and
    # the refusal took up to 70 ms more than the wait at 2x overload on an H200
    # (docs/performance.md, "Admission under overload": 523-569 ms with a 0.5 s wait).
    max_wait_s: float = 0.2
    # Fraction of the engine's time kept free of the streams' steady decode and prefill work:
    # for bursts of prompts, codec work and the variation of step times.
    headroom: float = 0.1
    # Streams admitted before the estimate has enough samples, and the only limit for a
    # backend that is not step-based (0: no cap).
    initial_capacity: int = 0
    min_samples: int = 100  # steps measured before the estimate is used
    # The decode cap from measured step times (0: off, the backend's own cap stands): the most
    # decode rows whose step the fit predicts within this fraction of the real-time step (one
    # token's worth of audio, 1 / tokens per audio second), within the backend's own cap; the
    # engine core applies it as the fit moves (docs/scheduling.md, "A measured decode cap").
    # -1 (default): the model's own, which the engine core takes from its backend (an LM
    # program's ``ServingDefaults`` on CUDA: Orpheus 0.85 with bf16 weights, off for the others).
    decode_cap_budget: float = -1.0

    def __post_init__(self) -> None:
        if self.policy not in ADMISSION_POLICIES:
            raise ValueError(f"admission policy must be one of {', '.join(ADMISSION_POLICIES)}, "
                             f"got {self.policy!r}")
        if self.max_queue < 0:
            raise ValueError(f"admission max_queue must be >= 0, got {self.max_queue}")
        if not (math.isfinite(self.max_wait_s) and self.max_wait_s >= 0):
            raise ValueError(f"admission max_wait_s must be >= 0 seconds, got {self.max_wait_s}")
        if not 0.0 <= self.headroom < 1.0:
            raise ValueError(f"admission headroom must be in [0, 1), got {self.headroom}")
        if self.initial_capacity < 0:
            raise ValueError(f"admission initial_capacity must be >= 0 (0: no cap), got "
                             f"{self.initial_capacity}")
        if not (self.decode_cap_budget == -1.0
                or (math.isfinite(self.decode_cap_budget) and 0.0 <= self.decode_cap_budget <= 1.0)):
            raise ValueError(f"decode_cap_budget must be in [0, 1] (0: off) or -1 (the model's), "
                             f"got {self.decode_cap_budget}")
        if self.min_samples < 1:
            raise ValueError(f"admission min_samples must be >= 1, got {self.min_samples}")


@dataclass(frozen=True)
class Decision:
    """What ``Admission.request`` decided for a stream."""

    verdict: str  # "admit" | "queue" | "refuse"
    # Refusals: "capacity" (policy refuse), "queue_full", "queue_wait" (its expected wait is
    # longer than max_wait_s), "queue_timeout" (it waited max_wait_s).
    reason: str = ""
    retry_after_s: float | None = None
    message: str = ""


@dataclass
class _Waiting:
    key: int
    t_queued: float


@dataclass
class _Counters:
    admitted: int = 0
    admitted_after_wait: int = 0
    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("capacity", "queue_full", "queue_wait", "queue_timeout"), 0))


class Admission:
    """Per-stream admission against the measured capacity (module docstring).

    The engine core calls ``request`` at a stream's first job, ``release`` when a stream that
    was admitted or queued is gone, ``poll`` after each round of commands and steps (it admits
    queued streams that fit now, in order, and refuses those that waited too long), and
    ``observe_step`` with each step the engine ran.
    """

    def __init__(self, config: AdmissionConfig | None = None, *,
                 tokens_per_audio_second: float | None = None, max_streams: int = 4096,
                 job_slots: int = 0, clock: Callable[[], float] = time.monotonic,
                 model: StepTimeModel | None = None) -> None:
        if tokens_per_audio_second is not None and not tokens_per_audio_second > 0:
            raise ValueError(f"tokens_per_audio_second must be > 0, got {tokens_per_audio_second}")
        if job_slots < 0:
            raise ValueError(f"job_slots must be >= 0 (0: no limit), got {job_slots}")
        self.config = config or AdmissionConfig()
        self.tokens_per_audio_second = tokens_per_audio_second
        self.max_streams = max_streams
        # The jobs the backend runs at once (an LM engine's --max-num-seqs; 0: no limit): a
        # stream admitted past them would wait for a slot with its audio due (``seats``).
        self.job_slots = job_slots
        self._clock = clock
        self.model = model or StepTimeModel()
        self._speaking: dict[int, float] = {}  # admitted stream key -> when admitted
        self._queue: deque[_Waiting] = deque()
        self._queued_keys: set[int] = set()
        self._mean_duration_s: float | None = None  # EWMA of streams' time speaking
        self.max_rows_per_step = 0  # the backend's decode cap (0: none)
        # The rows a step fills with jobs that are not yet due (the scheduler's decode fill
        # within its horizon; 0: every job decodes every step, up to the cap).
        self.fill_rows_per_step = 0
        # Prefill: prompt tokens and decode rows, decayed with the model's clock; speaking-stream
        # seconds and the seconds of their jobs (the segments generated ahead count) likewise.
        self._prompt_tokens = 0.0
        self._rows = 0.0
        self._stream_s = 0.0
        self._job_s = 0.0
        self._capacity: int | None = None
        self._capacity_stale = True
        self._waits: deque[float] = deque(maxlen=_MAX_REPORTED_WAITS)
        self.counters = _Counters()

    # -- state -----------------------------------------------------------------------------

    @property
    def demand(self) -> int:
        """Streams speaking (admitted, not yet gone)."""
        return len(self._speaking)

    @property
    def num_queued(self) -> int:
        return len(self._queue)

    @property
    def is_measured(self) -> bool:
        """The estimate has enough samples to be used."""
        return (self.tokens_per_audio_second is not None and self.model.coefficients is not None
                and self.model.num_samples >= self.config.min_samples)

    def capacity(self) -> int | None:
        """Streams that can speak at once: the measured estimate, or before it (and for a
        backend that is not step-based) ``initial_capacity``, within the ``seats`` of the job
        slots; None for no limit known."""
        seats = self.seats()
        if not self.is_measured:
            cap = self.config.initial_capacity or None
        else:
            if self._capacity_stale:
                self._capacity = self._estimate()
                self._capacity_stale = False
            cap = self._capacity
        if seats is None:
            return cap
        return seats if cap is None else min(cap, seats)

    def seats(self) -> int | None:
        """Streams the backend's job slots hold: one each, for its spoken segment (a segment
        generated ahead may wait for a slot while the one before it speaks); None without a
        slot limit."""
        return self.job_slots or None

    def measured_decode_cap(self, limit: int) -> int | None:
        """The decode cap ``decode_cap_budget`` asks for: the most decode rows, at most ``limit``
        (the backend's own cap, or its batch slots), whose decode-only step the fit predicts
        within that fraction of the real-time step; at least 1. None while it is off, before the
        estimate is measured, or without a limit."""
        frac = self.config.decode_cap_budget
        if frac <= 0 or limit <= 0 or not self.is_measured:  # (-1, the model's, unresolved: off)
            return None
        budget_s = frac / self.tokens_per_audio_second  # type: ignore[operator]
        if self.model.predict(limit) <= budget_s:
            return limit
        lo, hi = 1, limit  # predict(hi) over the budget; the answer is in [1, hi)
        if self.model.predict(lo) > budget_s:
            return 1
        while hi - lo > 1:  # predict(lo) within the budget, predict(hi) not (the fit is a line)
            mid = (lo + hi) // 2
            if self.model.predict(mid) <= budget_s:
                lo = mid
            else:
                hi = mid
        return lo

    def prefill_share(self) -> float:
        """Engine time per second that one stream's prompts take while it speaks in real time
        (seconds/second): the prompt tokens per decode row measured (a segment's prompt per the
        rows it makes) times the stream's ``tokens_per_audio_second`` rows a second.

        Per row, not per second spoken: a stream sends its first prompts as it starts, so
        early in a ramp (every stream young) tokens per second spoken read several times what
        the streams need over their time, and streams that run ahead of real time (a lightly
        loaded engine) read more than they need at capacity."""
        coef = self.model.coefficients
        r = self.tokens_per_audio_second
        if coef is None or r is None or self._rows <= 0:
            return 0.0
        return coef[2] * r * self._prompt_tokens / self._rows

    def jobs_per_stream(self) -> float:
        """Jobs a speaking stream holds in the backend (measured, at least 1): its spoken
        segment and the ones generated ahead of it."""
        if self._stream_s <= 0:
            return 1.0
        return max(1.0, self._job_s / self._stream_s)

    def rows_per_step(self, num_streams: int) -> float:
        """Decode rows a step runs while ``num_streams`` speak: every job of theirs while the
        scheduler fills its steps with jobs not yet due (``fill_rows_per_step``; without a
        horizon, all of them), at least one row per stream, at most the decode cap."""
        rows = num_streams * self.jobs_per_stream()
        if self.fill_rows_per_step:
            rows = max(float(num_streams), min(rows, self.fill_rows_per_step))
        if self.max_rows_per_step:
            rows = min(rows, self.max_rows_per_step)
        return rows

    def utilisation(self, num_streams: int) -> float:
        """The share of the engine's time that ``num_streams`` speaking streams take: their
        spoken segments' decode rows and their prompts.

        A step of B rows (``rows_per_step``) takes t(B); a stream's row advances once per step
        it is in, so with B >= N every stream gets a row each step and takes r x t(B) of the
        time (rows of segments generated ahead make the step longer, not the stream faster),
        and with B < N (a decode cap) the N streams share the B rows: N x r x t(B) / B."""
        r = self.tokens_per_audio_second
        if r is None or num_streams <= 0:
            return 0.0
        rows = self.rows_per_step(num_streams)
        t = max(self.model.optimistic(rows), 0.0)
        return r * t * max(1.0, num_streams / rows) + num_streams * self.prefill_share()

    def _estimate(self) -> int:
        budget = 1.0 - self.config.headroom
        fits = lambda n: self.utilisation(n) <= budget  # noqa: E731
        if not fits(1):
            return 0
        lo, hi = 1, 2
        while hi <= self.max_streams and fits(hi):
            lo, hi = hi, hi * 2
        hi = min(hi, self.max_streams + 1)
        while hi - lo > 1:  # fits(lo), not fits(hi) (or hi past max_streams)
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        return lo

    def room(self) -> int | None:
        """Streams more that ``request`` would admit or queue rather than refuse now (None: no
        limit known). The gateway refuses at its own door once the streams it sent since this
        engine's last report have taken this room (gateway.placement), so that a flood of
        streams past capacity costs the engine's loop nothing."""
        cfg = self.config
        cap = self.capacity()
        if cfg.policy == "off" or cap is None:
            return None
        # ``request``'s decisions replayed on copies of its figures (at most cap + max_queue)
        m = self._mean_duration_s
        demand, queued, n = self.demand, len(self._queue), 0
        while True:
            has_room = demand < cap or demand == 0
            if not queued and has_room:
                demand += 1
            elif cfg.policy == "refuse" or queued >= cfg.max_queue:
                return n
            elif (not has_room and m is not None
                  and (queued + 1 + max(0, demand - cap)) * m / demand > cfg.max_wait_s):
                return n
            else:
                queued += 1
            n += 1

    def _has_room(self) -> bool:
        cap = self.capacity()
        return cap is None or self.demand < cap or self.demand == 0

    # -- streams ---------------------------------------------------------------------------

    def request(self, key: int) -> Decision:
        """A stream's first job is ready: admit it, queue it, or refuse it."""
        cfg = self.config
        if cfg.policy == "off" or (not self._queue and self._has_room()):
            self._admit(key)
            return Decision("admit")
        now = self._clock()
        if cfg.policy == "refuse":
            return self._refuse("capacity", self._retry_after_s(1))
        if len(self._queue) >= cfg.max_queue:
            return self._refuse("queue_full", self._retry_after_s(len(self._queue) + 1))
        expected = None if self._has_room() else self._expected_wait_s(len(self._queue) + 1)
        if expected is not None and expected > cfg.max_wait_s:
            return self._refuse("queue_wait", self._clamp(expected))
        self._queue.append(_Waiting(key, now))
        self._queued_keys.add(key)
        return Decision("queue")

    def release(self, key: int) -> None:
        """The stream is gone (ended, cancelled, failed): it frees its place (idempotent)."""
        t0 = self._speaking.pop(key, None)
        if t0 is not None:
            d = self._clock() - t0
            m = self._mean_duration_s
            self._mean_duration_s = d if m is None else m + _DURATION_ALPHA * (d - m)
            return
        if key in self._queued_keys:
            self._queued_keys.discard(key)
            self._queue = deque(w for w in self._queue if w.key != key)

    def poll(self) -> tuple[list[int], list[tuple[int, Decision]]]:
        """Queued streams admitted now (in order) and those refused for waiting too long."""
        admitted: list[int] = []
        while self._queue and self._has_room():
            w = self._queue.popleft()
            self._queued_keys.discard(w.key)
            self._admit(w.key)
            self.counters.admitted_after_wait += 1
            self._waits.append(self._clock() - w.t_queued)
            admitted.append(w.key)
        refused: list[tuple[int, Decision]] = []
        now = self._clock()
        while self._queue and now - self._queue[0].t_queued >= self.config.max_wait_s:
            w = self._queue.popleft()
            self._queued_keys.discard(w.key)
            refused.append((w.key, self._refuse("queue_timeout", self._retry_after_s(1))))
        return admitted, refused

    def next_timeout_s(self) -> float | None:
        """Seconds until the longest-waiting stream runs out of patience (None: no queue)."""
        if not self._queue:
            return None
        return max(0.0, self._queue[0].t_queued + self.config.max_wait_s - self._clock())

    def _admit(self, key: int) -> None:
        self._speaking[key] = self._clock()
        self.counters.admitted += 1

    def _refuse(self, reason: str, retry_after_s: float) -> Decision:
        self.counters.refused[reason] += 1
        cap = self.capacity()
        why = {"capacity": "the engine is at capacity",
               "queue_full": f"the admission queue is full ({self.config.max_queue} streams)",
               "queue_wait": f"the expected wait is over {self.config.max_wait_s:g} s",
               "queue_timeout": f"no room within {self.config.max_wait_s:g} s"}[reason]
        cap_text = "no limit" if cap is None else f"capacity {cap}"
        if cap is not None and cap == self.seats():
            cap_text += f": the engine's {self.job_slots} job slots (--max-num-seqs)"
        message = (f"server at capacity: {why} ({self.demand} streams speaking, {cap_text}); "
                   f"retry after {retry_after_s:.1f} s")
        return Decision("refuse", reason, retry_after_s, message)

    def _expected_wait_s(self, position: int) -> float | None:
        """When the stream at ``position`` (1 = next) in the queue is expected to get room:
        streams leave at about ``demand / mean time speaking`` a second."""
        m = self._mean_duration_s
        if m is None or self.demand == 0:
            return None
        cap = self.capacity()
        over = max(0, self.demand - cap) if cap is not None else 0
        return (position + over) * m / self.demand

    def _retry_after_s(self, position: int) -> float:
        expected = self._expected_wait_s(position)
        return _RETRY_AFTER_DEFAULT_S if expected is None else self._clamp(expected)

    @staticmethod
    def _clamp(seconds: float) -> float:
        return round(min(max(seconds, _RETRY_AFTER_MIN_S), _RETRY_AFTER_MAX_S), 2)

    # -- measurements ----------------------------------------------------------------------

    def observe_step(self, rows: int, prompt_tokens: int, seconds: float, *,
                     max_rows: int | None = None, fill_rows: int | None = None,
                     jobs: int | None = None) -> None:
        """One engine step (decode rows, prompt tokens, wall seconds), the backend's decode cap
        (0: none) and decode fill (0: every job decodes), and the jobs the speaking streams
        hold now (None: one each), for the estimate."""
        if max_rows is not None and max_rows != self.max_rows_per_step:
            self.max_rows_per_step = max_rows
            self._capacity_stale = True
        if fill_rows is not None and fill_rows != self.fill_rows_per_step:
            self.fill_rows_per_step = fill_rows
            self._capacity_stale = True
        if self.tokens_per_audio_second is None:
            return
        fitted = self.model.num_samples // self.model.refit_every
        if not self.model.observe(rows, prompt_tokens, seconds):
            return
        keep = 0.5 ** (seconds / self.model.half_life_s)
        self._prompt_tokens = self._prompt_tokens * keep + prompt_tokens
        self._rows = self._rows * keep + rows
        self._stream_s = self._stream_s * keep + self.demand * seconds
        self._job_s = self._job_s * keep + (self.demand if jobs is None else jobs) * seconds
        if self.model.num_samples // self.model.refit_every != fitted:
            self._capacity_stale = True

    def take_waits(self) -> list[float]:
        """Queue waits (seconds) of the streams admitted after waiting since the last call."""
        out = list(self._waits)
        self._waits.clear()
        return out

    def snapshot(self) -> dict[str, Any]:
        """The figures the engine reports (``Stats.admission``); ``waits_s`` drains the waits."""
        cap = self.capacity()
        coef = self.model.coefficients
        c = self.counters
        out: dict[str, Any] = {
            "policy": self.config.policy,
            "capacity": cap,
            "is_measured": self.is_measured,
            "demand": self.demand,
            "queued": self.num_queued,
            "admitted": c.admitted,
            "admitted_after_wait": c.admitted_after_wait,
            **{f"refused_{k}": v for k, v in c.refused.items()},
            "samples": self.model.num_samples,
            "outliers": self.model.num_outliers,
            "waits_s": self.take_waits(),
            "room": self.room(),
            "retry_after_s": self._retry_after_s(1),
            "decode_cap": self.max_rows_per_step,  # the backend's cap in force (0: none)
            "job_slots": self.job_slots,  # 0: no limit
        }
        if coef is not None:
            out.update(step_base_ms=1e3 * coef[0], step_row_us=1e6 * coef[1],
                       step_prompt_token_us=1e6 * coef[2], prefill_share=self.prefill_share(),
                       jobs_per_stream=self.jobs_per_stream(), step_scale=self.model.scale)
        return out
