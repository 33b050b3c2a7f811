"""Several engine processes behind one gateway (``EnginePool``: one ``EngineSupervisor`` each, data
parallel) that look to the server like one engine; docs/deploy.md has the flags and the rules.
"""

from __future__ import annotations

import asyncio
import dataclasses
import http
from functools import partial
from typing import Any, Callable

from engine import messages as em
from engine.config import EngineConfig
from gateway.config import GatewayConfig
from gateway.engine_client import EngineStartError, EngineSupervisor
from gateway.metrics import GatewayMetrics, total_admission
from gateway.placement import EngineLoad, choose_engine, is_full

__all__ = ["EnginePool", "EngineSpec", "engine_specs"]


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """One engine of the pool: the GPU it is given ("" for none) and its process environment."""

    gpu: str = ""
    env: dict[str, str] = dataclasses.field(default_factory=dict)


def engine_specs(config: GatewayConfig) -> list[EngineSpec]:
    """The engines ``config`` asks for: ``num_engines``, engine i on ``gpus[i % len(gpus)]``
    (so that with several engines per GPU, consecutive indices are on different GPUs), or CPU
    engines with no ``gpus``."""
    several = config.num_engines > 1
    index_env = (lambda i: {"VOXGATE_ENGINE_INDEX": str(i)}) if several else (lambda i: {})
    gpus = config.gpus
    if gpus:
        return [EngineSpec(gpus[i % len(gpus)],
                           {"CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)], **index_env(i)})
                for i in range(config.num_engines)]
    return [EngineSpec("", index_env(i)) for i in range(config.num_engines)]


class EnginePool:
    """The engines of one gateway (module docstring)."""

    def __init__(
        self,
        engine_config: EngineConfig,
        config: GatewayConfig,
        *,
        log_level: str,
        on_message: Callable[[em.Message], None],
        on_lost: Callable[[list[int]], None],
        metrics: GatewayMetrics,
        supervisor: Callable[..., EngineSupervisor] = EngineSupervisor,
    ) -> None:
        """``supervisor`` builds each engine's supervisor (tests pass a fake)."""
        self._on_lost = on_lost
        self._metrics = metrics
        self.engines: list[EngineSupervisor] = [
            supervisor(engine_config, config, log_level=log_level, on_message=on_message,
                       on_lost=partial(self._lost, i), metrics=metrics, index=i, gpu=spec.gpu,
                       env=spec.env)
            for i, spec in enumerate(engine_specs(config))]
        self.hello: em.Hello | None = None  # set once, when every engine has started
        self._failed = asyncio.Event()

    # --- state -----------------------------------------------------------------------------

    def is_ready(self) -> bool:
        """Some engine serves: a new stream can be placed."""
        return any(e.is_ready() for e in self.engines)

    @property
    def is_failed(self) -> bool:
        """Every engine failed for good (each past its ``--max-engine-restarts``)."""
        return all(e.is_failed for e in self.engines)

    async def wait_failed(self) -> None:
        """Return once every engine has failed for good (after ``on_lost`` for the last)."""
        await self._failed.wait()

    @property
    def last_error(self) -> str | None:
        if len(self.engines) == 1:
            return self.engines[0].last_error
        errors = [f"engine {e.index}: {e.last_error}" for e in self.engines if e.last_error]
        return "; ".join(errors) or None

    @property
    def status(self) -> str:
        """ok (every engine serves), degraded (some do), else restarting, starting, failed or
        stopped."""
        statuses = [e.status for e in self.engines]
        num_ready = statuses.count("ready")
        if num_ready == len(statuses):
            return "ok"
        if num_ready:
            return "degraded"
        for status in ("restarting", "starting", "failed"):
            if status in statuses:
                return status
        return "stopped"

    def statuses(self) -> list[str]:
        return [e.status for e in self.engines]

    def health(self) -> tuple[http.HTTPStatus, dict[str, Any]]:
        """``/health``: with one engine, its own body (as before there were several) and
        ``engines``; with several, ``engine`` holds totals, ``engines`` each engine, and
        ``load`` and ``admission`` are the serving engines' together (``total_admission``).
        200 while any engine serves, else 503."""
        if len(self.engines) == 1:
            code, body = self.engines[0].health()
            body["engines"] = [self.engines[0].report()]
            return code, body
        ready = [e for e in self.engines if e.is_ready()]
        status = self.status
        reports = [e.report() for e in self.engines]
        total: dict[str, Any] = {"status": status, "engines": len(self.engines),
                                 "ready": len(ready),
                                 "restarts": sum(e.num_restarts for e in self.engines),
                                 "open_streams": sum(e.num_open for e in self.engines)}
        for name in ("streams", "queued_jobs", "running_jobs"):
            values = [r[name] for e, r in zip(self.engines, reports) if e.is_ready() and name in r]
            if values:
                total[name] = sum(values)
        hello = self.hello
        body: dict[str, Any] = {"status": status, "engine": total, "engines": reports,
                                "model": hello.model if hello else None,
                                "weights": hello.weights if hello else None,
                                "model_loaded": bool(ready)}
        admissions = [e.stats.admission for e in ready if e.stats is not None and e.stats.admission]
        if admissions:
            admission = total_admission(admissions)
            body["load"] = admission["load"]
            body["admission"] = admission
        code = http.HTTPStatus.OK if ready else http.HTTPStatus.SERVICE_UNAVAILABLE
        return code, body

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start every engine and wait for their handshakes. Raises ``EngineStartError`` (the
        others are stopped) when one cannot start: a server that serves fewer engines than
        asked for is found at once, not under load."""
        if len(self.engines) == 1:
            await self.engines[0].start()
        else:
            results = await asyncio.gather(*(e.start() for e in self.engines),
                                           return_exceptions=True)
            for engine, result in zip(self.engines, results):
                if isinstance(result, BaseException):
                    await self.stop()
                    if not isinstance(result, EngineStartError):
                        raise result
                    gpu = f" (GPU {engine.gpu})" if engine.gpu else ""
                    raise EngineStartError(f"engine {engine.index}{gpu}: {result}") from result
        hellos = [e.hello for e in self.engines if e.hello is not None]
        self.hello = _common_hello(hellos)
        h = self.hello
        self._metrics.engine_info.info({"model": h.model, "device": h.device, "weights": h.weights})

    async def stop(self) -> None:
        await asyncio.gather(*(e.stop() for e in self.engines))

    def _lost(self, index: int, keys: list[int]) -> None:
        self._on_lost(keys)  # reads is_failed: the last engine failed for good
        if self.is_failed:
            self._failed.set()

    # --- gateway -> engines ----------------------------------------------------------------

    def send_nowait(self, msg: em.Message) -> None:
        """Queue ``msg`` for the engine of its stream; an ``Open`` places the stream first."""
        engines = self.engines
        if type(msg) is em.Open:
            index = 0 if len(engines) == 1 else self._place()
            if index is None:  # none serves (the session checked is_ready, so not expected)
                return
            self._metrics.count_placed(index)
            engines[index].send_nowait(msg)
            return
        if len(engines) == 1:
            engines[0].send_nowait(msg)
            return
        key = getattr(msg, "key", None)
        for engine in engines:
            if engine.has_stream(key):  # type: ignore[arg-type]
                engine.send_nowait(msg)
                return
        # not open in any engine: done, cancelled, or lost with its engine; nothing to deliver

    def _loads(self) -> list[EngineLoad]:
        loads = []
        for e in self.engines:
            admission = e.stats.admission if e.stats is not None else {}
            room = admission.get("room") if admission else None
            loads.append(EngineLoad(
                index=e.index, is_ready=e.is_ready(), num_open=e.num_open,
                capacity=admission.get("capacity") if admission else None,
                demand=int(admission.get("demand", 0)) + int(admission.get("queued", 0)),
                num_open_at_report=e.num_open_at_report,
                room=None if room is None else int(room)))
        return loads

    def _place(self) -> int | None:
        return choose_engine(self._loads())

    def full_hint(self) -> float | None:
        """None while some serving engine has room for one more stream (by its last report
        and the streams sent to it since); else the shortest retry hint the engines reported
        (gateway.admission_door refuses the stream at the gateway)."""
        if not is_full(self._loads()):
            return None
        hints = [float(e.stats.admission["retry_after_s"]) for e in self.engines
                 if e.is_ready() and e.stats is not None
                 and e.stats.admission.get("retry_after_s") is not None]
        return min(hints) if hints else 1.0  # (reports from before the hint was reported)

    async def wait_writable(self) -> None:
        """Return once no engine's queue is backed up (readers of client frames wait here)."""
        for engine in self.engines:
            await engine.wait_writable()


def _common_hello(hellos: list[em.Hello]) -> em.Hello:
    """The engines' handshake as one (they serve the same model): the first, with every
    engine's device named when there are several."""
    first = hellos[0]
    if len(hellos) == 1:
        return first
    devices = list(dict.fromkeys(h.device for h in hellos))
    return dataclasses.replace(first, device=f"{len(hellos)} engines: " + "; ".join(devices))
