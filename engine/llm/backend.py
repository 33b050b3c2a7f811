"""``LMBackend``: the ``engine.backend.Backend`` contract over scheduler + runner + program.

One ``step`` = schedule (admit, pick decodes then prefill chunks), execute (one forward, one
sample, one host sync), update sequences, postprocess new tokens into audio, retire finished
sequences. Errors:
- a job refused at ``add_job`` (capacity, too long) gets its error from the next ``step``;
- an exception in the model step fails every job of that step with ``model_error`` (not
  retryable: the same input is likely to fail again), frees their pages, and the backend keeps
  serving the others;
- an exception while turning one step's tokens into audio fails the jobs of that step the same
  way.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from engine.backend import BackendInfo, JobError, JobOutput
from engine.llm.model_runner import ModelRunner
from engine.llm.program import Program
from engine.llm.scheduler import RequestError, Scheduler
from engine.llm.sequence import Sequence

__all__ = ["LMBackend", "MAX_CHUNK_SAMPLES"]

log = logging.getLogger(__name__)

MAX_CHUNK_SAMPLES = 2400  # 100 ms at 24 kHz: the contract's largest chunk


class LMBackend:
    """Continuous-batching LM speech backend; see the module docstring."""

    def __init__(self, program: Program, runner: ModelRunner, scheduler: Scheduler) -> None:
        self.program = program
        self.runner = runner
        self.scheduler = scheduler
        self.info: BackendInfo = program.info
        self._pending: list[JobOutput] = []
        self._closed = False

    # -- Backend contract -----------------------------------------------------------------

    def validate(self, voice: str | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return self.program.validate(voice, options)

    def add_job(self, job_id: int, text: str, voice: str, options: dict[str, Any]) -> None:
        try:
            seq = Sequence(
                seq_id=job_id,
                prompt_ids=self.program.build_prompt(text, voice, options),
                params=self.program.sampling_params(options),
            )
            seq.program_state = self.program.new_state(voice, options)
            seq.allowed_row = self.program.allowed_row(seq.program_state)
            self.scheduler.add(seq)
        except RequestError as e:
            self._pending.append(JobOutput(job_id, error=e.error))
        except Exception as e:  # a bad job fails alone
            log.exception("job %d could not be queued", job_id)
            self._pending.append(JobOutput(job_id, error=JobError("bad_request", str(e), retryable=False)))

    def abort_job(self, job_id: int) -> None:
        self.scheduler.abort(job_id)
        self._pending = [o for o in self._pending if o.job_id != job_id]

    def has_work(self) -> bool:
        return bool(self._pending) or self.scheduler.has_work()

    def num_queued(self) -> int:
        return self.scheduler.num_waiting

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for seq in list(self.scheduler.waiting) + list(self.scheduler.running):
            self.scheduler.abort(seq.seq_id)
        self._pending = []

    def step(self) -> list[JobOutput]:
        outputs, self._pending = self._pending, []
        batch = self.scheduler.schedule()
        if batch is None:
            return outputs
        try:
            tokens = self.runner.execute(batch).tolist()
        except Exception as e:
            log.exception("model step failed; failing its %d jobs", batch.num_seqs)
            return outputs + self._fail(batch.seqs, f"model step failed: {type(e).__name__}: {e}")
        new = self.scheduler.update(batch, tokens)
        try:
            outputs.extend(self._postprocess(new))
        except Exception as e:
            log.exception("postprocessing failed; failing its %d jobs", len(new))
            outputs.extend(self._fail([s for s, _ in new], f"audio decoding failed: {type(e).__name__}: {e}"))
        return outputs

    # -- internals ------------------------------------------------------------------------

    def _postprocess(self, new: list[tuple[Sequence, int]]) -> list[JobOutput]:
        stop_ids = self.program.stop_ids
        live = [(s, t) for s, t in new if t not in stop_ids]
        pcms = self.program.postprocess([s.program_state for s, _ in live], [t for _, t in live])
        audio: dict[int, list[np.ndarray]] = {}
        for (seq, _), pcm in zip(live, pcms):
            seq.allowed_row = self.program.allowed_row(seq.program_state)
            if pcm is not None and pcm.size:
                audio.setdefault(seq.seq_id, []).append(pcm)
        outputs: list[JobOutput] = []
        for seq, tok in new:
            is_finished = tok in stop_ids or seq.num_output_tokens >= seq.params.max_tokens
            parts = audio.pop(seq.seq_id, [])
            if is_finished:
                tail = self.program.finish(seq.program_state)
                if tail is not None and tail.size:
                    parts.append(tail)
                self.scheduler.finish(seq)
            if parts or is_finished:
                outputs.extend(_chunked(seq.seq_id, parts, is_finished))
        return outputs

    def _fail(self, seqs: list[Sequence], message: str) -> list[JobOutput]:
        out = []
        for seq in seqs:
            if seq in self.scheduler.running:
                self.scheduler.finish(seq)
            out.append(JobOutput(seq.seq_id, error=JobError("model_error", message, retryable=False)))
        return out


def _chunked(job_id: int, parts: list[np.ndarray], is_finished: bool) -> list[JobOutput]:
    """Outputs of at most ``MAX_CHUNK_SAMPLES`` each; the last one carries ``is_finished``."""
    pcm = np.concatenate(parts).astype(np.float32, copy=False) if parts else np.zeros(0, np.float32)
    pieces = [pcm[i : i + MAX_CHUNK_SAMPLES] for i in range(0, pcm.size, MAX_CHUNK_SAMPLES)] or [pcm]
    outs = [JobOutput(job_id, pcm=p) for p in pieces]
    outs[-1].is_finished = is_finished
    return outs
