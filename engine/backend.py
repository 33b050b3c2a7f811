"""The contract between the engine core and a speech generator ("backend"): jobs in, audio and
ends out. The rules each backend keeps, and the backends there are: docs/architecture.md,
"The backend contract".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

__all__ = [
    "BackendInfo",
    "JobError",
    "JobOutput",
    "Backend",
    "ModelUnavailable",
    "OptionError",
]



@dataclass(frozen=True)
class BackendInfo:
    """What the gateway announces in ``hello`` and ``/v1/voices``."""

    model: str
    voices: tuple[str, ...]
    default_voice: str
    sample_rate: int
    # Names and ranges of the per-stream options a client may set, for docs and errors.
    options: dict[str, Any] = field(default_factory=dict)
    supports_cloning: bool = False  # has ``prepare_voice``: takes registered voices
    # The backend takes a stream's text as it arrives (native input streaming): one job per
    # turn, fed by ``push_text``, instead of one job per segment.
    input_streaming: bool = False
    # "loaded" (the checkpoint's weights) or "random" (``--load-format dummy``: noise, for
    # benchmarks); said wherever the model is named (hello, /health, the start-up line).
    weights: str = "loaded"
    # Decode rows (audio tokens, or frames where a row samples a whole frame) one stream needs
    # per second of audio, for a step-based backend: the engine's admission turns its measured
    # step times into a capacity in streams with it (engine.admission). None: not step-based.
    tokens_per_audio_second: float | None = None


@dataclass(frozen=True)
class JobError:
    code: str  # machine-readable, e.g. "model_error", "capacity"
    message: str
    retryable: bool


@dataclass
class JobOutput:
    job_id: int
    # float32 [n], may be None or empty; valid until the backend's next step (it may be a view of
    # a buffer the backend reuses: whoever keeps it longer copies it)
    pcm: np.ndarray | None = None
    is_finished: bool = False
    error: JobError | None = None


class OptionError(ValueError):
    """A voice or option a client asked for is invalid; the message names the field and range."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class ModelUnavailable(RuntimeError):
    """A model's files cannot be had here (not on disk, not in the hub cache, no network); the
    message says how to get them. The engine logs it without a traceback, as a setting refused
    at start-up (a ValueError) or a missing file."""


class Backend(Protocol):
    info: BackendInfo

    def validate(self, voice: str | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Check a stream's voice and options; return them normalised (defaults filled in).

        Raises ``OptionError`` naming the field and its valid range / the valid voices.
        """
        ...

    def add_job(self, job_id: int, text: str, voice: str, options: dict[str, Any]) -> None:
        """Queue a segment for generation. ``options`` were returned by ``validate``."""
        ...

    def abort_job(self, job_id: int) -> None:
        """Drop a job now (idempotent). Its queued and in-flight work is discarded."""
        ...

    def has_work(self) -> bool:
        """True while any job is queued or running."""
        ...

    def step(self) -> list[JobOutput]:
        """Advance all running jobs by one bounded unit of work."""
        ...

    def num_queued(self) -> int:
        """Jobs waiting for admission (for metrics)."""
        ...

    def close(self) -> None:
        """Release resources (idempotent)."""
        ...
