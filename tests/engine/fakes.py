"""A scripted in-memory backend for engine-core and gateway tests."""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from engine.backend import BackendInfo, JobError, JobOutput, OptionError


class FakeBackend:
    """Each job yields ``chunks_per_job`` chunks of ``chunk_samples`` samples, one per step.

    A job whose text contains "[[fail]]" fails with a model_error on its first step.
    """

    def __init__(self, *, chunks_per_job: int = 2, chunk_samples: int = 240) -> None:
        self.info = BackendInfo(model="fake", voices=("a", "b"), default_voice="a",
                                sample_rate=24000, options={"seed": {"type": "int"}})
        self.chunks_per_job = chunks_per_job
        self.chunk_samples = chunk_samples
        self.jobs: dict[int, dict[str, Any]] = {}
        self.order: deque[int] = deque()
        self.added: list[tuple[int, str]] = []
        self.aborted: list[int] = []

    def validate(self, voice: str | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        voice = voice or "a"
        if voice not in self.info.voices:
            raise OptionError("unknown_voice", f"unknown voice {voice!r}; voices: a, b")
        seed = options.get("seed", 0)
        if not isinstance(seed, int):
            raise OptionError("invalid_option", "seed must be an integer")
        return voice, {"seed": seed}

    def add_job(self, job_id: int, text: str, voice: str, options: dict[str, Any]) -> None:
        self.added.append((job_id, text))
        self.jobs[job_id] = {"text": text, "left": self.chunks_per_job}
        self.order.append(job_id)

    def abort_job(self, job_id: int) -> None:
        self.aborted.append(job_id)
        if self.jobs.pop(job_id, None) is not None:
            self.order.remove(job_id)

    def has_work(self) -> bool:
        return bool(self.order)

    def num_queued(self) -> int:
        return 0

    def step(self) -> list[JobOutput]:
        """Every job advances one chunk per step (a batch of all jobs)."""
        out: list[JobOutput] = []
        for job_id in list(self.order):
            job = self.jobs[job_id]
            if "[[fail]]" in job["text"]:
                self.abort_job(job_id)
                out.append(JobOutput(job_id, error=JobError("model_error", "boom", False)))
                continue
            job["left"] -= 1
            pcm = np.full(self.chunk_samples, 0.25, dtype=np.float32)
            is_finished = job["left"] == 0
            if is_finished:
                self.jobs.pop(job_id)
                self.order.remove(job_id)
            out.append(JobOutput(job_id, pcm=pcm, is_finished=is_finished))
        return out

    def close(self) -> None:
        pass


class CloningFakeBackend(FakeBackend):
    """``FakeBackend`` that takes registered voices: ``prepare_voice`` records the reference
    and returns its id as a voice name, unless the id starts with "bad" (``OptionError``)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.info = BackendInfo(model="fake-clone", voices=("a", "b"), default_voice="a",
                                sample_rate=24000, options={"seed": {"type": "int"}},
                                supports_cloning=True)
        self.prepared: list[Any] = []

    def prepare_voice(self, voice_ref: Any) -> str:
        if voice_ref.voice_id.startswith("bad"):
            raise OptionError("voice_unavailable", f"voice {voice_ref.voice_id!r} cannot be read")
        self.prepared.append(voice_ref)
        return voice_ref.voice_id

    def validate(self, voice: str | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if voice is not None and any(ref.voice_id == voice for ref in self.prepared):
            return voice, super().validate(None, options)[1]
        return super().validate(voice, options)
