"""The engine's step time as a function of its work (``StepTimeModel``, an online fit over decode
rows and prompt tokens), measured from the steps it runs (``StepSampler``); ``engine.admission``
turns it into a capacity (docs/scheduling.md, "The estimate"). Pure Python, no clock of its own.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

__all__ = ["StepSampler", "StepTimeModel"]

# ``optimistic`` is the fitted step time minus this many standard errors of the prediction:
# while the row counts seen so far span too little to tell the slope, the capacity errs towards
# admitting (a pessimistic one would refuse the load that would have measured it); near the
# rows the engine runs, the band is narrow and the estimate is what was measured.
_BAND_Z = 2.0
_STALL_ARM_SAMPLES = 8  # steps seen before any is used (their median is the first reference)
_STALL_FIT_SAMPLES = 32  # the stall filter compares with the fit once it stands on this many


_SUMS = ("w", "x", "p", "y", "xx", "xp", "pp", "xy", "py", "yy")  # the order of _Band.sums


class _Band:
    """Exponentially forgetting sums of one band of row counts (``_SUMS``): weight, x = rows,
    p = prompt tokens, y = seconds, and their products."""

    __slots__ = ("sums", "t_last")

    def __init__(self) -> None:
        self.sums = [0.0] * len(_SUMS)
        self.t_last = 0.0

    def add(self, x: float, p: float, y: float, keep: float, t: float) -> None:
        new = (1.0, x, p, y, x * x, x * p, p * p, x * y, p * y, y * y)
        self.sums = [s * keep + v for s, v in zip(self.sums, new)]
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
                 stall_factor: float = 5.0, refit_every: int = 32, scale_samples: int = 64) -> None:
        if min(bucket_rows, bucket_samples, refit_every, scale_samples) < 1:
            raise ValueError("bucket_rows, bucket_samples, refit_every and scale_samples must be >= 1")
        if not (half_life_s > 0 and stall_factor > 1):
            raise ValueError("half_life_s must be > 0 and stall_factor > 1")
        self.bucket_rows = bucket_rows
        self._keep = 1.0 - 1.0 / bucket_samples
        self.half_life_s = half_life_s
        self.stall_factor = stall_factor
        self.refit_every = refit_every
        self._scale_alpha = 1.0 / scale_samples
        self.scale = 1.0  # running ratio of measured to fitted step time (recent steps)
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
        line = self._line(rows, prompt_tokens)
        if line > 0:
            ratio = min(max(seconds / line, 0.2), 5.0)
            self.scale += self._scale_alpha * (ratio - self.scale)
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
        acc = [0.0] * len(_SUMS)
        for band in self._bands.values():
            f = 0.5 ** ((self._t - band.t_last) / self.half_life_s)
            acc = [a + f * b for a, b in zip(acc, band.sums)]
        s = dict(zip(_SUMS, acc))
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
        """The step time (seconds): the fitted line, scaled by the recent ratio; 0 before a fit."""
        return self._line(rows, prompt_tokens) * self.scale

    def _line(self, rows: float, prompt_tokens: float = 0.0) -> float:
        if self._fit is None:
            return 0.0
        a, b, c = self._fit.coef
        return a + b * rows + c * prompt_tokens

    def optimistic(self, rows: float) -> float:
        """A decode-only step's time at the low edge of the fit's band (``_BAND_Z`` standard
        errors below it), never below that edge at the samples' mean row count for more rows
        (a step with more rows does not take less time); scaled like ``predict``."""
        fit = self._fit
        if fit is None:
            return 0.0
        lo = self._line(rows) - _BAND_Z * self._se(rows)
        if rows > fit.mean_rows:
            lo = max(lo, self._line(fit.mean_rows) - _BAND_Z * self._se(fit.mean_rows))
        return lo * self.scale

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
