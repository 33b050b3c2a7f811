"""Admission by measured capacity: how many streams the engine can keep real time, and what
happens to the one past it. Pure Python: no I/O, no torch, no clock of its own beyond the one
it is given (tests drive it with a fake clock and simulated step times).

Three parts (``docs/scheduling.md`` says the policy in plain words):

- ``StepTimeModel``: an online fit of the engine's step time, ``t = a + b*rows + c*prompt_tokens``
  (decode rows and prompt tokens of the step), to the steps the engine actually runs. Samples
  are kept per band of row counts (``bucket_rows`` wide), each band forgetting its oldest
  samples as new ones come (at most ``bucket_samples`` of them count), and a band not visited
  for a while weighs less (``half_life_s`` of engine busy time), so the fit follows a change of
  step times (a slower GPU, longer contexts) where the engine runs now, while the bands visited
  earlier keep the slope measurable. A step over ``stall_factor`` times its prediction (a
  compile, a garbage collection) is left out.
- ``StepSampler``: pairs each step's rows with the time it took, from the engine loop's calls
  (with asynchronous steps, a call's time is the step launched one call before).
- ``Admission``: the policy. A stream is *speaking* from its first job until it is gone; the
  engine's *capacity* is the largest number of speaking streams whose tokens (each needs
  ``tokens_per_audio_second``) the engine makes in real time, keeping ``headroom`` of its time
  free. A new stream past capacity waits in a bounded queue (``policy="queue"``) or is refused
  (``"refuse"``); ``"off"`` admits every stream (the figures are still measured).
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = [
    "ADMISSION_POLICIES",
    "Admission",
    "AdmissionConfig",
    "Decision",
    "StepSampler",
    "StepTimeModel",
]

ADMISSION_POLICIES = ("queue", "refuse", "off")

# The capacity is computed from the fitted step time minus this many standard errors of the
# prediction: while the row counts seen so far span too little to tell the slope, the estimate
# errs towards admitting (a pessimistic one would refuse the load that would have measured it);
# near the rows the engine runs, the band is narrow and the estimate is what was measured.
_BAND_Z = 2.0
_RETRY_AFTER_MIN_S = 0.1
_RETRY_AFTER_MAX_S = 30.0
_RETRY_AFTER_DEFAULT_S = 1.0  # before any stream has ended: nothing to go by
_DURATION_ALPHA = 0.1  # EWMA weight of one stream's time speaking (the retry-after hint)
_MAX_REPORTED_WAITS = 4096  # queue waits kept between two reports (``take_waits``)
_STALL_ARM_SAMPLES = 8  # steps seen before any is used (their median is the first reference)
_STALL_FIT_SAMPLES = 32  # the stall filter compares with the fit once it stands on this many


@dataclass(frozen=True)
class AdmissionConfig:
    """How the engine admits streams (``voxgate serve --admission ...``)."""

    policy: str = "queue"  # queue | refuse | off
    max_queue: int = 256  # streams waiting for admission; one more is refused
    # The longest a stream waits: one whose expected wait is longer is refused at once, one
    # still waiting after it is refused then (its wait counts against its time to first audio).
    max_wait_s: float = 0.5
    # Fraction of the engine's time kept free of the streams' steady decode and prefill work:
    # for bursts of prompts, codec work and the variation of step times.
    headroom: float = 0.1
    # Streams admitted before the estimate has enough samples, and the only limit for a
    # backend that is not step-based (0: no cap).
    initial_capacity: int = 0
    min_samples: int = 100  # steps measured before the estimate is used

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
        if self.min_samples < 1:
            raise ValueError(f"admission min_samples must be >= 1, got {self.min_samples}")


# --- the step-time estimate --------------------------------------------------------------


class _Band:
    """Exponentially forgetting sums of one band of row counts: weight, x = rows, p = prompt
    tokens, y = seconds, and their products."""

    __slots__ = ("w", "x", "p", "y", "xx", "xp", "pp", "xy", "py", "yy", "t_last")

    def __init__(self) -> None:
        self.w = self.x = self.p = self.y = 0.0
        self.xx = self.xp = self.pp = self.xy = self.py = self.yy = 0.0
        self.t_last = 0.0

    def add(self, x: float, p: float, y: float, keep: float, t: float) -> None:
        self.w = self.w * keep + 1.0
        self.x = self.x * keep + x
        self.p = self.p * keep + p
        self.y = self.y * keep + y
        self.xx = self.xx * keep + x * x
        self.xp = self.xp * keep + x * p
        self.pp = self.pp * keep + p * p
        self.xy = self.xy * keep + x * y
        self.py = self.py * keep + p * y
        self.yy = self.yy * keep + y * y
        self.t_last = t


@dataclass(frozen=True)
class _Fit:
    coef: tuple[float, float, float]  # a (s), b (s per row), c (s per prompt token)
    cov: tuple[tuple[float, ...], ...]  # 3x3, zero rows/columns for terms left out
    num_samples: float  # weight of the samples (after forgetting)
    mean_rows: float  # the samples' weighted mean row count
    terms: tuple[int, ...]  # fitted: 0 = a, 1 = b, 2 = c (the others are 0: no spread to tell them)


def _solve(m: list[list[float]], v: list[float]) -> list[float] | None:
    """``m x = v`` by Gaussian elimination with partial pivoting; None if singular."""
    n = len(v)
    a = [row[:] + [v[i]] for i, row in enumerate(m)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[piv][col]) < 1e-300:
            return None
        a[col], a[piv] = a[piv], a[col]
        for r in range(col + 1, n):
            f = a[r][col] / a[col][col]
            for k in range(col, n + 1):
                a[r][k] -= f * a[col][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (a[r][n] - sum(a[r][k] * x[k] for k in range(r + 1, n))) / a[r][r]
    return x


class StepTimeModel:
    """Online, robust fit of step time against decode rows and prompt tokens (module docstring).

    Its clock is the engine's busy time (the sum of the samples' seconds), so an idle engine
    does not age what it measured. ``observe`` is cheap; the fit is redone every
    ``refit_every`` accepted samples.
    """

    def __init__(self, *, bucket_rows: int = 8, bucket_samples: int = 32, half_life_s: float = 30.0,
                 stall_factor: float = 5.0, refit_every: int = 16) -> None:
        if bucket_rows < 1 or bucket_samples < 1 or refit_every < 1:
            raise ValueError("bucket_rows, bucket_samples and refit_every must be >= 1")
        if not (half_life_s > 0 and stall_factor > 1):
            raise ValueError("half_life_s must be > 0 and stall_factor > 1")
        self.bucket_rows = bucket_rows
        self._keep = 1.0 - 1.0 / bucket_samples
        self.half_life_s = half_life_s
        self.stall_factor = stall_factor
        self.refit_every = refit_every
        self._bands: dict[int, _Band] = {}
        self._t = 0.0  # busy seconds observed
        self._recent: deque[float] = deque(maxlen=64)  # raw seconds, for the stall filter before a fit
        self._rejected_in_row = 0
        self._since_fit = 0
        self._fit: _Fit | None = None
        self.num_samples = 0  # accepted
        self.num_outliers = 0  # left out as stalls

    # -- samples ---------------------------------------------------------------------------

    def observe(self, rows: int, prompt_tokens: int, seconds: float) -> bool:
        """One step: its decode rows, prompt tokens and wall seconds. Returns whether it was
        used (a step with no work, or a stall, is not)."""
        if rows < 0 or prompt_tokens < 0 or (rows == 0 and prompt_tokens == 0):
            return False
        if not (math.isfinite(seconds) and seconds > 0):
            return False
        self._t += seconds
        if len(self._recent) < _STALL_ARM_SAMPLES:  # the first steps only arm the stall filter
            self._recent.append(seconds)  # (the very first is often a stall: their median is not)
            return False
        if self._is_stall(rows, prompt_tokens, seconds):
            self.num_outliers += 1
            return False
        band = self._bands.get(rows // self.bucket_rows)
        if band is None:
            band = self._bands[rows // self.bucket_rows] = _Band()
        band.add(float(rows), float(prompt_tokens), seconds, self._keep, self._t)
        self.num_samples += 1
        self._since_fit += 1
        if self._fit is None or self._since_fit >= self.refit_every:
            self.refit()
        return True

    def _is_stall(self, rows: int, prompt_tokens: int, seconds: float) -> bool:
        recent = self._recent
        recent.append(seconds)
        fit = self._fit
        if fit is not None and fit.num_samples >= _STALL_FIT_SAMPLES:
            ref = self.predict(rows, prompt_tokens)
            has_prompt_term = 2 in fit.terms
        else:
            ref = sorted(recent)[len(recent) // 2]
            has_prompt_term = False
        if prompt_tokens and not has_prompt_term:
            # Not yet known what prompts cost: a step takes at most in proportion to its tokens.
            ref *= 1.0 + prompt_tokens / max(rows, 1)
        if ref > 0 and seconds > self.stall_factor * ref:
            self._rejected_in_row += 1
            # Many in a row are no stall but a new regime (a much slower device): take them.
            return self._rejected_in_row <= recent.maxlen // 2  # type: ignore[operator]
        self._rejected_in_row = 0
        return False

    # -- the fit ---------------------------------------------------------------------------

    def refit(self) -> None:
        """Fit the weighted samples (each band weighed by how recently it was visited)."""
        self._since_fit = 0
        s = dict.fromkeys(_Band.__slots__[:-1], 0.0)
        for band in self._bands.values():
            f = 0.5 ** ((self._t - band.t_last) / self.half_life_s)
            for name in s:
                s[name] += f * getattr(band, name)
        w = s["w"]
        if w <= 0:
            self._fit = None
            return
        mx, mp = s["x"] / w, s["p"] / w
        var_x = s["xx"] / w - mx * mx
        var_p = s["pp"] / w - mp * mp
        terms = [0] + ([1] if var_x > 0.25 else []) + ([2] if var_p > 1.0 else [])
        full = [[w, s["x"], s["p"]], [s["x"], s["xx"], s["xp"]], [s["p"], s["xp"], s["pp"]]]
        rhs = [s["y"], s["xy"], s["py"]]
        while True:
            m = [[full[i][j] for j in terms] for i in terms]
            sol = _solve(m, [rhs[i] for i in terms])
            if sol is None:
                self._fit = None
                return
            negative = [t for t, v in zip(terms, sol) if t != 0 and v < 0]
            if not negative:
                break
            terms = [t for t in terms if t != negative[0]]  # a slope below zero is noise: drop it
        coef = [0.0, 0.0, 0.0]
        for t, v in zip(terms, sol):
            coef[t] = v
        rss = max(0.0, s["yy"] - sum(coef[i] * rhs[i] for i in terms))
        sigma2 = rss / max(w - len(terms), 1.0)
        inv = [_solve(m, [1.0 if r == c else 0.0 for r in range(len(terms))]) for c in range(len(terms))]
        cov = [[0.0] * 3 for _ in range(3)]
        for ci, col in enumerate(inv):
            if col is None:
                continue
            for ri, val in enumerate(col):
                cov[terms[ri]][terms[ci]] = sigma2 * val
        self._fit = _Fit((coef[0], coef[1], coef[2]), tuple(tuple(r) for r in cov), w, mx, tuple(terms))

    @property
    def weight(self) -> float:
        """The weight of the samples the fit stands on (after forgetting)."""
        return self._fit.num_samples if self._fit is not None else 0.0

    @property
    def coefficients(self) -> tuple[float, float, float] | None:
        """(a s, b s per row, c s per prompt token), or None before a fit."""
        return self._fit.coef if self._fit is not None else None

    def predict(self, rows: float, prompt_tokens: float = 0.0) -> float:
        """The fitted step time (seconds); 0 before a fit."""
        if self._fit is None:
            return 0.0
        a, b, c = self._fit.coef
        return a + b * rows + c * prompt_tokens

    def optimistic(self, rows: float) -> float:
        """A decode-only step's time at the low edge of the fit's band (``_BAND_Z`` standard
        errors below it), never below that edge at the samples' mean row count for more rows
        (a step with more rows does not take less time)."""
        fit = self._fit
        if fit is None:
            return 0.0
        lo = self.predict(rows) - _BAND_Z * self._se(rows)
        if rows > fit.mean_rows:
            lo = max(lo, self.predict(fit.mean_rows) - _BAND_Z * self._se(fit.mean_rows))
        return lo

    def _se(self, rows: float) -> float:
        cov = self._fit.cov  # type: ignore[union-attr]
        v = (1.0, rows, 0.0)
        var = sum(v[i] * cov[i][j] * v[j] for i in range(3) for j in range(3))
        return math.sqrt(max(var, 0.0))


class StepSampler:
    """Pairs a step's rows with its time from the engine loop's calls (pure: times are given).

    Call ``on_step(t_start, rows, prompt_tokens)`` after each backend call with its start time
    and the decode rows and prompt tokens it launched; ``reset()`` when the loop waited between
    calls (the time is then not the step's). The time of the step launched by call i is the
    interval between the starts of calls i+lag and i+lag+1: with asynchronous steps (``lag`` 1)
    a call waits for the step launched by the call before it.
    """

    def __init__(self, *, lag: int = 0) -> None:
        if lag not in (0, 1):
            raise ValueError(f"lag must be 0 or 1, got {lag}")
        self.lag = lag
        self._calls: deque[tuple[float, int, int]] = deque(maxlen=lag + 2)

    def reset(self) -> None:
        self._calls.clear()

    def on_step(self, t_start: float, rows: int, prompt_tokens: int) -> tuple[int, int, float] | None:
        """This call's figures in; (rows, prompt tokens, seconds) of a step out, once known."""
        calls = self._calls
        calls.append((t_start, rows, prompt_tokens))
        if len(calls) < self.lag + 2:
            return None
        _, r, p = calls[0]
        return r, p, calls[-1][0] - calls[-2][0]


# --- the policy --------------------------------------------------------------------------


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
                 clock: Callable[[], float] = time.monotonic,
                 model: StepTimeModel | None = None) -> None:
        if tokens_per_audio_second is not None and not tokens_per_audio_second > 0:
            raise ValueError(f"tokens_per_audio_second must be > 0, got {tokens_per_audio_second}")
        self.config = config or AdmissionConfig()
        self.tokens_per_audio_second = tokens_per_audio_second
        self.max_streams = max_streams
        self._clock = clock
        self.model = model or StepTimeModel()
        self._speaking: dict[int, float] = {}  # admitted stream key -> when admitted
        self._queue: deque[_Waiting] = deque()
        self._queued_keys: set[int] = set()
        self._mean_duration_s: float | None = None  # EWMA of streams' time speaking
        self.max_rows_per_step = 0  # the backend's decode cap (0: none)
        # Prefill: prompt tokens and speaking-stream seconds, decayed with the model's clock.
        self._prompt_tokens = 0.0
        self._stream_s = 0.0
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
        backend that is not step-based) ``initial_capacity``; None for no limit known."""
        if not self.is_measured:
            return self.config.initial_capacity or None
        if self._capacity_stale:
            self._capacity = self._estimate()
            self._capacity_stale = False
        return self._capacity

    def prefill_share(self) -> float:
        """Engine time per second that one speaking stream's prompts take (seconds/second)."""
        coef = self.model.coefficients
        if coef is None or self._stream_s <= 0:
            return 0.0
        return coef[2] * self._prompt_tokens / self._stream_s

    def utilisation(self, num_streams: int) -> float:
        """The share of the engine's time that ``num_streams`` speaking streams take: their
        decode steps (rows per step up to the decode cap) and their prompts."""
        r = self.tokens_per_audio_second
        if r is None or num_streams <= 0:
            return 0.0
        rows = min(num_streams, self.max_rows_per_step) if self.max_rows_per_step else num_streams
        t = max(self.model.optimistic(rows), 0.0)
        return num_streams * r * t / rows + num_streams * self.prefill_share()

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
                     max_rows: int | None = None) -> None:
        """One engine step (decode rows, prompt tokens, wall seconds) and the backend's decode
        cap (0: none) for the estimate."""
        if max_rows is not None and max_rows != self.max_rows_per_step:
            self.max_rows_per_step = max_rows
            self._capacity_stale = True
        if self.tokens_per_audio_second is None:
            return
        fitted = self.model.num_samples // self.model.refit_every
        if not self.model.observe(rows, prompt_tokens, seconds):
            return
        keep = 0.5 ** (seconds / self.model.half_life_s)
        self._prompt_tokens = self._prompt_tokens * keep + prompt_tokens
        self._stream_s = self._stream_s * keep + self.demand * seconds
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
        }
        if coef is not None:
            out.update(step_base_ms=1e3 * coef[0], step_row_us=1e6 * coef[1],
                       step_prompt_token_us=1e6 * coef[2], prefill_share=self.prefill_share())
        return out
