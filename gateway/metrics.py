"""Prometheus metrics of one gateway (its own registry: no module globals)."""

from __future__ import annotations

import math
from typing import Any, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["GatewayMetrics", "CONTENT_TYPE_LATEST", "admission_health", "total_admission"]

_LATENCY_BUCKETS_S = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
                      1.0, 2.0, 5.0)
_REFUSAL_REASONS = ("capacity", "queue_full", "queue_wait", "queue_timeout")
# The engine's fit of its step time (engine.admission), by term: name in Stats -> label
_STEP_TERMS = {"step_base_ms": "base_ms", "step_row_us": "per_row_us",
               "step_prompt_token_us": "per_prompt_token_us"}
# The estimate's other terms (engine.admission): what makes a capacity out of the step fit
_ESTIMATE_TERMS = ("prefill_share", "jobs_per_stream", "step_scale", "decode_cap", "job_slots")


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


def total_admission(admissions: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The figures of several engines' admission reports (the serving engines') as one, in
    the shape of ``admission_health``: capacity and demand summed, and ``load`` = the demand
    of the engines with a limit known over the sum of their capacities (0 when none has one).
    One report gives exactly ``admission_health`` of it."""
    if len(admissions) == 1:
        return admission_health(admissions[0])
    each = [admission_health(a) for a in admissions]
    known = [h for h in each if h["capacity"] is not None]
    capacity = sum(h["capacity"] for h in known) if known else None
    demand_known = sum(h["demand"] for h in known)
    load = 0.0 if capacity is None else demand_known / max(capacity, 1)
    return {"load": round(load, 4), "capacity": capacity,
            "demand": sum(h["demand"] for h in each), "queued": sum(h["queued"] for h in each),
            "policy": each[0]["policy"] if each else None,
            "is_measured": bool(each) and all(h["is_measured"] for h in each)}


class GatewayMetrics:
    """Implements ``gateway.session.SessionMetrics`` and the gauges the server sets."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.connections = Gauge("voxgate_connections", "Open WebSocket connections", registry=r)
        self.active_streams = Gauge("voxgate_active_streams",
                                    "Streams started and not yet done, over all connections",
                                    registry=r)
        # The engine families without an `engine` label are totals over the serving engines
        # (with one engine, its figures); the voxgate_pool_* families are per engine.
        self.engine_streams = Gauge("voxgate_engine_streams",
                                    "Streams open in the engines (their last reports)", registry=r)
        self.queued_jobs = Gauge("voxgate_engine_queued_jobs",
                                 "Segments waiting for admission in the engine (queue depth)",
                                 registry=r)
        self.running_jobs = Gauge("voxgate_engine_running_jobs",
                                  "Segments being generated in the engine", registry=r)
        self.engine_up = Gauge("voxgate_engine_up", "Engines serving (1 with one engine that "
                               "serves)", registry=r)
        self.engine_info = Info("voxgate_engine", "The engine's model and the device it computes on "
                                "(from its handshake; with several engines, every engine's device)",
                                registry=r)
        self.engine_totals = Gauge(
            "voxgate_engine_totals",
            "Engine counters since the engine (re)started, by name: steps and busy_s (seconds in "
            "steps) from its loop; lm_steps, decode_rows, deferred_decodes, prefill_rows, "
            "prefill_tokens, light_steps, light_rows, light_busy_s and loaded_busy_s (seconds of the "
            "backend's step calls that took a light step's tokens and any other step's) from the LM backend; gc_collections, gc_full_collections, gc_pause_s "
            "(all collections' pauses), gc_max_pause_s and gc_frozen_objects from the engine "
            "process's garbage collector. Rates of these give rows per step and step time. "
            "Summed over the serving engines.",
            ["name"], registry=r)
        self.engine_restarts = Counter("voxgate_engine_restarts",
                                       "Engine restarts after it died (all engines)", registry=r)
        self.engine_hangs = Counter("voxgate_engine_hangs",
                                    "Engines killed by the watchdog: streams open and nothing "
                                    "from the engine for --engine-watchdog-s", registry=r)
        self.samples_sent = Counter("voxgate_audio_samples_sent",
                                    "Audio samples sent to clients (counted as each stream ends: "
                                    "the sum of its done.samples; at the model's rate for a "
                                    "stream resampled to another)", registry=r)
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
        self.admission_refused_at_gateway = Counter(
            "voxgate_admission_refused_at_gateway",
            "Streams refused by the gateway itself with `capacity`: no engine had room by its "
            "last report and the streams sent to it since (they never reached an engine, so "
            "voxgate_admission_refused does not count them)", registry=r)
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
        self.admission_estimate = Gauge(
            "voxgate_admission_estimate",
            "The capacity estimate's other terms: prefill_share (engine time per second one "
            "stream's prompts take), jobs_per_stream (jobs a speaking stream holds), step_scale "
            "(recent measured / fitted step time), decode_cap (decode rows a step at most, 0: no "
            "cap; measured with --decode-cap-budget), job_slots (jobs the engine runs at once, "
            "--max-num-seqs; the capacity is at most job_slots, one a stream; 0: no limit)",
            ["term"], registry=r)
        # Per engine (label engine: its place in --gpus or --engines, from 0)
        self.pool_engines = Gauge("voxgate_pool_engines", "Engines of this server, by status "
                                  "(starting, ready, restarting, failed, stopped)", ["status"],
                                  registry=r)
        self.pool_up = Gauge("voxgate_pool_engine_up", "1 when the engine is serving", ["engine"],
                             registry=r)
        self.pool_info = Info("voxgate_pool_engine", "Each engine's device (from its handshake) and "
                              "the GPU it was given (--gpus; empty for a CPU engine)", ["engine"],
                              registry=r)
        self.pool_streams = Gauge("voxgate_pool_engine_streams", "Streams open in the engine (its "
                                  "last report)", ["engine"], registry=r)
        self.pool_placed = Counter("voxgate_pool_engine_placed_streams", "Streams the gateway "
                                   "placed on the engine", ["engine"], registry=r)
        self.pool_restarts = Counter("voxgate_pool_engine_restarts", "Restarts of the engine after "
                                     "it died", ["engine"], registry=r)
        self.pool_hangs = Counter("voxgate_pool_engine_hangs", "Times the watchdog killed the "
                                  "engine", ["engine"], registry=r)
        self.pool_totals = Gauge("voxgate_pool_engine_totals", "The engine's counters since it "
                                 "(re)started, by name (as voxgate_engine_totals)",
                                 ["engine", "name"], registry=r)
        self.pool_capacity = Gauge("voxgate_pool_admission_capacity_streams", "The engine's "
                                   "capacity estimate (NaN: no limit known, or not serving)",
                                   ["engine"], registry=r)
        self.pool_demand = Gauge("voxgate_pool_admission_demand_streams", "Streams speaking on the "
                                 "engine", ["engine"], registry=r)
        self.pool_headroom = Gauge("voxgate_pool_admission_headroom_streams", "The engine's "
                                   "capacity minus demand (NaN: no limit known)", ["engine"],
                                   registry=r)
        self.pool_load = Gauge("voxgate_pool_admission_load", "The engine's demand / capacity",
                               ["engine"], registry=r)
        self.pool_queued = Gauge("voxgate_pool_admission_queued_streams", "Streams waiting for "
                                 "admission on the engine", ["engine"], registry=r)
        self.pool_refused = Counter("voxgate_pool_admission_refused", "Streams the engine refused "
                                    "with a `capacity` error, by reason", ["engine", "reason"],
                                    registry=r)
        # engine index -> its counters at its last report (refusals move on by the difference)
        self._admission_seen: dict[int, dict[str, float]] = {}
        self._stats: dict[int, Any] = {}  # engine index -> its last Stats
        self._up: set[int] = set()  # engines serving
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

    # Engines (gateway.engine_client, gateway.engine_pool)
    def engine_started(self, index: int, *, device: str, gpu: str) -> None:
        """Engine ``index`` answered its handshake and serves."""
        engine = str(index)
        self._up.add(index)
        self._stats.pop(index, None)  # its counters start from zero again
        self.pool_up.labels(engine=engine).set(1)
        self.pool_info.labels(engine=engine).info({"device": device, "gpu": gpu})
        self._refresh_totals()

    def engine_stopped(self, index: int) -> None:
        """Engine ``index`` died or was stopped: it leaves the totals (its last counters too)."""
        engine = str(index)
        self._up.discard(index)
        self.pool_up.labels(engine=engine).set(0)
        for gauge in (self.pool_capacity, self.pool_headroom):
            gauge.labels(engine=engine).set(math.nan)
        for gauge in (self.pool_demand, self.pool_queued, self.pool_load, self.pool_streams):
            gauge.labels(engine=engine).set(0)
        self._refresh_totals()

    def count_engine_restart(self, index: int) -> None:
        self.engine_restarts.inc()
        self.pool_restarts.labels(engine=str(index)).inc()

    def count_engine_hang(self, index: int) -> None:
        self.engine_hangs.inc()
        self.pool_hangs.labels(engine=str(index)).inc()

    def count_placed(self, index: int) -> None:
        self.pool_placed.labels(engine=str(index)).inc()

    def set_engine_statuses(self, statuses: Sequence[str]) -> None:
        """Every engine's status, for ``voxgate_pool_engines{status}`` (at scrape time)."""
        for status in ("starting", "ready", "restarting", "failed", "stopped"):
            self.pool_engines.labels(status=status).set(sum(s == status for s in statuses))

    def observe_engine_stats(self, index: int, stats: Any) -> None:
        """Engine ``index``'s ``Stats``: its own series, the counters moved on by what it
        counted since its last report (from zero again after a restart), and the totals."""
        engine = str(index)
        self._stats[index] = stats
        self._up.add(index)  # only a live engine reports (after its handshake)
        self.pool_streams.labels(engine=engine).set(stats.num_streams)
        for name, value in stats.totals.items():
            self.pool_totals.labels(engine=engine, name=name).set(value)
        admission = stats.admission
        if admission:
            health = admission_health(admission)
            cap = health["capacity"]
            self.pool_capacity.labels(engine=engine).set(math.nan if cap is None else float(cap))
            self.pool_demand.labels(engine=engine).set(health["demand"])
            self.pool_headroom.labels(engine=engine).set(
                math.nan if cap is None else float(cap) - health["demand"])
            self.pool_load.labels(engine=engine).set(health["load"])
            self.pool_queued.labels(engine=engine).set(health["queued"])
            seen = self._admission_seen.setdefault(index, {})
            for reason in _REFUSAL_REASONS:
                delta = _delta(seen, f"refused_{reason}", admission)
                self.admission_refused.labels(reason=reason).inc(delta)
                self.pool_refused.labels(engine=engine, reason=reason).inc(delta)
            self.admission_waited.inc(_delta(seen, "admitted_after_wait", admission))
            for wait in admission.get("waits_s") or ():
                self.admission_wait.observe(float(wait))
        self._refresh_totals()

    def _refresh_totals(self) -> None:
        """The unlabelled engine families from the serving engines' last reports. With none
        serving they keep their last values (as with one engine before there were several)."""
        self.engine_up.set(len(self._up))
        reports = [self._stats[i] for i in sorted(self._up) if i in self._stats]
        if not reports:
            return
        self.engine_streams.set(sum(s.num_streams for s in reports))
        self.queued_jobs.set(sum(s.num_queued_jobs for s in reports))
        self.running_jobs.set(sum(s.num_running_jobs for s in reports))
        totals: dict[str, float] = {}
        for s in reports:
            for name, value in s.totals.items():
                totals[name] = totals.get(name, 0.0) + value
        for name, value in totals.items():
            self.engine_totals.labels(name=name).set(value)
        admissions = [s.admission for s in reports if s.admission]
        if admissions:
            self.observe_admission(total_admission(admissions))
            for gauge, terms in ((self.admission_step, _STEP_TERMS.items()),
                                 (self.admission_estimate, ((t, t) for t in _ESTIMATE_TERMS))):
                for name, term in terms:
                    values = [float(a[name]) for a in admissions if name in a]
                    if values:  # with several engines, their mean
                        gauge.labels(term=term).set(sum(values) / len(values))

    def observe_admission(self, admission: dict[str, Any]) -> None:
        """Set the admission gauges from one report (or a total, ``total_admission``)."""
        if not admission:
            return
        cap = admission.get("capacity")
        demand = float(admission.get("demand", 0))
        self.admission_capacity.set(math.nan if cap is None else float(cap))
        self.admission_demand.set(demand)
        self.admission_headroom.set(math.nan if cap is None else float(cap) - demand)
        self.admission_load.set(admission_health(admission)["load"])
        self.admission_queued.set(float(admission.get("queued", 0)))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _delta(seen: dict[str, float], name: str, admission: dict[str, Any]) -> float:
    """How far an engine's counter ``name`` moved since its last report (a lower value: the
    engine restarted and counts from zero)."""
    value = float(admission.get(name, 0))
    last = seen.get(name, 0.0)
    seen[name] = value
    return value - last if value >= last else value
