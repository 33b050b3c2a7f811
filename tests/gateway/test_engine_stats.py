"""Engine Stats reach the gateway's metrics: gauges and the engine's counters by name."""

from __future__ import annotations

from engine import messages as em
from engine.config import EngineConfig
from gateway.config import GatewayConfig
from gateway.engine_client import EngineSupervisor
from gateway.metrics import GatewayMetrics


def test_engine_totals_become_labelled_gauges() -> None:
    """A Stats record sets the queue gauges and one voxgate_engine_totals sample per counter;
    a later record moves them on."""
    metrics = GatewayMetrics()
    sup = EngineSupervisor(EngineConfig(model="synthetic"), GatewayConfig(), log_level="WARNING",
                           on_message=lambda msg: None, on_lost=lambda keys: None, metrics=metrics)
    sup._dispatch(em.encode(em.Stats(3, 1, 2, {"steps": 10, "busy_s": 0.5, "decode_rows": 640})))
    text = metrics.render().decode()
    assert 'voxgate_engine_totals{name="decode_rows"} 640.0' in text
    assert 'voxgate_engine_totals{name="busy_s"} 0.5' in text
    assert "voxgate_engine_running_jobs 2.0" in text
    sup._dispatch(em.encode(em.Stats(3, 0, 2, {"steps": 25, "busy_s": 1.5, "decode_rows": 1600})))
    assert 'voxgate_engine_totals{name="steps"} 25.0' in metrics.render().decode()
    assert sup.stats.totals["decode_rows"] == 1600


def _supervisor() -> tuple[EngineSupervisor, GatewayMetrics]:
    metrics = GatewayMetrics()
    sup = EngineSupervisor(EngineConfig(model="synthetic"), GatewayConfig(), log_level="WARNING",
                           on_message=lambda msg: None, on_lost=lambda keys: None, metrics=metrics)
    return sup, metrics


def _admission(**kw: object) -> dict:
    base = {"policy": "queue", "capacity": 400, "is_measured": True, "demand": 300, "queued": 2,
            "admitted": 320, "admitted_after_wait": 5, "refused_capacity": 0, "refused_queue_full": 1,
            "refused_queue_wait": 3, "refused_queue_timeout": 0, "waits_s": [0.1, 0.4],
            "step_base_ms": 3.2, "step_row_us": 20.6, "step_prompt_token_us": 4.0,
            "prefill_share": 0.0004, "jobs_per_stream": 1.9, "step_scale": 1.1, "decode_cap": 384,
            "job_slots": 1024}
    return {**base, **kw}


def test_admission_figures_become_metrics() -> None:
    """Capacity, demand, headroom, load and queue as gauges; refusals and admissions after a
    wait as counters moved on by the engine's increase (from zero again after a restart); the
    waits as a histogram; the step-time fit and the estimate's other terms by term."""
    sup, metrics = _supervisor()
    sup._dispatch(em.encode(em.Stats(300, 0, 600, {}, _admission())))
    text = metrics.render().decode()
    for line in ("voxgate_admission_capacity_streams 400.0", "voxgate_admission_demand_streams 300.0",
                 "voxgate_admission_headroom_streams 100.0", "voxgate_admission_load 0.75",
                 "voxgate_admission_queued_streams 2.0", 'voxgate_admission_refused_total{reason="queue_wait"} 3.0',
                 "voxgate_admission_admitted_after_wait_total 5.0", "voxgate_admission_wait_seconds_count 2.0",
                 'voxgate_admission_step_model{term="per_row_us"} 20.6',
                 'voxgate_admission_estimate{term="prefill_share"} 0.0004',
                 'voxgate_admission_estimate{term="jobs_per_stream"} 1.9',
                 'voxgate_admission_estimate{term="step_scale"} 1.1',
                 'voxgate_admission_estimate{term="decode_cap"} 384.0',
                 'voxgate_admission_estimate{term="job_slots"} 1024.0'):
        assert line in text, line
    sup._dispatch(em.encode(em.Stats(300, 0, 600, {}, _admission(refused_queue_wait=7, waits_s=[]))))
    assert 'voxgate_admission_refused_total{reason="queue_wait"} 7.0' in metrics.render().decode()
    sup._dispatch(em.encode(em.Stats(0, 0, 0, {}, _admission(refused_queue_wait=2, capacity=None))))  # restarted
    text = metrics.render().decode()
    assert 'voxgate_admission_refused_total{reason="queue_wait"} 9.0' in text
    assert "voxgate_admission_capacity_streams NaN" in text and "voxgate_admission_load 0.0" in text


def test_health_carries_the_load_a_balancer_can_use() -> None:
    """/health's body has load = demand / capacity and the admission figures."""
    sup, _ = _supervisor()
    sup.status = "ready"
    sup._dispatch(em.encode(em.Stats(300, 0, 600, {}, _admission(demand=500))))
    _, body = sup.health()
    assert body["load"] == 1.25
    assert body["admission"] == {"load": 1.25, "capacity": 400, "demand": 500, "queued": 2,
                                 "policy": "queue", "is_measured": True}
