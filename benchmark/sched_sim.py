"""The engine's scheduling replayed on a modelled GPU, without one: which share of streams a
policy keeps on time under a given load, to choose what to measure next on the device.

**An estimate, not a measurement.** The engine's own code runs (``EngineCore`` with its
segmenter and deadlines, ``LMBackend``, ``Scheduler`` with the CUDA defaults of
``engine.llm.build``), on a virtual clock; the GPU is a step-time model fitted by hand to the
H200 server timelines of docs/performance.md (runs 11-13), and the model stands in for
Orpheus: no stop token, one 2,048-sample frame per 7 tokens, the first audio after the first
frame (the real fast-start ramp and codec delay are left out). Clients are ``voxgate bench``'s
fixed-concurrency workers: the project's prompts of 30-50 words sent at once, first starts
spread over ``--ramp``, new streams during ``--duration``, each stream's chunks through the
bench's player (100 ms start buffer).

    python -m benchmark.sched_sim --concurrency 224,256,320 --ramp 3 [--mixed] [--cap 320]

``--decode-ms``, ``--decode-row-ms``, ``--prompt-token-ms``, ``--prompt-ms`` and
``--prefill-pass-ms`` replace the step model's figures (e.g. with a ``benchmark.step_fit`` fit
of newer runs: run 22's 4.26 + 0.0141 per row + 0.0274 per prompt token, with no per-prompt or
pass cost, kept 384 streams over a 3 s ramp 100% on time where the server kept 92.7%).

Prints per level: streams, TTFA p50/p90, % on time, mean decode rows and ms per step.
"""

from __future__ import annotations

import argparse
import heapq
import random
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmark.args import list_type, number_type
from benchmark.bench.metrics import percentile, simulate_player
from benchmark.bench.prompts import filter_prompts, load_prompts

__all__ = ["StepModel", "SimProgram", "SimRunner", "simulate", "main"]

SAMPLE_RATE = 24000
FRAME_SAMPLES = 2048
TOKENS_PER_FRAME = 7


@dataclass(frozen=True)
class StepModel:
    """Milliseconds of one engine step on the GPU, codec included.

    Decode: ``decode_ms + decode_row_ms`` per row (run 11: 384 rows, no prompts, 9.4 ms; the
    light seconds of every run: 64 rows, about 4.5 ms). Prompts: ``prompt_token_ms`` per prompt
    token and ``prompt_ms`` per prompt, plus ``prefill_pass_ms`` for a prefill replay of their
    own (not paid with mixed graphs when the step has decode rows). The steady seconds of runs
    12-13 (320 rows at 11.0-11.9 ms with about one prompt per step) say a prompt costs 2-3 ms
    of step time, but not how that splits between the pass and the prompt itself: 2 + 2 ms
    reproduced the measured sweeps best of the splits tried (docs/performance.md).
    """

    decode_ms: float = 3.6
    decode_row_ms: float = 0.0152
    prefill_pass_ms: float = 2.0
    prompt_token_ms: float = 0.004
    prompt_ms: float = 2.0  # per prompt, whatever shares its pass (a new segment's codec start, ...)

    def step_ms(self, decode_rows: int, prompt_tokens: int, *, mixed: bool, prompts: int = 0) -> float:
        ms = self.decode_ms + self.decode_row_ms * decode_rows if decode_rows else 0.0
        if prompt_tokens:
            ms += self.prompt_token_ms * prompt_tokens + self.prompt_ms * prompts
            if not (mixed and decode_rows):
                ms += self.prefill_pass_ms
        return ms


class SimProgram:
    """Orpheus' shape without a model: the prompt of dummy mode (``PieceTokenizer``, about
    Llama 3's lengths), no stop, one frame of audio per 7 tokens."""

    info: Any = None
    stop_ids: frozenset[int] = frozenset()

    def __init__(self) -> None:
        from engine.backend import BackendInfo

        from models.orpheus.loader import PieceTokenizer

        self.info = BackendInfo(model="sim", voices=("v",), default_voice="v", sample_rate=SAMPLE_RATE)
        self._frame = np.zeros(FRAME_SAMPLES, dtype=np.float32)
        self._tokenizer = PieceTokenizer()

    def validate(self, voice: str | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return "v", dict(options)

    def build_prompt(self, text: str, voice: str, options: dict[str, Any]) -> list[int]:
        from models.orpheus.prompt import build_prompt_ids

        return build_prompt_ids(self._tokenizer, "tara", text)

    def sampling_params(self, options: dict[str, Any]) -> Any:
        from engine.llm.sequence import SamplingParams

        return SamplingParams(max_tokens=int(options.get("max_tokens", 287)))

    def new_state(self, voice: str, options: dict[str, Any]) -> list[int]:
        return [0]

    def allowed_row(self, state: Any, ahead: int = 0) -> int:
        return 0

    def launch_postprocess(self, states: list[list[int]], tokens: list[int]) -> Any:
        out = []
        for st in states:
            st[0] += 1
            out.append(self._frame if st[0] % TOKENS_PER_FRAME == 0 else None)
        return lambda: out

    def launch_finish(self, states: list[Any]) -> Any:
        return lambda: [None] * len(states)

    def note_step_interval(self, seconds: float) -> None:
        pass


class SimRunner:
    """Launches nothing: records each step's shape for the step model; every token is 100."""

    def __init__(self) -> None:
        self.last: tuple[int, int] = (0, 0)  # decode rows, prompt tokens of the last launch
        self.prompts = 0

    def launch(self, batch: Any, feed: Any = None) -> Any:
        from engine.llm.model_runner import LaunchedStep

        self.last = (batch.num_decode_seqs, batch.num_tokens - batch.num_decode_seqs)
        self.prompts = batch.num_seqs - batch.num_decode_seqs
        values = [100] * batch.num_seqs
        return LaunchedStep(lambda: values, None)  # type: ignore[arg-type]


@dataclass
class _Stream:
    worker: int
    t_start: float
    chunk_t: list[float]
    chunk_s: list[float]
    done: bool = False


def simulate(concurrency: int, *, ramp_s: float, duration_s: float, model: StepModel, mixed: bool = False,
             cap: int | None = None, max_tokens: int = 287, seed: int = 0, start_buffer_s: float = 0.1,
             ahead_from_now: bool = True, horizon_s: float | None = None, fill: int | None = None,
             hold_undue_prompts: bool = False) -> dict[str, Any]:
    """One level; returns its figures (see the module docstring). ``cap``: decode rows per
    step, ``horizon_s`` the decode horizon, ``fill`` the decode fill (None: the CUDA defaults)."""
    from engine.core import CoreConfig, EngineCore
    from engine.llm.backend import LMBackend
    from models.orpheus.build import AUTO_DECODE_CAP_CUDA, AUTO_DECODE_FILL_CUDA, AUTO_DECODE_HORIZON_S_CUDA, \
        AUTO_PREFILL_BATCH_CUDA, AUTO_PREFILL_WAIT_S_CUDA
    from engine.llm.page_allocator import PageAllocator
    from engine.llm.scheduler import Scheduler, SchedulerConfig
    from engine.messages import Audio, Done, Error

    now = [0.0]

    def clock() -> float:
        return now[0]

    scheduler = Scheduler(SchedulerConfig(
        max_num_seqs=4096, max_num_batched_tokens=4096 + 256, max_model_len=2048, max_waiting=1 << 20,
        max_num_prefill_seqs=16, max_num_prefill_tokens=512, max_num_decode_seqs=cap or AUTO_DECODE_CAP_CUDA,
        decode_horizon_s=AUTO_DECODE_HORIZON_S_CUDA if horizon_s is None else horizon_s,
        decode_fill_seqs=AUTO_DECODE_FILL_CUDA if fill is None else fill,
        prefill_wait_s=0.0 if mixed else AUTO_PREFILL_WAIT_S_CUDA,
        prefill_batch_seqs=0 if mixed else AUTO_PREFILL_BATCH_CUDA, whole_prompts=True,
        hold_undue_prompts=hold_undue_prompts,
    ), PageAllocator(1 << 20, 16), clock=clock)
    runner = SimRunner()
    backend = LMBackend(SimProgram(), runner, scheduler)  # type: ignore[arg-type]
    core = EngineCore(backend, CoreConfig(max_streams=1 << 20), clock=clock)  # type: ignore[arg-type]
    if not ahead_from_now:  # the deadline rule before `max(dry, now)`: for comparison
        _old_deadlines(core)
    prompts = filter_prompts(load_prompts(), min_words=30, max_words=50)
    rng = random.Random(seed)
    starts: list[tuple[float, int]] = [(i * ramp_s / concurrency, i) for i in range(concurrency)]
    heapq.heapify(starts)
    streams: dict[int, _Stream] = {}
    next_key = 0
    rows = steps = 0
    busy_ms = 0.0
    seconds: dict[int, list[float]] = {}  # second -> [steps, decode rows, prompt rows, ms]
    while starts or core.has_work():
        while starts and starts[0][0] <= now[0]:
            t, worker = heapq.heappop(starts)
            key, next_key = next_key, next_key + 1
            streams[key] = _Stream(worker, t, [], [])
            core.open(key, None, {"max_tokens": max_tokens})
            core.add_text(key, rng.choice(prompts))
            core.end(key)
        if not core.has_work():
            now[0] = starts[0][0]
            continue
        out = core.step()
        decode_rows, prompt_tokens = runner.last
        ms = model.step_ms(decode_rows, prompt_tokens, mixed=mixed, prompts=runner.prompts)
        num_prompts, runner.last, runner.prompts = runner.prompts, (0, 0), 0
        now[0] += ms / 1e3
        busy_ms += ms
        steps += decode_rows > 0 or prompt_tokens > 0
        rows += decode_rows
        sec = seconds.setdefault(int(now[0]), [0, 0, 0, 0.0])
        sec[0] += 1
        sec[1] += decode_rows
        sec[2] += num_prompts
        sec[3] += ms
        for msg in out:
            if isinstance(msg, Audio):
                s = streams[msg.key]
                s.chunk_t.append(now[0])
                s.chunk_s.append(len(msg.pcm) / 4 / SAMPLE_RATE)  # pcm_f32le
            elif isinstance(msg, (Done, Error)) and msg.key is not None:
                s = streams[msg.key]
                s.done = True
                if now[0] < duration_s:  # (voxgate bench: no new stream after the duration)
                    heapq.heappush(starts, (now[0], s.worker))
    ttfa, on_time = [], 0
    for s in streams.values():
        if not s.chunk_t:
            continue
        ttfa.append(s.chunk_t[0] - s.t_start)
        res = simulate_player(s.chunk_t, s.chunk_s, start_buffer_s=start_buffer_s, is_complete=s.done)
        on_time += res.underruns == 0
    n = len(streams)
    return {"concurrency": concurrency, "streams": n, "ttfa_p50_ms": 1e3 * percentile(ttfa, 50),
            "ttfa_p90_ms": 1e3 * percentile(ttfa, 90), "on_time": on_time / n if n else 0.0,
            "decode_rows_per_step": rows / steps if steps else 0.0, "ms_per_step": busy_ms / steps if steps else 0.0,
            "timeline": [{"t_s": k + 1, "steps": v[0], "decode_rows_per_step": v[1] / v[0], "prompts_per_step": v[2] / v[0],
                          "ms_per_step": v[3] / v[0]} for k, v in sorted(seconds.items()) if v[0]]}


def _old_deadlines(core: Any) -> None:
    """Give ``core`` the deadline rule of before: a segment ahead is due the slack after its
    stream's dry time, even when that time has passed."""
    orig = core._schedule
    set_deadline = core._set_deadline

    def schedule(stream: Any, job: Any) -> None:
        orig(stream, job)
        if stream.t_first_audio is not None and job is not stream.jobs[0]:
            dry = stream.t_first_audio + stream.samples / SAMPLE_RATE
            set_deadline(job.job_id, dry + core.config.lookahead_slack_s)

    core._schedule = schedule


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmark.sched_sim", description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--concurrency", type=list_type(number_type(int, lo=1)), default=[224, 256, 320])
    ap.add_argument("--ramp", type=number_type(float, lo=0), default=3.0, help="first starts spread over (s)")
    ap.add_argument("--duration", type=number_type(float, lo=0), default=15.0, help="new streams start for (s)")
    ap.add_argument("--max-tokens", type=number_type(int, lo=7), default=287, help="per segment (default 287)")
    ap.add_argument("--cap", type=number_type(int, lo=1), default=None,
                    help="decode rows per step (default: the CUDA default, models.orpheus.build)")
    ap.add_argument("--horizon", type=number_type(float, lo=0), default=None,
                    help="decode horizon in s (default: the CUDA default; 0 = off)")
    ap.add_argument("--fill", type=number_type(int, lo=0), default=None,
                    help="decode fill rows (default: the CUDA default)")
    ap.add_argument("--hold-undue-prompts", action="store_true",
                    help="under load, prompts not due within the horizon wait (SchedulerConfig)")
    ap.add_argument("--mixed", action="store_true", help="prompts ride in the decode pass (mixed graphs)")
    ap.add_argument("--old-ahead-deadlines", action="store_true",
                    help="segments ahead due the slack after a dry time already past (the rule before)")
    ap.add_argument("--decode-ms", type=number_type(float, lo=0), default=StepModel.decode_ms)
    ap.add_argument("--decode-row-ms", type=number_type(float, lo=0), default=StepModel.decode_row_ms)
    ap.add_argument("--prompt-token-ms", type=number_type(float, lo=0), default=StepModel.prompt_token_ms)
    ap.add_argument("--prefill-pass-ms", type=number_type(float, lo=0), default=StepModel.prefill_pass_ms)
    ap.add_argument("--prompt-ms", type=number_type(float, lo=0), default=StepModel.prompt_ms)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    model = StepModel(decode_ms=args.decode_ms, decode_row_ms=args.decode_row_ms,
                      prompt_token_ms=args.prompt_token_ms, prefill_pass_ms=args.prefill_pass_ms,
                      prompt_ms=args.prompt_ms)
    print(f"modelled GPU {model}; ramp {args.ramp:g} s, duration {args.duration:g} s, cap {args.cap or 'default'}, "
          f"horizon {'default' if args.horizon is None else f'{args.horizon:g} s'}, "
          f"fill {'default' if args.fill is None else args.fill}, "
          f"{'holding' if args.hold_undue_prompts else 'not holding'} undue prompts, "
          f"mixed {'on' if args.mixed else 'off'}, {'old' if args.old_ahead_deadlines else 'current'} "
          "ahead deadlines (an estimate, not a measurement)")
    print(f"{'load':>6} {'streams':>7} {'TTFA p50':>8} {'p90':>6} {'on time':>8} {'rows/step':>9} {'ms/step':>7}")
    for c in args.concurrency:
        r = simulate(c, ramp_s=args.ramp, duration_s=args.duration, model=model, mixed=args.mixed, cap=args.cap,
                     max_tokens=args.max_tokens, seed=args.seed, ahead_from_now=not args.old_ahead_deadlines,
                     horizon_s=args.horizon, fill=args.fill, hold_undue_prompts=args.hold_undue_prompts)
        print(f"{c:>6} {r['streams']:>7} {r['ttfa_p50_ms']:>8.0f} {r['ttfa_p90_ms']:>6.0f} "
              f"{100 * r['on_time']:>7.1f}% {r['decode_rows_per_step']:>9.0f} {r['ms_per_step']:>7.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
