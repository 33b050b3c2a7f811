"""``LMBackend``: the ``engine.backend.Backend`` contract over scheduler + runner + program.

One ``step`` call = schedule step N+1 and launch it, with ``async_steps`` before step N's
tokens (launched by the previous call) reach the host: rows continuing from N take their token
from N's output on the device, so the device never waits for the host between steps; without
it, after taking N's tokens (the one host sync), recording them and letting ended sequences go.
Then, while N+1 runs: the program's bookkeeping of N's tokens, their codec work on the codec's
own CUDA stream, and the collection of N's audio; then return, so the engine core's work on the
outputs (encoding, sending) overlaps the device's next step too. Errors:
- a job refused at ``add_job`` (capacity, too long) gets its error from the next ``step``;
- an exception in the model step fails every job of that step with ``model_error`` (not
  retryable: the same input is likely to fail again), frees their pages, and the backend keeps
  serving the others;
- an exception while turning one step's tokens into audio fails the jobs of that step the same
  way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.backend import BackendInfo, JobError, JobOutput
from engine.llm.model_runner import LaunchedStep, ModelRunner
from engine.llm.program import Program
from engine.llm.scheduler import RequestError, ScheduledBatch, Scheduler
from engine.llm.sequence import Sequence, SequenceStatus

__all__ = ["LMBackend", "MAX_CHUNK_SAMPLES", "build_orpheus_backend"]

log = logging.getLogger(__name__)

MAX_CHUNK_SAMPLES = 2400  # 100 ms at 24 kHz: the contract's largest chunk
RAMP_WINDOW_FRAMES = 4  # window decoder frames when it only serves the fast-start ramp
AUTO_DECODE_CAP_CUDA = 256  # decode rows per step by default on CUDA (scheduler.max_num_decode_seqs)
AUTO_DECODE_HORIZON_S_CUDA = 1.0  # scheduler.decode_horizon_s on CUDA: = CoreConfig.lookahead_slack_s, so segments generated ahead only fill
AUTO_RAMP_STEPS_CUDA = (1024, 1536)  # ramp_step_samples: light load, under load (OrpheusProgram)
AUTO_DECODE_FILL_CUDA = 64  # scheduler.decode_fill_seqs: on an H200 a 64-row step took 4.5 ms, one row 3.0 ms
AUTO_PREFILL_WAIT_S_CUDA = 0.02  # scheduler.prefill_wait_s: a due prompt waits at most 20 ms for company
AUTO_PREFILL_BATCH_CUDA = 4  # scheduler.prefill_batch_seqs: this many prompts go at once


class LMBackend:
    """Continuous-batching LM speech backend; see the module docstring."""

    def __init__(self, program: Program, runner: ModelRunner, scheduler: Scheduler, *,
                 async_steps: bool = False) -> None:
        self.program = program
        self.runner = runner
        self.scheduler = scheduler
        # Launch step N+1 before step N's tokens reach the host (see ``step``).
        self.async_steps = async_steps
        self._num_launched = 0
        self.info: BackendInfo = program.info
        self._pending: list[JobOutput] = []
        self._running: tuple[ScheduledBatch, LaunchedStep] | None = None  # launched step
        self._t_step = 0.0  # when the call that launched ``_running`` began
        # Counters since start (``totals``; the engine's Stats carry them to the gateway's metrics)
        self._totals = dict.fromkeys(("lm_steps", "decode_rows", "deferred_decodes", "prefill_steps",
                                      "prefill_rows", "prefill_tokens"), 0)
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
        seq = self.scheduler.abort(job_id)
        if seq is not None:
            self._release(seq)
        if self._running is not None and all(s.status is not SequenceStatus.RUNNING for s in self._running[0].seqs):
            self._running = None  # the launched step's tokens concern nobody now (the device finishes it)
        self._pending = [o for o in self._pending if o.job_id != job_id]

    def set_deadline(self, job_id: int, deadline_s: float) -> None:
        """Admission, prefill and decode order (``engine.backend``; the scheduler's policy)."""
        self.scheduler.set_deadline(job_id, deadline_s)

    def totals(self) -> dict[str, int]:
        """Counters since start: steps launched, decode rows, decodes deferred (cap, horizon),
        steps with prompts, prefill rows and tokens; the runner's steps that ran eagerly (no
        graph) and the program's own counters where they have them."""
        out = dict(self._totals)
        eager = getattr(self.runner, "num_eager_steps", None)
        if eager is not None:
            out["eager_steps"] = eager
        program_totals = getattr(self.program, "totals", None)
        if program_totals is not None:
            out.update(program_totals())
        return out

    def _count(self, batch: ScheduledBatch) -> None:
        t = self._totals
        t["lm_steps"] += 1
        t["decode_rows"] += batch.num_decode_seqs
        t["deferred_decodes"] += batch.num_deferred_decodes
        t["prefill_rows"] += batch.num_seqs - batch.num_decode_seqs
        t["prefill_steps"] += batch.num_seqs > batch.num_decode_seqs
        t["prefill_tokens"] += batch.num_tokens - batch.num_decode_seqs

    def has_work(self) -> bool:
        return bool(self._pending) or self._running is not None or self.scheduler.has_work()

    def num_queued(self) -> int:
        return self.scheduler.num_waiting

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for seq in list(self.scheduler.waiting) + list(self.scheduler.running):
            self.abort_job(seq.seq_id)
        self._pending = []

    def warmup(self, text: str = "Hello there.", *, max_tokens: int = 28) -> None:
        """Run one short greedy job end to end (first-call costs stay out of serving).

        With prefill graphs, a second job's prompt is longer than the largest of them, so it is
        chunked and takes the eager step path: what that path compiles on first use (FlashInfer's
        JIT kernels, ``torch.compile`` pieces; over a minute on a fresh GPU host) is done here
        instead of stalling every stream at the first serving step that needs it."""
        voice, options = self.validate(None, {"temperature": 0.0, "max_tokens": max_tokens})
        self.add_job(-1, text, voice, options)
        self._run_warmup_job(max_tokens)
        graphs = getattr(self.runner, "prefill_graphs", None)
        if graphs is None:
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
        lands in pages that later users overwrite after it, in stream order)."""
        if self.async_steps:
            return self._step_async()
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
        if prev is not None:
            taken = self._take_tokens(prev[0], prev[1], outputs, filled=True)
            if taken is not None:
                work = self._launch_audio(taken, outputs)
                if work is not None:
                    outputs.extend(self._collect(work))
        return outputs

    def _launch(self, batch: ScheduledBatch | None, prev: Any, now: float, outputs: list[JobOutput]) -> None:
        """Set each row's allowed-token row and launch ``batch`` (``prev``: the launched step
        whose tokens some rows still wait for)."""
        if batch is None or not batch.seqs:
            return
        program = self.program
        for seq in batch.seqs:  # the next token's position: what the program saw plus what is in flight
            seq.allowed_row = program.allowed_row(seq.program_state, seq.num_output_tokens - seq.num_program_tokens)
        try:
            launched = self.runner.launch(batch) if prev is None else self.runner.launch(batch, prev.tokens)
        except Exception as e:
            log.exception("model step failed; failing its %d jobs", batch.num_seqs)
            outputs.extend(self._fail(batch.seqs, f"model step failed: {type(e).__name__}: {e}"))
            return
        if self.async_steps:
            self._num_launched += 1
            self.scheduler.advance(batch, self._num_launched)
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
        if filled:
            self.scheduler.fill(batch, tokens)
        else:
            self.scheduler.update(batch, tokens)
        stop_ids = self.program.stop_ids
        new: list[tuple[Sequence, int]] = []
        ended: list[Sequence] = []
        for seq, index, tok in zip(batch.seqs, batch.output_index, tokens):
            if index < 0 or seq.status is not SequenceStatus.RUNNING:  # not sampled; ended or aborted meanwhile
                continue
            tok = int(tok)
            new.append((seq, tok))
            if tok in stop_ids or index + 1 >= seq.params.max_tokens:
                ended.append(seq)
        for seq in ended:
            self.scheduler.finish(seq)
        live = [(s, t) for s, t in new if t not in stop_ids]
        return _Taken(new, live, ended)

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
            return self._fail([s for s, _ in work.taken.new],
                              f"audio decoding failed: {type(e).__name__}: {e}")

    def _outputs(self, work: _Inflight) -> list[JobOutput]:
        audio: dict[int, list[np.ndarray]] = {}
        taken = work.taken
        for (seq, _), pcm in zip(taken.live, work.live_audio()):
            if pcm is not None and pcm.size:
                audio.setdefault(seq.seq_id, []).append(pcm)
        for seq, tail in zip(taken.ended, work.tail_audio()):
            if tail is not None and tail.size:
                audio.setdefault(seq.seq_id, []).append(tail)
        ended_ids = {s.seq_id for s in taken.ended}
        outputs: list[JobOutput] = []
        for seq, _ in taken.new:
            is_finished = seq.seq_id in ended_ids
            parts = audio.pop(seq.seq_id, [])
            if parts or is_finished:
                outputs.extend(_chunked(seq.seq_id, parts, is_finished))
        return outputs

    def _release(self, seq: Sequence) -> None:
        """Let the program free what a dropped sequence holds (e.g. a codec slot)."""
        release = getattr(self.program, "release", None)
        if release is not None and seq.program_state is not None:
            release(seq.program_state)

    def _fail(self, seqs: list[Sequence], message: str) -> list[JobOutput]:
        out = []
        for seq in seqs:
            if seq in self.scheduler.running:
                self.scheduler.finish(seq)
            self._release(seq)
            out.append(JobOutput(seq.seq_id, error=JobError("model_error", message, retryable=False)))
        return out


@dataclass
class _Taken:
    """One step's tokens, recorded in the scheduler, before the program has seen them."""

    new: list[tuple[Sequence, int]]  # every sampled row of the step
    live: list[tuple[Sequence, int]]  # rows with an audio token
    ended: list[Sequence]  # sequences that ended at this step (already out of the scheduler)


@dataclass
class _Inflight:
    """One step's tokens whose audio the codec is decoding."""

    taken: _Taken
    live_audio: Callable[[], list[np.ndarray | None]]  # per row of taken.live
    tail_audio: Callable[[], list[np.ndarray | None]]  # per sequence of taken.ended


def _chunked(job_id: int, parts: list[np.ndarray], is_finished: bool) -> list[JobOutput]:
    """Outputs of at most ``MAX_CHUNK_SAMPLES`` each; the last one carries ``is_finished``."""
    pcm = np.concatenate(parts).astype(np.float32, copy=False) if parts else np.zeros(0, np.float32)
    pieces = [pcm[i : i + MAX_CHUNK_SAMPLES] for i in range(0, pcm.size, MAX_CHUNK_SAMPLES)] or [pcm]
    outs = [JobOutput(job_id, pcm=p) for p in pieces]
    outs[-1].is_finished = is_finished
    return outs


def _resolve_async(value: bool | str, runner: Any) -> bool:
    """``async_steps`` from True/False or "on"/"off"/"auto" (on when the runner replays graphs)."""
    if isinstance(value, bool):
        return value
    if value not in ("auto", "on", "off"):
        raise ValueError(f"async_steps must be auto, on or off, got {value!r}")
    return value == "on" or (value == "auto" and bool(getattr(runner, "use_graphs", False)))


def _ramp_steps(ramp_step_samples: int, device: str) -> dict[str, int | None]:
    """OrpheusProgram's ramp settings: a fixed step, or (0) the automatic pair on CUDA."""
    if ramp_step_samples:
        return {"ramp_step_samples": ramp_step_samples, "loaded_ramp_step_samples": None}
    light, loaded = AUTO_RAMP_STEPS_CUDA
    return {"ramp_step_samples": light, "loaded_ramp_step_samples": loaded if device == "cuda" else None}


def build_orpheus_backend(
    model_path_or_id: str,
    *,
    config: Any = None,
    device: str | None = None,
    load_format: str | None = None,
    dtype: str | None = None,
    gpu_memory_utilization: float | None = None,
    max_num_seqs: int | None = None,
    max_model_len: int | None = None,
    codec_path: str | None = None,
    page_size: int = 16,
    max_num_batched_tokens: int | None = None,
    max_waiting: int = 1024,
    num_pages: int | None = None,
    cpu_kv_cache_bytes: int = 2 << 30,
    reserve_bytes: int = 2 << 30,
    stateful_codec: bool | None = None,
    codec_dtype: str | None = None,
    codec_compile: bool | None = None,
    max_num_decode_seqs: int | None = None,
    decode_horizon_s: float | None = None,
    decode_fill_seqs: int | None = None,
    prefill_wait_s: float | None = None,
    prefill_batch_seqs: int | None = None,
    async_steps: bool | str | None = None,
    ramp_step_samples: int | None = None,
    attention_backend_factory: Any = None,
    runner_factory: Any = None,
    warmup: bool = True,
    kv_cache_dtype: str | None = None,
    quantization: str | None = None,
) -> LMBackend:
    """Load Orpheus + SNAC and assemble an ``LMBackend``.

    Settings come from ``config`` (an ``engine.config.EngineConfig``) unless given as keywords.
    ``kv_cache_dtype`` "fp8" / ``quantization`` "fp8": the fp8 options (``engine.llm.fp8``).
    ``device`` "auto" picks CUDA when available; ``dtype`` "auto" is bf16 on CUDA, fp32 on CPU.
    KV cache: ``num_pages`` if given; on CUDA, what fits in ``total * gpu_memory_utilization``
    after the weights, minus ``reserve_bytes`` for activations and graphs; on the CPU,
    ``cpu_kv_cache_bytes``. Never more than ``max_num_seqs`` full-length sequences need, never
    less than one. One page (``runner.scratch_page``) is owned by no sequence: CUDA-graph
    padding rows write there. On CUDA with flashinfer installed the runner is
    ``CudaGraphModelRunner`` (``enable_cuda_graphs``, default) or ``ModelRunner`` with
    FlashInfer attention; ``runner_factory`` / ``attention_backend_factory`` override. ``max_num_batched_tokens`` defaults to
    ``max(512, max_num_seqs + 256)`` (every decode plus at least 256 prompt tokens). With prefill
    graphs the scheduler packs whole fresh prompts only, up to the graphs' row limit per step.
    ``stateful_codec`` (default True): SNAC decodes each frame once per stream
    (``StreamingCodecGraphs``, CUDA graphs when the window decoder is graphed too); False
    re-decodes a window per frame. ``codec_dtype`` of the stateful codec: "auto" (bf16 on CUDA,
    fp32 on the CPU), "float32" or "bfloat16"; the ramp's window decodes stay fp32.
    ``codec_compile`` (default: with CUDA graphs): the stateful codec's channels-last step
    through ``torch.compile``. ``max_num_decode_seqs``: decode rows per step, earliest
    deadlines first (``SchedulerConfig``); -1 (default) = ``AUTO_DECODE_CAP_CUDA`` on CUDA, no
    cap on the CPU. ``decode_horizon_s`` / ``decode_fill_seqs``: decode only jobs due within the
    horizon, filling up to that many rows (``SchedulerConfig``); -1 (default) =
    ``AUTO_DECODE_HORIZON_S_CUDA`` / ``AUTO_DECODE_FILL_CUDA`` on CUDA, off on the CPU.
    ``prefill_wait_s`` / ``prefill_batch_seqs``: under load, fresh prompts wait that long (once
    due) for that many to share one prefill pass (``SchedulerConfig``); -1 (default) =
    ``AUTO_PREFILL_WAIT_S_CUDA`` / ``AUTO_PREFILL_BATCH_CUDA`` with prefill graphs, off otherwise.
    ``async_steps``: launch each step before the previous one's tokens reach the host
    (``LMBackend``): True / "on", False / "off", or "auto" (default): on when the runner replays
    CUDA graphs.
    ``ramp_step_samples``: the fast-start ramp's lookahead growth per frame
    (``models.orpheus.codec.StreamingDecoder``); 0 (default) = ``AUTO_RAMP_STEPS_CUDA`` on CUDA
    (the second one for segments that start under load, ``OrpheusProgram``), 1024 on the CPU.
    """
    import functools
    import importlib.util

    import torch

    from engine.llm.model_runner import kv_bytes_per_page, num_pages_for_memory
    from engine.llm.page_allocator import PageAllocator
    from engine.llm.program import OrpheusProgram
    from engine.llm.scheduler import SchedulerConfig
    from models.orpheus.codec import SnacDecoder
    from models.orpheus.loader import SNAC_HUB_ID, load_orpheus, load_snac

    def pick(value: Any, name: str, default: Any) -> Any:
        if value is not None:
            return value
        return getattr(config, name, default) if config is not None else default

    device = pick(device, "device", "auto")
    load_format = pick(load_format, "load_format", "auto")
    dtype_name = pick(dtype, "dtype", "auto")
    utilization = pick(gpu_memory_utilization, "gpu_memory_utilization", 0.85)
    max_num_seqs = pick(max_num_seqs, "max_num_seqs", 256)
    max_model_len = pick(max_model_len, "max_model_len", 2048)
    codec_path = pick(codec_path, "codec_path", None) or SNAC_HUB_ID
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch sees no CUDA GPU")
    if dtype_name == "auto":
        dtype_name = "bfloat16" if device == "cuda" else "float32"
    torch_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype_name]
    from engine.llm.fp8 import quantise_decoder_linears_, resolve_fp8_options

    # fp8 options (engine.llm.fp8): CUDA + bf16 only, refused here at start-up otherwise.
    kv_dtype, quantise_fp8 = resolve_fp8_options(
        pick(kv_cache_dtype, "kv_cache_dtype", "auto"), pick(quantization, "quantization", "none"),
        device=device, dtype=torch_dtype,
    )

    model, tokenizer, llama_config = load_orpheus(
        model_path_or_id, device=device, dtype=torch_dtype, load_format=load_format, max_seq_len=max_model_len
    )
    if quantise_fp8:
        quantise_decoder_linears_(model)  # before any runner builds its fused forward
    codec = SnacDecoder(load_snac(codec_path, device=device, load_format=load_format)).to(device)
    decode_fn = None
    decode_fn_enabled = (device == "cuda" and pick(None, "enable_cuda_graphs", True)
                         and importlib.util.find_spec("flashinfer") is not None)

    use_stateful = pick(stateful_codec, "stateful_codec", True)
    # With the stateful codec the window decoder only serves the fast-start ramp (frames 1-4,
    # all of them from the stream's start), so 4-frame windows suffice: a third less work.
    window_frames = RAMP_WINDOW_FRAMES if use_stateful else None
    if decode_fn_enabled:
        from engine.llm.codec_graphs import make_graph_decode_fn

        decode_fn = make_graph_decode_fn(codec, window_frames=window_frames)  # all streams' windows, one replay
    stream_codec = None
    if use_stateful:  # each frame through SNAC once (engine.llm.program)
        from engine.llm.codec_stream_graphs import StreamingCodecGraphs
        from models.orpheus.snac_stream import StreamingSnac

        codec_dtype_name = pick(codec_dtype, "codec_dtype", "auto")
        if codec_dtype_name not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"codec_dtype must be auto, float32 or bfloat16, got {codec_dtype_name!r}")
        if codec_dtype_name == "auto":
            codec_dtype_name = "bfloat16" if device == "cuda" else "float32"
        # torch.compile'd channels-last step on CUDA graphs: 1.14 ms for 64 rows in bf16 on the
        # H200 vs 4.22 ms for the plain NCW layers (benchmark.codec_stream --compare); ~40 s of
        # compilation at start-up.
        compiled = pick(codec_compile, "codec_compile", decode_fn is not None)
        stream_codec = StreamingCodecGraphs(
            StreamingSnac(codec, max_streams=max_num_seqs, device=device, dtype=getattr(torch, codec_dtype_name),
                          channels_last=compiled, compile=compiled),
            capture=decode_fn is not None)
    program = OrpheusProgram(tokenizer, codec, model_name=str(model_path_or_id), decode_fn=decode_fn,
                             stream_codec=stream_codec, window_frames=window_frames,
                             **_ramp_steps(pick(ramp_step_samples, "ramp_step_samples", 0), device))

    pages_per_seq = -(-max_model_len // page_size)
    if num_pages is None:
        if device == "cuda":
            num_pages = num_pages_for_memory(
                llama_config, page_size=page_size, dtype=kv_dtype, device=torch.device(device),
                gpu_memory_utilization=utilization, reserve_bytes=reserve_bytes,
            )
        else:
            num_pages = cpu_kv_cache_bytes // kv_bytes_per_page(llama_config, page_size, kv_dtype)
        num_pages = min(num_pages, max_num_seqs * pages_per_seq + 1)
    if num_pages - 1 < pages_per_seq:  # (one page may become the scratch page)
        raise ValueError(
            f"the KV cache ({num_pages} pages of {page_size}) cannot hold one sequence of "
            f"max_model_len={max_model_len}; lower max_model_len or give it more memory"
        )
    if runner_factory is None and device == "cuda":
        from engine.llm.cuda_graphs import CudaGraphModelRunner, flashinfer_attention_factory

        if importlib.util.find_spec("flashinfer") is None:
            log.warning("flashinfer is not installed: plain torch paged attention, no CUDA graphs")
        elif pick(None, "enable_cuda_graphs", True):
            runner_factory = functools.partial(CudaGraphModelRunner, max_model_len=max_model_len)
        else:
            attention_backend_factory = attention_backend_factory or flashinfer_attention_factory
    runner_kw: dict[str, Any] = {}
    if attention_backend_factory is not None:
        runner_kw["attention_backend_factory"] = attention_backend_factory
    if kv_dtype != torch_dtype:
        runner_kw["kv_cache_dtype"] = kv_dtype
    runner = (runner_factory or ModelRunner)(
        model, llama_config, device=device, dtype=torch_dtype, num_pages=num_pages, page_size=page_size,
        max_num_seqs=max_num_seqs, vocab_ids=program.vocab_ids, allowed_table=program.allowed_table,
        **runner_kw,
    )
    allocator_pages = num_pages
    if runner.scratch_page is None:  # keep the last page out of the allocator's range
        allocator_pages = num_pages - 1
        runner.scratch_page = allocator_pages
    prefill_graphs = getattr(runner, "prefill_graphs", None)
    decode_cap = pick(max_num_decode_seqs, "max_num_decode_seqs", -1)
    if decode_cap < 0:  # auto: what a step keeps in real time (measured on an H200: docs/performance.md)
        decode_cap = AUTO_DECODE_CAP_CUDA if device == "cuda" else 0
    horizon = pick(decode_horizon_s, "decode_horizon_s", -1.0)
    if horizon < 0:
        horizon = AUTO_DECODE_HORIZON_S_CUDA if device == "cuda" else 0.0
    fill = pick(decode_fill_seqs, "decode_fill_seqs", -1)
    if fill < 0:
        fill = AUTO_DECODE_FILL_CUDA if device == "cuda" else 0
    prefill_wait = pick(prefill_wait_s, "prefill_wait_s", -1.0)
    if prefill_wait < 0:
        prefill_wait = AUTO_PREFILL_WAIT_S_CUDA if prefill_graphs is not None else 0.0
    prefill_batch = pick(prefill_batch_seqs, "prefill_batch_seqs", -1)
    if prefill_batch < 0:
        prefill_batch = AUTO_PREFILL_BATCH_CUDA if prefill_graphs is not None else 0
    scheduler = Scheduler(
        SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens or max(512, max_num_seqs + 256),
            max_model_len=max_model_len,
            max_waiting=max_waiting,
            # whole fresh prompts, as many as one packed prefill graph holds
            max_num_prefill_seqs=prefill_graphs.max_num_seqs if prefill_graphs is not None else 0,
            max_num_prefill_tokens=prefill_graphs.max_num_tokens if prefill_graphs is not None else 0,
            max_num_decode_seqs=decode_cap,
            decode_horizon_s=horizon,
            decode_fill_seqs=fill,
            prefill_wait_s=prefill_wait,
            prefill_batch_seqs=prefill_batch,
            whole_prompts=prefill_graphs is not None,
        ),
        PageAllocator(allocator_pages, page_size),
    )
    backend = LMBackend(program, runner, scheduler,
                        async_steps=_resolve_async(pick(async_steps, "async_steps", "auto"), runner))
    if warmup:
        backend.warmup()
    return backend
