"""Checks a program's per-stream numeric options share: a number in its range, or an
``invalid_option`` error that names the range."""

from __future__ import annotations

import math
from typing import Any

from engine.backend import OptionError

__all__ = ["number_option"]


def number_option(name: str, value: Any, lo: float, hi: float, *, integer: bool) -> int | float:
    """``value`` as an int (``integer``) or a float in [lo, hi]; ``top_p`` must also be above 0."""
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not math.isfinite(value) or not lo <= value <= hi:
        raise OptionError("invalid_option", f"{name} must be {'an integer' if integer else 'a number'} in "
                          f"[{lo}, {hi}], got {value!r}")
    if name == "top_p" and value <= 0:
        raise OptionError("invalid_option", f"top_p must be in (0, 1], got {value!r}")
    return int(value) if integer else float(value)
