"""gateway.engine_client: the watchdog's decision, giving up after too many deaths, and audio
dropped for cancelled streams; no engine process (the real one is in test_server_hardening)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from engine import messages as em
from engine.config import EngineConfig
from engine.shm_ring import ShmQueue
from gateway.config import GatewayConfig
from gateway.engine_client import EngineSupervisor, EngineWatchdog
from gateway.metrics import GatewayMetrics


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_watchdog_fires_only_with_work_and_silence_past_the_limit() -> None:
    """Silence past timeout_s is a hang only with work in hand and nothing unread."""
    clock = Clock()
    wd = EngineWatchdog(10.0, clock=clock)
    clock.t += 9.9
    assert not wd.is_hung(has_work=True, has_unread=False)
    clock.t += 0.2
    assert wd.is_hung(has_work=True, has_unread=False)
    assert not wd.is_hung(has_work=False, has_unread=False)  # idle: nothing is waiting on it
    assert not wd.is_hung(has_work=True, has_unread=True)  # the gateway is behind, not the engine
    wd.note_heard()
    assert wd.silent_s() == 0.0 and not wd.is_hung(has_work=True, has_unread=False)


def test_watchdog_off_at_zero() -> None:
    """timeout_s 0 turns the watchdog off."""
    clock = Clock()
    wd = EngineWatchdog(0.0, clock=clock)
    clock.t += 1e6
    assert not wd.is_hung(has_work=True, has_unread=False)


def _supervisor(clock: Clock | None = None, **config: Any) -> tuple[EngineSupervisor, list[str], list]:
    lost: list[str] = []
    routed: list[em.Message] = []
    sup = EngineSupervisor(EngineConfig(model="synthetic"), GatewayConfig(**config),
                           log_level="WARNING", on_message=routed.append,
                           on_lost=lambda keys: lost.append(sup.status), metrics=GatewayMetrics(),
                           clock=clock or Clock())
    return sup, lost, routed


def test_a_death_past_the_limit_fails_for_good() -> None:
    """With max_engine_restarts 1: the first death restarts, the second tells the clients
    (on_lost with is_failed) and wait_failed returns."""

    async def main() -> None:
        sup, lost, _ = _supervisor(max_engine_restarts=1, engine_restart_backoff_s=0.0)
        sup._is_stopping = True  # the scheduled restart returns without launching
        sup.status = "ready"
        sup._on_engine_death()
        assert sup.status == "restarting" and lost == ["restarting"] and not sup.is_failed
        sup._on_engine_death()  # while restarting (a failed restart): no streams, but final
        assert sup.is_failed and lost == ["restarting", "failed"]
        await asyncio.wait_for(sup.wait_failed(), 10)
        assert "giving up" in (sup.last_error or "")
        code, body = sup.health()
        assert code == 503 and body["status"] == "failed"

    asyncio.run(main())


class FakeProcess:
    def __init__(self) -> None:
        self.killed = asyncio.Event()

    def kill(self) -> None:
        self.killed.set()


def test_a_silent_engine_with_streams_open_is_killed() -> None:
    """The silence watch kills the engine once the (fake) clock passes the limit with a
    stream open, and says why."""

    async def main() -> None:
        clock = Clock()
        sup, _, _ = _supervisor(clock, engine_watchdog_s=3.0)
        proc = FakeProcess()
        with ShmQueue.create(capacity_bytes=1 << 16, max_message_bytes=1 << 12) as outbox:
            sup._outbox, sup._process = outbox, proc  # type: ignore[assignment]
            sup._open[1] = 2
            sup.watchdog.note_heard()
            clock.t += 3.5
            watch = asyncio.create_task(sup._watch_silence(proc))  # type: ignore[arg-type]
            await asyncio.wait_for(proc.killed.wait(), 30)
            await watch
            assert "hung" in (sup._hang_note or "")
            sup._outbox = None

    asyncio.run(main())


def test_audio_after_a_cancel_is_dropped_and_counted() -> None:
    """Audio for a stream the gateway cancelled never reaches the server, and its samples are
    counted as dropped (cancelled) until the engine's Done for it."""

    async def main() -> None:
        sup, _, routed = _supervisor()
        with ShmQueue.create(capacity_bytes=1 << 16, max_message_bytes=1 << 12) as inbox:
            sup._inbox, sup.status = inbox, "ready"  # type: ignore[assignment]
            sup.send_nowait(em.Open(1, None, {}, "pcm_s16le"))
            sup.send_nowait(em.Open(2, None, {}, "pcm_f32le"))
            sup.send_nowait(em.Cancel(1))
            sup._route(em.Audio(1, b"\0" * 10, None, 0.0))
            sup._route(em.Audio(2, b"\0" * 8, None, 0.0))
            sup._route(em.Done(1, "cancelled", 0, {}))
            assert [type(m) for m in routed] == [em.Audio, em.Done]
            dropped = sup._metrics.samples_dropped.labels(reason="cancelled")._value.get()
            assert dropped == 5
            assert sup._open == {2: 4} and sup._cancelled == {}
            sup._inbox = None

    asyncio.run(main())


def test_heartbeats_are_kept_not_routed() -> None:
    """A Heartbeat updates the supervisor and is not passed on to the server."""
    sup, _, routed = _supervisor()
    sup._route(em.Heartbeat(0.5, 3))
    assert sup.heartbeat == em.Heartbeat(0.5, 3) and routed == []


@pytest.mark.parametrize("value", [-1.0, 1.0, 2.9])
def test_watchdog_config_is_off_or_a_few_heartbeats(value: float) -> None:
    """engine_watchdog_s is 0 (off) or at least 3 s (three heartbeats)."""
    with pytest.raises(ValueError):
        GatewayConfig(engine_watchdog_s=value)
