"""Starts, watches and restarts one engine process (``EngineSupervisor``) and moves messages to
and from it over the shared-memory queues; docs/architecture.md, "Engine supervision".
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import logging
import multiprocessing
import os
import time
from collections import deque
from collections.abc import Iterator
from typing import Any, Callable

from engine import messages as em
from engine.config import EngineConfig
from engine.process import engine_main
from engine.shm_ring import QueueClosed, QueueFull, ShmQueue
from gateway.config import GatewayConfig
from gateway.metrics import GatewayMetrics, admission_health

__all__ = ["EngineSupervisor", "EngineStartError", "EngineWatchdog"]

log = logging.getLogger("voxgate.gateway")

_BACKLOG_HIGH_WATER = 4096  # messages; readers wait above this
_BYTES_PER_SAMPLE = {"pcm_s16le": 2, "pcm_f32le": 4}


class EngineStartError(RuntimeError):
    """The engine could not start (the model failed to load, or no handshake in time)."""


class EngineWatchdog:
    """Decides when a silent engine is hung: work in hand and nothing from it for ``timeout_s``.

    No I/O and an injectable clock, so that tests drive it with a fake one. ``timeout_s <= 0``
    turns it off.
    """

    def __init__(self, timeout_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        self._t_heard = clock()

    def note_heard(self) -> None:
        """The engine sent something (output, stats or a heartbeat)."""
        self._t_heard = self._clock()

    def silent_s(self) -> float:
        """Seconds since the engine was last heard."""
        return self._clock() - self._t_heard

    def is_hung(self, *, has_work: bool, has_unread: bool) -> bool:
        """``has_work``: streams are open in the engine, or commands wait for it.
        ``has_unread``: its queue holds messages the gateway has not read yet (the gateway is
        behind: they may hold a heartbeat, so that is not the engine's silence)."""
        if self.timeout_s <= 0 or not has_work or has_unread:
            return False
        return self.silent_s() > self.timeout_s


class EngineSupervisor:
    def __init__(
        self,
        engine_config: EngineConfig,
        config: GatewayConfig,
        *,
        log_level: str,
        on_message: Callable[[em.Message], None],
        on_lost: Callable[[list[int]], None],
        metrics: GatewayMetrics,
        clock: Callable[[], float] = time.monotonic,
        index: int = 0,
        gpu: str = "",
        env: dict[str, str] | None = None,
    ) -> None:
        """``on_lost(keys)``: the engine died (or failed for good: ``is_failed``); ``keys`` are
        the streams that were open in it. ``index``: its place in the pool (metrics, logs);
        ``gpu``: the device it was given (``--gpus``; "" for none); ``env``: set for its process."""
        self.engine_config = engine_config
        self.config = config
        self.log_level = log_level
        self.index = index
        self.gpu = gpu
        self.env = dict(env or {})
        self._on_message = on_message
        self._on_lost = on_lost
        self._metrics = metrics
        self.status = "stopped"  # starting | ready | restarting | failed | stopped
        self.hello: em.Hello | None = None
        self.stats: em.Stats | None = None
        self.last_error: str | None = None
        self.num_restarts = 0
        self._deaths: deque[float] = deque()
        self._process: multiprocessing.process.BaseProcess | None = None
        self._inbox: ShmQueue | None = None  # gateway -> engine
        self._outbox: ShmQueue | None = None  # engine -> gateway
        self._reader: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._backlog: deque[bytes] = deque()
        self._flusher: asyncio.Task[None] | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._hello_waiter: asyncio.Future[em.Hello] | None = None
        self._is_stopping = False
        self.watchdog = EngineWatchdog(config.engine_watchdog_s, clock=clock)
        self.heartbeat: em.Heartbeat | None = None
        self._watchdog_task: asyncio.Task[None] | None = None
        self._hang_note: str | None = None  # why the watchdog killed the engine
        self._failed = asyncio.Event()
        # Streams open in the engine (key -> bytes per sample of their audio), and those the
        # gateway cancelled whose Done has not come back: audio for these is dropped here.
        self._open: dict[int, int] = {}
        self._cancelled: dict[int, int] = {}
        self.num_open_at_report = 0  # len(_open) when the last Stats arrived (placement)

    # --- state -----------------------------------------------------------------------------

    def is_ready(self) -> bool:
        return self.status == "ready"

    def has_stream(self, key: int) -> bool:
        """Stream ``key`` is open in this engine (opened, not cancelled, not done)."""
        return key in self._open

    @property
    def num_open(self) -> int:
        """Streams open in this engine now (the gateway's count)."""
        return len(self._open)

    @property
    def is_failed(self) -> bool:
        """The engine died more than ``max_engine_restarts`` times within the window; it is
        not restarted, and the server should exit (``wait_failed``)."""
        return self.status == "failed"

    async def wait_failed(self) -> None:
        """Return once the engine has failed for good (after ``on_lost`` was called for it)."""
        await self._failed.wait()

    def health(self) -> tuple[http.HTTPStatus, dict[str, Any]]:
        hello = self.hello
        body: dict[str, Any] = {
            "status": "ok" if self.is_ready() else self.status,
            "engine": self._engine_body(),
            "model": hello.model if hello else None,
            "weights": hello.weights if hello else None,
            "model_loaded": self.is_ready(),
        }
        if self.stats is not None and self.stats.admission:
            # the load a balancer can use: demand / capacity
            admission = admission_health(self.stats.admission)
            body["load"] = admission["load"]
            body["admission"] = admission
        code = http.HTTPStatus.OK if self.is_ready() else http.HTTPStatus.SERVICE_UNAVAILABLE
        return code, body

    def report(self) -> dict[str, Any]:
        """This engine in ``/health``'s ``engines`` list: ``index``, ``gpu``, ``device``,
        ``open_streams`` (the gateway's live count), the ``engine`` fields and its own
        ``load`` and ``admission``."""
        body = {"index": self.index, "gpu": self.gpu or None,
                "device": self.hello.device if self.hello else None,
                "open_streams": len(self._open), **self._engine_body()}
        if self.stats is not None and self.stats.admission:
            admission = admission_health(self.stats.admission)
            body["load"] = admission["load"]
            body["admission"] = admission
        return body

    def _engine_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"status": self.status, "restarts": self.num_restarts,
                                "pid": self._process.pid if self._process else None,
                                "last_error": self.last_error,
                                "last_heard_s": round(self.watchdog.silent_s(), 3)}
        if self.stats is not None:
            body.update(streams=self.stats.num_streams, queued_jobs=self.stats.num_queued_jobs,
                        running_jobs=self.stats.num_running_jobs)
        return body

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the engine and wait for its handshake. Raises ``EngineStartError``."""
        self.status = "starting"
        try:
            await self._launch()
        except EngineStartError as exc:
            self.status = "failed"
            self.last_error = str(exc)
            raise

    async def stop(self) -> None:
        self._is_stopping = True
        self.status = "stopped"
        proc = self._process
        if proc is not None and proc.is_alive() and self._inbox is not None:
            try:
                self._inbox.put(em.encode(em.Shutdown()), timeout_s=1.0)
            except (QueueFull, QueueClosed):
                pass
            await asyncio.get_running_loop().run_in_executor(None, proc.join, 5.0)
            if proc.is_alive():
                proc.kill()
        self._teardown()

    async def _launch(self) -> None:
        cfg = self.engine_config
        self._inbox = ShmQueue.create(capacity_bytes=cfg.queue_capacity_bytes,
                                      max_message_bytes=cfg.max_message_bytes)
        self._outbox = ShmQueue.create(capacity_bytes=cfg.queue_capacity_bytes,
                                       max_message_bytes=cfg.max_message_bytes)
        ctx = multiprocessing.get_context("spawn")
        proc = ctx.Process(target=engine_main, name=f"voxgate-engine-{self.index}", daemon=True,
                           args=(cfg, self._inbox, self._outbox, self.log_level))
        loop = asyncio.get_running_loop()
        self._hello_waiter = loop.create_future()
        with _environ(self.env):  # the child inherits it at exec; nothing here awaits
            proc.start()
        self._process = proc
        log.info("engine %d: process %d starting (model %s%s)", self.index, proc.pid, cfg.model,
                 f", GPU {self.gpu}" if self.gpu else "")
        self._reader = asyncio.create_task(self._read_loop(self._outbox))
        self._watcher = asyncio.create_task(self._watch(proc))
        try:
            hello = await asyncio.wait_for(asyncio.shield(self._hello_waiter),
                                           self.config.engine_start_timeout_s)
        except asyncio.TimeoutError:
            proc.kill()
            raise EngineStartError(
                f"the engine sent no handshake within {self.config.engine_start_timeout_s:g} s "
                "(--engine-start-timeout-s)") from None
        self.hello = hello
        self.stats = None  # the last engine's figures are not this one's
        self.num_open_at_report = 0
        self.status = "ready"
        self.last_error = None
        self.watchdog.note_heard()
        if self.watchdog.timeout_s > 0:
            self._watchdog_task = asyncio.create_task(self._watch_silence(proc))
        self._metrics.engine_started(self.index, device=hello.device, gpu=self.gpu)
        log.info("engine %d ready: model %s (%s weights) on %s, voices %s, %d Hz", self.index,
                 hello.model, hello.weights, hello.device or "?", hello.voices, hello.sample_rate)

    def _teardown(self) -> None:
        for task in (self._reader, self._watcher, self._flusher, self._watchdog_task):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self._watchdog_task = None
        self._backlog.clear()
        self._open.clear()
        self._cancelled.clear()
        self._writable.set()
        for q in (self._inbox, self._outbox):
            if q is not None:
                q.close()
        self._inbox = self._outbox = None
        self._metrics.engine_stopped(self.index)

    async def _watch(self, proc: multiprocessing.process.BaseProcess) -> None:
        loop = asyncio.get_running_loop()
        exited = loop.create_future()
        loop.add_reader(proc.sentinel, lambda: exited.done() or exited.set_result(None))
        try:
            await exited
        finally:
            loop.remove_reader(proc.sentinel)
        proc.join(0)
        if self._is_stopping:
            return
        code = proc.exitcode
        waiter = self._hello_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(EngineStartError(
                self.last_error or f"the engine exited during start-up (exit code {code})"))
            return
        if self._hang_note is not None:
            self.last_error, self._hang_note = self._hang_note, None
        else:
            log.error("engine %d: the process died (exit code %s); failing its streams",
                      self.index, code)
            self.last_error = f"engine exited with code {code}"
        self._on_engine_death()

    def _on_engine_death(self) -> None:
        was_ready = self.status == "ready"
        lost_keys = list(self._open)
        self._teardown_keep_watcher()
        now = time.monotonic()
        self._deaths.append(now)
        while self._deaths and now - self._deaths[0] > self.config.engine_restart_window_s:
            self._deaths.popleft()
        is_final = len(self._deaths) > self.config.max_engine_restarts
        self.status = "failed" if is_final else "restarting"
        if is_final:
            self.last_error = (f"the engine died {len(self._deaths)} times within "
                               f"{self.config.engine_restart_window_s:g} s "
                               f"(--max-engine-restarts {self.config.max_engine_restarts}); "
                               f"giving up (last: {self.last_error})")
            log.error("engine %d: %s", self.index, self.last_error)
        if was_ready or is_final:
            self._on_lost(lost_keys)  # reads is_failed: failed for good, or restarting
        if is_final:
            self._failed.set()
            return
        asyncio.get_running_loop().create_task(self._restart())

    async def _watch_silence(self, proc: multiprocessing.process.BaseProcess) -> None:
        """Kill the engine when the watchdog takes its silence for a hang (the process
        sentinel then reports the death)."""
        watchdog = self.watchdog
        period_s = min(1.0, watchdog.timeout_s / 4)
        while True:
            await asyncio.sleep(period_s)
            outbox = self._outbox
            if outbox is None or self._process is not proc:
                return
            has_work = bool(self._open) or bool(self._backlog)
            if watchdog.is_hung(has_work=has_work, has_unread=outbox.qsize_bytes() > 0):
                break
        self._hang_note = (f"the engine was hung: nothing from it for {watchdog.silent_s():.1f} s "
                           f"with {len(self._open)} streams open (--engine-watchdog-s "
                           f"{watchdog.timeout_s:g}); killed it")
        log.error(self._hang_note)
        self._metrics.count_engine_hang(self.index)
        proc.kill()

    def _teardown_keep_watcher(self) -> None:
        self._watcher = None
        self._teardown()

    async def _restart(self) -> None:
        await asyncio.sleep(self.config.engine_restart_backoff_s)
        if self._is_stopping:
            return
        self.num_restarts += 1
        self._metrics.count_engine_restart(self.index)
        try:
            await self._launch()
        except EngineStartError as exc:
            log.error("engine %d: restart failed: %s", self.index, exc)
            self.last_error = str(exc)
            self._on_engine_death()

    # --- engine -> gateway -----------------------------------------------------------------

    async def _read_loop(self, outbox: ShmQueue) -> None:
        try:
            while True:
                batch = await outbox.get_many_async()
                self.watchdog.note_heard()
                for data in batch:
                    self._dispatch(data)
        except QueueClosed:
            return  # the watcher handles the death

    def _dispatch(self, data: bytes) -> None:
        try:
            msg = em.decode(data)
        except em.DecodeError as exc:
            log.error("dropped a malformed engine message: %s", exc)
            return
        if type(msg) is em.Batch:
            for item in msg.messages:
                self._route(item)
        else:
            self._route(msg)

    def _route(self, msg: em.Message) -> None:
        if type(msg) is em.Audio:  # the hot path: skip the checks below
            if self._cancelled and msg.key in self._cancelled:
                width = self._cancelled[msg.key]
                self._metrics.samples_dropped.labels(reason="cancelled").inc(len(msg.pcm) // width)
                return
            try:
                self._on_message(msg)
            except Exception:  # one bad route must not stop the reader
                log.exception("routing an engine message failed")
            return
        if isinstance(msg, em.Stats):
            self.stats = msg
            self.num_open_at_report = len(self._open)
            self._metrics.observe_engine_stats(self.index, msg)
            return
        if isinstance(msg, em.Heartbeat):
            self.heartbeat = msg
            return
        if isinstance(msg, (em.Done, em.Error)) and msg.key is not None:
            self._open.pop(msg.key, None)
            self._cancelled.pop(msg.key, None)
        if isinstance(msg, em.Hello):
            if self._hello_waiter is not None and not self._hello_waiter.done():
                self._hello_waiter.set_result(msg)
            return
        if isinstance(msg, em.Error) and msg.key is None:
            self.last_error = f"{msg.code}: {msg.message}"
            if self._hello_waiter is not None and not self._hello_waiter.done():
                # (said once, by whoever awaits the start: serve's error line, a restart's log)
                self._hello_waiter.set_exception(EngineStartError(
                    f"the model failed to load: {msg.message}"))
            else:
                log.error("engine error: %s", self.last_error)
            return
        try:
            self._on_message(msg)
        except Exception:  # one bad route must not stop the reader
            log.exception("routing an engine message failed")

    # --- gateway -> engine -----------------------------------------------------------------

    def send_nowait(self, msg: em.Message) -> None:
        """Queue a message for the engine without waiting (see the module docstring)."""
        inbox = self._inbox
        if inbox is None or self.status != "ready":
            return  # streams were failed by on_lost; nothing to deliver to
        kind = type(msg)
        if kind is em.Open:
            self._open[msg.key] = _BYTES_PER_SAMPLE.get(msg.format, 4)  # type: ignore[attr-defined]
        elif kind is em.Cancel:
            width = self._open.pop(msg.key, None)  # type: ignore[attr-defined]
            if width is not None:
                self._cancelled[msg.key] = width  # type: ignore[attr-defined]
        data = em.encode(msg)
        if not self._backlog:
            try:
                inbox.put_nowait(data)
                return
            except QueueFull:
                pass
            except QueueClosed:
                return
        self._backlog.append(data)
        if len(self._backlog) >= _BACKLOG_HIGH_WATER:
            self._writable.clear()
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_backlog(inbox))

    async def wait_writable(self) -> None:
        if not self._writable.is_set():
            await self._writable.wait()

    async def _flush_backlog(self, inbox: ShmQueue) -> None:
        try:
            while self._backlog:
                await inbox.put_async(self._backlog[0])
                self._backlog.popleft()
                if len(self._backlog) < _BACKLOG_HIGH_WATER // 2:
                    self._writable.set()
        except (QueueClosed, QueueFull):
            self._backlog.clear()
        self._writable.set()


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``env`` set, restored after (around a child's spawn)."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
