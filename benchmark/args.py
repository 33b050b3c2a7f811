"""argparse ``type`` s shared by the benchmarks: a number in a stated range, a comma-separated
list of them."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

__all__ = ["list_type", "number_type"]


def number_type(kind: type, lo: float | None = None, hi: float | None = None,
                lo_open: bool = False) -> Callable[[str], Any]:
    """An argparse ``type`` that names the range in its message."""
    rng = (f"{'>' if lo_open else '>='} {lo}" if hi is None else
           f"in {'(' if lo_open else '['}{lo}, {hi}]") if lo is not None else ""
    label = "an integer" if kind is int else "a number"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {label} {rng}, got {text!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number {rng}, got {text!r}")
        if lo is not None and (value < lo or (lo_open and value == lo)) or (
                hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"expected {label} {rng}, got {text!r}")
        return value

    return parse


def choice_type(choices: tuple[str, ...]) -> Callable[[str], str]:
    """One of ``choices`` (for ``list_type``: argparse's ``choices`` sees the whole list)."""
    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(choices)}, got {text!r}")
        return text
    return parse


def list_type(item: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    """Comma-separated levels: ``1,8,32``."""
    def parse(text: str) -> list[Any]:
        parts = [p for p in text.split(",") if p.strip()]
        if not parts:
            raise argparse.ArgumentTypeError("expected a comma-separated list, e.g. 1,8,32")
        return [item(p.strip()) for p in parts]
    return parse
