"""``LMBackend``: the ``engine.backend.Backend`` contract over scheduler + runner + program.

One ``step`` schedules and launches the next device step, then does the host's work on the
previous one while it runs (docs/orpheus.md, "asynchronous steps"; errors: "Failures").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from engine.backend import BackendInfo, JobError, JobOutput, OptionError
from engine.llm.model_runner import LaunchedStep, ModelRunner
from engine.llm.program import Program
from engine.llm.scheduler import RequestError, ScheduledBatch, Scheduler
from engine.llm.sequence import Sequence, SequenceStatus

__all__ = ["LMBackend", "MAX_CHUNK_SAMPLES"]

log = logging.getLogger(__name__)

MAX_CHUNK_SAMPLES = 2400  # 100 ms at 24 kHz: the contract's largest chunk


class LMBackend:
    """Continuous-batching LM speech backend; see the module docstring."""

    def __init__(self, program: Program, runner: ModelRunner, scheduler: Scheduler, *,
                 async_steps: bool = False, default_decode_cap_budget: float = 0.0) -> None:
        self.program = program
        # The measured decode cap's fraction for AdmissionConfig.decode_cap_budget -1 (the
        # model's): the program's ServingDefaults on CUDA, 0 (off) elsewhere (engine.llm.build).
        self.default_decode_cap_budget = default_decode_cap_budget
        self.runner = runner
        self.scheduler = scheduler
        # Launch step N+1 before step N's tokens reach the host (see ``step``).
        self.async_steps = async_steps
        self.info: BackendInfo = program.info
        self._pending: list[JobOutput] = []
        self._running: tuple[ScheduledBatch, LaunchedStep] | None = None  # launched step
        # With async_steps: the codec work launched by the previous call, collected by the next
        # (by then it has finished behind the LM step it overlapped: the host never waits for it)
        self._inflight: _Inflight | None = None
        self._t_step = 0.0  # when the call that launched ``_running`` began
        # Counters since start (``totals``; the engine's Stats carry them to the gateway's metrics)
        self._totals: dict[str, float] = dict.fromkeys(
            ("lm_steps", "decode_rows", "deferred_decodes", "prefill_steps", "prefill_rows", "prefill_tokens",
             "light_steps", "light_rows"), 0)
        # Seconds of ``step`` calls, by the kind of the launched step each one took the tokens of
        # (a call's time is mostly its wait for that step): light steps apart from the others
        self._totals.update(light_busy_s=0.0, loaded_busy_s=0.0)
        self._closed = False
        # Input streaming (``Program.input_streaming``): a job is one turn whose text arrives
        # while it speaks; the program chooses each decode row's input (``next_input``).
        self._streaming = bool(getattr(program, "input_streaming", False))
        self._feeds_inputs = hasattr(program, "next_input")
        self._turns: dict[int, _Turn] = {}  # streaming jobs, by id, until they end
        self._binds_slots = hasattr(program, "bind_slot")
        self._flush_inputs = getattr(program, "flush_inputs", None)

    # -- Backend contract -----------------------------------------------------------------

    def validate(self, voice: str | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return self.program.validate(voice, options)

    def prepare_voice(self, voice_ref: Any) -> str:
        """A registered voice, made usable by the program (its encoding of the voice, computed once);
        the core calls it only while ``info.supports_cloning`` is set."""
        prepare = getattr(self.program, "prepare_voice", None)
        if prepare is None:
            raise OptionError("cloning_unsupported", f"model {self.info.model} cannot clone voices")
        return prepare(voice_ref)

    def add_job(self, job_id: int, text: str, voice: str, options: dict[str, Any]) -> None:
        """Queue a job. With an input-streaming program, ``text`` is the turn's first text; more
        comes through ``push_text``, and the sequence starts once its prompt can be built."""
        try:
            state = self.program.new_state(voice, options)
            params = self.program.sampling_params(options)
            if self._streaming:
                self._turns[job_id] = _Turn(state, params)
                if not self._push(job_id, state, text, flush=False, final=False):
                    return
                self._start_turn(job_id)
                return
            seq = Sequence(seq_id=job_id, prompt_ids=self.program.build_prompt(text, voice, options), params=params)
            seq.program_state = state
            seq.allowed_row = self.program.allowed_row(seq.program_state)
            self.scheduler.add(seq)
        except RequestError as e:
            self._turns.pop(job_id, None)
            self._pending.append(JobOutput(job_id, error=e.error))
        except Exception as e:  # a bad job fails alone
            log.exception("job %d could not be queued", job_id)
            self._turns.pop(job_id, None)
            self._pending.append(JobOutput(job_id, error=JobError("model_error", str(e), retryable=False)))

    def _push(self, job_id: int, state: Any, text: str, *, flush: bool, final: bool) -> bool:
        """Text to an input-streaming program; False when it refused the text (a ``ValueError``,
        its contract for text the model cannot speak): the job has failed with ``model_error``
        naming why, logged without a traceback (the client's text, not a fault of ours)."""
        try:
            self.program.push_text(state, text, flush=flush, final=final)
        except ValueError as e:
            log.info("job %d: text refused: %s", job_id, e)
            self.abort_job(job_id)
            self._pending.append(JobOutput(job_id, error=JobError("model_error", str(e), retryable=False)))
            return False
        return True

    def push_text(self, job_id: int, text: str, *, flush: bool = False, final: bool = False) -> None:
        """More text for an input-streaming job (``flush``: speak what is buffered, even a word
        cut short; ``final``: no more text comes). A paused sequence resumes when its program has
        its next input; a turn that ends before any prompt could be built finishes silent."""
        turn = self._turns.get(job_id)
        if turn is None:
            return  # an unknown or finished job: late text is dropped
        try:
            if not self._push(job_id, turn.state, text, flush=flush, final=final):
                return
            if turn.seq is None:
                self._start_turn(job_id)
                if turn.seq is None and final:
                    self._turns.pop(job_id, None)
                    self._pending.append(JobOutput(job_id, pcm=np.zeros(0, np.float32), is_finished=True))
            elif turn.seq.is_paused:
                self._refresh_input(turn.seq)
        except Exception as e:  # a fault while taking the text: the job fails alone
            log.exception("job %d: text not taken", job_id)
            self.abort_job(job_id)
            self._pending.append(JobOutput(job_id, error=JobError("model_error", str(e), retryable=False)))

    def _start_turn(self, job_id: int) -> None:
        """Queue an input-streaming job's sequence once its program can build the prompt."""
        turn = self._turns[job_id]
        prompt = self.program.prompt_ids(turn.state)
        if prompt is None:
            return
        seq = Sequence(seq_id=job_id, prompt_ids=prompt, params=turn.params,
                       reserve_tokens=getattr(self.program, "reserve_tokens", None))
        seq.program_state = turn.state
        seq.allowed_row = self.program.allowed_row(turn.state)
        self.scheduler.add(seq)  # (RequestError: the caller fails the job)
        turn.seq = seq

    def _refresh_input(self, seq: Sequence) -> None:
        """Set a program-fed sequence's next decode input, or pause it until there is one."""
        if seq.status is not SequenceStatus.RUNNING:
            return
        nxt = self.program.next_input(seq.program_state, seq.num_output_tokens)
        if nxt is None:
            self.scheduler.pause(seq)
        else:
            seq.next_input = nxt
            self.scheduler.resume(seq)

    def abort_job(self, job_id: int) -> None:
        self._turns.pop(job_id, None)
        seq = self.scheduler.abort(job_id)
        if seq is not None:
            self._release(seq)
        if self._running is not None and all(s.status is not SequenceStatus.RUNNING for s in self._running[0].seqs):
            self._running = None  # the launched step's tokens concern nobody now (the device finishes it)
        self._pending = [o for o in self._pending if o.job_id != job_id]
        if self._inflight is not None:
            self._inflight.dropped.add(job_id)  # its audio on the way is discarded

    def set_deadline(self, job_id: int, deadline_s: float, first_audio: bool = False) -> None:
        """Admission, prefill and decode order (``engine.backend``; the scheduler's policy);
        the program hears how soon the job's audio is due (``Program.note_due``).
        ``first_audio``: the deadline is the stream's first-audio target, not when a playing
        client runs dry (light steps may delay such a row; ``SchedulerConfig.light_slack_s``)."""
        seq = self.scheduler.set_deadline(job_id, deadline_s, first_audio=first_audio)
        note_due = getattr(self.program, "note_due", None)
        if seq is not None and note_due is not None:
            note_due(seq.program_state, deadline_s - self.scheduler.now())

    def totals(self) -> dict[str, float]:
        """Counters since start: steps launched, decode rows, decodes deferred (cap, horizon),
        steps with prompts, prefill rows and tokens, light steps and their rows, the seconds of
        ``step`` calls that took a light step's tokens and a loaded (any other) step's; the
        runner's steps that ran eagerly (no graph) and the program's own counters where they
        have them."""
        out = dict(self._totals)
        eager = getattr(self.runner, "num_eager_steps", None)
        if eager is not None:
            out["eager_steps"] = eager
        program_totals = getattr(self.program, "totals", None)
        if program_totals is not None:
            out.update(program_totals())
        return out

    def step_counts(self) -> tuple[int, int]:
        """Decode rows and prompt tokens launched since start: the engine loop pairs each
        step's share with the step's time (``engine.admission``). Light steps' rows are left
        out: a few rows in a cheap step variant are not what a row costs in a whole step (a
        light step without prompts is then no sample at all)."""
        t = self._totals
        return int(t["decode_rows"] - t["light_rows"]), int(t["prefill_tokens"])

    @property
    def job_slots(self) -> int:
        """The jobs the engine runs at once (``--max-num-seqs``); one more waits for a slot.
        The engine core admits streams within them (``engine.admission``, ``seats``)."""
        return self.scheduler.config.max_num_seqs

    @property
    def max_decode_rows(self) -> int:
        """The most decode rows one step runs: the decode cap, else the batch slots."""
        return self.scheduler.config.max_num_decode_seqs or self.scheduler.config.max_num_seqs

    def set_decode_cap(self, rows: int) -> None:
        """At most ``rows`` decode rows a step from now on (0: no cap): the engine core's cap
        from measured step times (``AdmissionConfig.decode_cap_budget``). Only the row count
        changes; the CUDA graphs captured for the batch sizes up to the slots stay."""
        if rows < 0:
            raise ValueError(f"a decode cap must be >= 0, got {rows}")
        self.scheduler.config = replace(self.scheduler.config, max_num_decode_seqs=rows)

    @property
    def decode_fill_rows(self) -> int:
        """The decode rows a step fills with jobs not yet due (the scheduler's fill within its
        cap) while it has a decode horizon; 0 without one (every job decodes, up to the cap)."""
        cfg = self.scheduler.config
        if cfg.decode_horizon_s <= 0.0:
            return 0
        return max(1, min(cfg.decode_fill_seqs, cfg.max_num_decode_seqs or cfg.max_num_seqs))

    def _count(self, batch: ScheduledBatch) -> None:
        t = self._totals
        t["lm_steps"] += 1
        t["decode_rows"] += batch.num_decode_seqs
        t["deferred_decodes"] += batch.num_deferred_decodes
        t["prefill_rows"] += batch.num_seqs - batch.num_decode_seqs
        t["prefill_steps"] += batch.num_seqs > batch.num_decode_seqs
        t["prefill_tokens"] += batch.num_tokens - batch.num_decode_seqs
        if batch.is_light:
            t["light_steps"] += 1
            t["light_rows"] += batch.num_decode_seqs

    def has_work(self) -> bool:
        return (bool(self._pending) or self._running is not None or self._inflight is not None
                or self.scheduler.has_work())

    def num_queued(self) -> int:
        return self.scheduler.num_waiting

    def num_running(self) -> int:
        """Jobs admitted and generating (the engine's ``running_jobs`` gauge)."""
        return self.scheduler.num_running

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for seq in list(self.scheduler.waiting) + list(self.scheduler.running):
            self.abort_job(seq.seq_id)
        self._pending = []
        self._inflight = None

    def warmup(self, text: str = "Hello there.", *, max_tokens: int = 28) -> None:
        """Run one short greedy job end to end (first-call costs stay out of serving).

        With prefill graphs, a second job's prompt is longer than the largest of them, so it is
        chunked and takes the eager step path: what that path compiles on first use (FlashInfer's
        JIT kernels, ``torch.compile`` pieces; over a minute on a fresh GPU host) is done here
        instead of stalling every stream at the first serving step that needs it."""
        voice, options = self.validate(None, {"temperature": 0.0, "max_tokens": max_tokens})
        self.add_job(-1, text, voice, options)
        if self._streaming:
            self.push_text(-1, "", final=True)
        self._run_warmup_job(max_tokens)
        graphs = getattr(self.runner, "prefill_graphs", None)
        if graphs is None or self._streaming:  # (a streaming prompt holds the first words only)
            return
        long_text = text
        while len(self.program.build_prompt(long_text, voice, options)) <= graphs.max_num_tokens:
            long_text = f"{long_text} {long_text}"
        if len(self.program.build_prompt(long_text, voice, options)) < self.scheduler.config.max_model_len - 8:
            self.add_job(-2, long_text, voice, dict(options, max_tokens=7))
            self._run_warmup_job(7)

    def _run_warmup_job(self, max_tokens: int) -> None:
        for _ in range(10 * max_tokens + 100):
            outs = self.step()
            bad = [o.error for o in outs if o.error is not None]
            if bad:
                raise RuntimeError(f"warm-up failed: {bad[0].message}")
            if not self.has_work():
                return
        raise RuntimeError("warm-up did not finish")

    def step(self) -> list[JobOutput]:
        """Take step N's tokens (launched by the previous call): record them and let ended
        sequences leave the scheduler; schedule and launch step N+1; then the program's
        bookkeeping of N's tokens and their codec work (on the codec's CUDA stream), and collect
        N's audio, all while N+1 runs. Returns while N+1 runs on the device, so the caller's
        own work (encoding, sending) overlaps it too.

        With ``async_steps``, N+1 is scheduled and launched *before* N's tokens are taken: rows
        that continue from N read their input token from N's tokens on the device, so the
        device goes from N to N+1 without waiting for the host. A sequence that stops at N is
        then in N+1 too; that row's token is dropped (one wasted row per stop, and its KV write
        lands in pages that later users overwrite after it, in stream order). N's audio is then
        collected by the next call, not this one: the codec work for N shares the device with
        N+1 and tends to finish with it, so waiting for it here would leave the device idle
        while the host finishes the call; one call later it is done (the audio leaves one step
        later: a few ms)."""
        t0 = time.perf_counter()
        waited = self._running[0] if self._running is not None else None  # whose tokens this call takes
        try:
            return self._step_async() if self.async_steps else self._step_sync()
        finally:
            if waited is not None:
                key = "light_busy_s" if waited.is_light else "loaded_busy_s"
                self._totals[key] += time.perf_counter() - t0

    def _step_sync(self) -> list[JobOutput]:
        outputs, self._pending = self._pending, []
        taken = None
        now = time.perf_counter()
        if self._running is not None:
            self.program.note_step_interval(now - self._t_step)  # steps back to back: the step period
            batch, wait = self._running
            self._running = None
            taken = self._take_tokens(batch, wait, outputs, filled=False)
        self._launch(self.scheduler.schedule(), None, now, outputs)
        if taken is not None:
            work = self._launch_audio(taken, outputs)
            if work is not None:
                outputs.extend(self._collect(work))
        return outputs

    def _step_async(self) -> list[JobOutput]:
        outputs, self._pending = self._pending, []
        now = time.perf_counter()
        prev, self._running = self._running, None
        if prev is not None:
            self.program.note_step_interval(now - self._t_step)
        self._launch(self.scheduler.schedule(), prev[1] if prev is not None else None, now, outputs)
        work = None
        if prev is not None:
            taken = self._take_tokens(prev[0], prev[1], outputs, filled=True)
            if taken is not None:
                work = self._launch_audio(taken, outputs)
        # The audio of the step before: its codec work ran behind that step's successor, which
        # has finished by now, so collecting it does not wait on the device (one step of delay).
        done, self._inflight = self._inflight, work
        if done is not None:
            outputs.extend(self._collect(done))
        return outputs

    def _launch(self, batch: ScheduledBatch | None, prev: Any, now: float, outputs: list[JobOutput]) -> None:
        """Set each row's allowed-token row and launch ``batch`` (``prev``: the launched step
        whose tokens some rows still wait for)."""
        if batch is None or not batch.seqs:
            return
        program = self.program
        for seq in batch.seqs:  # the next token's position: what the program saw plus what is in flight
            seq.allowed_row = program.allowed_row(seq.program_state, seq.num_output_tokens - seq.num_program_tokens)
            if self._binds_slots and seq.num_computed_tokens == 0:  # its slot's state, before its prompt runs
                program.bind_slot(seq.program_state, seq.slot)
        if self._flush_inputs is not None:  # what next_input and bind_slot staged, in one go
            self._flush_inputs()
        try:
            launched = self.runner.launch(batch) if prev is None else self.runner.launch(batch, prev.tokens)
        except Exception as e:
            log.exception("model step failed; failing its %d jobs", batch.num_seqs)
            outputs.extend(self._fail(batch.seqs, f"model step failed: {type(e).__name__}: {e}"))
            return
        if self.async_steps:
            self.scheduler.advance(batch)
            if self._feeds_inputs:
                self._refresh_inputs(batch)
        self._running = (batch, launched)
        self._t_step = now
        self._count(batch)

    def _take_tokens(self, batch: ScheduledBatch, wait: Callable[[], list[int]], outputs: list[JobOutput], *,
                     filled: bool) -> _Taken | None:
        """Wait for a launched step's tokens and record them (``filled``: the step was advanced
        at launch, ``Scheduler.advance``); ended sequences leave the scheduler."""
        try:
            tokens = wait()
        except Exception as e:
            log.exception("model step failed; failing its %d jobs", batch.num_seqs)
            live = [s for s in batch.seqs if s.status is SequenceStatus.RUNNING]
            outputs.extend(self._fail(live, f"model step failed: {type(e).__name__}: {e}"))
            return None
        rows = tokens
        if tokens and isinstance(tokens[0], list):  # a frame of codebooks per row: the first one is the token
            tokens = [row[0] for row in rows]
        if filled:
            self.scheduler.fill(batch, tokens)
        else:
            self.scheduler.update(batch, tokens)
        stop_ids = self.program.stop_ids
        new: list[tuple[Sequence, Any]] = []
        live: list[tuple[Sequence, Any]] = []  # rows whose token is not a stop: audio to decode
        ended: list[Sequence] = []
        for seq, index, tok, row in zip(batch.seqs, batch.output_index, tokens, rows):
            if index < 0 or seq.status is not SequenceStatus.RUNNING:  # not sampled; ended or aborted meanwhile
                continue
            tok = int(tok)
            new.append((seq, row))
            is_stop = tok in stop_ids
            if not is_stop:
                live.append((seq, row))
            if is_stop or index + 1 >= seq.params.max_tokens:
                ended.append(seq)
        for seq in ended:
            self.scheduler.finish(seq)
            self._turns.pop(seq.seq_id, None)
        if self._feeds_inputs and not filled:
            self._refresh_inputs(batch)
        return _Taken(new, live, ended)

    def _refresh_inputs(self, batch: ScheduledBatch) -> None:
        """After a step's progress is recorded: each sampled row's next input (or its pause)."""
        for seq, index in zip(batch.seqs, batch.output_index):
            if index >= 0:
                self._refresh_input(seq)

    # -- internals ------------------------------------------------------------------------

    def _launch_audio(self, taken: _Taken, outputs: list[JobOutput]) -> _Inflight | None:
        """The program's bookkeeping of a step's tokens and their codec work, started on the
        device; ``_collect`` turns it into outputs. A failure fails the step's sequences."""
        program = self.program
        for seq, _ in taken.live:
            seq.num_program_tokens += 1
        try:
            live_audio = program.launch_postprocess([s.program_state for s, _ in taken.live],
                                                    [t for _, t in taken.live])
            tail_audio = program.launch_finish([s.program_state for s in taken.ended])
        except Exception as e:
            log.exception("postprocessing failed; failing its %d jobs", len(taken.new))
            outputs.extend(self._fail([s for s, _ in taken.new], f"audio decoding failed: {type(e).__name__}: {e}"))
            return None
        return _Inflight(taken, live_audio, tail_audio)

    def _collect(self, work: _Inflight) -> list[JobOutput]:
        try:
            return self._outputs(work)
        except Exception as e:
            log.exception("postprocessing failed; failing its %d jobs", len(work.taken.new))
            return self._fail([s for s, _ in work.taken.new if s.seq_id not in work.dropped],
                              f"audio decoding failed: {type(e).__name__}: {e}")

    def _outputs(self, work: _Inflight) -> list[JobOutput]:
        taken = work.taken
        if not taken.ended and not work.dropped:  # the usual step: a row, a chunk at most (frame models)
            outputs: list[JobOutput] = []
            for (seq, _), pcm in zip(taken.live, work.live_audio()):
                if pcm is None or not pcm.size:
                    continue
                if pcm.size <= MAX_CHUNK_SAMPLES and pcm.dtype == np.float32:
                    outputs.append(JobOutput(seq.seq_id, pcm=pcm))
                else:
                    outputs.extend(_chunked(seq.seq_id, [pcm], False))
            return outputs
        audio: dict[int, list[np.ndarray]] = {}
        for (seq, _), pcm in zip(taken.live, work.live_audio()):
            if pcm is not None and pcm.size:
                parts = audio.get(seq.seq_id)
                if parts is None:
                    audio[seq.seq_id] = [pcm]
                else:
                    parts.append(pcm)
        for seq, tail in zip(taken.ended, work.tail_audio()):
            if tail is not None and tail.size:
                audio.setdefault(seq.seq_id, []).append(tail)
        ended_ids = {s.seq_id for s in taken.ended}
        dropped = work.dropped
        outputs: list[JobOutput] = []
        for seq, _ in taken.new:
            job_id = seq.seq_id
            if job_id in dropped:
                continue
            is_finished = job_id in ended_ids
            parts = audio.pop(job_id, None)
            if parts is None:
                if is_finished:
                    outputs.append(JobOutput(job_id, pcm=np.zeros(0, np.float32), is_finished=True))
            elif len(parts) == 1 and parts[0].size <= MAX_CHUNK_SAMPLES and parts[0].dtype == np.float32:
                # a frame model's row, as the program gave it (the engine core encodes it before
                # the next step, and copies what it holds longer: a program may reuse its buffer)
                outputs.append(JobOutput(job_id, pcm=parts[0], is_finished=is_finished))
            else:
                outputs.extend(_chunked(job_id, parts, is_finished))
        return outputs

    def _release(self, seq: Sequence) -> None:
        """Let the program free what a dropped sequence holds (e.g. a codec slot)."""
        release = getattr(self.program, "release", None)
        if release is not None and seq.program_state is not None:
            release(seq.program_state)

    def _fail(self, seqs: list[Sequence], message: str) -> list[JobOutput]:
        out = []
        for seq in seqs:
            self._turns.pop(seq.seq_id, None)
            if seq in self.scheduler.running:
                self.scheduler.finish(seq)
            self._release(seq)
            out.append(JobOutput(seq.seq_id, error=JobError("model_error", message, retryable=False)))
        return out


@dataclass
class _Turn:
    """An input-streaming job: its program state and, once its prompt could be built, its sequence."""

    state: Any
    params: Any
    seq: Sequence | None = None


@dataclass
class _Taken:
    """One step's tokens, recorded in the scheduler, before the program has seen them."""

    new: list[tuple[Sequence, Any]]  # every sampled row of the step: its token (or frame of codebooks)
    live: list[tuple[Sequence, Any]]  # rows with an audio token
    ended: list[Sequence]  # sequences that ended at this step (already out of the scheduler)


@dataclass
class _Inflight:
    """One step's tokens whose audio the codec is decoding."""

    taken: _Taken
    live_audio: Callable[[], list[np.ndarray | None]]  # per row of taken.live
    tail_audio: Callable[[], list[np.ndarray | None]]  # per sequence of taken.ended
    dropped: set[int] = field(default_factory=set)  # jobs aborted since: no outputs


def _chunked(job_id: int, parts: list[np.ndarray], is_finished: bool) -> list[JobOutput]:
    """Outputs of at most ``MAX_CHUNK_SAMPLES`` each; the last one carries ``is_finished``."""
    pcm = np.concatenate(parts).astype(np.float32, copy=False) if parts else np.zeros(0, np.float32)
    pieces = [pcm[i : i + MAX_CHUNK_SAMPLES] for i in range(0, pcm.size, MAX_CHUNK_SAMPLES)] or [pcm]
    outs = [JobOutput(job_id, pcm=p) for p in pieces]
    outs[-1].is_finished = is_finished
    return outs
