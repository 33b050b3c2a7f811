"""Prometheus metrics of one gateway (its own registry: no module globals)."""

from __future__ import annotations

import math
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["GatewayMetrics", "CONTENT_TYPE_LATEST", "admission_health"]

_LATENCY_BUCKETS_S = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
                      1.0, 2.0, 5.0)
_REFUSAL_REASONS = ("capacity", "queue_full", "queue_wait", "queue_timeout")
# The engine's fit of its step time (engine.admission), by term: name in Stats -> label
_STEP_TERMS = {"step_base_ms": "base_ms", "step_row_us": "per_row_us",
               "step_prompt_token_us": "per_prompt_token_us"}


def admission_health(admission: dict[str, Any]) -> dict[str, Any]:
    """The ``/health`` figures from an engine's admission report: ``load`` = speaking streams /
    capacity (0 with no limit known; above 1 when the estimate fell below what was admitted),
    the capacity, demand and queue."""
    cap = admission.get("capacity")
    demand = int(admission.get("demand", 0))
    load = 0.0 if cap is None else demand / max(cap, 1)  # (an idle engine admits one stream)
    return {"load": round(load, 4), "capacity": cap, "demand": demand,
            "queued": int(admission.get("queued", 0)), "policy": admission.get("policy"),
            "is_measured": bool(admission.get("is_measured", False))}


class GatewayMetrics:
    """Implements ``gateway.session.SessionMetrics`` and the gauges the server sets."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.connections = Gauge("voxgate_connections", "Open WebSocket connections", registry=r)
        self.active_streams = Gauge("voxgate_active_streams",
                                    "Streams started and not yet done, over all connections",
                                    registry=r)
        self.engine_streams = Gauge("voxgate_engine_streams", "Streams open in the engine",
                                    registry=r)
        self.queued_jobs = Gauge("voxgate_engine_queued_jobs",
                                 "Segments waiting for admission in the engine (queue depth)",
                                 registry=r)
        self.running_jobs = Gauge("voxgate_engine_running_jobs",
                                  "Segments being generated in the engine", registry=r)
        self.engine_up = Gauge("voxgate_engine_up", "1 when the engine is serving", registry=r)
        self.engine_info = Info("voxgate_engine", "The engine's model and the device it computes on "
                                "(from its handshake)", registry=r)
        self.engine_totals = Gauge(
            "voxgate_engine_totals",
            "Engine counters since the engine (re)started, by name: steps and busy_s (seconds in "
            "steps) from its loop; lm_steps, decode_rows, deferred_decodes, prefill_rows and "
            "prefill_tokens from the LM backend; gc_collections, gc_full_collections, gc_pause_s "
            "(all collections' pauses), gc_max_pause_s and gc_frozen_objects from the engine "
            "process's garbage collector. Rates of these give rows per step and step time.",
            ["name"], registry=r)
        self.engine_restarts = Counter("voxgate_engine_restarts",
                                       "Engine restarts after it died", registry=r)
        self.engine_hangs = Counter("voxgate_engine_hangs",
                                    "Engines killed by the watchdog: streams open and nothing "
                                    "from the engine for --engine-watchdog-s", registry=r)
        self.samples_sent = Counter("voxgate_audio_samples_sent",
                                    "Audio samples sent to clients (counted as each stream ends: "
                                    "the sum of its done.samples)", registry=r)
        self.samples_dropped = Counter("voxgate_audio_samples_dropped",
                                       "Audio samples from the engine the gateway dropped, by "
                                       "reason (cancelled: they arrived after the stream was "
                                       "cancelled or its connection closed)", ["reason"],
                                       registry=r)
        self.ttfa = Histogram("voxgate_time_to_first_audio_seconds",
                              "First text received to first audio sent, per stream",
                              buckets=_LATENCY_BUCKETS_S, registry=r)
        self.chunk_gap = Histogram("voxgate_chunk_gap_seconds",
                                   "Time between consecutive audio chunks of a stream",
                                   buckets=_LATENCY_BUCKETS_S, registry=r)
        self.errors = Counter("voxgate_errors", "Errors sent to clients, by code", ["code"],
                              registry=r)
        self.streams = Counter("voxgate_streams", "Finished streams, by outcome", ["outcome"],
                               registry=r)
        # Admission (engine.admission, docs/scheduling.md), from the engine's Stats
        self.admission_capacity = Gauge(
            "voxgate_admission_capacity_streams",
            "Streams the engine can keep speaking in real time, estimated from its step times "
            "(before the estimate, the initial capacity; NaN: no limit known)", registry=r)
        self.admission_demand = Gauge("voxgate_admission_demand_streams",
                                      "Streams speaking: admitted and not yet done", registry=r)
        self.admission_headroom = Gauge("voxgate_admission_headroom_streams",
                                        "Capacity minus demand (NaN: no limit known)", registry=r)
        self.admission_load = Gauge("voxgate_admission_load",
                                    "Demand / capacity (0 with no limit known), as in /health",
                                    registry=r)
        self.admission_queued = Gauge("voxgate_admission_queued_streams",
                                      "Streams waiting for admission", registry=r)
        self.admission_refused = Counter(
            "voxgate_admission_refused",
            "Streams refused with a `capacity` error, by reason: capacity (policy refuse), "
            "queue_full, queue_wait (expected wait over the maximum), queue_timeout (waited it)",
            ["reason"], registry=r)
        self.admission_waited = Counter("voxgate_admission_admitted_after_wait",
                                        "Streams admitted after waiting in the admission queue",
                                        registry=r)
        self.admission_wait = Histogram("voxgate_admission_wait_seconds",
                                        "Time a stream admitted after waiting spent in the queue",
                                        buckets=_LATENCY_BUCKETS_S, registry=r)
        self.admission_step = Gauge(
            "voxgate_admission_step_model",
            "The engine's fit of its step time, t = base + per_row * decode rows + "
            "per_prompt_token * prompt tokens, by term (ms and us)", ["term"], registry=r)
        self._admission_seen: dict[str, float] = {}  # engine counters at the last report
        self.admission_capacity.set(math.nan)  # nothing reported yet
        self.admission_headroom.set(math.nan)

    # SessionMetrics
    def observe_ttfa(self, seconds: float) -> None:
        self.ttfa.observe(seconds)

    def observe_chunk_gap(self, seconds: float) -> None:
        self.chunk_gap.observe(seconds)

    def count_error(self, code: str) -> None:
        self.errors.labels(code=code).inc()

    def count_stream(self, outcome: str) -> None:
        self.streams.labels(outcome=outcome).inc()

    def count_samples_sent(self, num_samples: int) -> None:
        self.samples_sent.inc(num_samples)

    def observe_admission(self, admission: dict[str, Any]) -> None:
        """An engine admission report (``Stats.admission``): gauges set, counters moved on by
        what the engine counted since its last report (from zero again after a restart)."""
        if not admission:
            return
        cap = admission.get("capacity")
        demand = float(admission.get("demand", 0))
        self.admission_capacity.set(math.nan if cap is None else float(cap))
        self.admission_demand.set(demand)
        self.admission_headroom.set(math.nan if cap is None else float(cap) - demand)
        self.admission_load.set(admission_health(admission)["load"])
        self.admission_queued.set(float(admission.get("queued", 0)))
        for reason in _REFUSAL_REASONS:
            self._count_delta(f"refused_{reason}", admission,
                              self.admission_refused.labels(reason=reason))
        self._count_delta("admitted_after_wait", admission, self.admission_waited)
        for wait in admission.get("waits_s") or ():
            self.admission_wait.observe(float(wait))
        for name, term in _STEP_TERMS.items():
            if name in admission:
                self.admission_step.labels(term=term).set(float(admission[name]))

    def _count_delta(self, name: str, admission: dict[str, Any], counter: Any) -> None:
        value = float(admission.get(name, 0))
        last = self._admission_seen.get(name, 0.0)
        counter.inc(value - last if value >= last else value)  # lower: the engine restarted
        self._admission_seen[name] = value

    def render(self) -> bytes:
        return generate_latest(self.registry)
