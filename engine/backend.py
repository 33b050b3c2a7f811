"""The contract between the engine core and a speech generator ("backend").

The engine core (``engine.core.EngineCore``) owns streams, their segmenters and the order in
which segments are spoken. It hands each speakable segment to a backend as a *job* and routes
what the backend emits back to the stream. A backend never sees streams or connections, only
jobs: (job id, text, voice, options).

Backends:
- ``models.hibari.backend.HibariBackend``: the embedded CPU voice (default).
- ``engine.llm.backend.LMBackend``: LLM-based TTS programs (Orpheus) with continuous batching.
- ``engine.synthetic.SyntheticBackend``: a tone generator paced at real time, for tests and the
  gateway-overhead benchmark.

Contract:
- ``add_job`` is called between steps; a job may join a running batch at the next ``step``.
- ``abort_job`` is idempotent; after it, no output for that job id is ever returned again.
- ``step`` does a bounded amount of work (one decode step, or one chunk of audio) and returns
  what it produced. It must not block waiting for new jobs.
- Audio is float32 mono in [-1, 1] at ``info.sample_rate``; a chunk is at most about 100 ms.
- Optional ``set_deadline(job_id, deadline_s)``: the ``time.monotonic()`` by which the job's
  next audio is needed (the engine core keeps it current: a stream's first audio soon, a playing
  stream's when its client would run dry, a segment generated ahead later). A backend that
  can choose what to run next serves the earliest deadline first; one without it is FIFO.
- Optional ``prepare_voice(voice_ref) -> str``: make a registered voice (``engine.messages.
  VoiceRef``: a WAV file, its rate, sha256 and transcript) usable and return the voice name to
  pass to ``validate``; raise ``OptionError`` if the reference cannot be used. It is called
  only while ``info.supports_cloning`` is true; without both, the backend cannot clone (the
  stream fails with ``cloning_unsupported``).
- Input streaming (``info.input_streaming``): the engine core gives each stream's turn one job
  and feeds it ``push_text(job_id, text, flush=..., final=...)`` as text arrives; the backend
  speaks it as the model takes it, and ends the job after ``final``.
- Optional ``step_counts()`` (decode rows and prompt tokens launched since start) and
  ``max_decode_rows`` (the most decode rows a step runs): a step-based backend's figures for
  admission, with ``info.tokens_per_audio_second`` (``engine.admission``).
- A job ends with exactly one ``JobOutput`` whose ``is_finished`` is true (possibly carrying
  the last audio) or whose ``error`` is set. An error fails that job only.
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
    pcm: np.ndarray | None = None  # float32 [n], may be None or empty
    is_finished: bool = False
    error: JobError | None = None


class OptionError(ValueError):
    """A voice or option a client asked for is invalid; the message names the field and range."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


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
