"""Single-producer single-consumer byte-message queue in shared memory (one per direction).

Layout, commit rule, wake-up and peer death: docs/architecture.md, "The shared-memory queue".
"""

from __future__ import annotations

import asyncio
import mmap
import os
import select
import struct
import threading
import time
from collections.abc import Callable
from multiprocessing import reduction, shared_memory
from typing import NamedTuple

import _posixshmem

__all__ = ["ShmQueue", "QueueFull", "QueueClosed", "PeerDead"]


class QueueFull(Exception):
    """No room for the message (``put_nowait``, or ``put`` after its timeout)."""


class QueueClosed(Exception):
    """The peer closed its end (after the committed messages were delivered), or this handle is closed."""


class PeerDead(QueueClosed):
    """The peer process exited without closing its end."""


# Header word indices (u64 each); the producer's and consumer's hot words on separate lines.
_WRITE = 0  # producer stores
_READ = 8  # consumer stores
_CONSUMER_WAITING = 16  # consumer stores
_PRODUCER_WAITING = 24  # producer stores
_META_OFFSET = 256  # bytes: magic, version, capacity_bytes, max_message_bytes (written once)
_PRODUCER_PID, _CONSUMER_PID, _PRODUCER_CLOSED, _CONSUMER_CLOSED = 36, 37, 38, 39
_DATA = 320  # byte offset of the ring
_META = struct.Struct("<IIQQ")
_MAGIC, _VERSION = 0x56585152, 2  # "VXQR"
_RECORD_HEADER = 8
_MAX_SLEEP_S = 0.25

# Adaptive spinning: after _NUM_MISSES_TO_SHORTEN waits in a row whose spin ran out (the
# answer comes late, or the peer shares our core and cannot answer while we spin), waits spin
# only _SHORT_SPIN_S, with a full spin every _PROBE_EVERY misses to notice when spinning pays
# again. A spin that catches the answer resets the count.
_SHORT_SPIN_S = 10e-6
_NUM_MISSES_TO_SHORTEN = 4
_PROBE_EVERY = 16


class _Side(NamedTuple):
    """The header words that one waiting side (a getter or a putter) uses."""

    waiting: int
    peer_pid: int
    peer_closed: int
    role: str


_GETTER = _Side(_CONSUMER_WAITING, _PRODUCER_PID, _PRODUCER_CLOSED, "get")
_PUTTER = _Side(_PRODUCER_WAITING, _CONSUMER_PID, _CONSUMER_CLOSED, "put")


def _record_bytes(num_payload_bytes: int) -> int:
    return (num_payload_bytes + _RECORD_HEADER + 7) & ~7


def _attach_segment(name: str, size: int) -> mmap.mmap:
    # Map by name ourselves: on Python < 3.13 SharedMemory(name) registers the segment with
    # the attaching process's resource tracker, which unlinks it (with a warning) when that
    # process exits. Only the creator's SharedMemory is tracked.
    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def _is_readable(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _drain_bell(fd: int) -> None:
    try:
        os.eventfd_read(fd)
    except BlockingIOError:
        pass


class ShmQueue:
    """A bounded SPSC queue of byte messages in shared memory, usable across spawned processes.

    One process puts, one process gets. A handle takes its side on first use; a side may be
    handed to another process only once its previous holder has stopped using it. Messages
    keep their order and each is delivered exactly once. The queue pickles for
    ``multiprocessing`` (spawn): the child re-attaches the memory by name and receives
    duplicates of the doorbell file descriptors.

    Full queue: ``put_nowait`` raises :class:`QueueFull` at once; ``put`` and ``put_async``
    sleep until the consumer frees room, then raise :class:`QueueFull` after ``timeout_s``.
    Empty queue: ``get_nowait`` returns ``None``; ``get``/``get_async`` sleep and return
    ``None`` after ``timeout_s``. Once the peer has closed (or died) and the committed
    messages are drained, the blocking and async calls raise :class:`QueueClosed`
    (:class:`PeerDead`).
    """

    def __init__(
        self, *, name: str, buf: mmap.mmap, data_bell: int, space_bell: int, shm: shared_memory.SharedMemory | None, spin_s: float
    ) -> None:
        magic, version, capacity, max_message = _META.unpack_from(buf, _META_OFFSET)
        if magic != _MAGIC or version != _VERSION:
            raise ValueError(f"shared memory {name!r} is not a version-{_VERSION} ShmQueue")
        self.name = name
        self.capacity_bytes: int = capacity
        self.max_message_bytes: int = max_message
        self.spin_s = spin_s
        self._buf = buf
        self._words = memoryview(buf).cast("Q")  # header words and record lengths
        self._shm = shm  # set only in the creator, which owns unlinking
        self._data_bell = data_bell
        self._space_bell = space_bell
        lock = threading.Lock()
        self._lock_acquire, self._lock_release = lock.acquire, lock.release
        # Each side owns one index and caches the other's last value (refreshed on first use).
        self._write_idx: int = self._words[_WRITE]
        self._read_idx: int = self._words[_READ]
        self._is_producer = False
        self._is_consumer = False
        self._is_closed = False
        self._peer_pid, self._peer_pidfd_cached = 0, -1  # pidfd of the last peer we watched
        self._async_waiters: set[str] = set()
        self._num_spin_misses = 0  # consecutive waits whose spin ran out (see _SHORT_SPIN_S)

    @classmethod
    def create(cls, *, capacity_bytes: int = 16 << 20, max_message_bytes: int = 4 << 20, spin_s: float = 100e-6) -> ShmQueue:
        """Create a new queue; this handle owns the shared memory and unlinks it on ``close()``.

        ``capacity_bytes`` (a multiple of 8) bounds the bytes in flight, record headers
        included; every message up to ``max_message_bytes`` must fit in an empty ring.
        ``spin_s``: how long a blocking ``get``/``put`` busy-polls the ring before it sleeps
        (shortened after spins that failed, see ``_SHORT_SPIN_S``); 0 sleeps at once. The
        asyncio calls never poll.
        """
        if capacity_bytes <= 0 or capacity_bytes % 8:
            raise ValueError(f"capacity_bytes must be a positive multiple of 8, got {capacity_bytes}")
        if max_message_bytes <= 0 or _record_bytes(max_message_bytes) > capacity_bytes:
            raise ValueError(
                f"max_message_bytes={max_message_bytes} must be positive and fit in "
                f"capacity_bytes={capacity_bytes} with its {_RECORD_HEADER}-byte header"
            )
        if spin_s < 0:
            raise ValueError(f"spin_s must be >= 0, got {spin_s}")
        shm = shared_memory.SharedMemory(create=True, size=_DATA + capacity_bytes)
        try:
            buf = _attach_segment(shm.name, _DATA + capacity_bytes)
            shm.close()  # keep the object only to unlink; we use our own mapping
            _META.pack_into(buf, _META_OFFSET, _MAGIC, _VERSION, capacity_bytes, max_message_bytes)
            flags = os.EFD_NONBLOCK | os.EFD_CLOEXEC
            data_bell, space_bell = os.eventfd(0, flags), os.eventfd(0, flags)
        except BaseException:
            shm.unlink()
            raise
        return cls(name=shm.name, buf=buf, data_bell=data_bell, space_bell=space_bell, shm=shm, spin_s=spin_s)

    def __reduce__(self) -> tuple[object, ...]:
        if self._is_closed:
            raise QueueClosed("cannot pickle a closed ShmQueue")
        bells = (reduction.DupFd(self._data_bell), reduction.DupFd(self._space_bell))
        return (_rebuild, (self.name, self.capacity_bytes, *bells, self.spin_s))

    # -- producer -------------------------------------------------------------------------

    def put_nowait(self, data: bytes | bytearray | memoryview) -> None:
        """Append one message, or raise :class:`QueueFull` at once if there is no room."""
        num_bytes = len(data)
        if num_bytes > self.max_message_bytes:
            raise ValueError(f"message of {num_bytes} bytes exceeds max_message_bytes={self.max_message_bytes}")
        if not self._is_producer:
            self._become_producer()
        size = (num_bytes + 15) & ~7
        cap = self.capacity_bytes
        w = self._write_idx
        words, buf = self._words, self._buf
        try:
            if cap - (w - self._read_idx) < size:
                self._read_idx = words[_READ]
                if cap - (w - self._read_idx) < size:
                    if words[_CONSUMER_CLOSED]:
                        raise QueueClosed("the consumer closed the queue")
                    raise QueueFull(f"no room for {num_bytes} bytes")
            pos = w % cap
            words[(_DATA + pos) >> 3] = num_bytes
            start = _DATA + pos + _RECORD_HEADER
            first = _DATA + cap - start  # room before the ring's end
            if num_bytes <= first:
                buf[start : start + num_bytes] = data
            else:  # the record wraps: copy in two pieces
                view = memoryview(data)
                buf[start : _DATA + cap] = view[:first]
                buf[_DATA : _DATA + num_bytes - first] = view[first:]
            w += size
            words[_WRITE] = w  # commit: the record becomes visible here
            self._write_idx = w
            self._lock_acquire()  # full fence: the store above before the flag load below
            self._lock_release()
            if words[_CONSUMER_WAITING]:
                os.eventfd_write(self._data_bell, 1)
        except ValueError:
            self._raise_if_closed()
            raise

    def put(self, data: bytes | bytearray | memoryview, timeout_s: float | None = None) -> None:
        """Append one message, sleeping while the queue is full; :class:`QueueFull` after ``timeout_s``."""
        try:
            return self.put_nowait(data)
        except QueueFull:
            if timeout_s is not None and timeout_s <= 0:
                raise
        if not self._wait(self._room_check(len(data)), _PUTTER, self._space_bell, timeout_s):
            raise QueueFull(f"no room for {len(data)} bytes within {timeout_s} s")
        self.put_nowait(data)

    async def put_async(self, data: bytes | bytearray | memoryview, timeout_s: float | None = None) -> None:
        """Like :meth:`put`, but waits for room on the running event loop; never blocks it."""
        try:
            return self.put_nowait(data)
        except QueueFull:
            if timeout_s is not None and timeout_s <= 0:
                raise
        if not await self._wait_async(self._room_check(len(data)), _PUTTER, self._space_bell, timeout_s):
            raise QueueFull(f"no room for {len(data)} bytes within {timeout_s} s")
        self.put_nowait(data)

    def _room_check(self, num_bytes: int) -> Callable[[], bool]:
        size = _record_bytes(num_bytes)
        words = self._words

        def has_room() -> bool:
            return self.capacity_bytes - (self._write_idx - words[_READ]) >= size

        return has_room

    # -- consumer -------------------------------------------------------------------------

    def get_nowait(self) -> bytes | None:
        """Take the oldest committed message, or return ``None`` if there is none."""
        if not self._is_consumer:
            self._become_consumer()
        words = self._words
        r = self._read_idx
        try:
            w = words[_WRITE]
            if w == r:
                return None
            msg, r = self._read_record(r, w)
            words[_READ] = r  # frees the space for the producer
            self._read_idx = r
            self._lock_acquire()  # full fence: the store above before the flag load below
            self._lock_release()
            if words[_PRODUCER_WAITING]:
                os.eventfd_write(self._space_bell, 1)
        except ValueError:
            self._raise_if_closed()
            raise
        return msg

    def get_many_nowait(self, max_messages: int = 1 << 30) -> list[bytes]:
        """Take up to ``max_messages`` committed messages at once (empty list if none)."""
        if not self._is_consumer:
            self._become_consumer()
        words = self._words
        r = self._read_idx
        out: list[bytes] = []
        try:
            w = words[_WRITE]
            while r != w and len(out) < max_messages:
                msg, r = self._read_record(r, w)
                out.append(msg)
            if out:
                words[_READ] = r  # one store and one fence for the whole batch
                self._read_idx = r
                self._lock_acquire()
                self._lock_release()
                if words[_PRODUCER_WAITING]:
                    os.eventfd_write(self._space_bell, 1)
        except ValueError:
            self._raise_if_closed()
            raise
        return out

    def _read_record(self, r: int, w: int) -> tuple[bytes, int]:
        """Copy out the record at read index ``r`` (below the loaded write index ``w``)."""
        cap = self.capacity_bytes
        pos = r % cap
        num_bytes = self._words[(_DATA + pos) >> 3]
        if num_bytes > self.max_message_bytes or _record_bytes(num_bytes) > w - r:
            raise RuntimeError(f"corrupt record of {num_bytes} bytes at index {r} in {self.name!r}")
        start = _DATA + pos + _RECORD_HEADER
        end = start + num_bytes
        if end <= _DATA + cap:
            return self._buf[start:end], r + ((num_bytes + 15) & ~7)
        wrapped = self._buf[start : _DATA + cap] + self._buf[_DATA : end - cap]
        return wrapped, r + ((num_bytes + 15) & ~7)

    def get(self, timeout_s: float | None = None, *, spin_s: float | None = None) -> bytes | None:
        """Take the oldest message, sleeping until one is committed; ``None`` after ``timeout_s``.

        ``spin_s`` overrides the queue's ``spin_s`` for this call (0: sleep at once, for a
        caller that sleeps on purpose, e.g. until a paced output is due).
        """
        msg = self.get_nowait()
        if msg is not None or (timeout_s is not None and timeout_s <= 0):
            return msg
        if not self._wait(self._has_data, _GETTER, self._data_bell, timeout_s, spin_s):
            return None
        return self.get_nowait()

    async def get_async(self, timeout_s: float | None = None) -> bytes | None:
        """Like :meth:`get`, but sleeps on the running event loop (``add_reader``); never blocks it."""
        msg = self.get_nowait()
        if msg is not None or (timeout_s is not None and timeout_s <= 0):
            return msg
        if not await self._wait_async(self._has_data, _GETTER, self._data_bell, timeout_s):
            return None
        return self.get_nowait()

    async def get_many_async(self, max_messages: int = 1 << 30, timeout_s: float | None = None) -> list[bytes]:
        """Wait for at least one message, then take up to ``max_messages``; ``[]`` after ``timeout_s``."""
        batch = self.get_many_nowait(max_messages)
        if batch or (timeout_s is not None and timeout_s <= 0):
            return batch
        if not await self._wait_async(self._has_data, _GETTER, self._data_bell, timeout_s):
            return []
        return self.get_many_nowait(max_messages)

    def _has_data(self) -> bool:
        return self._words[_WRITE] != self._read_idx

    # -- sleeping -------------------------------------------------------------------------

    def _wait(self, is_ready: Callable[[], bool], side: _Side, bell: int, timeout_s: float | None,
              spin_s: float | None = None) -> bool:
        """Block until ``is_ready()`` (True) or the timeout (False); raise if the peer is gone."""
        now = time.monotonic()
        deadline = None if timeout_s is None else now + timeout_s
        if spin_s is None or spin_s > 0:
            spin_s = self.spin_s if spin_s is None else spin_s
            misses = self._num_spin_misses
            is_short = misses >= _NUM_MISSES_TO_SHORTEN and misses % _PROBE_EVERY
            spin_end = now + (min(spin_s, _SHORT_SPIN_S) if is_short else spin_s)
            while time.monotonic() < spin_end:
                if is_ready():
                    self._num_spin_misses = 0
                    return True
            self._num_spin_misses = misses + 1
        words = self._words
        while True:
            words[side.waiting] = 1
            self._lock_acquire()  # full fence: the flag store before the re-check's loads
            self._lock_release()
            try:
                if is_ready():
                    return True
                pidfd = self._peer_pidfd(side)  # per sleep: the peer may register meanwhile
                self._raise_if_peer_gone(side, pidfd)
                remaining = _MAX_SLEEP_S if deadline is None else min(_MAX_SLEEP_S, deadline - time.monotonic())
                if remaining <= 0:
                    return False
                poller = select.poll()
                poller.register(bell, select.POLLIN)
                if pidfd is not None:
                    poller.register(pidfd, select.POLLIN)
                poller.poll(remaining * 1000)
            finally:
                words[side.waiting] = 0
            _drain_bell(bell)

    async def _wait_async(self, is_ready: Callable[[], bool], side: _Side, bell: int, timeout_s: float | None) -> bool:
        """Like :meth:`_wait`, but sleeps on the running loop's selector and never spins."""
        if side.role in self._async_waiters:
            raise RuntimeError(f"another task is already waiting to {side.role} on this ShmQueue")
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        words = self._words
        self._async_waiters.add(side.role)
        try:
            while True:
                words[side.waiting] = 1
                self._lock_acquire()  # full fence, as in _wait
                self._lock_release()
                try:
                    if is_ready():
                        return True
                    pidfd = self._peer_pidfd(side)
                    self._raise_if_peer_gone(side, pidfd)
                    fds = [bell] if pidfd is None else [bell, pidfd]
                    remaining = _MAX_SLEEP_S if deadline is None else min(_MAX_SLEEP_S, deadline - loop.time())
                    if remaining <= 0:
                        return False
                    woken = loop.create_future()

                    def wake(woken: asyncio.Future[None] = woken) -> None:
                        if not woken.done():
                            woken.set_result(None)

                    for fd in fds:
                        loop.add_reader(fd, wake)
                    timer = loop.call_later(remaining, wake)
                    try:
                        await woken
                    finally:
                        timer.cancel()
                        for fd in fds:
                            loop.remove_reader(fd)
                finally:
                    words[side.waiting] = 0
                _drain_bell(bell)
        finally:
            self._async_waiters.discard(side.role)

    def _become_producer(self) -> None:
        """Take the producer side: record our pid, re-open the end, start from the shared index."""
        self._raise_if_closed()
        words = self._words
        words[_PRODUCER_PID] = os.getpid()
        words[_PRODUCER_CLOSED] = 0  # a replacement producer (restarted engine) re-opens the end
        self._write_idx = words[_WRITE]  # the previous holder may have been another process
        self._is_producer = True

    def _become_consumer(self) -> None:
        """Take the consumer side: record our pid, re-open the end, start from the shared index."""
        self._raise_if_closed()
        words = self._words
        words[_CONSUMER_PID] = os.getpid()
        words[_CONSUMER_CLOSED] = 0
        self._read_idx = words[_READ]
        self._is_consumer = True

    def _peer_pidfd(self, side: _Side) -> int | None:
        """A pidfd of the peer recorded in the header (-1: already gone; None: unknown)."""
        pid = self._words[side.peer_pid]
        if pid == 0 or pid == os.getpid():
            return None
        if pid != self._peer_pid:
            self._close_pidfd()
            try:
                self._peer_pidfd_cached = os.pidfd_open(pid)
            except ProcessLookupError:  # already reaped: dead
                self._peer_pidfd_cached = -1
            except OSError:  # pidfd unsupported: rely on the close flag and timeouts
                return None
            self._peer_pid = pid
        return self._peer_pidfd_cached

    def _close_pidfd(self) -> None:
        if self._peer_pidfd_cached >= 0:
            os.close(self._peer_pidfd_cached)
        self._peer_pid, self._peer_pidfd_cached = 0, -1

    def _raise_if_peer_gone(self, side: _Side, pidfd: int | None) -> None:
        if self._words[side.peer_closed]:
            raise QueueClosed("the peer closed the queue")
        if pidfd is not None and (pidfd < 0 or _is_readable(pidfd)):
            raise PeerDead("the peer process exited")

    def _raise_if_closed(self) -> None:
        if self._is_closed:
            raise QueueClosed("this ShmQueue handle is closed")

    # -- lifecycle ------------------------------------------------------------------------

    def qsize_bytes(self) -> int:
        """Bytes committed and not yet consumed, record headers included (a snapshot)."""
        return self._words[_WRITE] - self._words[_READ]

    def forget_peer(self) -> None:
        """Forget a peer that died or closed, so that waits sleep again instead of raising.

        Call after :class:`PeerDead` / :class:`QueueClosed` and before starting a replacement
        peer on the same queue; the replacement registers itself on its first put/get.
        """
        if not self._is_producer:
            self._words[_PRODUCER_PID] = self._words[_PRODUCER_CLOSED] = 0
        if not self._is_consumer:
            self._words[_CONSUMER_PID] = self._words[_CONSUMER_CLOSED] = 0
        self._close_pidfd()

    def close(self) -> None:
        """Detach this handle; tell the peer we are gone; the creator also unlinks. Idempotent."""
        if self._is_closed:
            return
        self._is_closed = True
        if self._is_producer:
            self._words[_PRODUCER_CLOSED] = 1
        if self._is_consumer:
            self._words[_CONSUMER_CLOSED] = 1
        # Wake a sleeping peer so that it sees the flag now, not at its backstop.
        if self._is_producer:
            os.eventfd_write(self._data_bell, 1)
        if self._is_consumer:
            os.eventfd_write(self._space_bell, 1)
        self._release()
        if self._shm is not None:
            self._shm.unlink()

    def __enter__(self) -> ShmQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Only free the mapping and fds; never unlink or flag "closed" from a finaliser.
        if not getattr(self, "_is_closed", True):
            self._is_closed = True
            self._release()

    def _release(self) -> None:
        os.close(self._data_bell)
        os.close(self._space_bell)
        self._close_pidfd()
        self._words.release()
        self._buf.close()


def _rebuild(name: str, capacity_bytes: int, data_bell: object, space_bell: object, spin_s: float) -> ShmQueue:
    data_fd, space_fd = data_bell.detach(), space_bell.detach()  # type: ignore[attr-defined]
    for fd in (data_fd, space_fd):
        os.set_inheritable(fd, False)
    buf = _attach_segment(name, _DATA + capacity_bytes)
    return ShmQueue(name=name, buf=buf, data_bell=data_fd, space_bell=space_fd, shm=None, spin_s=spin_s)
