"""Prometheus metrics of one gateway (its own registry: no module globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["GatewayMetrics", "CONTENT_TYPE_LATEST"]

_LATENCY_BUCKETS_S = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
                      1.0, 2.0, 5.0)


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

    def render(self) -> bytes:
        return generate_latest(self.registry)
