"""A deterministic tone/noise generator implementing the Backend contract, for tests and the
gateway-overhead benchmark (pacing, cost, cloning, failure injection: docs/architecture.md,
"The synthetic backend").
"""

from __future__ import annotations

import hashlib
import heapq
import math
import time
import wave
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Literal

import numpy as np

from engine.backend import BackendInfo, JobError, JobOutput, OptionError
from engine.messages import VoiceRef

__all__ = ["SyntheticBackend", "VOICES"]

VOICES = ("tone", "noise")
SPEED_RANGE = (0.5, 2.0)
SEED_RANGE = (0, 2**63 - 1)
_AMPLITUDE = 0.25


@dataclass
class _Job:
    job_id: int
    voice: str
    seed: int
    num_samples: int  # total audio this job makes
    t_added: float
    is_failing: bool
    rng: np.random.Generator
    frequency_hz: int
    num_emitted: int = 0
    order: int = 0  # insertion number: tells this job's heap entries from a reused id's


class SyntheticBackend:
    """Tones ("tone") or seeded noise ("noise"), ``ms_per_char`` of audio per text character."""

    def __init__(
        self,
        *,
        sample_rate: int = 24_000,
        ms_per_char: float = 60.0,
        chunk_ms: float = 40.0,
        realtime: bool = False,
        fail_on: str | Callable[[str], bool] | None = "[[fail]]",
        fail_mode: Literal["raise", "error"] = "raise",
        clone_voices: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(sample_rate, int) or sample_rate < 1000:
            raise ValueError(f"sample_rate must be an integer >= 1000, got {sample_rate!r}")
        if not ms_per_char > 0:
            raise ValueError(f"ms_per_char must be > 0, got {ms_per_char!r}")
        if not 1.0 <= chunk_ms <= 1000.0:
            raise ValueError(f"chunk_ms must be in [1, 1000], got {chunk_ms!r}")
        if fail_mode not in ("raise", "error"):
            raise ValueError(f"fail_mode must be 'raise' or 'error', got {fail_mode!r}")
        self.info = BackendInfo(
            model="synthetic",
            voices=VOICES,
            default_voice=VOICES[0],
            sample_rate=sample_rate,
            options={
                "speed": {"type": "float", "min": SPEED_RANGE[0], "max": SPEED_RANGE[1], "default": 1.0},
                "seed": {"type": "int", "min": SEED_RANGE[0], "max": SEED_RANGE[1], "default": 0},
            },
            supports_cloning=clone_voices,
        )
        self.ms_per_char = float(ms_per_char)
        self.chunk_samples = max(1, round(sample_rate * chunk_ms / 1000.0))
        self.is_realtime = realtime
        if isinstance(fail_on, str):
            marker = fail_on
            self._fail_on: Callable[[str], bool] | None = lambda text: marker in text
        else:
            self._fail_on = fail_on
        self.fail_mode = fail_mode
        self._clock = clock
        self._jobs: OrderedDict[int, _Job] = OrderedDict()  # insertion order = FIFO
        self._failing: set[int] = set()  # ids of jobs that fail at the next step
        # Paced only: (due time of the job's next chunk, insertion number, job id). An entry
        # whose job is gone (aborted, failed) is skipped when it comes up.
        self._due: list[tuple[float, int, int]] = []
        self._num_added = 0
        self._tones: dict[int, np.ndarray] = {}  # frequency -> [sample_rate + chunk] float32
        self._cloned: dict[str, tuple[str, int]] = {}  # voice id -> (sha256, pitch in Hz)

    # -- Backend ------------------------------------------------------------------------------

    def validate(self, voice: str | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if voice is not None and voice in self._cloned:
            return voice, _validate(self.info, None, options)[1]
        return _validate(self.info, voice, options)

    def prepare_voice(self, voice_ref: VoiceRef) -> str:
        """Accept a registered voice whose WAV file is there and matches its sha256."""
        known = self._cloned.get(voice_ref.voice_id)
        if known is not None and known[0] == voice_ref.sha256:
            return voice_ref.voice_id
        try:
            data = open(voice_ref.path, "rb").read()
            with wave.open(voice_ref.path, "rb") as wav:
                rate = wav.getframerate()
        except (OSError, wave.Error, EOFError) as exc:
            raise OptionError("voice_unavailable",
                              f"voice {voice_ref.voice_id!r} cannot be read: {exc}") from None
        if hashlib.sha256(data).hexdigest() != voice_ref.sha256 or rate != voice_ref.sample_rate:
            raise OptionError("voice_unavailable",
                              f"voice {voice_ref.voice_id!r}: the file does not match its record")
        pitch = 320 + int(voice_ref.sha256[:8], 16) % 200  # whole Hz: see _tone_table
        self._cloned[voice_ref.voice_id] = (voice_ref.sha256, pitch)
        return voice_ref.voice_id

    def add_job(self, job_id: int, text: str, voice: str, options: dict[str, Any]) -> None:
        if job_id in self._jobs:
            raise ValueError(f"job {job_id} already exists")
        speed = float(options.get("speed", 1.0))
        seed = int(options.get("seed", 0))
        seconds = len(text.strip()) * self.ms_per_char / 1000.0 / speed
        # A per-text pitch makes segments distinguishable in a recording; stable across runs.
        pitch = 180 + (sum(map(ord, text)) % 120)  # whole Hz: the tone table's period is 1 s
        if voice in self._cloned:
            pitch = self._cloned[voice][1]  # a registered voice: its own pitch (above 300 Hz)
        job = _Job(
            job_id=job_id,
            voice=voice,
            seed=seed,
            num_samples=round(seconds * self.info.sample_rate),
            t_added=self._clock(),
            is_failing=self._fail_on is not None and self._fail_on(text),
            rng=np.random.default_rng([seed, job_id & 0xFFFFFFFF]),
            frequency_hz=pitch,
        )
        self._num_added += 1
        job.order = self._num_added
        self._jobs[job_id] = job
        if job.is_failing:
            self._failing.add(job_id)
        elif self.is_realtime:
            heapq.heappush(self._due, (job.t_added, self._num_added, job_id))

    def abort_job(self, job_id: int) -> None:
        self._jobs.pop(job_id, None)
        self._failing.discard(job_id)
        if not self._jobs:
            self._due.clear()

    def has_work(self) -> bool:
        return bool(self._jobs)

    def num_queued(self) -> int:
        return 0  # every job runs at once: nothing waits for admission

    def close(self) -> None:
        self._jobs.clear()
        self._failing.clear()
        self._due.clear()

    def step(self) -> list[JobOutput]:
        """Emit the due chunks of every running job (one chunk each when not paced)."""
        out: list[JobOutput] = []
        # Failures first, so that a raising step has advanced no other job (no audio is lost).
        while self._failing:
            job_id = min(self._failing)  # the oldest first, as jobs were added
            self._failing.discard(job_id)
            self._jobs.pop(job_id, None)
            if self.fail_mode == "raise":
                raise RuntimeError(f"synthetic failure injected for job {job_id}")
            out.append(JobOutput(job_id, error=JobError("model_error", "synthetic failure", False)))
        if not self.is_realtime:
            for job in list(self._jobs.values()):
                out.append(self._emit_one(job))
            return out
        now = self._clock()
        due, jobs = self._due, self._jobs
        while due and due[0][0] <= now:
            _, order, job_id = heapq.heappop(due)
            job = jobs.get(job_id)
            if job is None or job.order != order:
                continue  # aborted
            while True:  # every chunk that is due (the loop may be late)
                result = self._emit_one(job)
                out.append(result)
                if result.is_finished:
                    break
                t_next = job.t_added + job.num_emitted / self.info.sample_rate
                if t_next > now:
                    heapq.heappush(due, (t_next, order, job_id))
                    break
        return out

    def next_due_s(self) -> float:
        """Seconds until the next chunk is due (0.0 if one is due now; ``inf`` with no jobs)."""
        if not self._jobs:
            return math.inf
        if not self.is_realtime or self._failing:
            return 0.0
        due, jobs = self._due, self._jobs
        while due and (due[0][2] not in jobs or jobs[due[0][2]].order != due[0][1]):
            heapq.heappop(due)  # aborted
        if not due:
            return 0.0
        return max(0.0, due[0][0] - self._clock())

    # -- internals ----------------------------------------------------------------------------

    def _emit_one(self, job: _Job) -> JobOutput:
        """The job's next chunk (or its end, if it had no audio); a finished job is removed."""
        n = min(self.chunk_samples, job.num_samples - job.num_emitted)
        if n <= 0:  # a job with no audio at all
            del self._jobs[job.job_id]
            return JobOutput(job.job_id, is_finished=True)
        pcm = self._render(job, n)
        job.num_emitted += n
        is_last = job.num_emitted >= job.num_samples
        if is_last:
            del self._jobs[job.job_id]
        return JobOutput(job.job_id, pcm=pcm, is_finished=is_last)

    def _render(self, job: _Job, n: int) -> np.ndarray:
        if job.voice == "noise":
            return (job.rng.uniform(-_AMPLITUDE, _AMPLITUDE, n)).astype(np.float32)  # [n]
        table = self._tones.get(job.frequency_hz)
        if table is None:
            table = self._tone_table(job.frequency_hz)
        start = job.num_emitted % self.info.sample_rate
        return table[start:start + n]  # [n] read-only view

    def _tone_table(self, frequency_hz: int) -> np.ndarray:
        rate = self.info.sample_rate
        t = np.arange(rate + self.chunk_samples) / rate  # [rate + chunk] seconds
        table = (_AMPLITUDE * np.sin(2.0 * np.pi * frequency_hz * t)).astype(np.float32)
        table.setflags(write=False)
        self._tones[frequency_hz] = table
        return table


def _validate(
    info: BackendInfo, voice: str | None, options: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """Check the voice and the speed/seed options; fill in defaults."""
    voice = info.default_voice if voice is None else voice
    if voice not in info.voices:
        raise OptionError("unknown_voice", f"unknown voice {voice!r}; voices: {', '.join(info.voices)}")
    unknown = sorted(set(options) - set(info.options))
    if unknown:
        raise OptionError(
            "invalid_option", f"unknown option {unknown[0]!r}; options: {', '.join(info.options)}"
        )
    speed = options.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not (
        SPEED_RANGE[0] <= speed <= SPEED_RANGE[1]
    ):
        raise OptionError(
            "invalid_option", f"speed must be a number in [{SPEED_RANGE[0]}, {SPEED_RANGE[1]}], got {speed!r}"
        )
    seed = options.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise OptionError("invalid_option", f"seed must be an integer in [0, 2^63 - 1], got {seed!r}")
    return voice, {"speed": float(speed), "seed": seed}
