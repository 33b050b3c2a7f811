"""A torch.profiler window over the served engine's steps, off unless
``VOXGATE_TORCH_PROFILE_DIR`` is set (as vLLM's ``VLLM_TORCH_PROFILER_DIR``): the next
``VOXGATE_TORCH_PROFILE_STEPS`` (default 50) steps after one with ``VOXGATE_TORCH_PROFILE_MIN_ROWS``
(default 1) decode rows are traced to ``engine_trace.json.gz`` (benchmark/gpu/README.md).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["StepProfiler"]

log = logging.getLogger("voxgate.engine")


class StepProfiler:
    """``after_step(decode_rows_in_step)`` after each engine step; records one window of steps,
    then stays off."""

    def __init__(self, out_dir: str, *, min_rows: int = 1, steps: int = 50) -> None:
        if min_rows < 0 or steps < 1:
            raise ValueError(f"VOXGATE_TORCH_PROFILE_MIN_ROWS must be >= 0 and _STEPS >= 1, got {min_rows}, {steps}")
        self.out_dir = Path(out_dir)
        self.min_rows = min_rows
        self.steps = steps
        self._prof: Any = None
        self._left = steps
        self.done = False
        self.path: Path | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> StepProfiler | None:
        out_dir = env.get("VOXGATE_TORCH_PROFILE_DIR", "")
        if not out_dir:
            return None
        try:
            min_rows = int(env.get("VOXGATE_TORCH_PROFILE_MIN_ROWS", "1"))
            steps = int(env.get("VOXGATE_TORCH_PROFILE_STEPS", "50"))
        except ValueError as exc:
            raise ValueError(f"VOXGATE_TORCH_PROFILE_MIN_ROWS and _STEPS must be integers: {exc}") from None
        return cls(out_dir, min_rows=min_rows, steps=steps)

    @property
    def recording(self) -> bool:
        return self._prof is not None

    def after_step(self, rows_in_step: int) -> None:
        """Count a step just taken (``rows_in_step`` decode rows): start recording after the
        first step with enough rows, stop and write after ``steps`` recorded steps."""
        if self.done:
            return
        if self._prof is None:
            if rows_in_step >= self.min_rows:
                self._start()
            return
        self._left -= 1
        if self._left <= 0:
            self._finish()

    def _start(self) -> None:
        import torch

        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        prof = torch.profiler.profile(activities=activities)
        try:
            prof.start()
        except Exception:  # a diagnostic must not stop the engine
            log.exception("torch profiler: could not start; no trace")
            self.done = True
            return
        self._prof = prof
        log.warning("torch profiler: recording %d engine steps", self.steps)

    def _finish(self) -> None:
        import gzip
        import shutil

        prof, self._prof, self.done = self._prof, None, True
        try:
            prof.stop()
            self.out_dir.mkdir(parents=True, exist_ok=True)
            raw = self.out_dir / "engine_trace.json"
            prof.export_chrome_trace(str(raw))
            path = self.out_dir / "engine_trace.json.gz"
            with open(raw, "rb") as src, gzip.open(path, "wb") as dst:
                shutil.copyfileobj(src, dst)
            raw.unlink()
            self.path = path
            log.warning("torch profiler: %d steps written to %s", self.steps, path)
        except Exception:  # a diagnostic must not stop the engine
            log.exception("torch profiler: could not write the trace")
