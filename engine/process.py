"""The engine process: a thin wrapper that connects ``EngineCore`` to the shared-memory queues,
with its loop and heartbeat thread (docs/architecture.md, "Engine" and "Engine supervision").
"""

from __future__ import annotations

import faulthandler
import logging
import os
import threading
import time
import traceback

from engine import messages as m
from engine.step_time import StepSampler
from engine.backend import Backend, ModelUnavailable
from engine.config import EngineConfig
from engine.device_info import describe_device
from engine.core import EngineCore
from engine.gc_heap import GcProbe, freeze_startup_heap
from engine.shm_ring import QueueClosed, QueueFull, ShmQueue
from engine.torch_profile import StepProfiler

__all__ = ["engine_main", "EngineLoop", "HEARTBEAT_INTERVAL_S"]

log = logging.getLogger("voxgate.engine")

_PARENT_CHECK_S = 1.0
HEARTBEAT_INTERVAL_S = 1.0
_SLOW_STEP_S = 2.0
_HUNG_STEP_S = 30.0
_SEND_TIMEOUT_S = 30.0
# Start-up errors whose message is the whole story: a setting refused, a file missing, a model
# not to be had offline.
_SAID_ERRORS = (ValueError, FileNotFoundError, ModelUnavailable)
# A paced backend (``next_due_s``) whose next output is not yet due lets the loop sleep at
# least this long, so that outputs due close together leave in one step and one Batch (at
# 25,000 chunks/s spread over time, one step per chunk would cost a wake-up and a record each).
# Outputs leave up to this much later than due; the emit stamp is taken when they leave.
_MIN_PACED_SLEEP_S = 1e-3
# Audio bytes per Batch record, well under max_message_bytes (msgpack framing adds ~30 bytes
# per message).
_BATCH_PAYLOAD_FRACTION = 0.5


class EngineLoop:
    """Drives an ``EngineCore`` from an inbox queue and writes to an outbox queue."""

    def __init__(
        self, core: EngineCore, inbox: ShmQueue, outbox: ShmQueue, *, stats_interval_s: float,
        gc_probe: GcProbe | None = None, heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S,
    ) -> None:
        self.core = core
        self.gc_probe = gc_probe  # its counters join the Stats' totals
        self.inbox = inbox
        self.outbox = outbox
        self.stats_interval_s = stats_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self._put_lock = threading.Lock()  # the outbox has one producer at a time
        self._stopped = threading.Event()  # ends the heartbeat thread
        self._parent = os.getppid()
        self._next_stats = 0.0
        self._is_running = True
        self._step_since: float | None = None  # when the step in progress began (the watchdog's)
        self._num_steps = 0
        self._busy_s = 0.0  # time spent in core.step
        # VOXGATE_TORCH_PROFILE_DIR: a torch.profiler window over loaded steps (engine.torch_profile)
        self.profiler = StepProfiler.from_env()
        # Step samples for admission (engine.admission): rows launched per call, paired with
        # the time between back-to-back calls (with async steps, the call after's).
        self._step_counts = getattr(core.backend, "step_counts", None)
        self._sampler = StepSampler(lag=1 if getattr(core.backend, "async_steps", False) else 0)

    def run(self) -> None:
        threading.Thread(target=self._heartbeat, name="engine-heartbeat", daemon=True).start()
        try:
            self._run()
        except QueueClosed:
            log.warning("the gateway closed the queue; the engine exits")
        finally:
            self._stopped.set()

    def _run(self) -> None:
        while self._is_running:
            wait_s = self._wait_s()
            # A paced sleep is on purpose: no busy-polling before it (see ShmQueue.get).
            is_paced = wait_s > 0.0 and self.core.has_work()
            if wait_s > 0.0:
                self._sampler.reset()  # the next call's time is not a step's
            data = self.inbox.get(timeout_s=wait_s, spin_s=0.0 if is_paced else None)
            while data is not None and self._is_running:
                self._handle(data)
                data = self.inbox.get_nowait()
            if self.core.has_work():
                self._step()
            else:
                self._sampler.reset()
            self._send(self.core.poll())  # admission: waiting streams in, or refused
            now = time.monotonic()
            if now >= self._next_stats:
                self._next_stats = now + self.stats_interval_s
                self._send_stats()
                if os.getppid() != self._parent:
                    log.warning("the gateway has gone; the engine exits")
                    return

    def _heartbeat(self) -> None:
        """Send ``Heartbeat`` every interval until the loop ends; dump every thread's stack once
        per step that runs past ``_HUNG_STEP_S``."""
        dumped_for = None
        interval = self.heartbeat_interval_s
        while not self._stopped.wait(interval):
            since = self._step_since
            step_s = 0.0 if since is None else max(time.monotonic() - since, 0.0)
            if not self._put_lock.acquire(timeout=interval):
                continue  # the loop is blocked in a put: the outbox is full, the gateway has data
            try:
                self.outbox.put_nowait(m.encode(m.Heartbeat(step_s, self._num_steps)))
            except QueueFull:
                pass  # as above
            except (QueueClosed, ValueError):  # the gateway has gone, or the queue is closed
                return
            finally:
                self._put_lock.release()
            if since is not None and since != dumped_for and step_s > _HUNG_STEP_S:
                dumped_for = since
                log.warning("an engine step has run for %.0f s; the threads' stacks follow", step_s)
                faulthandler.dump_traceback(all_threads=True)

    def _put(self, data: bytes) -> None:
        with self._put_lock:
            self.outbox.put(data, timeout_s=_SEND_TIMEOUT_S)

    def _wait_s(self) -> float:
        if not self.core.has_work():
            until = self.core.next_poll_s()  # a stream waiting for admission times out then
            return _PARENT_CHECK_S if until is None else min(until, _PARENT_CHECK_S)
        next_due = getattr(self.core.backend, "next_due_s", None)
        if next_due is None:
            return 0.0
        due_s = next_due()
        if due_s <= 0.0:
            return 0.0
        return min(max(due_s, _MIN_PACED_SLEEP_S), _PARENT_CHECK_S)

    def _handle(self, data: bytes) -> None:
        try:
            msg = m.decode(data)
        except m.DecodeError as exc:
            log.error("dropped a malformed command: %s", exc)
            return
        core = self.core
        try:
            if isinstance(msg, m.Open):
                out = core.open(msg.key, msg.voice, msg.options, msg.format, msg.voice_ref)
            elif isinstance(msg, m.Text):
                out = core.add_text(msg.key, msg.text)
            elif isinstance(msg, m.Flush):
                out = core.flush(msg.key)
            elif isinstance(msg, m.End):
                out = core.end(msg.key)
            elif isinstance(msg, m.Cancel):
                out = core.cancel(msg.key)
            elif isinstance(msg, m.Shutdown):
                self._is_running = False
                return
            else:
                log.error("unexpected message %s from the gateway", type(msg).__name__)
                return
        except Exception as exc:  # a bad request fails that request only
            log.exception("command %s failed", type(msg).__name__)
            key = getattr(msg, "key", None)
            out = [m.Error(key, "internal", f"engine error: {exc}", True)]
            if key is not None:
                core.cancel(key)
        self._send(out)

    def _step(self) -> None:
        prof = self.profiler
        rows0 = self._decode_rows() if prof is not None and not prof.done else 0
        counts = self._step_counts() if self._step_counts is not None else None
        t0 = self._step_since = time.monotonic()
        try:
            out = self.core.step()
        except Exception as exc:  # a backend bug: fail the streams in flight, keep serving
            log.error("engine step failed:\n%s", traceback.format_exc())
            out = []
            for key in list(self.core.stream_keys()):
                self.core.cancel(key)
                out.append(m.Error(key, "model_error", f"engine step failed: {exc}", True))
        finally:
            self._step_since = None
        took = time.monotonic() - t0
        self._num_steps += 1
        self._busy_s += took
        if took > _SLOW_STEP_S:
            log.warning("an engine step took %.1f s (%d streams waited on it)", took, self.core.num_streams)
        if prof is not None and not prof.done:
            prof.after_step(self._decode_rows() - rows0)
        if counts is not None:
            after = self._step_counts()  # type: ignore[misc]
            sample = self._sampler.on_step(t0, after[0] - counts[0], after[1] - counts[1])
            if sample is not None:
                backend = self.core.backend
                self.core.note_step(*sample, max_rows=backend.max_decode_rows,  # type: ignore[attr-defined]
                                    fill_rows=getattr(backend, "decode_fill_rows", 0))
        self._send(out)

    def _decode_rows(self) -> int:
        totals = getattr(self.core.backend, "totals", None)
        return int(totals().get("decode_rows", 0)) if totals is not None else 0

    def _send(self, out: list[m.Message]) -> None:
        if len(out) == 1:
            self._put(m.encode(out[0]))
            return
        limit = int(self.outbox.max_message_bytes * _BATCH_PAYLOAD_FRACTION)
        start, num_bytes = 0, 0
        for i, msg in enumerate(out):
            size = len(msg.pcm) if type(msg) is m.Audio else 0  # type: ignore[attr-defined]
            if num_bytes + size > limit and i > start:
                self._put_batch(out[start:i])
                start, num_bytes = i, 0
            num_bytes += size + 64
        if start < len(out):
            self._put_batch(out[start:])

    def _put_batch(self, msgs: list[m.Message]) -> None:
        self._put(m.encode(msgs[0] if len(msgs) == 1 else m.Batch(msgs)))

    def _send_stats(self) -> None:
        backend = self.core.backend
        running = 1 if backend.has_work() else 0
        num_running = getattr(backend, "num_running", None)
        if num_running is not None:
            running = num_running()
        totals: dict[str, float] = {"steps": self._num_steps, "busy_s": self._busy_s}
        totals.update(self.core.sample_totals())
        backend_totals = getattr(backend, "totals", None)
        if backend_totals is not None:
            totals.update(backend_totals())
        if self.gc_probe is not None:
            totals.update(self.gc_probe.totals())
        stats = m.Stats(self.core.num_streams, backend.num_queued(), running, totals,
                        self.core.admission.snapshot())
        self._put(m.encode(stats))


def _hello(backend: Backend) -> m.Hello:
    info = backend.info
    return m.Hello(info.model, list(info.voices), info.default_voice, info.sample_rate,
                   dict(info.options), describe_device(), getattr(info, "weights", "loaded"),
                   info.supports_cloning, bool(getattr(info, "input_streaming", False)))


def engine_main(config: EngineConfig, inbox: ShmQueue, outbox: ShmQueue, log_level: str) -> None:
    """Entry point of the engine process (the target of the spawned ``Process``)."""
    # Several engines (voxgate serve --gpus/--engines): the gateway names each in its environment.
    name = "engine " + os.environ["VOXGATE_ENGINE_INDEX"] if "VOXGATE_ENGINE_INDEX" in os.environ else "engine"
    logging.basicConfig(level=log_level, format=f"%(asctime)s {name} %(levelname)s %(message)s")
    from engine.backends import build_backend

    try:
        backend = build_backend(config)
    except Exception as exc:
        if isinstance(exc, _SAID_ERRORS):  # the message says what to change: no traceback unless asked
            log.error("the model failed to load: %s: %s (--log-level DEBUG for the traceback)",
                      type(exc).__name__, exc)
            log.debug("the model failed to load:\n%s", traceback.format_exc())
        else:
            log.error("the model failed to load:\n%s", traceback.format_exc())
        outbox.put(m.encode(m.Error(None, "load_failed", f"{type(exc).__name__}: {exc}", False)),
                   timeout_s=_SEND_TIMEOUT_S)
        return
    core = EngineCore(backend, config.core, admission=config.admission)
    frozen = freeze_startup_heap()  # the loaded model's objects: out of every full collection
    log.info("engine: %d start-up objects frozen out of garbage collection", frozen)
    probe = GcProbe(frozen_objects=frozen).install()
    outbox.put(m.encode(_hello(backend)), timeout_s=_SEND_TIMEOUT_S)
    loop = EngineLoop(core, inbox, outbox, stats_interval_s=config.stats_interval_s, gc_probe=probe)
    try:
        loop.run()
    finally:
        backend.close()
