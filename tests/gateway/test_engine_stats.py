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
                           on_message=lambda msg: None, on_lost=lambda: None, metrics=metrics)
    sup._dispatch(em.encode(em.Stats(3, 1, 2, {"steps": 10, "busy_s": 0.5, "decode_rows": 640})))
    text = metrics.render().decode()
    assert 'voxgate_engine_totals{name="decode_rows"} 640.0' in text
    assert 'voxgate_engine_totals{name="busy_s"} 0.5' in text
    assert "voxgate_engine_running_jobs 2.0" in text
    sup._dispatch(em.encode(em.Stats(3, 0, 2, {"steps": 25, "busy_s": 1.5, "decode_rows": 1600})))
    assert 'voxgate_engine_totals{name="steps"} 25.0' in metrics.render().decode()
    assert sup.stats.totals["decode_rows"] == 1600
