"""Checks a program's per-stream options share: only known names, a number in its range, a seed,
or an ``invalid_option`` error that names what is allowed."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from engine.backend import OptionError

__all__ = ["checked_options", "number_option", "seed_option"]


def number_option(name: str, value: Any, lo: float, hi: float, *, integer: bool) -> int | float:
    """``value`` as an int (``integer``) or a float in [lo, hi]; ``top_p`` must also be above 0."""
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not math.isfinite(value) or not lo <= value <= hi:
        raise OptionError("invalid_option", f"{name} must be {'an integer' if integer else 'a number'} in "
                          f"[{lo}, {hi}], got {value!r}")
    if name == "top_p" and value <= 0:
        raise OptionError("invalid_option", f"top_p must be in (0, 1], got {value!r}")
    return int(value) if integer else float(value)


def seed_option(value: Any) -> int | None:
    """A stream's seed: None (none given) or an integer in [0, 2^63)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise OptionError("invalid_option", f"seed must be an integer in [0, 2^63), got {value!r}")
    return value


def checked_options(options: dict[str, Any], defaults: dict[str, Any],
                    check: Callable[[str, Any], Any]) -> dict[str, Any]:
    """``defaults`` with each of ``options`` checked by ``check(name, value)``; an unknown name
    is an ``invalid_option`` error listing the known ones."""
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise OptionError("invalid_option", f"unknown option {unknown[0]!r}; options: {', '.join(defaults)}")
    return {**defaults, **{name: check(name, value) for name, value in options.items()}}
