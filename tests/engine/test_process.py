"""engine.process.EngineLoop: a step's outputs leave as Batch records, split to fit the queue."""

from __future__ import annotations

import dataclasses
import math
import threading
import time

from engine import messages as m
from engine.core import EngineCore
from engine.process import EngineLoop
from engine.shm_ring import ShmQueue
from tests.engine.fakes import FakeBackend


class PacedBackend(FakeBackend):
    """A FakeBackend that says when its next output is due."""

    def __init__(self, due_s: float) -> None:
        super().__init__()
        self.due_s = due_s

    def next_due_s(self) -> float:
        return self.due_s if self.jobs else math.inf


def _loop(backend: FakeBackend, max_message_bytes: int = 1 << 16) -> tuple[EngineLoop, ShmQueue, ShmQueue]:
    inbox = ShmQueue.create(capacity_bytes=4 * max_message_bytes, max_message_bytes=max_message_bytes)
    outbox = ShmQueue.create(capacity_bytes=4 * max_message_bytes, max_message_bytes=max_message_bytes)
    return EngineLoop(EngineCore(backend), inbox, outbox, stats_interval_s=60.0), inbox, outbox


def _received(outbox: ShmQueue) -> list[m.Message]:
    return [m.decode(data) for data in outbox.get_many_nowait()]


def _open_streams(loop: EngineLoop, keys: range) -> None:
    for key in keys:
        loop._send(loop.core.open(key, None, {}))
        loop._send(loop.core.add_text(key, "Hello there, a sentence that is long enough."))
        loop._send(loop.core.flush(key))


def test_a_steps_audio_leaves_as_one_batch() -> None:
    """Three streams' chunks of one step arrive as one Batch, in the core's order."""
    loop, inbox, outbox = _loop(FakeBackend())
    with inbox, outbox:
        _open_streams(loop, range(1, 4))
        assert all(type(x) is m.Started for x in _received(outbox))
        expected = loop.core.step()
        loop._send(expected)
        [record] = _received(outbox)
        assert type(record) is m.Batch
        assert record.messages == expected


def test_a_batch_too_large_for_one_record_is_split_in_order() -> None:
    """Audio beyond half of max_message_bytes goes into further records, order kept."""
    backend = FakeBackend(chunk_samples=1000)  # 4,000 bytes of float32 per chunk
    loop, inbox, outbox = _loop(backend, max_message_bytes=16_384)
    with inbox, outbox:
        _open_streams(loop, range(1, 11))
        _received(outbox)
        expected = loop.core.step()
        loop._send(expected)
        records = _received(outbox)
        assert len(records) > 1
        flat = [x for r in records for x in (r.messages if type(r) is m.Batch else [r])]
        assert flat == expected


def test_a_single_message_is_not_wrapped() -> None:
    """One message is sent as itself, not as a Batch of one."""
    loop, inbox, outbox = _loop(FakeBackend())
    with inbox, outbox:
        loop._send([m.Stats(1, 0, 1)])
        assert _received(outbox) == [m.Stats(1, 0, 1)]


def test_paced_backend_sleeps_at_least_the_minimum() -> None:
    """A paced backend due in 10 us lets the loop sleep 1 ms; one due now, not at all."""
    backend = PacedBackend(due_s=10e-6)
    loop, inbox, outbox = _loop(backend)
    with inbox, outbox:
        _open_streams(loop, range(1, 2))
        assert loop._wait_s() == 1e-3
        backend.due_s = 0.0
        assert loop._wait_s() == 0.0
        backend.due_s = 0.2
        assert loop._wait_s() == 0.2


def test_a_slow_step_is_logged_with_the_streams_it_held(monkeypatch, caplog) -> None:
    """A step over the slow-step threshold is logged as a warning naming how many streams
    waited; its outputs still leave."""
    import engine.process as process

    monkeypatch.setattr(process, "_SLOW_STEP_S", -1.0)  # every step counts as slow
    loop, inbox, outbox = _loop(FakeBackend())
    with inbox, outbox:
        _open_streams(loop, range(1, 3))
        _received(outbox)
        with caplog.at_level("WARNING", logger="voxgate.engine"):
            loop._step()
        assert any("engine step took" in r.message and "2 streams" in r.message for r in caplog.records)
        assert _received(outbox)
        assert loop._step_since is None


class BlockingBackend(FakeBackend):
    """A FakeBackend whose steps block until ``release`` is set (a long step)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def step(self) -> list:
        self.entered.set()
        assert self.release.wait(60), "the test never released the step"
        return super().step()


def _next_of(outbox: ShmQueue, kind: type, timeout_s: float = 60.0) -> m.Message:
    """The next message of ``kind`` the engine sends (others are skipped)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        data = outbox.get(timeout_s=1.0)
        if data is not None:
            msg = m.decode(data)
            for item in msg.messages if type(msg) is m.Batch else [msg]:
                if type(item) is kind:
                    return item
    raise AssertionError(f"no {kind.__name__} within {timeout_s} s")


def test_heartbeats_keep_coming_while_a_step_blocks() -> None:
    """The heartbeat thread beats at its interval also while a step blocks the loop, and says
    how long the step has run; the loop ends on Shutdown."""
    backend = BlockingBackend()
    inbox = ShmQueue.create(capacity_bytes=1 << 18, max_message_bytes=1 << 16)
    outbox = ShmQueue.create(capacity_bytes=1 << 18, max_message_bytes=1 << 16)
    loop = EngineLoop(EngineCore(backend), inbox, outbox, stats_interval_s=60.0,
                      heartbeat_interval_s=0.02)
    runner = threading.Thread(target=loop.run, daemon=True)
    with inbox, outbox:
        runner.start()
        assert _next_of(outbox, m.Heartbeat).step_s == 0.0  # idle: beats too
        for msg in (m.Open(1, None, {}), m.Text(1, "Hello there, a sentence long enough."),
                    m.Flush(1)):
            inbox.put(m.encode(msg), timeout_s=10)
        assert backend.entered.wait(60)
        while (beat := _next_of(outbox, m.Heartbeat)).step_s == 0.0:
            pass  # one sent before the step began
        assert beat.step_s > 0.0 and beat.num_steps == 0
        backend.release.set()
        inbox.put(m.encode(m.Shutdown()), timeout_s=10)
        runner.join(60)
        assert not runner.is_alive()


class CountingBackend(FakeBackend):
    """A FakeBackend with the step-based figures: each step launches one decode row per job."""

    async_steps = False
    max_decode_rows = 256
    decode_fill_rows = 128

    def __init__(self) -> None:
        super().__init__(chunks_per_job=50)
        self.info = dataclasses.replace(self.info, tokens_per_audio_second=82.0)
        self.rows = 0

    def step_counts(self) -> tuple[int, int]:
        return self.rows, 0

    def step(self):  # type: ignore[no-untyped-def]
        self.rows += len(self.order)
        return super().step()


def test_back_to_back_steps_become_admission_samples_and_stats_carry_the_figures(monkeypatch) -> None:
    """Each step's rows are paired with the time to the next back-to-back step and given to the
    core with the decode cap and fill; a wait between steps breaks the pairing; Stats carry the
    admission figures."""
    backend = CountingBackend()
    loop, inbox, outbox = _loop(backend)
    samples: list[tuple[int, int, float, int, int]] = []
    monkeypatch.setattr(loop.core, "note_step", lambda rows, prompts, seconds, *, max_rows, fill_rows:
                        samples.append((rows, prompts, seconds, max_rows, fill_rows)))
    with inbox, outbox:
        _open_streams(loop, range(1, 4))
        _received(outbox)
        for _ in range(3):
            loop._step()
        assert [(r, p, cap, fill) for r, p, _, cap, fill in samples] == [(6, 0, 256, 128)] * 2  # 2 jobs a stream
        assert all(s > 0 for _, _, s, _, _ in samples)
        loop._sampler.reset()  # the loop slept
        loop._step()
        assert len(samples) == 2
        _received(outbox)
        loop._send_stats()
        [stats] = _received(outbox)
        assert stats.admission["policy"] == "queue" and stats.admission["demand"] == 3
        assert stats.admission["capacity"] is None  # not yet measured, no initial cap


def test_an_idle_loop_wakes_when_a_waiting_stream_times_out(monkeypatch) -> None:
    """With nothing to step, the loop sleeps only until the admission queue's head times out."""
    from engine.admission import AdmissionConfig

    inbox = ShmQueue.create(capacity_bytes=1 << 18, max_message_bytes=1 << 16)
    outbox = ShmQueue.create(capacity_bytes=1 << 18, max_message_bytes=1 << 16)
    core = EngineCore(FakeBackend(), admission=AdmissionConfig(initial_capacity=1, max_wait_s=0.3))
    loop = EngineLoop(core, inbox, outbox, stats_interval_s=60.0)
    with inbox, outbox:
        _open_streams(loop, range(1, 3))
        assert core.admission.num_queued == 1
        monkeypatch.setattr(core, "has_work", lambda: False)
        assert 0.0 < loop._wait_s() <= 0.3
