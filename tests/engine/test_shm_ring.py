"""Tests for engine.shm_ring: the shared-memory SPSC queue between gateway and engine."""

from __future__ import annotations

import asyncio
import collections
import multiprocessing as mp
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import shm_ring
from engine.shm_ring import PeerDead, QueueClosed, QueueFull, ShmQueue

REPO_ROOT = Path(__file__).resolve().parents[2]
SPAWN = mp.get_context("spawn")


def _message(seq: int, num_bytes: int) -> bytes:
    """A message whose every byte depends on ``seq``, so reordering, loss or garbage shows."""
    return (seq.to_bytes(4, "little") * (num_bytes // 4 + 1))[:num_bytes]


def _record(num_bytes: int) -> int:
    return (num_bytes + 8 + 7) // 8 * 8


def _run_async(coro):
    loop = uvloop.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


# -- spawn children (module level so that the spawned interpreter can import them) -------------


def _child_echo(q_in: ShmQueue, q_out: ShmQueue, max_sleep_s: float | None = None) -> None:
    if max_sleep_s is not None:
        shm_ring._MAX_SLEEP_S = max_sleep_s
    try:
        while (msg := q_in.get(timeout_s=60)) is not None:
            q_out.put(msg, timeout_s=60)
    except QueueClosed:
        pass
    q_out.close()
    q_in.close()


def _child_flood(q: ShmQueue, first_seq: int, num_bytes: int) -> None:
    seq = first_seq
    while True:
        q.put(_message(seq, num_bytes), timeout_s=60)
        seq += 1


def _child_put_then_close(q: ShmQueue, num_messages: int, num_bytes: int = 100) -> None:
    for seq in range(num_messages):
        q.put(_message(seq, num_bytes), timeout_s=60)
    q.close()


# -- in-process behaviour ----------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("put"), st.integers(0, 200)),
            st.tuples(st.just("get"), st.integers(1, 4)),
        ),
        max_size=120,
    )
)
def test_matches_fifo_model_across_wraparound(ops: list[tuple[str, int]]) -> None:
    """Random puts/gets keep order, lose and duplicate nothing, and refuse exactly when full."""
    capacity = 256
    with ShmQueue.create(capacity_bytes=capacity, max_message_bytes=200) as q:
        model: collections.deque[bytes] = collections.deque()
        used = 0
        for seq, (op, arg) in enumerate(ops):
            if op == "put":
                msg = _message(seq, arg)
                if used + _record(arg) > capacity:
                    with pytest.raises(QueueFull):
                        q.put_nowait(msg)
                else:
                    q.put_nowait(msg)
                    model.append(msg)
                    used += _record(arg)
            else:
                got = q.get_many_nowait(arg)
                expected = [model.popleft() for _ in range(min(arg, len(model)))]
                assert got == expected
                used -= sum(_record(len(m)) for m in got)
            assert q.qsize_bytes() == used
        assert q.get_many_nowait() == list(model)


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 1000), min_size=1, max_size=60))
def test_separate_handles_deliver_in_order(sizes: list[int]) -> None:
    """A producer handle and a consumer handle (stale cached indices) agree on every message."""
    with ShmQueue.create(capacity_bytes=1024, max_message_bytes=1000) as producer:
        consumer = pickle.loads(pickle.dumps(producer))
        received = []
        for seq, size in enumerate(sizes):
            while True:
                try:
                    producer.put_nowait(_message(seq, size))
                    break
                except QueueFull:
                    received.extend(consumer.get_many_nowait())
        received.extend(consumer.get_many_nowait())
        consumer.close()
        assert received == [_message(seq, size) for seq, size in enumerate(sizes)]


def test_messages_larger_than_half_the_ring_wrap_at_every_offset() -> None:
    """Messages of up to the whole ring, split across its end, come back intact."""
    capacity = 4096
    with ShmQueue.create(capacity_bytes=capacity, max_message_bytes=capacity - 8) as q:
        for seq, size in enumerate(range(0, capacity - 8, 56)):
            msg = _message(seq, size)
            q.put_nowait(msg)
            assert q.get_nowait() == msg
        big = _message(7, capacity - 8)
        q.put_nowait(big)
        with pytest.raises(QueueFull):
            q.put_nowait(b"")
        assert q.get_nowait() == big


def test_four_mib_audio_messages() -> None:
    """4 MiB messages (far larger than a record header) pass through a 6 MiB ring, wrapping."""
    with ShmQueue.create(capacity_bytes=6 << 20, max_message_bytes=4 << 20) as q:
        for seq in range(5):
            msg = os.urandom(4 << 20)
            q.put(msg, timeout_s=1)
            assert q.get(timeout_s=1) == msg


def test_oversized_message_is_refused() -> None:
    """A message above max_message_bytes raises ValueError and leaves the queue untouched."""
    with ShmQueue.create(capacity_bytes=1024, max_message_bytes=100) as q:
        with pytest.raises(ValueError):
            q.put_nowait(b"x" * 101)
        assert q.qsize_bytes() == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"capacity_bytes": 1001},
        {"capacity_bytes": 0},
        {"capacity_bytes": 1024, "max_message_bytes": 1024},
        {"capacity_bytes": 1024, "max_message_bytes": 0},
        {"capacity_bytes": 1024, "max_message_bytes": 64, "spin_s": -1.0},
    ],
)
def test_create_validates_arguments(kwargs: dict) -> None:
    """Bad sizes are rejected with ValueError before any shared memory is created."""
    with pytest.raises(ValueError):
        ShmQueue.create(**kwargs)


def test_uncommitted_record_is_never_visible() -> None:
    """A record written but not committed (producer died before the index store) is skipped."""
    with ShmQueue.create(capacity_bytes=1024, max_message_bytes=512) as q:
        q.put_nowait(b"first")
        assert q.get_nowait() == b"first"
        # Simulate a producer that wrote the header and half the payload, then died.
        pos = shm_ring._DATA + q._write_idx % q.capacity_bytes
        q._buf[pos : pos + 8] = (300).to_bytes(8, "little")
        q._buf[pos + 8 : pos + 158] = b"\xff" * 150
        assert q.get_nowait() is None
        assert q.get(timeout_s=0.05) is None
        # A producer that comes later overwrites the torn record.
        q.put_nowait(b"second")
        assert q.get_many_nowait() == [b"second"]


def test_put_nowait_raises_queue_full_at_once() -> None:
    """put_nowait on a full queue raises QueueFull without waiting."""
    with ShmQueue.create(capacity_bytes=64, max_message_bytes=48) as q:
        q.put_nowait(b"x" * 48)
        with pytest.raises(QueueFull):
            q.put_nowait(b"y")


def test_put_times_out_with_queue_full() -> None:
    """put on a full queue waits up to timeout_s, then raises QueueFull."""
    with ShmQueue.create(capacity_bytes=64, max_message_bytes=48) as q:
        q.put_nowait(b"x" * 48)
        t0 = time.monotonic()
        with pytest.raises(QueueFull):
            q.put(b"y", timeout_s=0.1)
        assert time.monotonic() - t0 >= 0.1


def test_put_wakes_when_consumer_frees_room() -> None:
    """A producer sleeping on a full queue is woken by the consumer's get and completes."""
    with ShmQueue.create(capacity_bytes=64, max_message_bytes=48, spin_s=0) as q:
        q.put_nowait(b"x" * 48)
        done = threading.Event()

        def produce() -> None:
            q.put(b"y" * 48, timeout_s=30)
            done.set()

        thread = threading.Thread(target=produce)
        thread.start()
        assert not done.wait(0.05)  # still blocked: the queue is full
        assert q.get_nowait() == b"x" * 48
        assert done.wait(10)
        thread.join()
        assert q.get_nowait() == b"y" * 48


def test_consumer_close_fails_a_waiting_producer() -> None:
    """A full-queue put raises QueueClosed once the consumer has closed its end."""
    with ShmQueue.create(capacity_bytes=64, max_message_bytes=48) as q:
        consumer = pickle.loads(pickle.dumps(q))
        assert consumer.get_nowait() is None  # registers as the consumer
        q.put_nowait(b"x" * 48)
        consumer.close()
        with pytest.raises(QueueClosed):
            q.put(b"y", timeout_s=5)


def test_close_is_idempotent_and_unlinks() -> None:
    """close() twice is fine; the creator's close removes the shared memory name."""
    q = ShmQueue.create(capacity_bytes=1024, max_message_bytes=64)
    path = Path("/dev/shm") / q.name
    assert path.exists()
    q.close()
    q.close()
    assert not path.exists()
    with pytest.raises(QueueClosed):
        q.put_nowait(b"x")
    with pytest.raises(QueueClosed):
        q.get_nowait()


def test_idle_blocking_get_costs_no_cpu() -> None:
    """A consumer blocked ~0.5 s in get on an empty queue uses under 5% of a core."""
    with ShmQueue.create(capacity_bytes=1024, max_message_bytes=64) as q:
        wall0, cpu0 = time.monotonic(), time.process_time()
        assert q.get(timeout_s=0.5) is None
        wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
        assert wall >= 0.5
        assert cpu < 0.05 * wall


def test_get_without_spin_sleeps_at_once() -> None:
    """get(spin_s=0) on a queue that spins for 1 s sleeps at once and returns at its timeout."""
    with ShmQueue.create(capacity_bytes=1024, max_message_bytes=64, spin_s=1.0) as q:
        wall0 = time.monotonic()
        assert q.get(timeout_s=0.01, spin_s=0.0) is None
        assert time.monotonic() - wall0 < 0.5
        q.put_nowait(b"x")
        assert q.get(timeout_s=1.0, spin_s=0.0) == b"x"


def test_idle_async_get_costs_no_cpu() -> None:
    """An asyncio consumer awaiting get_async ~0.5 s on uvloop uses under 5% of a core."""
    with ShmQueue.create(capacity_bytes=1024, max_message_bytes=64) as q:

        async def idle() -> tuple[float, float]:
            wall0, cpu0 = time.monotonic(), time.process_time()
            assert await q.get_async(timeout_s=0.5) is None
            return time.monotonic() - wall0, time.process_time() - cpu0

        wall, cpu = _run_async(idle())
        assert wall >= 0.5 - 0.005  # the loop's timers may fire up to a millisecond early (seen: 0.49983 s)
        assert cpu < 0.05 * wall


def test_get_async_is_woken_by_put_without_blocking_the_loop() -> None:
    """get_async parks on the loop (other tasks run) and a put wakes it through the doorbell."""
    with ShmQueue.create(capacity_bytes=1024, max_message_bytes=64) as q:

        async def scenario() -> bytes | None:
            task = asyncio.create_task(q.get_async(timeout_s=30))
            for _ in range(5):
                await asyncio.sleep(0)  # the loop keeps running other work meanwhile
            assert not task.done()
            assert q._words[shm_ring._CONSUMER_WAITING] == 1  # asleep, announced
            q.put_nowait(b"wake")
            return await asyncio.wait_for(task, 10)

        assert _run_async(scenario()) == b"wake"


def test_put_async_waits_for_room_on_the_loop() -> None:
    """put_async on a full queue waits on the loop until a consumer task makes room."""
    with ShmQueue.create(capacity_bytes=128, max_message_bytes=100) as q:

        async def scenario() -> list[bytes]:
            async def produce() -> None:
                for seq in range(50):
                    await q.put_async(_message(seq, 100), timeout_s=30)

            producer = asyncio.create_task(produce())
            got: list[bytes] = []
            while len(got) < 50:
                got.extend(await q.get_many_async(timeout_s=30))
            await producer
            return got

        assert _run_async(scenario()) == [_message(seq, 100) for seq in range(50)]


# -- across processes (real spawn children) ----------------------------------------------------


def test_spawn_child_round_trip_then_closed() -> None:
    """A spawned child echoes random-size messages in order; its close ends our get with QueueClosed."""
    to_child = ShmQueue.create(capacity_bytes=16 << 10, max_message_bytes=12 << 10)
    to_parent = ShmQueue.create(capacity_bytes=16 << 10, max_message_bytes=12 << 10)
    child = SPAWN.Process(target=_child_echo, args=(to_child, to_parent))
    child.start()
    try:
        rng = __import__("random").Random(1)
        sent = [_message(seq, rng.randrange(0, 12 << 10)) for seq in range(300)]
        received = []
        for msg in sent:  # keep at most a few in flight so neither side blocks forever
            to_child.put(msg, timeout_s=30)
            received.append(to_parent.get(timeout_s=30))
        assert received == sent
        to_child.close()  # the child sees QueueClosed, closes its end and exits
        with pytest.raises(QueueClosed):
            to_parent.get(timeout_s=30)
        child.join(30)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
        to_child.close()
        to_parent.close()


def test_asyncio_side_with_spawn_child() -> None:
    """The gateway side on uvloop (put_async / get_many_async) talks to a spawned engine side."""
    to_child = ShmQueue.create(capacity_bytes=4096, max_message_bytes=1024)
    to_parent = ShmQueue.create(capacity_bytes=4096, max_message_bytes=1024)
    child = SPAWN.Process(target=_child_echo, args=(to_child, to_parent))
    child.start()
    sent = [_message(seq, seq % 1000) for seq in range(500)]

    async def scenario() -> list[bytes]:
        async def produce() -> None:
            for msg in sent:
                await to_child.put_async(msg, timeout_s=30)

        producer = asyncio.create_task(produce())
        got: list[bytes] = []
        while len(got) < len(sent):
            batch = await to_parent.get_many_async(timeout_s=30)
            assert batch, "timed out waiting for the echo"
            got.extend(batch)
        await producer
        return got

    try:
        assert _run_async(scenario()) == sent
    finally:
        to_child.close()
        child.join(30)
        if child.is_alive():
            child.kill()
        to_parent.close()


@pytest.mark.parametrize("use_async", [False, True])
def test_no_lost_wakeups_without_backstop(monkeypatch: pytest.MonkeyPatch, use_async: bool) -> None:
    """With spinning off and the sleep backstop at an hour, 1000 ping-pongs never miss a wake-up."""
    monkeypatch.setattr(shm_ring, "_MAX_SLEEP_S", 3600.0)
    to_child = ShmQueue.create(capacity_bytes=4096, max_message_bytes=64, spin_s=0)
    to_parent = ShmQueue.create(capacity_bytes=4096, max_message_bytes=64, spin_s=0)
    child = SPAWN.Process(target=_child_echo, args=(to_child, to_parent, 3600.0))
    child.start()

    async def ping_pong_async() -> None:
        for seq in range(1000):
            to_child.put_nowait(_message(seq, 16))
            assert await to_parent.get_async(timeout_s=30) == _message(seq, 16)

    try:
        if use_async:
            _run_async(ping_pong_async())
        else:
            for seq in range(1000):
                to_child.put_nowait(_message(seq, 16))
                assert to_parent.get(timeout_s=30) == _message(seq, 16)
    finally:
        to_child.close()
        child.join(30)
        if child.is_alive():
            child.kill()
        to_parent.close()


def test_producer_killed_mid_put_does_not_wedge_consumer() -> None:
    """SIGKILL of a producer streaming 1 MiB messages: we get only whole messages, then PeerDead;
    a new producer attached to the same queue is then heard."""
    size = 1 << 20
    q = ShmQueue.create(capacity_bytes=3 << 20, max_message_bytes=size)
    child = SPAWN.Process(target=_child_flood, args=(q, 0, size))
    child.start()
    try:
        seq = 0
        for _ in range(10):
            assert q.get(timeout_s=30) == _message(seq, size)
            seq += 1
        child.kill()  # most likely while it is copying a message
        with pytest.raises(PeerDead):
            while True:
                msg = q.get(timeout_s=30)
                assert msg == _message(seq, size)  # None (a hang) or garbage would fail here
                seq += 1
        child.join(30)

        q.forget_peer()
        child = SPAWN.Process(target=_child_flood, args=(q, 1000, size))
        child.start()
        assert q.get(timeout_s=30) == _message(1000, size)
        assert q.get(timeout_s=30) == _message(1001, size)
    finally:
        child.kill()
        child.join(30)
        q.close()


def test_child_close_after_puts_delivers_all_then_closed() -> None:
    """Messages committed before the producer's close are all delivered before QueueClosed."""
    q = ShmQueue.create(capacity_bytes=64 << 10, max_message_bytes=1024)
    child = SPAWN.Process(target=_child_put_then_close, args=(q, 200))
    child.start()
    try:
        got = []
        with pytest.raises(QueueClosed):
            while True:
                msg = q.get(timeout_s=30)
                assert msg is not None
                got.append(msg)
        assert got == [_message(seq, 100) for seq in range(200)]
        child.join(30)
    finally:
        if child.is_alive():
            child.kill()
        q.close()


def test_concurrent_stream_never_shows_a_torn_index() -> None:
    """50k small messages streamed by a child while we drain concurrently arrive intact and in
    order (the indices are read and written whole, never byte by byte)."""
    num_messages = 50_000
    q = ShmQueue.create(capacity_bytes=4096, max_message_bytes=64)
    child = SPAWN.Process(target=_child_put_then_close, args=(q, num_messages, 8))
    child.start()
    try:
        seq = 0
        with pytest.raises(QueueClosed):
            while True:
                msg = q.get(timeout_s=30)
                assert msg == _message(seq, 8)
                seq += 1
        assert seq == num_messages
        child.join(30)
    finally:
        if child.is_alive():
            child.kill()
        q.close()


def test_concurrent_reader_sees_only_committed_indices() -> None:
    """While a child streams 200k messages, every write index we observe is one the producer
    committed: it never goes backwards or off the record grid (no half-written index)."""
    num_messages = 200_000
    q = ShmQueue.create(capacity_bytes=_record(8) * num_messages, max_message_bytes=64)
    child = SPAWN.Process(target=_child_put_then_close, args=(q, num_messages, 8))
    child.start()
    try:
        last = 0
        final = _record(8) * num_messages
        deadline = time.monotonic() + 120
        while last < final and time.monotonic() < deadline:
            seen = q.qsize_bytes()  # nothing is consumed, so this is the write index
            assert seen >= last and seen % _record(8) == 0, (seen, last)
            last = seen
        assert last == final
        child.join(30)
    finally:
        if child.is_alive():
            child.kill()
        q.close()


def test_attaching_child_leaves_segment_and_no_tracker_warning(tmp_path: Path) -> None:
    """A spawn child that attaches and exits neither unlinks the segment nor triggers a
    resource_tracker warning; the creator's close unlinks it."""
    script = textwrap.dedent(
        """
        import multiprocessing as mp
        from pathlib import Path
        from engine.shm_ring import ShmQueue

        def child(q):
            assert q.get(timeout_s=30) == b"hi"
            q.close()

        if __name__ == "__main__":
            q = ShmQueue.create(capacity_bytes=1024, max_message_bytes=64)
            q.put_nowait(b"hi")
            p = mp.get_context("spawn").Process(target=child, args=(q,))
            p.start(); p.join(30)
            assert p.exitcode == 0
            assert Path("/dev/shm", q.name).exists()
            q.put_nowait(b"still usable")
            assert q.get_nowait() == b"still usable"
            q.close()
            assert not Path("/dev/shm", q.name).exists()
            print("ok")
        """
    )
    script_path = tmp_path / "attach_child.py"
    script_path.write_text(script)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run([sys.executable, str(script_path)], capture_output=True, text=True, env=env, timeout=120, cwd=REPO_ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    assert "resource_tracker" not in out.stderr and "leaked" not in out.stderr, out.stderr
