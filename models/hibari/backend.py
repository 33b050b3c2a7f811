"""The embedded CPU voice: ``hibari-tts`` behind the Backend contract (``engine.backend``).

Each ``step`` synthesises one sentence of the job whose audio is due first and returns it in
chunks of at most ``chunk_ms``; voices, speed and scheduling: docs/architecture.md,
"The embedded CPU voice".
"""

from __future__ import annotations

import unicodedata
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.backend import BackendInfo, JobError, JobOutput, OptionError

__all__ = ["HibariBackend", "available_voices"]

SAMPLE_RATE = 24_000
SPEED_RANGE = (0.5, 2.0)
SEED_RANGE = (0, 2**63 - 1)
DEFAULT_VOICE = "heart"


def available_voices() -> tuple[str, ...]:
    """Voices usable offline: the one in the package and any already in hibari's cache."""
    from hibari.voices import VOICES, voice_path

    names = []
    for name in VOICES:
        try:
            voice_path(name, download_missing=False)
        except FileNotFoundError:
            continue
        names.append(name)
    return tuple(names)


@dataclass
class _Job:
    job_id: int
    text: str
    voice: str
    speed: float
    rng: np.random.Generator
    phonemes: list[str] | None = None  # hibari's sentences, filled on the first step
    num_done: int = 0  # sentences synthesised so far
    deadline_s: float = 0.0  # time.monotonic() by which its next audio is needed


class HibariBackend:
    """hibari-tts voices; loads and warms up every offline voice in the constructor."""

    def __init__(self, *, threads: int = 1, chunk_ms: float = 100.0, warmup: bool = True) -> None:
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
        if not 1.0 <= chunk_ms <= 100.0:
            raise ValueError(f"chunk_ms must be in [1, 100], got {chunk_ms!r}")
        from hibari import SAMPLE_RATE as hibari_rate
        from hibari import Hibari

        if hibari_rate != SAMPLE_RATE:
            raise RuntimeError(f"hibari produces {hibari_rate} Hz audio; this backend expects {SAMPLE_RATE}")
        voices = available_voices()
        self._tts = {name: Hibari(voice=name, threads=threads) for name in voices}
        self.info = BackendInfo(
            model="hibari",
            voices=voices,
            default_voice=DEFAULT_VOICE if DEFAULT_VOICE in voices else voices[0],
            sample_rate=SAMPLE_RATE,
            options={
                "speed": {"type": "float", "min": SPEED_RANGE[0], "max": SPEED_RANGE[1], "default": 1.0},
                "seed": {"type": "int", "min": SEED_RANGE[0], "max": SEED_RANGE[1], "default": None},
            },
        )
        self.chunk_samples = max(1, round(SAMPLE_RATE * chunk_ms / 1000.0))
        self._jobs: OrderedDict[int, _Job] = OrderedDict()  # insertion order breaks ties
        if warmup:
            # Loads the G2P lexicons and runs the model once, so the first request is fast.
            for tts in self._tts.values():
                tts("Warm up.", seed=0)

    # -- Backend ------------------------------------------------------------------------------

    def validate(self, voice: str | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        voice = self.info.default_voice if voice is None else voice
        if voice not in self.info.voices:
            raise OptionError(
                "unknown_voice", f"unknown voice {voice!r}; voices: {', '.join(self.info.voices)}"
            )
        unknown = sorted(set(options) - set(self.info.options))
        if unknown:
            raise OptionError(
                "invalid_option", f"unknown option {unknown[0]!r}; options: {', '.join(self.info.options)}"
            )
        speed = options.get("speed", 1.0)
        if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not (
            SPEED_RANGE[0] <= speed <= SPEED_RANGE[1]
        ):
            raise OptionError(
                "invalid_option",
                f"speed must be a number in [{SPEED_RANGE[0]}, {SPEED_RANGE[1]}], got {speed!r}",
            )
        seed = options.get("seed")
        if seed is not None and (
            isinstance(seed, bool) or not isinstance(seed, int) or not SEED_RANGE[0] <= seed <= SEED_RANGE[1]
        ):
            raise OptionError("invalid_option", f"seed must be an integer in [0, 2^63 - 1], got {seed!r}")
        return voice, {"speed": float(speed), "seed": seed}

    def add_job(self, job_id: int, text: str, voice: str, options: dict[str, Any]) -> None:
        if job_id in self._jobs:
            raise ValueError(f"job {job_id} already exists")
        seed = options.get("seed")
        self._jobs[job_id] = _Job(
            job_id=job_id,
            text=text,
            voice=voice,
            speed=float(options.get("speed", 1.0)),
            rng=np.random.default_rng(seed),
        )

    def abort_job(self, job_id: int) -> None:
        self._jobs.pop(job_id, None)

    def set_deadline(self, job_id: int, deadline_s: float, first_audio: bool = False) -> None:
        """Serve the earliest deadline first (see ``engine.backend``); unknown ids are ignored
        (``first_audio``: the deadline is a first-audio target; no difference here)."""
        job = self._jobs.get(job_id)
        if job is not None:
            job.deadline_s = deadline_s

    def has_work(self) -> bool:
        return bool(self._jobs)

    def num_queued(self) -> int:
        return max(0, len(self._jobs) - 1)  # all but the head job wait

    def close(self) -> None:
        self._jobs.clear()

    def step(self) -> list[JobOutput]:
        """Synthesise the head job's next sentence; return its audio in chunks."""
        if not self._jobs:
            return []
        # Earliest deadline first; ties (and backends' callers that set none) in arrival order.
        job = min(self._jobs.values(), key=lambda j: j.deadline_s)
        try:
            pcm, is_last = self._synthesize_next(job)
        except Exception as exc:  # a bad segment fails its job only
            del self._jobs[job.job_id]
            return [JobOutput(job.job_id, error=JobError("model_error", f"hibari: {exc}", False))]
        if is_last:
            del self._jobs[job.job_id]
        return self._chunks(job.job_id, pcm, is_last)

    # -- internals ----------------------------------------------------------------------------

    def _synthesize_next(self, job: _Job) -> tuple[np.ndarray, bool]:
        """The audio of the job's next sentence, and whether it was the last one."""
        tts = self._tts[job.voice]
        if job.phonemes is None:  # compatibility forms (superscripts, ligatures, full-width
            # letters) as their plain letters and digits: hibari's number reading takes a
            # superscript for a digit it cannot read ("¹:30" failed the job)
            job.phonemes = tts.phonemize(unicodedata.normalize("NFKC", job.text))
        if job.num_done >= len(job.phonemes):
            return np.zeros(0, np.float32), True  # nothing speakable in this text
        phonemes = job.phonemes[job.num_done]
        job.num_done += 1
        audio = tts.from_ids(tts.ids(phonemes), job.speed, job.rng)  # [n] float32
        pcm = np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0)
        return pcm, job.num_done >= len(job.phonemes)

    def _chunks(self, job_id: int, pcm: np.ndarray, is_last: bool) -> list[JobOutput]:
        n = self.chunk_samples
        out = [JobOutput(job_id, pcm=pcm[i : i + n]) for i in range(0, pcm.size, n)]
        if not is_last:
            return out
        if out:
            out[-1].is_finished = True
        else:
            out.append(JobOutput(job_id, is_finished=True))
        return out
