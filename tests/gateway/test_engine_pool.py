"""gateway.engine_pool: placement, routing by stream, one engine's loss, the server's failure
rule, /health and metrics per engine and in total; fake supervisors, no engine process (the
real ones are in test_data_parallel)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from engine import messages as em
from engine.config import EngineConfig
from gateway.config import GatewayConfig
from gateway.engine_client import EngineStartError
from gateway.engine_pool import EnginePool, engine_specs
from gateway.metrics import GatewayMetrics, total_admission

_HELLO = em.Hello("synthetic", ["tone"], "tone", 24000, {}, "cpu: test", "loaded", False)


class FakeSupervisor:
    """An ``EngineSupervisor`` without a process: records what is sent; tests set its state."""

    def __init__(self, engine_config: EngineConfig, config: GatewayConfig, *, log_level: str,
                 on_message: Any, on_lost: Any, metrics: GatewayMetrics, index: int, gpu: str,
                 env: dict[str, str]) -> None:
        self.index, self.gpu, self.env = index, gpu, env
        self.on_lost = on_lost
        self.status = "stopped"
        self.sent: list[em.Message] = []
        self.open: set[int] = set()
        self.stats: em.Stats | None = None
        self.num_open_at_report = 0
        self.hello: em.Hello | None = None
        self.num_restarts = 0
        self.last_error: str | None = None
        self.start_error: str | None = None
        self.stopped = False

    def is_ready(self) -> bool:
        return self.status == "ready"

    @property
    def is_failed(self) -> bool:
        return self.status == "failed"

    @property
    def num_open(self) -> int:
        return len(self.open)

    def has_stream(self, key: int) -> bool:
        return key in self.open

    def send_nowait(self, msg: em.Message) -> None:
        self.sent.append(msg)
        if isinstance(msg, em.Open):
            self.open.add(msg.key)
        elif isinstance(msg, em.Cancel):
            self.open.discard(msg.key)

    async def start(self) -> None:
        await asyncio.sleep(0)
        if self.start_error:
            raise EngineStartError(self.start_error)
        self.status, self.hello = "ready", em.Hello(**{**_HELLO.__dict__, "device": f"dev{self.index}"})

    async def stop(self) -> None:
        self.stopped, self.status = True, "stopped"

    async def wait_writable(self) -> None:
        pass

    def report(self) -> dict[str, Any]:
        return {"index": self.index, "status": self.status, "open_streams": self.num_open,
                "restarts": self.num_restarts}

    def health(self) -> tuple[int, dict[str, Any]]:
        return (200 if self.is_ready() else 503), {"status": "ok" if self.is_ready() else self.status,
                                                   "engine": {"status": self.status}}

    def die(self, *, final: bool = False) -> None:
        """As the real one: status first, then on_lost with the keys open in it."""
        keys, self.open = sorted(self.open), set()
        self.status = "failed" if final else "restarting"
        self.on_lost(keys)


def _pool(num_engines: int = 3, **config: Any) -> tuple[EnginePool, list[list[int]], list[FakeSupervisor]]:
    lost: list[list[int]] = []
    pool = EnginePool(EngineConfig(model="synthetic"), GatewayConfig(num_engines=num_engines, **config),
                      log_level="WARNING", on_message=lambda msg: None, on_lost=lost.append,
                      metrics=GatewayMetrics(), supervisor=FakeSupervisor)
    return pool, lost, pool.engines  # type: ignore[return-value]


def _stats(demand: int, capacity: int | None, queued: int = 0) -> em.Stats:
    return em.Stats(demand, 0, demand, {}, {"capacity": capacity, "demand": demand, "queued": queued,
                                            "policy": "queue", "is_measured": capacity is not None})


def test_engine_specs_give_each_engine_its_gpu_and_index() -> None:
    """--gpus 0,1: CUDA_VISIBLE_DEVICES per engine; --engines 2: the index only; one engine
    without --gpus: the environment untouched, and --gpus 0 only CUDA_VISIBLE_DEVICES."""
    specs = engine_specs(GatewayConfig(gpus=("0", "1"), num_engines=2))
    assert [(s.gpu, s.env) for s in specs] == [
        ("0", {"CUDA_VISIBLE_DEVICES": "0", "VOXGATE_ENGINE_INDEX": "0"}),
        ("1", {"CUDA_VISIBLE_DEVICES": "1", "VOXGATE_ENGINE_INDEX": "1"})]
    assert [s.env for s in engine_specs(GatewayConfig(num_engines=2))] == [
        {"VOXGATE_ENGINE_INDEX": "0"}, {"VOXGATE_ENGINE_INDEX": "1"}]
    assert [s.env for s in engine_specs(GatewayConfig())] == [{}]
    assert [s.env for s in engine_specs(GatewayConfig(gpus=("0",)))] == [{"CUDA_VISIBLE_DEVICES": "0"}]


def test_starting_waits_for_every_engine_and_names_their_devices() -> None:
    """start() returns once all engines shook hands; the common hello names every device."""
    async def main() -> None:
        pool, _, engines = _pool(2)
        await pool.start()
        assert all(e.is_ready() for e in engines) and pool.is_ready()
        assert pool.hello is not None and pool.hello.device == "2 engines: dev0; dev1"
        assert pool.hello.model == "synthetic"

    asyncio.run(main())


def test_one_engine_that_cannot_start_stops_the_others_and_is_named() -> None:
    """An engine's start failure fails the pool's start, says which engine, stops the rest."""
    async def main() -> None:
        pool, _, engines = _pool(3)
        engines[1].start_error = "the model failed to load: boom"
        with pytest.raises(EngineStartError, match=r"^engine 1: the model failed to load: boom"):
            await pool.start()
        assert all(e.stopped for e in engines)

    asyncio.run(main())


def test_streams_are_spread_and_their_messages_follow_them() -> None:
    """Opens go to the engine with the fewest streams (no capacity known); text, end and
    cancel of a stream go to the engine that holds it, and nothing else."""
    pool, _, engines = _pool(3)
    for e in engines:
        e.status = "ready"
    for key in range(1, 7):
        pool.send_nowait(em.Open(key, None, {}, "pcm_s16le"))
    assert [sorted(e.open) for e in engines] == [[1, 4], [2, 5], [3, 6]]
    pool.send_nowait(em.Text(5, "hello"))
    pool.send_nowait(em.End(5))
    pool.send_nowait(em.Cancel(3))
    assert engines[1].sent[-2:] == [em.Text(5, "hello"), em.End(5)]
    assert engines[2].sent[-1] == em.Cancel(3) and len(engines[0].sent) == 2
    pool.send_nowait(em.Text(3, "late"))  # cancelled: held by no engine
    assert em.Text(3, "late") not in [m for e in engines for m in e.sent]
    placed = pool._metrics.pool_placed  # type: ignore[attr-defined]
    assert [placed.labels(engine=str(i))._value.get() for i in range(3)] == [2, 2, 2]


def test_streams_go_where_the_headroom_is() -> None:
    """With every engine's capacity reported, the one with the most room takes the streams
    until the room evens out; a restarting engine takes none."""
    pool, _, engines = _pool(3)
    for e, stats in zip(engines, (_stats(8, 10), _stats(2, 10), _stats(0, 10))):
        e.status, e.stats = "ready", stats
    engines[2].status = "restarting"
    for key in range(1, 8):
        pool.send_nowait(em.Open(key, None, {}, "pcm_f32le"))
    assert (len(engines[0].open), len(engines[1].open), len(engines[2].open)) == (1, 6, 0)


def test_an_engine_lost_reports_only_its_streams_and_the_pool_serves_on() -> None:
    """One engine dies: on_lost gets its keys only, the pool still serves; an engine given up
    while another serves leaves the pool serving; the last one given up fails the pool."""
    async def main() -> None:
        pool, lost, engines = _pool(2)
        for e in engines:
            e.status = "ready"
        for key in range(1, 5):
            pool.send_nowait(em.Open(key, None, {}, "pcm_f32le"))
        engines[0].die()
        assert lost == [[1, 3]] and pool.is_ready() and not pool.is_failed
        assert pool.status == "degraded"
        engines[0].status = "failed"  # given up after its restarts
        assert pool.is_ready() and not pool.is_failed
        engines[1].die(final=True)
        assert lost[-1] == [2, 4] and pool.is_failed and pool.status == "failed"
        await asyncio.wait_for(pool.wait_failed(), 10)

    asyncio.run(main())


def test_health_reports_each_engine_and_the_total_load() -> None:
    """Several engines: `engines` lists each, `engine` the totals, `load` the serving engines'
    demand over their capacity; 200 while one serves, 503 when none does."""
    pool, _, engines = _pool(3)
    for e, stats in zip(engines, (_stats(30, 100), _stats(50, 100), _stats(99, 100))):
        e.status, e.stats = "ready", stats
    engines[2].status = "restarting"  # its last figures do not count
    code, body = pool.health()
    assert code == 200 and body["status"] == "degraded"
    assert [r["index"] for r in body["engines"]] == [0, 1, 2]
    assert body["engine"]["engines"] == 3 and body["engine"]["ready"] == 2
    assert body["load"] == 0.4 and body["admission"]["capacity"] == 200
    for e in engines:
        e.status = "restarting"
    code, body = pool.health()
    assert code == 503 and body["status"] == "restarting" and body["model_loaded"] is False


def test_one_engine_keeps_its_own_health_body() -> None:
    """With one engine /health is that engine's body (as before there were several), plus
    `engines`."""
    pool, _, engines = _pool(1)
    engines[0].status = "ready"
    code, body = pool.health()
    assert code == 200 and body["status"] == "ok" and body["engine"] == {"status": "ready"}
    assert body["engines"] == [engines[0].report()]


def test_total_admission_of_one_report_is_that_report() -> None:
    """One engine's total is its own figures; several: capacities and demands add up, and the
    load counts only engines with a limit known."""
    one = {"capacity": 400, "demand": 100, "queued": 2, "policy": "queue", "is_measured": True}
    assert total_admission([one]) == {"load": 0.25, "capacity": 400, "demand": 100, "queued": 2,
                                      "policy": "queue", "is_measured": True}
    unknown = {"capacity": None, "demand": 7, "queued": 0, "policy": "queue", "is_measured": False}
    total = total_admission([one, one, unknown])
    assert (total["capacity"], total["demand"], total["load"], total["is_measured"]) == (800, 207, 0.25, False)
    assert total_admission([unknown, unknown])["load"] == 0.0


def test_metrics_per_engine_and_in_total() -> None:
    """Each engine's report sets its own labelled series; the unlabelled families are the
    serving engines' sum, refusals counted per engine by their increase."""
    m = GatewayMetrics()
    adm = {"capacity": 100, "demand": 40, "queued": 1, "policy": "queue", "is_measured": True,
           "refused_queue_full": 2, "step_row_us": 20.0}
    m.engine_started(0, device="d0", gpu="0")
    m.engine_started(1, device="d1", gpu="1")
    m.observe_engine_stats(0, em.Stats(40, 1, 40, {"steps": 10}, adm))
    m.observe_engine_stats(1, em.Stats(20, 0, 20, {"steps": 5}, {**adm, "demand": 20, "step_row_us": 30.0}))
    text = m.render().decode()
    for line in ('voxgate_pool_engine_streams{engine="1"} 20.0', "voxgate_engine_streams 60.0",
                 'voxgate_engine_totals{name="steps"} 15.0', "voxgate_admission_capacity_streams 200.0",
                 "voxgate_admission_load 0.3", 'voxgate_pool_admission_load{engine="0"} 0.4',
                 'voxgate_admission_refused_total{reason="queue_full"} 4.0',
                 'voxgate_pool_admission_refused_total{engine="1",reason="queue_full"} 2.0',
                 'voxgate_admission_step_model{term="per_row_us"} 25.0', "voxgate_engine_up 2.0",
                 'voxgate_pool_engine_info{device="d1",engine="1",gpu="1"} 1.0'):
        assert line in text, line
    m.engine_stopped(1)
    text = m.render().decode()
    assert "voxgate_engine_streams 40.0" in text and "voxgate_admission_capacity_streams 100.0" in text
    assert 'voxgate_pool_engine_up{engine="1"} 0.0' in text and "voxgate_engine_up 1.0" in text
