"""What a voxgate server's engine did during a level, from its ``/metrics``: the counters'
increase over the level, and a timeline polled during it (docs/benchmark.md, "Output")."""

from __future__ import annotations

import asyncio
import math
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["metrics_url", "parse_totals", "parse_gauges", "fetch_totals", "fetch_sample", "level_figures",
           "poll_timeline", "timeline"]

_FAMILY = "voxgate_engine_totals"
_GAUGES = {"voxgate_engine_streams": "streams", "voxgate_engine_queued_jobs": "queued_jobs",
           "voxgate_engine_running_jobs": "running_jobs",
           # admission (engine.admission): absent from older servers, NaN while no limit is known
           "voxgate_admission_capacity_streams": "capacity_streams",
           "voxgate_admission_demand_streams": "demand_streams",
           "voxgate_admission_queued_streams": "queued_streams"}
# labelled gauges of the capacity estimate, by term: (family, prefix of the timeline's name)
_TERM_GAUGES = {"voxgate_admission_step_model": "step_", "voxgate_admission_estimate": ""}
Sample = tuple[float, dict[str, float], dict[str, float]]  # (monotonic time, counters, gauges)


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


def parse_gauges(text: str) -> dict[str, float]:
    """The engine's gauges (streams, queued_jobs, running_jobs; the admission's capacity,
    demand and queued streams where known; the capacity estimate's terms, ``step_base_ms``,
    ``step_per_row_us``, ``step_per_prompt_token_us``, ``prefill_share``, ``jobs_per_stream``,
    ``step_scale``, ``decode_cap``, once it has them) from an exposition."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        name = _GAUGES.get(family.name)
        if name is not None and family.samples and math.isfinite(family.samples[0].value):
            out[name] = float(family.samples[0].value)
        prefix = _TERM_GAUGES.get(family.name)
        if prefix is not None:
            for sample in family.samples:
                if "term" in sample.labels and math.isfinite(sample.value):
                    out[prefix + sample.labels["term"]] = float(sample.value)
    return out


def _get(url: str, timeout_s: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (the user's own server)
        return resp.read().decode("utf-8", "replace")


async def fetch_sample(ws_url: str, *, timeout_s: float = 5.0) -> Sample | None:
    """(monotonic time, counters, gauges) from the server's /metrics; None if it cannot be read
    or is not a voxgate gateway's. No counters yet (the engine's first Stats has not arrived)
    read as an empty dict: nothing counted so far."""
    try:
        text = await asyncio.to_thread(_get, metrics_url(ws_url), timeout_s)
        totals, gauges = parse_totals(text), parse_gauges(text)
    except (OSError, urllib.error.URLError, ValueError):
        return None
    return (time.monotonic(), totals, gauges) if "voxgate_" in text else None


async def fetch_totals(ws_url: str, *, timeout_s: float = 5.0) -> tuple[float, dict[str, float]] | None:
    """(monotonic time, counters) from the server's /metrics (``fetch_sample`` without gauges)."""
    sample = await fetch_sample(ws_url, timeout_s=timeout_s)
    return None if sample is None else sample[:2]


async def poll_timeline(ws_url: str, into: list[Sample], *, interval_s: float = 0.25) -> None:
    """Append a sample to ``into`` each time the engine's counters change (it reports about once
    a second; polling faster dates each report to within ``interval_s``); runs until cancelled.
    A failed read is skipped."""
    while True:
        sample = await fetch_sample(ws_url, timeout_s=max(interval_s, 1.0))
        if sample is not None and sample[1] and (not into or sample[1] != into[-1][1]):
            into.append(sample)
        await asyncio.sleep(interval_s)


def timeline(samples: list[Sample], t0: float) -> list[dict[str, Any]]:
    """Per interval between consecutive samples: its end (``t_s``, seconds after ``t0``), the
    rates and per-step figures of ``level_figures`` over it, and the gauges at its end."""
    out: list[dict[str, Any]] = []
    for (ta, a, _), (tb, b, gauges) in zip(samples, samples[1:]):
        figures = level_figures((ta, a), (tb, b))
        if figures is None:
            continue
        keep = {k: v for k, v in figures.items() if k.endswith(("_per_s", "_per_step", "_fraction"))}
        out.append({"t_s": tb - t0, **keep, **gauges})
    return out


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
    if "gc_pause_s" in delta:  # the engine process's garbage-collection pauses
        out["gc_pause_ms_per_s"] = 1e3 * delta["gc_pause_s"] / (t1 - t0)
    lm_steps = delta.get("lm_steps", 0.0)
    if lm_steps:
        for name in ("decode_rows", "deferred_decodes", "prefill_rows", "prefill_tokens"):
            if name in delta:
                out[f"{name}_per_step"] = delta[name] / lm_steps
        if "light_steps" in delta:  # (light steps: docs/scheduling.md)
            light = delta["light_steps"]
            out["light_steps_fraction"] = light / lm_steps
            # each kind's time a step and the loaded steps' rows (the backend's step calls by
            # the kind of step whose tokens they took: a call's time is mostly that wait)
            if light and "light_busy_s" in delta:
                out["light_ms_per_step"] = 1e3 * delta["light_busy_s"] / light
            if lm_steps > light and "loaded_busy_s" in delta:
                out["loaded_ms_per_step"] = 1e3 * delta["loaded_busy_s"] / (lm_steps - light)
                out["loaded_rows_per_step"] = (delta.get("decode_rows", 0.0) - delta.get("light_rows", 0.0)) \
                    / (lm_steps - light)
    return out
