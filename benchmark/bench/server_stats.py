"""What the server's engine did during a level: its counters from ``/metrics``, before and after.

voxgate's gateway exports the engine's counters since start as ``voxgate_engine_totals{name=...}``
(steps, busy_s; with the LM backend lm_steps, decode_rows, deferred_decodes, prefill_rows,
prefill_tokens). The engine sends them once per ``stats_interval_s`` (1 s by default), so a
level's figures may miss up to that much of its end. Native targets only; any other server, or
a failed fetch, gives no figures (never an error).
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["metrics_url", "parse_totals", "fetch_totals", "level_figures"]

_FAMILY = "voxgate_engine_totals"


def metrics_url(ws_url: str) -> str:
    """``ws://host:port/v1/stream`` -> ``http://host:port/metrics`` (wss -> https)."""
    parts = urlsplit(ws_url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, "/metrics", "", ""))


def parse_totals(text: str) -> dict[str, float]:
    """The engine's counters by name from a Prometheus text exposition (empty if absent)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == _FAMILY:
            for sample in family.samples:
                if "name" in sample.labels:
                    out[sample.labels["name"]] = float(sample.value)
    return out


def _get(url: str, timeout_s: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (the user's own server)
        return resp.read().decode("utf-8", "replace")


async def fetch_totals(ws_url: str, *, timeout_s: float = 5.0) -> tuple[float, dict[str, float]] | None:
    """(monotonic time, counters) from the server's /metrics; None if it cannot be read or is
    not a voxgate gateway's. No counters yet (the engine's first Stats has not arrived) read as
    an empty dict: nothing counted so far."""
    try:
        text = await asyncio.to_thread(_get, metrics_url(ws_url), timeout_s)
        totals = parse_totals(text)
    except (OSError, urllib.error.URLError, ValueError):
        return None
    return (time.monotonic(), totals) if "voxgate_" in text else None


def level_figures(before: tuple[float, dict[str, float]] | None,
                  after: tuple[float, dict[str, float]] | None) -> dict[str, Any] | None:
    """Counter increases over the level and what follows from them: engine steps per second, ms
    per step (busy time / steps), the busy fraction and, from an LM backend, rows per step.
    None without both readings, or when the engine restarted in between (a counter went down)."""
    if before is None or after is None:
        return None
    (t0, a), (t1, b) = before, after
    delta = {k: b[k] - a.get(k, 0.0) for k in b}
    if any(v < 0 for v in delta.values()) or t1 <= t0:
        return None
    out: dict[str, Any] = {"window_s": t1 - t0, **delta}
    steps, busy = delta.get("steps", 0.0), delta.get("busy_s", 0.0)
    out["steps_per_s"] = steps / (t1 - t0)
    out["busy_fraction"] = busy / (t1 - t0)
    if steps:
        out["ms_per_step"] = 1e3 * busy / steps
    lm_steps = delta.get("lm_steps", 0.0)
    if lm_steps:
        for name in ("decode_rows", "deferred_decodes", "prefill_rows", "prefill_tokens"):
            if name in delta:
                out[f"{name}_per_step"] = delta[name] / lm_steps
    return out
