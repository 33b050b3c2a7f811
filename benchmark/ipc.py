"""Round-trip latency between two processes: the engine's ShmQueue against multiprocessing.Queue
and ZeroMQ, for a 32 B and an 8 KiB message (docs/performance.md).

    python -m benchmark.ipc [--iterations N] [--warmup N] [--no-pin]"""

from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.shm_ring import ShmQueue

__all__ = ["Result", "main", "run_all"]

SIZES_BYTES = (32, 8192)


@dataclass(frozen=True)
class Result:
    transport: str
    size_bytes: int
    samples_ns: list[int]

    def percentile_us(self, q: float) -> float:
        ordered = sorted(self.samples_ns)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000

    @property
    def mean_us(self) -> float:
        return statistics.fmean(self.samples_ns) / 1000


def _pin(cpu: int | None) -> None:
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu % (os.cpu_count() or 1)})


# -- children (module level so that spawn can import them) ----------------------------------


def _echo_shm(q_in: ShmQueue, q_out: ShmQueue, total: int, cpu: int | None) -> None:
    _pin(cpu)
    get, put = q_in.get, q_out.put
    for _ in range(total):
        msg = get(_TIMEOUT_S)
        if msg is None:
            raise TimeoutError("the parent went quiet")
        put(msg)
    q_in.close()
    q_out.close()


def _echo_mp(q_in: mp.Queue, q_out: mp.Queue, total: int, cpu: int | None) -> None:
    _pin(cpu)
    get, put = q_in.get, q_out.put
    for _ in range(total):
        put(get(True, _TIMEOUT_S))


def _echo_zmq(address: str, total: int, cpu: int | None) -> None:
    import zmq

    _pin(cpu)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.setsockopt(zmq.RCVTIMEO, int(_TIMEOUT_S * 1000))
    sock.connect(address)
    recv, send = sock.recv, sock.send
    for _ in range(total):
        send(recv())
    sock.close(linger=1000)
    ctx.term()


# -- parents ---------------------------------------------------------------------------------


_TIMEOUT_S = 60.0  # every receive has one, so that a dead child fails the run instead of hanging it


def _time_loop(send: Callable[[bytes], object], recv: Callable[[], object], payload: bytes, iterations: int, warmup: int) -> list[int]:
    """Time ``iterations`` round trips after ``warmup`` untimed ones; ``recv`` returns None on timeout."""
    clock = time.perf_counter_ns
    samples = [0] * iterations
    for i in range(-warmup, iterations):
        t0 = clock()
        send(payload)
        if recv() is None:
            raise TimeoutError(f"no echo within {_TIMEOUT_S} s: is the child alive?")
        if i >= 0:
            samples[i] = clock() - t0
    return samples


def bench_shm(size_bytes: int, iterations: int, warmup: int, pin: bool, *, use_async: bool = False, spin_s: float = 100e-6) -> Result:
    ctx = mp.get_context("spawn")
    to_child = ShmQueue.create(capacity_bytes=1 << 20, max_message_bytes=64 << 10, spin_s=spin_s)
    to_parent = ShmQueue.create(capacity_bytes=1 << 20, max_message_bytes=64 << 10, spin_s=spin_s)
    child = ctx.Process(target=_echo_shm, args=(to_child, to_parent, iterations + warmup, 1 if pin else None))
    child.start()
    payload = os.urandom(size_bytes)
    try:
        if use_async:
            import uvloop

            async def run() -> list[int]:
                clock = time.perf_counter_ns
                put, get = to_child.put_nowait, to_parent.get_async
                samples = [0] * iterations
                for i in range(-warmup, iterations):
                    t0 = clock()
                    put(payload)
                    if await get(_TIMEOUT_S) is None:
                        raise TimeoutError(f"no echo within {_TIMEOUT_S} s: is the child alive?")
                    if i >= 0:
                        samples[i] = clock() - t0
                return samples

            loop = uvloop.new_event_loop()
            try:
                samples = loop.run_until_complete(run())
            finally:
                loop.close()
        else:
            samples = _time_loop(to_child.put, functools.partial(to_parent.get, _TIMEOUT_S), payload, iterations, warmup)
        child.join(30)
    finally:
        if child.is_alive():
            child.kill()
        to_child.close()
        to_parent.close()
    # shm: the blocking API on both ends, as the engine uses it (spins briefly, then sleeps);
    # shm-async: the parent awaits get_async() on uvloop, as the gateway does (never spins:
    # every reply wakes it through the eventfd).
    return Result("shm-async" if use_async else "shm", size_bytes, samples)


def bench_mp_queue(size_bytes: int, iterations: int, warmup: int, pin: bool) -> Result:
    ctx = mp.get_context("spawn")
    to_child, to_parent = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_echo_mp, args=(to_child, to_parent, iterations + warmup, 1 if pin else None))
    child.start()
    try:
        samples = _time_loop(to_child.put, functools.partial(to_parent.get, True, _TIMEOUT_S), os.urandom(size_bytes), iterations, warmup)
        child.join(30)
    finally:
        if child.is_alive():
            child.kill()
    return Result("mp.Queue", size_bytes, samples)


def bench_zmq(size_bytes: int, iterations: int, warmup: int, pin: bool) -> Result:
    import zmq

    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        address = f"ipc://{tmp}/pair"
        zctx = zmq.Context()
        sock = zctx.socket(zmq.PAIR)
        sock.setsockopt(zmq.RCVTIMEO, int(_TIMEOUT_S * 1000))  # recv raises zmq.Again after it
        sock.bind(address)
        child = ctx.Process(target=_echo_zmq, args=(address, iterations + warmup, 1 if pin else None))
        child.start()
        try:
            samples = _time_loop(sock.send, sock.recv, os.urandom(size_bytes), iterations, warmup)
            child.join(30)
        finally:
            if child.is_alive():
                child.kill()
            sock.close(linger=0)
            zctx.term()
    return Result("zmq", size_bytes, samples)


def run_all(iterations: int, warmup: int, pin: bool) -> list[Result]:
    """Every transport at every size, in one run, side by side."""
    if pin:
        _pin(0)
    results = []
    for size in SIZES_BYTES:
        results.append(bench_shm(size, iterations, warmup, pin))
        results.append(bench_shm(size, iterations, warmup, pin, use_async=True))
        results.append(bench_mp_queue(size, iterations, warmup, pin))
        results.append(bench_zmq(size, iterations, warmup, pin))
    return results


def machine_description() -> str:
    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()} {platform.release()}"


def format_table(results: list[Result]) -> str:
    base = {r.size_bytes: r.percentile_us(0.5) for r in results if r.transport == "shm"}
    lines = [
        "| transport | message | p50 µs | p99 µs | mean µs | p50 / shm p50 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        p50 = r.percentile_us(0.5)
        lines.append(
            f"| {r.transport} | {r.size_bytes} B | {p50:.1f} | {r.percentile_us(0.99):.1f} | {r.mean_us:.1f} | {p50 / base[r.size_bytes]:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=20000, help="timed round trips per row")
    parser.add_argument("--warmup", type=int, default=2000, help="untimed round trips first")
    parser.add_argument("--no-pin", action="store_true", help="do not pin parent and child to different CPUs")
    args = parser.parse_args(argv)
    if args.iterations <= 0 or args.warmup < 0:
        raise ValueError("--iterations must be > 0 and --warmup >= 0")
    print(f"machine: {machine_description()}")
    print(f"round trips: {args.iterations} timed after {args.warmup} warm-up, pinned: {not args.no_pin}")
    load_before = os.getloadavg()[0]
    table = format_table(run_all(args.iterations, args.warmup, not args.no_pin))
    print(f"load average (1 min): {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(table)


if __name__ == "__main__":
    main()
