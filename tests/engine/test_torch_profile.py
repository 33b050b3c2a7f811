"""Tests for engine.torch_profile: the profiler window over the served engine's loaded steps."""

from __future__ import annotations

import gzip
import json

import pytest

from engine.process import EngineLoop
from engine.torch_profile import StepProfiler
from tests.engine.test_process import _loop, _open_streams
from tests.engine.fakes import FakeBackend


def test_off_unless_its_folder_is_set_and_bad_numbers_are_refused() -> None:
    assert StepProfiler.from_env({}) is None
    prof = StepProfiler.from_env({"VOXGATE_TORCH_PROFILE_DIR": "/x", "VOXGATE_TORCH_PROFILE_MIN_ROWS": "500",
                                  "VOXGATE_TORCH_PROFILE_STEPS": "40"})
    assert prof is not None and (prof.min_rows, prof.steps) == (500, 40)
    with pytest.raises(ValueError, match="integers"):
        StepProfiler.from_env({"VOXGATE_TORCH_PROFILE_DIR": "/x", "VOXGATE_TORCH_PROFILE_STEPS": "many"})
    with pytest.raises(ValueError, match=">= 1"):
        StepProfiler("/x", steps=0)


def test_records_the_steps_after_the_first_loaded_one_then_writes_once(tmp_path) -> None:
    prof = StepProfiler(str(tmp_path), min_rows=3, steps=2)
    prof.after_step(2)  # too few rows: not yet
    assert not prof.recording
    prof.after_step(3)  # the trigger: the next two steps are recorded
    assert prof.recording
    prof.after_step(0)
    assert prof.recording and not prof.done
    prof.after_step(0)
    assert prof.done and not prof.recording
    with gzip.open(prof.path, "rt") as f:
        assert "traceEvents" in json.load(f)
    prof.after_step(9)  # one window only
    assert not prof.recording


class RowsBackend(FakeBackend):
    """A FakeBackend that counts decode rows as the LM backend's totals do (one per job)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows = 0

    def step(self):  # noqa: ANN201
        self.rows += len(self.jobs)
        return super().step()

    def totals(self) -> dict[str, int]:
        return {"decode_rows": self.rows}


def test_the_engine_loop_arms_it_from_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("VOXGATE_TORCH_PROFILE_DIR", str(tmp_path))
    monkeypatch.setenv("VOXGATE_TORCH_PROFILE_MIN_ROWS", "2")
    monkeypatch.setenv("VOXGATE_TORCH_PROFILE_STEPS", "1")
    loop, inbox, outbox = _loop(RowsBackend())
    with inbox, outbox:
        assert isinstance(loop, EngineLoop) and loop.profiler is not None
        _open_streams(loop, range(1, 3))  # two jobs: two decode rows a step
        loop._step()
        assert loop.profiler.recording
        loop._step()
        assert loop.profiler.done and (tmp_path / "engine_trace.json.gz").exists()


def test_a_profiler_that_cannot_start_leaves_the_engine_alone(monkeypatch, tmp_path, caplog) -> None:
    import torch

    class Broken:
        def __init__(self, **kw) -> None: ...

        def start(self) -> None:
            raise RuntimeError("CUPTI unavailable")

    monkeypatch.setattr(torch.profiler, "profile", Broken)
    prof = StepProfiler(str(tmp_path), min_rows=0, steps=3)
    prof.after_step(0)
    assert prof.done and not prof.recording and prof.path is None
    assert "could not start" in caplog.text
    prof.after_step(5)  # and it stays off
    assert not prof.recording
